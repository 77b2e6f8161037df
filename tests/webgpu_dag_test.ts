/**
 * The DAG layers on WebGPU: they are compositions of engine ops (and `maximum`, on the backends'
 * `max` and `greater` kernels), so a graph net must train on WebGPU exactly as the kernels it is made
 * of do. One training step of the tiny ResNet (BatchNorm, Scale, Eltwise SUM, in-place layers),
 * a Concat / Eltwise PROD and MAX / WITHIN_CHANNEL LRN graph, and BatchNorm's evaluation statistics
 * are compared with the CPU backend (the ResNet only with TANDEM_SLOW_TESTS=1). Without a WebGPU
 * adapter the tests are registered as ignored.
 */

import assert from "node:assert/strict";
import "../mod.ts";
import { createWebGpuBackend, type WebGpuBackend } from "../backends/webgpu/backend.ts";
import { importCaffeNet } from "../engine/caffe/mod.ts";
import { registerBackend, setBackend, tensor, tidy } from "../engine/mod.ts";
import { slowTest } from "./fixtures/slow.ts";
import { rng, values } from "./gradcheck.ts";

const gpu: WebGpuBackend | null = await createWebGpuBackend();
if (!gpu) console.log("webgpu: no adapter, skipping the WebGPU DAG tests");
const TOL = 1e-4;

const RESNET = await Deno.readTextFile(
  new URL("../examples/caffe/resnet_tiny_train_test.prototxt", import.meta.url),
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
