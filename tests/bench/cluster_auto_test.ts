/**
 * `bench:cluster`'s `auto` rows choose their plan as `train --schedule auto` does across ranks: at the
 * link measured between the ranks (both ways, one way, the share of the cores a transfer takes), in
 * the row's own reduction mode, not at the nominal line rate. The profile is the AlexNet-like net's at
 * 32 images per rank as measured on a 2-core machine (milliseconds rounded to 10 µs), fixed here so
 * that the choices are the same on every machine.
 *
 * Mutations tried, each failing this test: `autoChoice` leaving out the measured share (overlap
 * chosen in every case); pricing at the nominal rate whatever was measured (1.3 GB/s in the reason);
 * the reduction mode left out (master priced for an allreduce row).
 */
import assert from "node:assert/strict";
import { autoChoice, type RankConfig } from "../../bench/cluster/rank.ts";
import type { MeasuredLink } from "../../schedule/mpi/mod.ts";
import type { LayerProfile, Profile } from "../../schedule/simulator/mod.ts";

const layer = (
  name: string,
  group: string,
  forwardSeconds: number,
  backwardSeconds: number,
  parameterBytes: number,
  outputBytes: number,
  kind: string,
): LayerProfile => ({ name, group, forwardSeconds, backwardSeconds, parameterBytes, outputBytes, kind });

const PROFILE: Profile = {
  batchSize: 32,
  description: "alexnet-like, 32 per rank",
  layers: [
    layer("conv1", "conv", 0.0014, 0.00201, 3328, 3211264, "Conv2d"),
    layer("relu1", "conv", 0.0003, 0.0008, 0, 3211264, "ReLU"),
    layer("pool1", "conv", 0.00106, 0.00043, 0, 802816, "MaxPool2d"),
    layer("conv2", "conv", 0.00173, 0.00482, 37120, 1605632, "Conv2d"),
    layer("relu2", "conv", 0.00011, 0.00045, 0, 1605632, "ReLU"),
    layer("pool2", "conv", 0.00024, 0.00018, 0, 401408, "MaxPool2d"),
    layer("conv3", "conv", 0.00133, 0.00287, 147712, 401408, "Conv2d"),
    layer("relu3", "conv", 3e-05, 9e-05, 0, 401408, "ReLU"),
    layer("pool3", "conv", 0.00011, 9e-05, 0, 73728, "MaxPool2d"),
    layer("fc6", "fc", 0.00077, 0.00147, 1772544, 98304, "Linear"),
    layer("relu6", "fc", 1e-05, 3e-05, 0, 98304, "ReLU"),
    layer("drop6", "fc", 9e-05, 4e-05, 0, 98304, "Dropout"),
    layer("fc7", "fc", 0.00099, 0.00176, 2362368, 98304, "Linear"),
    layer("relu7", "fc", 1e-05, 3e-05, 0, 98304, "ReLU"),
    layer("drop7", "fc", 9e-05, 4e-05, 0, 98304, "Dropout"),
    layer("fc8", "fc", 5e-05, 8e-05, 30760, 1280, "Linear"),
  ],
};

/** A 10 Gbit/s link as 2 emulated hosts on 2 cores carry it: 6.08 Gbit/s both ways, 9.58 one way. */
const measured = (commCpuShare: number): MeasuredLink => ({
  link: { bandwidthBytesPerSecond: 6.08e9 / 8, latencySeconds: 50e-6, label: "measured" },
  oneWayBytesPerSecond: 9.58e9 / 8,
  commCpuShare,
  bytes: 4 << 20,
});

const config = (mode: "master" | "allreduce"): RankConfig => ({
  net: "alexnet-like",
  schedule: "auto",
  mode,
  batch: 64,
  steps: 1,
  warmup: 0,
  linkBytesPerSecond: 10e9 / 8,
});

const pricedAt = (reason: string) => /at ([\d.]+ GB\/s with 2 devices \(\w+\))/.exec(reason)?.[1];

Deno.test("bench:cluster auto rows: priced at the measured link and share, in the row's mode", () => {
  for (const mode of ["master", "allreduce"] as const) {
    // The nominal rate alone: a 10 Gbit/s link with nothing on the CPU; the split's overlap wins.
    const line = autoChoice(PROFILE, config(mode), 2);
    assert.equal(pricedAt(line.judgement.reason), `1.3 GB/s with 2 devices (${mode})`);
    assert.equal(line.name, "overlap");
    // The measured link with no share: slower, but the same choice.
    const link = autoChoice(PROFILE, config(mode), 2, measured(0));
    assert.equal(pricedAt(link.judgement.reason), `0.8 GB/s with 2 devices (${mode})`);
    assert.equal(link.name, "overlap");
    // With the share measured there (0.95, the most the simulator takes), compute beside a transfer
    // runs at 5% of its speed: the overlap's predicted step grows by a fifth and hybrid, whose
    // activations are a few hundred kilobytes, wins.
    const shared = autoChoice(PROFILE, config(mode), 2, measured(0.95));
    assert.ok(shared.judgement.split!.overlapSeconds > 1.2 * link.judgement.split!.overlapSeconds);
    assert.equal(shared.name, "hybrid");
    assert.deepEqual(shared.groups, ["fc", "conv"]);
  }
});
