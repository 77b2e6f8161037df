/**
 * PyTorch DDP's default gradient buckets as plan groups (`schedule/plan/buckets.ts`), on the layer
 * sizes of the nets the benches train.
 */

import assert from "node:assert/strict";
import { ddpBuckets } from "../../schedule/mod.ts";

const MiB = 1 << 20;

/** Caffe's bvlc_alexnet (MiB of parameters per layer, forward order), a parameter-free layer between. */
const ALEXNET = [
  ["conv1", 0.133],
  ["conv2", 1.173],
  ["conv3", 3.376],
  ["conv4", 2.533],
  ["conv5", 1.688],
  ["pool5", 0],
  ["fc6", 144.016],
  ["fc7", 64.016],
  ["fc8", 15.629],
] as const;

/** Tandem's AlexNet-like default. */
const ALEXNET_LIKE = [
  ["conv1", 0.003],
  ["conv2", 0.035],
  ["conv3", 0.141],
  ["fc6", 1.69],
  ["fc7", 2.253],
  ["fc8", 0.029],
] as const;

const layers = (net: readonly (readonly [string, number])[]) =>
  net.map(([name, mib]) => ({ name, parameterBytes: Math.round(mib * MiB) }));

// Mutations tried, each made this test fail: a first bucket capped at 25 MiB like the others (the
// AlexNet-like net becomes one bucket); closing a bucket only above its cap (the 1 MiB layer below
// shares its bucket); buckets walked from the input side; a parameter-free layer put with the layer
// on its output side (pool5 lands in bucket3).
Deno.test("buckets: DDP's rule from the output side, 1 MiB first, then up to 25 MiB, big layers alone", () => {
  const alexnet = ddpBuckets(layers(ALEXNET));
  assert.deepEqual(alexnet.groups, ["bucket1", "bucket2", "bucket3", "bucket4"]);
  assert.deepEqual(alexnet.assignment, {
    fc8: "bucket1",
    fc7: "bucket2",
    fc6: "bucket3",
    pool5: "bucket4",
    conv5: "bucket4",
    conv4: "bucket4",
    conv3: "bucket4",
    conv2: "bucket4",
    conv1: "bucket4",
  });
  assert.deepEqual(alexnet.plan.groups, alexnet.groups);
  assert.equal(alexnet.plan.name, "bucketed");
  assert.equal(
    alexnet.bytes.reduce((a, b) => a + b, 0),
    layers(ALEXNET).reduce((a, l) => a + l.parameterBytes, 0),
  );

  // fc8 alone is under 1 MiB, so fc7 joins the first bucket; the rest fits in one of 25 MiB.
  const like = ddpBuckets(layers(ALEXNET_LIKE));
  assert.deepEqual(like.groups, ["bucket1", "bucket2"]);
  assert.deepEqual(
    Object.entries(like.assignment).filter(([, g]) => g === "bucket1").map(([name]) => name).sort(),
    ["fc7", "fc8"],
  );

  // A bucket closes as soon as it reaches its cap, as DDP's `>=`.
  const exact = ddpBuckets(layers([["a", 0.5], ["b", 1], ["c", 1]]));
  assert.deepEqual(exact.assignment, { c: "bucket1", b: "bucket2", a: "bucket2" });

  // Under 1 MiB in all: one bucket; layers before the first with parameters join the last one.
  const small = ddpBuckets(layers([["input", 0], ["conv", 0.1], ["fc", 0.4]]));
  assert.deepEqual(small.groups, ["bucket1"]);
  assert.deepEqual(small.assignment, { input: "bucket1", conv: "bucket1", fc: "bucket1" });

  // The caps are options.
  const caps = ddpBuckets(layers(ALEXNET_LIKE), { firstBucketBytes: 0.02 * MiB, bucketBytes: 2 * MiB });
  assert.deepEqual(caps.groups, ["bucket1", "bucket2", "bucket3"]);
  assert.equal(caps.assignment.fc8, "bucket1");
  assert.equal(caps.assignment.fc7, "bucket2");
  assert.equal(caps.assignment.fc6, "bucket3");
});
