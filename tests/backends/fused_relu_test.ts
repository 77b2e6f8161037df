/**
 * A layer's ReLU in its epilogue (`ops.conv2d(…, { activation: "relu" })` and
 * `ops.linear(…, { activation: "relu" })`, which `Sequential` runs for a Conv2d or a Linear directly
 * followed by a ReLU) gives the bits of `relu(layer(…))`, and a max pooling fused after it
 * (`maxPool`, for Conv2d → ReLU → MaxPool2d) those of `maxPool2d(relu(conv2d(…)))`: forward and
 * every gradient, on the WebAssembly and TypeScript CPU kernels and on WebGPU; the backends'
 * `matmul` with a bias and a ReLU gives the bits of the product, a broadcast add and a ReLU as
 * three calls, however the threads split it; and `Sequential` and graphs really fuse (no separate
 * ReLU pass runs; with the pooling, the ReLU's mask covers only the pooled gradient).
 *
 * Mutations tried, each made a test here fail: the WebAssembly epilogue skipping its ReLU (also
 * only on the unrolled vectors of its one pass, `channel_bias`, or storing those all at the first's
 * place); the TypeScript kernel skipping it; WebGPU skipping its ReLU dispatch; the fused backward
 * passing the gradient on without the ReLU's mask; `Sequential` not fusing (a ReLU pass runs: the
 * counted `unary("relu")` calls are not 0); the graph not fusing (the same); the graph fusing a
 * convolution another node also reads (that node reads a blob that was never made). For the fully
 * connected layer: the WebAssembly matmul's epilogue reading the bias from column 0 in every window
 * (the second thread's columns wrong); its ReLU skipped; the TypeScript matmul's bias skipped;
 * WebGPU's matmul skipping its ReLU, or its bias; `linear`'s backward without the ReLU's mask;
 * `fusedRun` refusing a Linear (a ReLU pass runs). For a max pooling fused after the ReLU: its
 * backward routing the pooled gradient unmasked; `fusedRun` refusing a MaxPool2d (the ReLU's mask
 * covers the unpooled output again); the graph stopping its chains at 2 nodes (the same); the graph
 * fusing a pooling whose input blob is asked for (that blob is never made); the graph fusing
 * through a blob with a second reader (that reader's blob is never made). For the WebAssembly
 * kernels' pooled forward (`conv2dForwardMaxPool`): threads' image outputs overlapping; the pooling
 * before the ReLU; `conv2d` not calling it. For a ReLU after the pooling: `fusedRun` refusing that
 * order (a ReLU pass runs).
 */

