/**
 * Max pooling's backward with its epilogue (`maxPool2dBackwardFused`: the ReLU's mask before the
 * scatter, each dx plane's sum after it) gives the bits of the separate calls it replaces —
 * `binary("reluGrad")`, `maxPool2dBackward`, `reduce("sum")` over each plane — on 1 to 3 threads,
 * with many planes per thread (summed in chunks); a pooled convolution's backward uses it (one call,
 * no separate mask, scatter or plane reduction) and its gradients keep their bits.
 *
 * Mutations tried, each made a test here fail: the kernel ignoring the mask (`masked` read as 0);
 * each chunk's sums written at its thread's first plane (`planeSums + 4·p0`); the backend accepting
 * plane sums for planes under 8 floats, which `reduce` sums with the TypeScript kernel (it then
 * returns true where it must decline); `conv2d`'s backward ignoring the capability; the bias
 * gradient summing dy's planes again although they were summed.
 */

import assert from "node:assert/strict";
import { CpuBackend } from "../../backends/cpu/backend.ts";
import { pool2dGeometry } from "../../backends/geometry.ts";
import type { Backend, Pool2dGeometry, Storage } from "../../backends/backend.ts";
import { ops, setBackend, type Tensor, tensor, valueAndGrad } from "../../mod.ts";
import { registerLogged } from "./logged_backend.ts";
import { mulberry32 } from "../reference/random.ts";
import { assertSameBits as sameBits } from "../reference/bits.ts";

const random = mulberry32(0x9b0d);
function values(n: number): Float32Array {
  return Float32Array.from({ length: n }, () => random() * 2 - 1);
}

async function read(backend: Backend, s: Storage): Promise<Float32Array> {
  return await backend.read(s) as Float32Array;
}

/**
 * A pooled ReLU output (the ReLU's zeros make ties and masked windows), its winners and a gradient
 * on `backend`, for `geometry` over a `[batch, channels, h, w]` input.
 */
function pooledRelu(backend: Backend, g: Pool2dGeometry) {
  // Mostly zeros: about a fifth of the 3×3 windows pool a 0, which the mask then drops.
  const input = values(g.batch * g.channels * g.inHeight * g.inWidth).map((v) => Math.max(v - 0.7, 0));
  const outputs = g.batch * g.channels * g.outHeight * g.outWidth;
  const x = backend.upload(input);
  const pooled = backend.allocate(outputs, "float32"), argmax = backend.allocate(outputs, "int32");
  backend.maxPool2dForward(x, pooled, argmax, g);
  backend.release(x);
  return { pooled, argmax, dy: backend.upload(values(outputs)) };
}

Deno.test("pooled backward epilogue: the WebAssembly kernels give the bits of reluGrad, maxPool2dBackward and the plane sums, on 1 to 3 threads", async () => {
  // 1,536 planes of 20×20 pooled 3×3 stride 2 (overlapping windows): 81 planes to a summed chunk,
  // several chunks per thread; enough work for 3 threads.
  const g = pool2dGeometry([16, 96, 20, 20], { kernel: 3, stride: 2 }, "test");
  const planes = g.batch * g.channels, plane = g.inHeight * g.inWidth;
  for (const threads of [1, 2, 3]) {
    const backend = new CpuBackend({ name: `cpu-pool-backward-${threads}`, threads });
    assert.equal(await backend.startThreads(), threads);
    const { pooled, argmax, dy } = pooledRelu(backend, g);
    const outputs = dy.length;
    // The separate calls.
    const masked = backend.allocate(outputs, "float32");
    const view = { offset: 0, strides: [1] };
    backend.binary("reluGrad", dy, view, pooled, view, masked, [outputs]);
    const dxPlain = backend.allocate(planes * plane, "float32");
    backend.maxPool2dBackward(masked, argmax, dxPlain, g);
    const sumsPlain = backend.allocate(planes, "float32");
    backend.reduce("sum", dxPlain, sumsPlain, planes, plane, 1);
    const dxUnmasked = backend.allocate(planes * plane, "float32");
    backend.maxPool2dBackward(dy, argmax, dxUnmasked, g);
    const sumsUnmasked = backend.allocate(planes, "float32");
    backend.reduce("sum", dxUnmasked, sumsUnmasked, planes, plane, 1);
    // Fused: mask and sums, mask only, sums only.
    const dx = backend.allocate(planes * plane, "float32"), sums = backend.allocate(planes, "float32");
    assert.ok(backend.maxPool2dBackwardFused(dy, argmax, dx, g, { reluOf: pooled, planeSums: sums }));
    sameBits(
      await read(backend, dx),
      await read(backend, dxPlain),
      `${threads} threads: dx, masked and summed`,
    );
    sameBits(await read(backend, sums), await read(backend, sumsPlain), `${threads} threads: plane sums`);
    assert.ok(backend.maxPool2dBackwardFused(dy, argmax, dx, g, { reluOf: pooled }));
    sameBits(await read(backend, dx), await read(backend, dxPlain), `${threads} threads: dx, masked`);
    assert.ok(backend.maxPool2dBackwardFused(dy, argmax, dx, g, { planeSums: sums }));
    sameBits(await read(backend, dx), await read(backend, dxUnmasked), `${threads} threads: dx, summed`);
    sameBits(
      await read(backend, sums),
      await read(backend, sumsUnmasked),
      `${threads} threads: unmasked sums`,
    );
    const masks = (await read(backend, masked)).filter((v) => v === 0).length;
    assert.ok(masks > outputs / 10, `the ReLU masks windows (${masks} of ${outputs})`);
    backend.dispose();
  }
});

