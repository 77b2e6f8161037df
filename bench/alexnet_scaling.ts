/**
 * Predictions for hardware we do not have: AlexNet (Caffe's bvlc_alexnet, 227×227) on 2–8 GPUs
 * over PCIe 3/4, NVLink and 10/100 GbE, sequential vs overlap, from the simulator. Written to
 * `bench/ALEXNET_SCALING.md`.
 *
 * The per-layer profile is measured here, on the CPU backend at batch 2, and then rescaled to a
 * stated GPU: each layer keeps its measured share of the time, and the total is set so the GPU runs
 * the network's FLOPs at `GPU_FLOPS` at batch 128. That keeps what the measurement knows (which
 * layers are slow relative to their FLOPs: LRN, pooling) and states plainly what it cannot know.
 *
 * Run: `npx deno task bench:alexnet` (about a minute).
 *
 * @module
 */

import { alexnet, summarize } from "../mod.ts";
import { alexnetScalingTable, measureProfile, type Profile } from "../schedule/simulator/mod.ts";
import { writeFileAtomic } from "../engine/io/mod.ts";
import { measureStamp, stampBlock } from "./stamp.ts";

/** Assumed sustained fp32 rate of one GPU: ~70% of an NVIDIA V100's 15.7 TFLOP/s peak. */
const GPU_FLOPS = 11e12;
/** Assumed GPU memory bandwidth for gradient sums and updates (V100 HBM2). */
const GPU_MEMORY_BANDWIDTH = 900e9;
const MEASURED_BATCH = 2, GPU_BATCH = 128;

const stamp = await measureStamp({
  file: "bench/ALEXNET_SCALING.md",
  command: "npx deno task bench:alexnet",
  sources: ["bench/alexnet_scaling.ts"],
});
const model = alexnet({ seed: 0 });
const summary = summarize(model, model.inputShape);
const measured = measureProfile(model, MEASURED_BATCH, { repeats: 1 });
model.dispose();
const cpuSeconds = measured.layers.reduce((s, l) => s + l.forwardSeconds + l.backwardSeconds, 0);
// Forward + backward ≈ 3 × forward FLOPs.
const gpuSeconds = (3 * summary.flops * GPU_BATCH) / GPU_FLOPS;
const scale = gpuSeconds / cpuSeconds;
const profile: Profile = {
  ...measured,
  batchSize: GPU_BATCH,
  layers: measured.layers.map((l) => ({
    ...l,
    forwardSeconds: l.forwardSeconds * scale,
    backwardSeconds: l.backwardSeconds * scale,
  })),
  description: `AlexNet per-layer shares measured on the CPU backend at batch ${MEASURED_BATCH}, rescaled`,
};
const table = alexnetScalingTable(profile, {
  memoryBandwidthBytesPerSecond: GPU_MEMORY_BANDWIDTH,
});
const cpuRate = (3 * summary.flops * MEASURED_BATCH) / cpuSeconds;
const text = [
  "# AlexNet 227×227 on 2–8 GPUs: simulator predictions",
  "",
  stampBlock(stamp),
  "",
  `Profile: per-layer forward/backward times of Caffe's bvlc_alexnet measured on this machine's CPU ` +
  `backend at batch ${MEASURED_BATCH} (${(cpuRate / 1e9).toFixed(1)} GFLOP/s overall), each layer's ` +
  `share kept and the total rescaled to an assumed GPU sustaining ${
    GPU_FLOPS / 1e12
  } TFLOP/s at batch ${GPU_BATCH} ` +
  `per GPU (${(gpuSeconds * 1000).toFixed(0)} ms forward + backward). Gradient sums and updates at ` +
  `${GPU_MEMORY_BANDWIDTH / 1e9} GB/s; master mode uses one shared link into the master. These are ` +
  "predictions of a cost model, not measurements.",
  "",
  table.markdown,
  "",
].join("\n");
console.log(text);
await writeFileAtomic(new URL("./ALEXNET_SCALING.md", import.meta.url).pathname, [
  new TextEncoder().encode(text),
]);
