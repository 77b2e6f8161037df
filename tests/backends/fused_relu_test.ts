/**
 * A convolution's ReLU in its epilogue (`ops.conv2d(…, { activation: "relu" })`, which
 * `Sequential` runs for a Conv2d directly followed by a ReLU) gives the bits of `relu(conv2d(…))`:
 * forward and every gradient, on the WebAssembly and TypeScript CPU kernels and on WebGPU; and
 * `Sequential` really fuses (no separate ReLU pass runs).
 *
 * Mutations tried, each made a test here fail: the WebAssembly epilogue skipping its ReLU; the
 * TypeScript kernel skipping it; WebGPU skipping its ReLU dispatch; the fused backward passing the
 * gradient on without the ReLU's mask; `Sequential` not fusing (a ReLU pass runs: the counted
 * `unary("relu")` calls are not 0); the graph not fusing (the same); the graph fusing a
 * convolution another node also reads (that node reads a blob that was never made).
 */

import assert from "node:assert/strict";
import { CpuBackend } from "../../backends/cpu/backend.ts";
import type { Storage, UnaryOp } from "../../backends/backend.ts";
import { moduleWebGpu } from "../fixtures/webgpu.ts";
import { Graph } from "../../engine/nn/graph.ts";
import { Eltwise } from "../../engine/nn/join.ts";
import {
  Conv2d,
  ops,
  registerBackend,
  ReLU,
  Sequential,
  setBackend,
  type Tensor,
  tensor,
  valueAndGrad,
} from "../../mod.ts";
import { mulberry32 } from "../reference/random.ts";

const random = mulberry32(0x5e1f);
function values(n: number): number[] {
  return Array.from({ length: n }, () => random() * 2 - 1);
}

function sameBits(actual: Float32Array, expected: Float32Array, what: string): void {
  const a = new Uint32Array(actual.buffer, actual.byteOffset, actual.length);
  const e = new Uint32Array(expected.buffer, expected.byteOffset, expected.length);
  const i = a.findIndex((v, j) => v !== e[j]);
  assert.ok(a.length === e.length && i < 0, `${what}: element ${i} is ${actual[i]}, expected ${expected[i]}`);
}

const gpu = await moduleWebGpu({ name: "webgpu-fused" });
if (gpu) registerBackend(gpu);
else console.log("fused_relu_test: no WebGPU adapter; its case is skipped");
registerBackend(new CpuBackend({ name: "cpu-ts-fused", kernels: "ts" }));

/** Forward and gradients of `Σ r·f(conv2d)` with the ReLU fused and unfused, on one backend. */
async function compare(backend: string): Promise<void> {
  setBackend(backend);
  try {
    // Two groups, padding, a tail of pixels; weights and bias of both signs, so the ReLU clips.
    const x = tensor(values(2 * 4 * 9 * 7), { shape: [2, 4, 9, 7] });
    const w = tensor(values(6 * 2 * 3 * 3), { shape: [6, 2, 3, 3] });
    const b = tensor(values(6), { shape: [6] });
    const r = tensor(values(2 * 6 * 9 * 7), { shape: [2, 6, 9, 7] });
    const options = { padding: 1, groups: 2 };
    const run = (fused: boolean) => {
      const f = valueAndGrad((xi: Tensor, wi: Tensor, bi: Tensor) => {
        const y = fused
          ? ops.conv2d(xi, wi, bi, { ...options, activation: "relu" })
          : ops.relu(ops.conv2d(xi, wi, bi, options));
        return ops.sum(ops.mul(y, r));
      });
      const { value, grads } = f(x, w, b);
      const y = fused
        ? ops.conv2d(x, w, b, { ...options, activation: "relu" })
        : ops.relu(ops.conv2d(x, w, b, options));
      return [y, value, ...grads];
    };
    const fused = run(true), plain = run(false);
    const names = ["y", "loss", "dx", "dw", "db"];
    const yData = await fused[0].data() as Float32Array;
    const zeros = yData.filter((v) => v === 0).length;
    assert.ok(
      zeros > 0.2 * yData.length && zeros < 0.8 * yData.length,
      `${backend}: the ReLU clips ${zeros}`,
    );
    for (let i = 0; i < fused.length; i++) {
      sameBits(
        await fused[i].data() as Float32Array,
        await plain[i].data() as Float32Array,
        `${backend} ${names[i]}`,
      );
    }
    for (const t of [x, w, b, r, ...fused, ...plain]) t.dispose();
  } finally {
    setBackend("cpu");
  }
}

Deno.test("fused ReLU: conv2d with activation relu has the bits of relu(conv2d), forward and gradients, on the CPU kernels", async () => {
  await compare("cpu");
  await compare("cpu-ts-fused");
});

