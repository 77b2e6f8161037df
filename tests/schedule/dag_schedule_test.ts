/**
 * Schedules for Caffe DAG nets: the profile is measured node by node on the graph (topological
 * order, each node on its own bottoms), the AlexNet-like test judges it — a net with little FC
 * weight is not AlexNet-like and `auto` picks DDP-style buckets (`--schedule auto` through the CLI
 * is in tests/cli/dag_training_test.ts). `hybrid` runs a graph whose head is a chain
 * (the body as a graph) and refuses, with a `ScheduleError`, one whose head is not.
 */

import assert from "node:assert/strict";
import "../../mod.ts";
import { importCaffeNet } from "../../engine/caffe/mod.ts";
import { SGD } from "../../engine/mod.ts";
import { headLayout } from "../../schedule/devices/head_layout.ts";
import type { ModelSpec } from "../../schedule/devices/model_spec.ts";
import { hybridPlan, overlapPlan } from "../../schedule/plan/builtins.ts";
import { ScheduleError } from "../../schedule/plan/errors.ts";
import type { Plan } from "../../schedule/plan/plan.ts";
import { DataParallelTrainer } from "../../schedule/runtime/trainer.ts";
import { autoSchedule } from "../../schedule/simulator/auto.ts";
import { DEFAULT_LINK, judgeNetwork } from "../../schedule/simulator/judge.ts";
import { measureProfile } from "../../schedule/simulator/measure.ts";
import { rng, values } from "../reference/gradcheck.ts";

const RESNET = "examples/caffe/resnet_tiny_train_test.prototxt";

