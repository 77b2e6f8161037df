/**
 * The DAG layers on WebGPU: they are compositions of engine ops (and `maximum`, on the backends'
 * `max` and `greater` kernels), so a graph net must train on WebGPU exactly as the kernels it is made
 * of do. One training step of the tiny ResNet (BatchNorm, Scale, Eltwise SUM, in-place layers),
 * a Concat / Eltwise PROD and MAX / WITHIN_CHANNEL LRN graph, and BatchNorm's evaluation statistics
 * are compared with the CPU backend (the ResNet only with TANDEM_SLOW_TESTS=1). Then a BatchNorm net
 * data-parallel on 2 WebGPU devices (GPU-resident replicas): the parameters and each device's own
 * statistics match 2 CPU Worker devices, a checkpoint's statistics reach every GPU, and a failed
 * step puts them back. Without a WebGPU adapter the tests are registered as ignored.
 */

import assert from "node:assert/strict";
import "../../mod.ts";
import type { WebGpuBackend } from "../../backends/webgpu/backend.ts";
import { moduleWebGpu } from "../fixtures/webgpu.ts";
import { importCaffeNet } from "../../engine/caffe/mod.ts";
import {
  loadCheckpoint,
  registerBackend,
  saveCheckpoint,
  setBackend,
  SGD,
  tensor,
  tidy,
} from "../../engine/mod.ts";
import { overlapPlan } from "../../schedule/plan/builtins.ts";
import { DataParallelTrainer } from "../../schedule/runtime/trainer.ts";
import { BN_GROUPS, BN_SPEC, bnBatch } from "../fixtures/bn_net.ts";
import { bits, relativeDifference, startGpuDevice } from "../fixtures/data_parallel.ts";
import { startFailing } from "../fixtures/devices.ts";
import { slowTest } from "../fixtures/slow.ts";
import type { StartDevice } from "../fixtures/wrapped_device.ts";
import { rng, values } from "../reference/gradcheck.ts";

const gpu: WebGpuBackend | null = await moduleWebGpu();
if (!gpu) console.log("webgpu: no adapter, skipping the WebGPU DAG tests");
const TOL = 1e-4;

const RESNET = await Deno.readTextFile(
  new URL("../../examples/caffe/resnet_tiny_train_test.prototxt", import.meta.url),
);
const JOINS = `name: "joins"
input: "data"
input_shape { dim: 1 dim: 3 dim: 8 dim: 8 }
input: "label"
layer { name: "a" type: "Convolution" bottom: "data" top: "a" convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } } }
layer { name: "b" type: "Convolution" bottom: "data" top: "b" convolution_param { num_output: 4 kernel_size: 1 weight_filler { type: "xavier" } } }
layer { name: "prod" type: "Eltwise" bottom: "a" bottom: "b" top: "prod" eltwise_param { operation: PROD } }
layer { name: "max" type: "Eltwise" bottom: "a" bottom: "b" top: "max" eltwise_param { operation: MAX } }
layer { name: "cat" type: "Concat" bottom: "prod" bottom: "max" top: "cat" }
layer { name: "bn" type: "BatchNorm" bottom: "cat" top: "cat" }
layer { name: "scale" type: "Scale" bottom: "cat" top: "cat" scale_param { bias_term: true } }
layer { name: "norm" type: "LRN" bottom: "cat" top: "norm" lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 norm_region: WITHIN_CHANNEL } }
layer { name: "ip" type: "InnerProduct" bottom: "norm" top: "ip" inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "aux" type: "InnerProduct" bottom: "cat" top: "aux" inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "loss_aux" type: "SoftmaxWithLoss" bottom: "aux" bottom: "label" top: "loss_aux" loss_weight: 0.3 }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
`;

function close(what: string, actual: ArrayLike<number>, expected: ArrayLike<number>): void {
  assert.equal(actual.length, expected.length, `${what}: length`);
  let diff = 0, ref = 0;
  for (let i = 0; i < expected.length; i++) {
    const d = Math.abs(actual[i] - expected[i]);
    if (!(d <= diff)) diff = d;
    ref = Math.max(ref, Math.abs(expected[i]));
  }
  assert.ok(diff / (ref + 1e-6) <= TOL, `${what}: max diff ${diff} / max |ref| ${ref}`);
}