Deno.test({
  name: "webgpu: fused ReLU: conv2d with activation relu has the bits of relu(conv2d), forward and gradients",
  ignore: !gpu,
  fn: () => compare("webgpu-fused"),
});

/** A CPU backend that counts its ReLU passes, registered and made current. */
function countingBackend(name: string): CpuBackend & { reluPasses: number } {
  const counting = Object.create(new CpuBackend()) as CpuBackend & { name: string; reluPasses: number };
  Object.defineProperty(counting, "name", { value: name });
  counting.reluPasses = 0;
  const unary = CpuBackend.prototype.unary;
  counting.unary = function (op: UnaryOp, x: Storage, out: Storage) {
    if (op === "relu") counting.reluPasses++;
    return unary.call(this, op, x, out);
  };
  registerBackend(counting);
  setBackend(name);
  return counting;
}

/** A ReLU by another class: fusion takes exact classes only, so a pair with it runs as two ops. */
class SeparateReLU extends ReLU {}

/** Loss and gradients of `Σ f(x)²` over `params`. */
async function lossAndGrads(f: () => Tensor, params: Tensor[]): Promise<Float32Array[]> {
  const { value, grads } = valueAndGrad((...p: Tensor[]) => {
    void p;
    const y = f();
    return ops.sum(ops.mul(y, y));
  })(...params);
  return [
    await value.data() as Float32Array,
    ...await Promise.all(grads.map((g) => g.data() as Promise<Float32Array>)),
  ];
}

Deno.test("fused ReLU: Sequential runs Conv2d → ReLU as one op, with the bits of the two layers", async () => {
  const counting = countingBackend("cpu-counting");
  try {
    const net = (relu: ReLU) =>
      new Sequential({ conv: new Conv2d(3, 8, 3, { padding: 1, groups: 1 }), relu }).initialize(5);
    const fusedNet = net(new ReLU()), plainNet = net(new SeparateReLU());
    const x = tensor(values(4 * 3 * 6 * 6), { shape: [4, 3, 6, 6] });
    counting.reluPasses = 0;
    const fused = await lossAndGrads(() => fusedNet.forward(x), fusedNet.parameters());
    assert.equal(counting.reluPasses, 0, "the fused pair runs no ReLU pass of its own");
    const plain = await lossAndGrads(() => plainNet.forward(x), plainNet.parameters());
    assert.equal(counting.reluPasses, 1, "the unfused pair runs one ReLU pass");
    fused.forEach((v, i) => sameBits(v, plain[i], `output ${i}`));
  } finally {
    setBackend("cpu");
  }
});

Deno.test("fused ReLU: a graph fuses a convolution whose one reader is a ReLU, and no other", async () => {
  const counting = countingBackend("cpu-counting-graph");
  try {
    // conv1 → relu1 (its one reader: fused); conv2 → relu2 and → the sum (two readers: not fused).
    const graph = (relu: () => ReLU) => {
      const modules = {
        conv1: new Conv2d(4, 4, 3, { padding: 1 }).initialize(1),
        conv2: new Conv2d(4, 4, 3, { padding: 1 }).initialize(2),
      };
      return {
        params: [...modules.conv1.parameters(), ...modules.conv2.parameters()],
        graph: new Graph({
          input: "x",
          nodes: [
            { name: "conv1", module: modules.conv1, bottoms: ["x"], top: "c1" },
            { name: "relu1", module: relu(), bottoms: ["c1"], top: "r1" },
            { name: "conv2", module: modules.conv2, bottoms: ["r1"], top: "c2" },
            { name: "relu2", module: relu(), bottoms: ["c2"], top: "r2" },
            { name: "sum", module: new Eltwise("SUM"), bottoms: ["r2", "c2"], top: "out" },
          ],
        }),
      };
    };
    const fusedGraph = graph(() => new ReLU()), plainGraph = graph(() => new SeparateReLU());
    const x = tensor(values(2 * 4 * 5 * 5), { shape: [2, 4, 5, 5] });
    counting.reluPasses = 0;
    const fused = await lossAndGrads(() => fusedGraph.graph.run(x, ["out"])[0], fusedGraph.params);
    assert.equal(
      counting.reluPasses,
      1,
      "relu1 fused into conv1; relu2 runs, conv2's output has two readers",
    );
    const plain = await lossAndGrads(() => plainGraph.graph.run(x, ["out"])[0], plainGraph.params);
    assert.equal(counting.reluPasses, 3);
    fused.forEach((v, i) => sameBits(v, plain[i], `output ${i}`));
  } finally {
    setBackend("cpu");
  }
});