import assert from "node:assert/strict";
import { CpuBackend } from "../../backends/cpu/backend.ts";
import { conv2dGeometry, pool2dGeometry } from "../../backends/geometry.ts";
import type { BinaryOp, Storage, UnaryOp } from "../../backends/backend.ts";
import { moduleWebGpu } from "../fixtures/webgpu.ts";
import { Graph } from "../../engine/nn/graph.ts";
import { Eltwise } from "../../engine/nn/join.ts";
import {
  Conv2d,
  Flatten,
  Linear,
  MaxPool2d,
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
import { assertSameBits as sameBits } from "../reference/bits.ts";

const random = mulberry32(0x5e1f);
function values(n: number): number[] {
  return Array.from({ length: n }, () => random() * 2 - 1);
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

/**
 * Forward and gradients of `Σ r·f(conv2d)` with a max pooling fused into the convolution (after its
 * ReLU, and alone) and as separate ops, on one backend: 3×3 stride-2 windows, and padded 2×2 ones
 * whose last window hangs over the edge (Caffe's rounded-up size).
 */
async function comparePooled(backend: string): Promise<void> {
  setBackend(backend);
  try {
    // Two groups of 2 channels (the WebAssembly kernels' im2col path), and 16 → 8 channels 3×3
    // (their Winograd path).
    const layers = [
      { x: [3, 4, 11, 9], w: [6, 2, 3, 3], conv: { padding: 1, groups: 2 } },
      { x: [3, 16, 10, 9], w: [8, 16, 3, 3], conv: { padding: 1 } },
    ];
    for (const layerShapes of layers) {
      const x = tensor(values(layerShapes.x.reduce((p, q) => p * q)), { shape: layerShapes.x });
      const w = tensor(values(layerShapes.w.reduce((p, q) => p * q)), { shape: layerShapes.w });
      // Odd channels' bias two standard deviations of the products below 0, so that whole windows
      // stay negative there and the ReLU clips their winners whatever the draws.
      const k = layerShapes.w[1] * layerShapes.w[2] * layerShapes.w[3], shift = (-2 * Math.sqrt(k)) / 3;
      const b = tensor(values(layerShapes.w[0]).map((v, c) => (c % 2 ? v + shift : v)), {
        shape: [layerShapes.w[0]],
      });
      const conv = layerShapes.conv;
      for (const maxPool of [{ kernel: 3, stride: 2 }, { kernel: 2, stride: 2, padding: 1 }]) {
        for (const relu of [true, false]) {
          const layer = (fused: boolean) => (xi: Tensor, wi: Tensor, bi: Tensor) => {
            if (fused) {
              return ops.conv2d(xi, wi, bi, { ...conv, maxPool, ...(relu ? { activation: "relu" } : {}) });
            }
            const y = ops.conv2d(xi, wi, bi, conv);
            return ops.maxPool2d(relu ? ops.relu(y) : y, maxPool);
          };
          const probe = layer(false)(x, w, b), shape = probe.shape;
          probe.dispose();
          const r = tensor(values(shape.reduce((p, q) => p * q, 1)), { shape });
          const run = (fused: boolean) => {
            const f = layer(fused);
            const { value, grads } = valueAndGrad((xi: Tensor, wi: Tensor, bi: Tensor) =>
              ops.sum(ops.mul(f(xi, wi, bi), r))
            )(x, w, b);
            return [f(x, w, b), value, ...grads];
          };
          const fusedResult = run(true), plainResult = run(false);
          const what = `${backend} ${JSON.stringify(layerShapes.w)} pool ${JSON.stringify(maxPool)}${
            relu ? " after relu" : ""
          }`;
          // With the ReLU, some windows' winners are clipped to 0: their gradient is masked.
          const y = await fusedResult[0].data() as Float32Array;
          if (relu) assert.ok(y.includes(0) && y.some((v) => v > 0), `${what}: the ReLU clips some winners`);
          const names = ["y", "loss", "dx", "dw", "db"];
          for (let i = 0; i < fusedResult.length; i++) {
            sameBits(
              await fusedResult[i].data() as Float32Array,
              await plainResult[i].data() as Float32Array,
              `${what} ${names[i]}`,
            );
          }
          for (const t of [r, ...fusedResult, ...plainResult]) t.dispose();
        }
      }
      for (const t of [x, w, b]) t.dispose();
    }
  } finally {
    setBackend("cpu");
  }
}

Deno.test("fused max pooling: conv2d with activation relu and maxPool has the bits of maxPool2d(relu(conv2d)), forward and gradients, on the CPU kernels", async () => {
  await comparePooled("cpu-wasm-2-fused");
  await comparePooled("cpu-ts-fused");
});

Deno.test({
  name:
    "webgpu: fused max pooling: conv2d with activation relu and maxPool has the bits of maxPool2d(relu(conv2d))",
  ignore: !gpu,
  fn: () => comparePooled("webgpu-fused"),
});

/**
 * Forward and gradients of `Σ r·f(linear)` with the bias and ReLU in the product's epilogue and
 * as `relu(matmul(x, wᵀ) + b)`, three ops, on one backend: columns
 * split between threads (units ≥ batch) and rows split (batch > units), with and without a bias.
 */
async function compareLinear(backend: string): Promise<void> {
  setBackend(backend);
  try {
    for (
      const [batch, features, units, withBias] of [[32, 200, 600, true], [600, 150, 24, true], [
        9,
        40,
        33,
        false,
      ]] as const
    ) {
      const x = tensor(values(batch * features), { shape: [batch, features] });
      const w = tensor(values(units * features), { shape: [units, features] });
      const b = withBias ? tensor(values(units), { shape: [units] }) : null;
      const r = tensor(values(batch * units), { shape: [batch, units] });
      const run = (fused: boolean) => {
        // Unfused: the product, the broadcast add and the ReLU as three ops of their own.
        const layer = (xi: Tensor, wi: Tensor, bi: Tensor | null) => {
          if (fused) return ops.linear(xi, wi, bi, { activation: "relu" });
          const product = ops.matmul(xi, wi, { transposeB: true });
          return ops.relu(bi ? ops.add(product, bi) : product);
        };
        const f = valueAndGrad((xi: Tensor, wi: Tensor, bi?: Tensor) =>
          ops.sum(ops.mul(layer(xi, wi, bi ?? null), r))
        );
        const { value, grads } = b ? f(x, w, b) : f(x, w);
        return [layer(x, w, b), value, ...grads];
      };
      const fused = run(true), plain = run(false);
      const what = `${backend} linear ${batch}×${features}→${units}${withBias ? "" : " (no bias)"}`;
      const yData = await fused[0].data() as Float32Array;
      const zeros = yData.filter((v) => v === 0).length;
      assert.ok(zeros > 0.2 * yData.length && zeros < 0.8 * yData.length, `${what}: the ReLU clips ${zeros}`);
      const names = ["y", "loss", "dx", "dw", "db"];
      for (let i = 0; i < fused.length; i++) {
        sameBits(
          await fused[i].data() as Float32Array,
          await plain[i].data() as Float32Array,
          `${what} ${names[i]}`,
        );
      }
      for (const t of [x, w, r, ...(b ? [b] : []), ...fused, ...plain]) t.dispose();
    }
  } finally {
    setBackend("cpu");
  }
}

// Two kernel threads, started before the first product (until they are, products run on one).
const twoThreads = new CpuBackend({ name: "cpu-wasm-2-fused", threads: 2 });
assert.equal(await twoThreads.startThreads(), 2);
registerBackend(twoThreads);

Deno.test("fused ReLU: linear with activation relu has the bits of relu(linear), forward and gradients, on the CPU kernels", async () => {
  await compareLinear("cpu-wasm-2-fused");
  await compareLinear("cpu-ts-fused");
});

Deno.test({
  name: "webgpu: fused ReLU: linear with activation relu has the bits of relu(linear), forward and gradients",
  ignore: !gpu,
  fn: () => compareLinear("webgpu-fused"),
});

Deno.test("matmul epilogue: bias and ReLU in the product give the bits of three calls, on 1 and 2 threads and the TypeScript kernels", async () => {
  const backends = [
    new CpuBackend({ name: "two", threads: 2 }),
    new CpuBackend({ name: "one", threads: 1 }),
    new CpuBackend({ name: "ts", kernels: "ts" }),
  ];
  assert.equal(await backends[0].startThreads(), 2, "two kernel threads compute");
  // Column windows (n ≥ m), row windows (m > n), and whole products per thread (batch 8).
  const cases = [
    { batch: 1, m: 64, n: 600, k: 100, transA: false, transB: true },
    { batch: 1, m: 600, n: 64, k: 100, transA: true, transB: false },
    { batch: 8, m: 40, n: 72, k: 300, transA: false, transB: false },
  ];
  for (const backend of backends) {
    for (const c of cases) {
      const a = new Float32Array(values(c.batch * c.m * c.k)),
        b = new Float32Array(values(c.batch * c.k * c.n));
      const bias = new Float32Array(values(c.n));
      const spec = { ...c, aBatchStride: c.m * c.k, bBatchStride: c.k * c.n };
      const [sa, sb, sbias] = [a, b, bias].map((v) => backend.upload(v));
      const length = c.batch * c.m * c.n;
      for (const relu of [false, true]) {
        const fused = backend.allocate(length, "float32"), plain = backend.allocate(length, "float32");
        backend.matmul(sa, sb, fused, spec, sbias, relu ? "relu" : undefined);
        backend.matmul(sa, sb, plain, spec);
        const shape = [c.batch * c.m, c.n];
        backend.binary(
          "add",
          plain,
          { offset: 0, strides: [c.n, 1] },
          sbias,
          { offset: 0, strides: [0, 1] },
          plain,
          shape,
        );
        if (relu) backend.unary("relu", plain, plain);
        const what = `${backend.name} ${JSON.stringify(c)}${relu ? " relu" : ""}`;
        const result = backend.readSync(fused) as Float32Array;
        sameBits(result, backend.readSync(plain) as Float32Array, what);
        if (relu) assert.ok(result.includes(0) && result.some((v) => v > 0), `${what}: the ReLU clips some`);
        backend.release(fused);
        backend.release(plain);
      }
      // A ReLU without a bias: the product, then the ReLU.
      const fused = backend.allocate(length, "float32"), plain = backend.allocate(length, "float32");
      backend.matmul(sa, sb, fused, spec, undefined, "relu");
      backend.matmul(sa, sb, plain, spec);
      backend.unary("relu", plain, plain);
      sameBits(
        backend.readSync(fused) as Float32Array,
        backend.readSync(plain) as Float32Array,
        `${backend.name} relu alone`,
      );
      for (const s of [sa, sb, sbias, fused, plain]) backend.release(s);
    }
    backend.dispose();
  }
});

type Counting = CpuBackend & { reluPasses: number; reluGradElements: number };

/**
 * A CPU backend that counts its ReLU passes and the elements its ReLU gradients cover (separate or
 * fused into max pooling's backward), registered and made current.
 */
function countingBackend(name: string): Counting {
  const counting = Object.create(new CpuBackend()) as Counting & { name: string };
  Object.defineProperty(counting, "name", { value: name });
  counting.reluPasses = 0;
  counting.reluGradElements = 0;
  const unary = CpuBackend.prototype.unary, binary = CpuBackend.prototype.binary;
  counting.unary = function (op: UnaryOp, x: Storage, out: Storage) {
    if (op === "relu") counting.reluPasses++;
    return unary.call(this, op, x, out);
  };
  counting.binary = function (
    op: BinaryOp,
    ...rest: Parameters<CpuBackend["binary"]> extends [unknown, ...infer R] ? R : never
  ) {
    if (op === "reluGrad") counting.reluGradElements += rest[4].length;
    return binary.call(this, op, ...rest);
  };
  // The mask fused into max pooling's backward counts as a ReLU gradient over the pooled gradient.
  const pooledBackward = CpuBackend.prototype.maxPool2dBackwardFused;
  counting.maxPool2dBackwardFused = function (...args: Parameters<CpuBackend["maxPool2dBackwardFused"]>) {
    const done = pooledBackward.apply(this, args);
    if (done && args[4].reluOf) counting.reluGradElements += args[0].length;
    return done;
  };
  // A first layer's weight gradient straight from the pooled gradient sums in another order (its
  // own test: pooled_filter_test.ts); left out here, where the fused ops' bits are the separate ops'.
  Object.defineProperty(counting, "conv2dBackwardFilterPooled", { value: undefined });
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

/**
 * `net(relu)` with a fusable ReLU and with a {@link SeparateReLU} on an input of `shape`: the
 * fused net runs no ReLU pass of its own, the unfused one runs one, and both give the same loss
 * and gradients.
 */
async function sequentialPairFuses(
  name: string,
  net: (relu: ReLU) => Sequential,
  shape: number[],
): Promise<void> {
  const counting = countingBackend(name);
  try {
    const x = tensor(values(shape.reduce((p, q) => p * q)), { shape });
    const fusedNet = net(new ReLU()), plainNet = net(new SeparateReLU());
    counting.reluPasses = 0;
    const fused = await lossAndGrads(() => fusedNet.forward(x), fusedNet.parameters());
    assert.equal(counting.reluPasses, 0, "the fused pair runs no ReLU pass of its own");
    const plain = await lossAndGrads(() => plainNet.forward(x), plainNet.parameters());
    assert.equal(counting.reluPasses, 1, "the unfused pair runs one ReLU pass");
    fused.forEach((v, i) => sameBits(v, plain[i], `output ${i}`));
  } finally {
    setBackend("cpu");
  }
}

Deno.test("fused ReLU: Sequential runs Conv2d → ReLU as one op, with the bits of the two layers", async () => {
  await sequentialPairFuses(
    "cpu-counting",
    (relu) => new Sequential({ conv: new Conv2d(3, 8, 3, { padding: 1, groups: 1 }), relu }).initialize(5),
    [4, 3, 6, 6],
  );
});

Deno.test("fused ReLU: Sequential runs Linear → ReLU as one op, with the bits of the two layers", async () => {
  await sequentialPairFuses(
    "cpu-counting-linear",
    (relu) => new Sequential({ fc: new Linear(30, 20), relu, out: new Linear(20, 5) }).initialize(7),
    [6, 30],
  );
});

Deno.test("fused max pooling: Sequential runs Conv2d → ReLU → MaxPool2d as one op, the ReLU's mask on the pooled gradient", async () => {
  const counting = countingBackend("cpu-counting-pool");
  try {
    const net = (relu: ReLU) =>
      new Sequential({
        conv: new Conv2d(3, 8, 3, { padding: 1 }),
        relu,
        pool: new MaxPool2d({ kernel: 3, stride: 2 }),
        flat: new Flatten(),
        fc: new Linear(8 * 4 * 4, 5),
      }).initialize(3);
    const fusedNet = net(new ReLU()), plainNet = net(new SeparateReLU());
    const x = tensor(values(4 * 3 * 9 * 9), { shape: [4, 3, 9, 9] });
    counting.reluGradElements = 0;
    const fused = await lossAndGrads(() => fusedNet.forward(x), fusedNet.parameters());
    assert.equal(counting.reluGradElements, 4 * 8 * 4 * 4, "the mask covers the pooled gradient only");
    counting.reluGradElements = 0;
    const plain = await lossAndGrads(() => plainNet.forward(x), plainNet.parameters());
    assert.equal(
      counting.reluGradElements,
      4 * 8 * 9 * 9,
      "unfused, the mask covers the convolution's output",
    );
    fused.forEach((v, i) => sameBits(v, plain[i], `output ${i}`));
  } finally {
    setBackend("cpu");
  }
});

Deno.test("fused max pooling: Sequential runs Conv2d → MaxPool2d → ReLU (cifar10_quick's order) as the same one op, with the bits of the three layers", async () => {
  const counting = countingBackend("cpu-counting-pool-relu");
  try {
    // relu(maxPool(y)) = maxPool(relu(y)), and the winners agree wherever the mask passes a gradient.
    const net = (relu: ReLU) =>
      new Sequential({
        conv: new Conv2d(3, 8, 3, { padding: 1 }),
        pool: new MaxPool2d({ kernel: 3, stride: 2 }),
        relu,
        flat: new Flatten(),
        fc: new Linear(8 * 4 * 4, 5),
      }).initialize(4);
    const fusedNet = net(new ReLU()), plainNet = net(new SeparateReLU());
    const x = tensor(values(4 * 3 * 9 * 9), { shape: [4, 3, 9, 9] });
    counting.reluPasses = 0;
    counting.reluGradElements = 0;
    const fused = await lossAndGrads(() => fusedNet.forward(x), fusedNet.parameters());
    assert.deepEqual([counting.reluPasses, counting.reluGradElements], [0, 4 * 8 * 4 * 4], "one op");
    counting.reluPasses = 0;
    const plain = await lossAndGrads(() => plainNet.forward(x), plainNet.parameters());
    assert.equal(counting.reluPasses, 1, "unfused, a ReLU pass on the pooled output");
    fused.forEach((v, i) => sameBits(v, plain[i], `output ${i}`));
  } finally {
    setBackend("cpu");
  }
});

Deno.test("fused max pooling: a graph fuses convolution, ReLU and pooling where each blob between has one reader and is not asked for", async () => {
  const counting = countingBackend("cpu-counting-graph-pool");
  try {
    // conv1 → relu1 → pool1 (fused, 3 ops in 1); conv2 → relu2 → pool2 with relu2's blob asked
    // for: conv2 and relu2 fuse, pool2 runs alone.
    const graph = (relu: () => ReLU) => {
      const conv1 = new Conv2d(2, 4, 3, { padding: 1 }).initialize(1);
      const conv2 = new Conv2d(4, 4, 3, { padding: 1 }).initialize(2);
      return {
        params: [...conv1.parameters(), ...conv2.parameters()],
        graph: new Graph({
          input: "x",
          nodes: [
            { name: "conv1", module: conv1, bottoms: ["x"], top: "c1" },
            { name: "relu1", module: relu(), bottoms: ["c1"], top: "r1" },
            { name: "pool1", module: new MaxPool2d({ kernel: 2 }), bottoms: ["r1"], top: "p1" },
            { name: "conv2", module: conv2, bottoms: ["p1"], top: "c2" },
            { name: "relu2", module: relu(), bottoms: ["c2"], top: "r2" },
            { name: "pool2", module: new MaxPool2d({ kernel: 2 }), bottoms: ["r2"], top: "p2" },
          ],
        }),
      };
    };
    const fusedGraph = graph(() => new ReLU()), plainGraph = graph(() => new SeparateReLU());
    const x = tensor(values(2 * 2 * 8 * 8), { shape: [2, 2, 8, 8] });
    const both = (g: Graph) => () => {
      const [p2, r2] = g.run(x, ["p2", "r2"]);
      return ops.add(ops.sum(ops.mul(p2, p2)), ops.sum(ops.mul(r2, r2)));
    };
    counting.reluPasses = 0;
    counting.reluGradElements = 0;
    const fused = await lossAndGrads(both(fusedGraph.graph), fusedGraph.params);
    assert.equal(counting.reluPasses, 0, "both ReLUs run in their convolutions' epilogues");
    assert.equal(
      counting.reluGradElements,
      2 * 4 * 4 * 4 + 2 * 4 * 4 * 4,
      "pool1's gradient masked (4×4), conv2's whole output (4×4: relu2's blob is asked for)",
    );
    counting.reluGradElements = 0;
    const plain = await lossAndGrads(both(plainGraph.graph), plainGraph.params);
    assert.equal(counting.reluGradElements, 2 * 4 * 8 * 8 + 2 * 4 * 4 * 4);
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

// Mutations that fail this test (and the pooled comparisons above): each thread's scratch not grown
// by the image's output (a thread's image overwrites the next thread's panels); the im2col path
// pooling before its ReLU.
Deno.test("fused max pooling: the WebAssembly kernels' pooled forward has the bits of conv2dForward then maxPool2dForward, values and winners, on 1 to 3 threads", async () => {
  const backends = [1, 2, 3].map((threads) => new CpuBackend({ name: `pool-${threads}`, threads }));
  for (const backend of backends) await backend.startThreads();
  // The AlexNet-like net's conv1 (im2col: one input channel) and conv2 (Winograd, two groups), at
  // 12 images: every thread takes several, one after another, in its own scratch.
  const layers = [
    { x: [12, 1, 28, 28], w: [8, 1, 5, 5], conv: { padding: 2 } },
    { x: [12, 16, 14, 14], w: [16, 8, 3, 3], conv: { padding: 1, groups: 2 } },
  ];
  for (const backend of backends) {
    for (const layer of layers) {
      const g = conv2dGeometry(layer.x, layer.w, layer.conv);
      const outShape = [g.batch, g.outChannels, g.outHeight, g.outWidth];
      const pool = pool2dGeometry(outShape, { kernel: 3, stride: 2 }, "maxPool2d");
      const size = (s: number[]) => s.reduce((p, q) => p * q, 1);
      const [x, w, bias] = [size(layer.x), size(layer.w), g.outChannels].map((n) =>
        backend.upload(new Float32Array(values(n)))
      );
      const pooledLength = pool.batch * pool.channels * pool.outHeight * pool.outWidth;
      for (const activation of ["relu", undefined] as const) {
        const pooled = backend.allocate(pooledLength, "float32"),
          argmax = backend.allocate(pooledLength, "int32");
        assert.ok(
          backend.conv2dForwardMaxPool(x, w, pooled, argmax, g, pool, bias, activation),
          "pooled in place",
        );
        const y = backend.allocate(size(outShape), "float32");
        const plain = backend.allocate(pooledLength, "float32"),
          plainArgmax = backend.allocate(pooledLength, "int32");
        backend.conv2dForward(x, w, y, g, bias, activation);
        backend.maxPool2dForward(y, plain, plainArgmax, pool);
        const what = `${backend.name} ${JSON.stringify(layer.w)} ${activation ?? "no activation"}`;
        sameBits(backend.readSync(pooled) as Float32Array, backend.readSync(plain) as Float32Array, what);
        assert.deepEqual(backend.readSync(argmax), backend.readSync(plainArgmax), `${what}: winners`);
        for (const s of [pooled, argmax, y, plain, plainArgmax]) backend.release(s);
      }
      for (const s of [x, w, bias]) backend.release(s);
    }
    backend.dispose();
  }
});

// Mutation that fails this test: `conv2d` ignoring the backend's `conv2dForwardMaxPool` (it then
// writes the convolution's output and pools it in a second call, which this backend counts).
Deno.test("fused max pooling: on the WebAssembly kernels, conv2d with maxPool runs as one pooled call, writing no convolution output", () => {
  const calls: string[] = [];
  const counted = new Proxy(twoThreads, {
    get(target, prop) {
      const value = Reflect.get(target, prop, target);
      if (prop === "name") return "cpu-wasm-counted";
      if (
        typeof value !== "function" ||
        !String(prop).startsWith("conv2dForward") && prop !== "maxPool2dForward"
      ) {
        return value;
      }
      return (...args: unknown[]) => {
        const result = value.apply(target, args);
        calls.push(`${String(prop)}${result === true ? " (done)" : ""}`);
        return result;
      };
    },
  });
  registerBackend(counted);
  setBackend("cpu-wasm-counted");
  try {
    const x = tensor(values(2 * 4 * 12 * 12), { shape: [2, 4, 12, 12] });
    const w = tensor(values(8 * 4 * 3 * 3), { shape: [8, 4, 3, 3] });
    const y = ops.conv2d(x, w, null, { padding: 1, activation: "relu", maxPool: { kernel: 3, stride: 2 } });
    assert.deepEqual(y.shape, [2, 8, 6, 6]);
    assert.deepEqual(calls, ["conv2dForwardMaxPool (done)"]);
    for (const t of [x, w, y]) t.dispose();
  } finally {
    setBackend("cpu");
  }
});
