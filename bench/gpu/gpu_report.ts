/**
 * GPU figures in one run, printed as one JSON object: GEMM GFLOP/s up to 4096³ and an AlexNet
 * 227×227 training step on one WebGPU device and on two (sequential vs overlap), in images/s.
 * `bench/gpu/run.sh` installs Deno from npm and runs this; `--smoke` shrinks everything so the
 * script can be checked on a software adapter. The object's `stamp` is the one every bench report
 * carries (`bench/stamp.ts`: date, commit, CPU, cores and the CPU's measured 128-bit peak).
 *
 * @module
 */

import { createWebGpuBackend } from "../../backends/webgpu/backend.ts";
import {
  alexnet,
  cifarQuick,
  DataParallelTrainer,
  ops,
  overlapPlan,
  type Plan,
  randn,
  registerBackend,
  sequentialPlan,
  setBackend,
  SGD,
  tensor,
  trainStep,
} from "../../mod.ts";
import { BackendDevice } from "../../schedule/devices/mod.ts";
import { uniformValues } from "../../engine/mod.ts";
import { measureStamp } from "../stamp.ts";

const stamp = await measureStamp({
  file: "bench/gpu/run.sh (stdout)",
  command: "bench/gpu/run.sh",
  sources: ["bench/gpu"],
});
const smoke = Deno.args.includes("--smoke");
const sizes = smoke ? [128, 256] : [256, 512, 1024, 2048, 4096];
const batch = smoke ? 2 : 128;
// Software adapters bind at most 128 MiB, less than AlexNet's fc6 weights: the smoke run checks the
// same path on cifar10_quick.
const net = smoke
  ? { name: "cifar-quick" as const, create: () => cifarQuick({ seed: 0 }), input: [3, 32, 32], classes: 10 }
  : { name: "alexnet" as const, create: () => alexnet({ seed: 0 }), input: [3, 227, 227], classes: 1000 };

const gpu = await createWebGpuBackend({ name: "webgpu" });
if (!gpu) {
  console.log(JSON.stringify({ error: "no WebGPU adapter" }));
  Deno.exit(1);
}
registerBackend(gpu);
setBackend("webgpu");
const adapterInfo = (gpu.device as GPUDevice & { adapterInfo?: GPUAdapterInfo }).adapterInfo;

const gemm: { n: number; gflops: number }[] = [];
for (const n of sizes) {
  const a = randn([n, n], { seed: 1 }), b = randn([n, n], { seed: 2 });
  await ops.matmul(a, b).data(); // compile and warm up
  const repeats = n >= 2048 ? 5 : 10;
  const t0 = performance.now();
  const outputs = [];
  for (let i = 0; i < repeats; i++) outputs.push(ops.matmul(a, b));
  await outputs[outputs.length - 1].data();
  const seconds = (performance.now() - t0) / 1000 / repeats;
  gemm.push({ n, gflops: (2 * n ** 3) / seconds / 1e9 });
  for (const t of [a, b, ...outputs]) t.dispose();
}

// One device: a whole AlexNet training step (forward, backward, fused SGD) on the GPU.
const model = net.create();
const optimizer = new SGD(model.namedParameters(), { lr: 0.001, momentum: 0.9, weightDecay: 5e-4 });
const images = randn([batch, ...net.input], { seed: 3 });
const labels = tensor(
  Int32Array.from(uniformValues(batch, { seed: 4 }), (u) => Math.floor(u * net.classes)),
  {
    dtype: "int32",
  },
);
await trainStep(model, optimizer, { images, labels });
const steps = smoke ? 1 : 5;
let t0 = performance.now();
for (let i = 0; i < steps; i++) await trainStep(model, optimizer, { images, labels });
const oneDevice = (batch * steps) / ((performance.now() - t0) / 1000);
const hostImages = (await images.data()) as Float32Array;
const hostLabels = labels.hostInts!;
model.dispose();
optimizer.dispose();
setBackend("cpu");

// Two devices, one GPUDevice each, global batch 2 × batch.
async function twoDevices(plan: Plan): Promise<number> {
  const trainer = await DataParallelTrainer.create({
    model: { kind: "builtin", name: net.name },
    devices: 2,
    plan,
    optimizer: (p) => new SGD(p, { lr: 0.001, momentum: 0.9, weightDecay: 5e-4 }),
    startDevice: (index, spec, layout) =>
      BackendDevice.start(index, spec, layout, (i) => createWebGpuBackend({ name: `webgpu:${i}` })),
  });
  const global = {
    images: new Float32Array([...hostImages, ...hostImages]),
    labels: Int32Array.from([...hostLabels, ...hostLabels]),
    shape: [2 * batch, ...net.input],
  };
  try {
    await trainer.step(global);
    t0 = performance.now();
    for (let i = 0; i < steps; i++) await trainer.step(global);
    return (2 * batch * steps) / ((performance.now() - t0) / 1000);
  } finally {
    await trainer.close();
  }
}
const groups = ["fc", "conv"];
const sequentialImages = await twoDevices(sequentialPlan(groups));
const overlapImages = await twoDevices(overlapPlan(groups));

console.log(JSON.stringify({
  stamp,
  adapter: adapterInfo
    ? `${adapterInfo.vendor} ${adapterInfo.architecture} ${adapterInfo.device}`.trim()
    : "unknown",
  deno: Deno.version.deno,
  smoke,
  gemm,
  training: {
    model: net.name,
    batchPerDevice: batch,
    oneDeviceImagesPerSecond: oneDevice,
    twoDevicesSequentialImagesPerSecond: sequentialImages,
    twoDevicesOverlapImagesPerSecond: overlapImages,
    overlapSpeedup: overlapImages / sequentialImages,
  },
}));