/** Loss, every parameter's gradient, the statistics after the step and an evaluation's logits. */
async function step(text: string, shape: number[]): Promise<Map<string, ArrayLike<number>>> {
  const { network } = importCaffeNet(text, { seed: 4 });
  const n = shape[0];
  const images = tensor(values(shape.reduce((a, b) => a * b, 1), rng(8)), { shape });
  const labels = tensor(Int32Array.from({ length: n }, (_, i) => (i * 3) % 10), { dtype: "int32" });
  const out = new Map<string, ArrayLike<number>>();
  try {
    network.train();
    const loss = tidy(() => {
      const { loss } = network.lossAndLogits(images, labels);
      loss.backward();
      return loss;
    });
    out.set("loss", await loss.data() as Float32Array);
    loss.dispose();
    for (const p of network.namedParameters()) {
      out.set(`grad ${p.name}`, await p.tensor.grad!.data() as Float32Array);
    }
    for (const b of network.namedBuffers()) {
      out.set(`buffer ${b.name}`, await b.tensor.data() as Float32Array);
    }
    network.eval();
    const logits = tidy(() => network.forward(images));
    out.set("eval logits", await logits.data() as Float32Array);
    logits.dispose();
  } finally {
    for (const p of network.namedParameters()) p.tensor.grad?.dispose();
    images.dispose();
    labels.dispose();
    network.dispose();
  }
  return out;
}

// The tiny ResNet takes seconds on a software adapter: a slow test; the joins graph is quick.
// Mutation tried: WebGPU's max kernel choosing the smaller operand fails the joins case (Eltwise MAX).
const CASES = [
  { name: "tiny ResNet", text: RESNET, shape: [4, 3, 32, 32], slow: true },
  { name: "joins, BatchNorm and Scale", text: JOINS, shape: [3, 3, 8, 8], slow: false },
];
for (const { name, text, shape, slow } of CASES) {
  Deno.test({
    name: `webgpu dag: ${name}: one training step and an evaluation match the CPU backend`,
    ignore: gpu === null || (slow && slowTest.ignore),
    fn: async () => {
      const expected = await step(text, shape);
      registerBackend(gpu!);
      setBackend("webgpu");
      try {
        const actual = await step(text, shape);
        assert.deepEqual([...actual.keys()], [...expected.keys()]);
        for (const [key, value] of expected) close(key, actual.get(key)!, value);
      } finally {
        setBackend("cpu");
      }
    },
  });
}

// -----------------------------------------------------------------------------------------------
// BatchNorm data-parallel on WebGPU devices: each GPU keeps its own statistics, as CPU Workers do

/** A trainer of the BatchNorm net on 2 devices: WebGPU (GPU-resident replicas) or CPU Workers. */
function bnTrainer(gpuDevices: boolean, startDevice?: StartDevice): Promise<DataParallelTrainer> {
  return DataParallelTrainer.create({
    model: BN_SPEC,
    devices: 2,
    plan: overlapPlan(BN_GROUPS),
    optimizer: (p) => new SGD(p, { lr: 0.05, momentum: 0.9 }),
    startDevice: startDevice ?? (gpuDevices ? startGpuDevice : undefined),
    timeoutSeconds: 60,
  });
}

const BN_STEPS = 3;

/** Parameters and every device's statistics after {@link BN_STEPS} steps. */
async function trainBn(gpuDevices: boolean) {
  const trainer = await bnTrainer(gpuDevices);
  try {
    assert.equal(trainer.exchange, gpuDevices ? "GPU-resident" : "shared memory");
    for (let step = 0; step < BN_STEPS; step++) await trainer.step(bnBatch(step));
    await trainer.syncParameters();
    return {
      parameters: trainer.masterParameters(),
      master: trainer.masterBuffers(),
      devices: trainer.devices.map((d) => d.buffers!.slice()),
    };
  } finally {
    await trainer.close();
  }
}

const maxAbsDiff = (a: Float32Array, b: Float32Array) =>
  a.reduce((m, v, i) => Math.max(m, Math.abs(v - b[i])), 0);