Deno.test("pooled backward epilogue: declined, with nothing done, where the separate calls would sum otherwise or there are no WebAssembly kernels", async () => {
  const wasm = new CpuBackend({ name: "cpu-pool-backward-small", threads: 1 });
  const oracle = new CpuBackend({ name: "cpu-pool-backward-ts", kernels: "ts" });
  try {
    // 2×2 planes: `reduce` sums rows shorter than 8 with the TypeScript kernel, so plane sums are
    // declined there; the mask alone is still fused.
    const g = pool2dGeometry([2, 3, 2, 2], { kernel: 2, stride: 2 }, "test");
    const { pooled, argmax, dy } = pooledRelu(wasm, g);
    const dx = wasm.upload(new Float32Array(24).fill(7)), sums = wasm.upload(new Float32Array(6).fill(7));
    assert.equal(wasm.maxPool2dBackwardFused(dy, argmax, dx, g, { reluOf: pooled, planeSums: sums }), false);
    assert.deepEqual(
      [...await read(wasm, dx), ...await read(wasm, sums)],
      Array(30).fill(7),
      "nothing written",
    );
    assert.equal(wasm.maxPool2dBackwardFused(dy, argmax, dx, g, { reluOf: pooled }), true);
    const g2 = pool2dGeometry([2, 3, 8, 8], { kernel: 2, stride: 2 }, "test");
    const o = pooledRelu(oracle, g2);
    const dx2 = oracle.allocate(2 * 3 * 64, "float32");
    assert.equal(oracle.maxPool2dBackwardFused(o.dy, o.argmax, dx2, g2, { reluOf: o.pooled }), false);
  } finally {
    wasm.dispose();
    oracle.dispose();
  }
});

/** Loss `Σ y²` of a pooled convolution with bias and its gradients, on the current backend. */
async function pooledConvGrads(x: Tensor, w: Tensor, b: Tensor): Promise<Float32Array[]> {
  const { value, grads } = valueAndGrad((xx: Tensor, ww: Tensor, bb: Tensor) => {
    const y = ops.conv2d(xx, ww, bb, { padding: 1, activation: "relu", maxPool: { kernel: 3, stride: 2 } });
    return ops.sum(ops.mul(y, y));
  })(x, w, b);
  return [await value.data(), ...await Promise.all(grads.map((t) => t.data()))] as Float32Array[];
}

Deno.test("pooled backward epilogue: a pooled convolution's backward makes one fused call and keeps its gradients' bits", async () => {
  const backend = new CpuBackend({ name: "cpu-pool-backward-engine", threads: 2 });
  await backend.startThreads();
  const calls: string[] = [];
  const log = (method: string, args: unknown[]) => {
    if (method === "binary" && args[0] === "reluGrad") return "reluGrad";
    if (method === "maxPool2dBackward" || method === "maxPool2dBackwardFused") return method;
    if (method === "reduce") return `reduce ${args.slice(3).join("×")}`;
    return undefined;
  };
  registerLogged(backend, "cpu-pool-fused", calls, log);
  registerLogged(backend, "cpu-pool-separate", calls, log, "maxPool2dBackwardFused");
  try {
    const shapes = { x: [3, 4, 12, 12], w: [8, 4, 3, 3], b: [8] };
    const data = Object.fromEntries(
      Object.entries(shapes).map(([k, s]) => [k, values(s.reduce((p, q) => p * q))]),
    );
    const run = async (name: string) => {
      setBackend(name);
      calls.length = 0;
      const [x, w, b] = (["x", "w", "b"] as const).map((k) => tensor(data[k], { shape: shapes[k] }));
      return {
        grads: await pooledConvGrads(x, w, b),
        calls: calls.filter((c) => !c.startsWith("reduce 1×")),
      };
    };
    const fused = await run("cpu-pool-fused");
    // Reductions with outer 1 (the loss's sum, the bias gradient's sum over the batch) are left
    // out: a plane reduction (outer = planes) would show.
    assert.deepEqual(fused.calls, ["maxPool2dBackwardFused"]);
    const separate = await run("cpu-pool-separate");
    assert.deepEqual(separate.calls, ["reluGrad", "maxPool2dBackward", "reduce 24×144×1"]);
    ["loss", "dx", "dw", "db"].forEach((what, i) => sameBits(fused.grads[i], separate.grads[i], what));
  } finally {
    setBackend("cpu");
    backend.dispose();
  }
});