Deno.test("dag schedule: the tiny ResNet is measured on its graph and is not AlexNet-like; auto picks buckets", async () => {
  // Mutations tried, each failing here: measureProfile walking the network's children as a chain
  // (the join nodes get one input: the first Eltwise throws); the minFcParameterFraction check
  // dropped (the ResNet's last stage holds most bytes at little compute and passes as AlexNet-like).
  const { network } = importCaffeNet(await Deno.readTextFile(RESNET), { seed: 1 });
  try {
    const profile = measureProfile(network, 2, { repeats: 1 });
    const graph = network.graph!;
    assert.deepEqual(profile.layers.map((l) => l.name), graph.nodes.map((n) => n.name));
    assert.equal(profile.layers.reduce((n, l) => n + l.parameterBytes, 0), 4 * 78_042);
    const res1 = profile.layers.find((l) => l.name === "res1")!;
    assert.equal(res1.kind, "Eltwise");
    assert.equal(res1.outputBytes, 4 * 2 * 16 * 32 * 32);
    assert.equal(profile.layers.find((l) => l.name === "bn_conv1")!.kind, "BatchNorm");
    assert.ok(profile.layers.every((l) => l.forwardSeconds >= 0 && l.backwardSeconds >= 0));

    const verdict = judgeNetwork(profile, { devices: 2 });
    assert.equal(verdict.alexnetLike, false);
    assert.ok(
      verdict.reason.startsWith(
        "not AlexNet-like: the fully-connected layers hold 0.8% of the parameter bytes (0.0 MB of 0.3 MB), less than 25.0%",
      ),
      verdict.reason,
    );
    const plan = autoSchedule(profile, DEFAULT_LINK, 2);
    assert.equal(plan.name, "bucketed", plan.judgement.reason);
    assert.match(plan.judgement.reason, /; use bucketed: [234] buckets of about equal bytes \(DDP-style: /);
    // Every layer is in a bucket, contiguous in topological order, the output side first.
    const order = profile.layers.map((l) => plan.groups.indexOf(plan.assignment[l.name]));
    assert.ok(order.every((g, i) => g >= 0 && (i === 0 || g <= order[i - 1])), `${order}`);
  } finally {
    network.dispose();
  }
});

// -----------------------------------------------------------------------------------------------
// hybrid on graphs

const HEADER = 'name: "g"\ninput: "data"\ninput_shape { dim: 1 dim: 2 dim: 6 dim: 6 }\ninput: "label"\n';
const conv = (name: string, bottom: string, top: string) =>
  `layer { name: "${name}" type: "Convolution" bottom: "${bottom}" top: "${top}" ` +
  `convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } } }\n`;
const ip = (name: string, bottom: string, top: string, n: number) =>
  `layer { name: "${name}" type: "InnerProduct" bottom: "${bottom}" top: "${top}" ` +
  `inner_product_param { num_output: ${n} weight_filler { type: "xavier" } } }\n`;
const loss = (name: string, bottom: string, weight = 1) =>
  `layer { name: "${name}" type: "SoftmaxWithLoss" bottom: "${bottom}" bottom: "label" top: "${name}" loss_weight: ${weight} }\n`;
/** A residual body (the input read twice) and a chain head fc1 → ReLU → fc2. */
const BODY = conv("c1", "data", "c1") + 'layer { name: "r1" type: "ReLU" bottom: "c1" top: "c1" }\n' +
  conv("c2", "c1", "c2") + 'layer { name: "sum" type: "Eltwise" bottom: "c1" bottom: "c2" top: "sum" }\n';
const CHAIN_HEAD = HEADER + BODY + ip("fc1", "sum", "fc1", 16) +
  'layer { name: "r2" type: "ReLU" bottom: "fc1" top: "fc1" }\n' + ip("fc2", "fc1", "fc2", 10) +
  loss("loss", "fc2");

Deno.test("dag schedule: hybrid shards a graph's chain head (the body runs as a graph) and trains like data-parallel", async () => {
  const spec: ModelSpec = { kind: "caffe", text: CHAIN_HEAD, options: { seed: 3 } };
  const run = async (plan: Plan) => {
    const trainer = await DataParallelTrainer.create({
      model: spec,
      devices: 2,
      plan,
      optimizer: (p) => new SGD(p, { lr: 0.05, momentum: 0.9 }),
      timeoutSeconds: 60,
    });
    try {
      for (let step = 0; step < 3; step++) {
        const labels = Int32Array.from({ length: 8 }, (_, i) => (i * 3 + step) % 10);
        await trainer.step({ images: values(8 * 72, rng(step + 1)), labels, shape: [8, 2, 6, 6] });
      }
      await trainer.syncParameters();
      return trainer.masterParameters();
    } finally {
      await trainer.close();
    }
  };
  const hybrid = await run(hybridPlan(["fc", "conv"], ["fc"]));
  const dataParallel = await run(overlapPlan(["fc", "conv"]));
  const worst = hybrid.reduce((m, v, i) => Math.max(m, Math.abs(v - dataParallel[i])), 0);
  assert.ok(worst < 1e-5, `hybrid differs from data-parallel by ${worst}`);
});

Deno.test("dag schedule: hybrid refuses, with a ScheduleError naming the layer, a graph whose head is not a chain", () => {
  // Mutation tried: headLayout without the graph checks lets GoogLeNet-like nets (auxiliary
  // classifiers) through to a head that would drop their losses; every case here then passes.
  const refused = (text: string, pattern: RegExp) => {
    const { network } = importCaffeNet(text, { seed: 1 });
    try {
      assert.throws(
        () => headLayout(network, ["fc"], 2, "hybrid"),
        (e: Error) =>
          e instanceof ScheduleError && pattern.test(e.message) &&
          e.message.startsWith('schedule "hybrid": '),
      );
    } finally {
      network.dispose();
    }
  };
  // GoogLeNet's shape: an auxiliary classifier on the body and a weighted second loss.
  refused(
    HEADER + BODY + ip("aux", "c2", "aux", 10) + loss("aux_loss", "aux", 0.3) + ip("fc1", "sum", "fc1", 16) +
      ip("fc2", "fc1", "fc2", 10) + loss("loss", "fc2"),
    /the hybrid head of g must be a chain: layer fc1 reads "sum", not the output of aux/,
  );
  refused(
    HEADER + BODY + ip("fc1", "sum", "fc1", 16) + ip("fc2", "fc1", "fc2", 10) + ip("aux", "fc1", "aux", 10) +
      loss("loss", "fc2") + loss("aux_loss", "aux", 0.3),
    /layer aux reads "fc1", not the output of fc2/,
  );
  refused(
    HEADER + BODY + ip("fc1", "sum", "fc1", 10) + ip("fc2", "sum", "fc2", 10) +
      'layer { name: "join" type: "Eltwise" bottom: "fc1" bottom: "fc2" top: "j" }\n' + loss("loss", "j"),
    /layer fc2 reads "sum", not the output of fc1/,
  );
  // A body branch that the head does not read: neither body nor head.
  refused(
    HEADER + BODY + conv("side", "data", "side") + ip("fc1", "sum", "fc1", 16) + ip("fc2", "fc1", "fc2", 10) +
      loss("loss", "fc2"),
    /layer side is neither in the body \(what fc1 reads\) nor in the head/,
  );
  // The chain head is accepted, its body output named.
  const { network } = importCaffeNet(CHAIN_HEAD, { seed: 1 });
  const head = headLayout(network, ["fc"], 2);
  assert.equal(head.bodyOutput, "sum");
  assert.deepEqual(head.stages.map((s) => [s.linear, s.after]), [["fc1", ["r2"]], ["fc2", []]]);
  network.dispose();
});