// Not bit for bit: the GPU's reductions add in another order than the CPU kernels, as for the nets
// without BatchNorm (tolerances below). Mutations tried, each failing here: BackendDevice not
// reading the statistics back after a step (`#readBuffers` skipped: the host arrays keep their
// initial values, unlike the CPU devices'); the trainer's masterBuffers() reading the last device's
// array instead of device 0's.
Deno.test({
  name:
    "webgpu dag: a BatchNorm net on 2 WebGPU devices matches 2 CPU devices; each device keeps its own statistics",
  ignore: gpu === null,
  fn: async () => {
    const cpu = await trainBn(false);
    const webgpu = await trainBn(true);
    // Tighter than the non-BatchNorm parity test holds its net (webgpu_data_parallel_test.ts: 1e-5
    // after 4 steps); seen here: 4e-8, and 2e-7 for the statistics.
    const relative = relativeDifference(webgpu.parameters, cpu.parameters);
    assert.ok(relative < 1e-6, `parameters differ from CPU devices by ${relative} (relative L2)`);
    assert.deepEqual(webgpu.master, webgpu.devices[0], "masterBuffers() is device 0's");
    console.log(
      `BatchNorm net, 2 WebGPU vs 2 CPU devices after ${BN_STEPS} steps: parameters ${
        relative.toExponential(2)
      } (relative L2), device 0's statistics ${
        maxAbsDiff(webgpu.devices[0], cpu.devices[0]).toExponential(2)
      } (max)`,
    );
    for (const d of [0, 1]) {
      const diff = maxAbsDiff(webgpu.devices[d], cpu.devices[d]);
      assert.ok(diff < 1e-6, `device ${d}'s statistics differ from the CPU device's by ${diff}`);
    }
    // Three training forwards moved device 1's too: bn1's scale factor is 1 + 0.999 + 0.999².
    assert.ok(Math.abs(webgpu.devices[1][8] - (1 + 0.999 + 0.999 ** 2)) < 1e-5, `${webgpu.devices[1][8]}`);
    assert.ok(
      maxAbsDiff(webgpu.devices[0], webgpu.devices[1]) > 1e-3,
      "device 1 saw other samples: its statistics must differ from device 0's",
    );
  },
});

// Mutations tried, each failing here: BackendDevice not writing the host statistics onto the GPU
// before a forward (`#writeBuffers` skipped: the resumed replicas normalise from the fresh zeros,
// so device 0's statistics after the resumed step differ from the uninterrupted run's); the
// trainer's #fail not putting the saved statistics back (device 0 finished its forward, so its
// array holds the failed step's).
Deno.test({
  name:
    "webgpu dag: BatchNorm statistics on WebGPU devices — a checkpoint resumes them on every device bit for bit; a failed step puts them back",
  ignore: gpu === null,
  fn: async () => {
    const path = await Deno.makeTempFile({ suffix: ".safetensors" });
    try {
      const straight = await bnTrainer(true);
      let expected: { parameters: Float32Array; buffers: Float32Array };
      let saved: Float32Array;
      try {
        for (let step = 0; step < 3; step++) {
          await straight.step(bnBatch(step));
          if (step === 1) {
            await straight.syncParameters();
            await saveCheckpoint(path, {
              parameters: straight.parameterEntries,
              buffers: straight.bufferEntries,
              optimizer: straight.optimizer,
              step: straight.iteration,
              modelName: "bn_tiny",
            });
            saved = straight.masterBuffers();
          }
        }
        await straight.syncParameters();
        expected = { parameters: straight.masterParameters(), buffers: straight.masterBuffers() };
      } finally {
        await straight.close();
      }
      const resumed = await bnTrainer(true);
      try {
        await loadCheckpoint(path, {
          parameters: resumed.parameterEntries,
          buffers: resumed.bufferEntries,
          optimizer: resumed.optimizer,
          modelName: "bn_tiny",
        });
        await resumed.broadcastParameters();
        for (const d of resumed.devices) {
          assert.deepEqual(d.buffers, saved!, `device ${d.index} after the load`);
        }
        await resumed.step(bnBatch(2));
        await resumed.syncParameters();
        assert.deepEqual(bits(resumed.masterParameters()), bits(expected.parameters), "parameters");
        assert.deepEqual(bits(resumed.masterBuffers()), bits(expected.buffers), "device 0's statistics");
      } finally {
        await resumed.close();
      }
    } finally {
      await Deno.remove(path);
    }

    const failing = await bnTrainer(
      true,
      startFailing({ device: 1, iteration: 1, group: "conv" }, startGpuDevice),
    );
    try {
      await failing.step(bnBatch(0));
      const before = failing.devices.map((d) => d.buffers!.slice());
      await assert.rejects(failing.step(bnBatch(1)), /device 1: injected failure in backward conv/);
      failing.devices.forEach((d, i) =>
        assert.deepEqual(d.buffers, before[i], `device ${i} after the failed step`)
      );
    } finally {
      await failing.close();
    }
  },
});
