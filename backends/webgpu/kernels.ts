/**
 * WGSL kernel templates of the WebGPU backend. Each function returns the full shader source for one
 * specialisation (op, rank, transposition…); the backend caches the compiled pipeline under the
 * same key, so a template runs once per distinct specialisation.
 *
 * Parameter layouts (the `P` words) are documented per template and must match the backend's
 * `Params` builders.
 *
 * It stays one file although long: a catalogue of independent templates, one short function each,
 * built from the shared helpers of `wgsl.ts`; nothing in one template depends on another.
 *
 * @module
 */

import type { BinaryOp, ReduceOp, UnaryOp } from "../backend.ts";
import { type BindingSpec, elementwiseMain, header, stridedOffsetFn, WORKGROUP_SIZE } from "./wgsl.ts";

const unaryExpr: Record<UnaryOp, string> = {
  neg: "-v",
  exp: "exp(v)",
  log: "log(v)",
  sqrt: "sqrt(v)",
  relu: "select(0.0, v, v > 0.0)",
  abs: "abs(v)",
  sign: "sign(v)",
};

const binaryExpr: Record<BinaryOp, string> = {
  add: "a + b",
  sub: "a - b",
  mul: "a * b",
  div: "a / b",
  pow: "powReal(a, b)",
  max: "select(b, a, a >= b)",
  equal: "select(0.0, 1.0, a == b)",
  greater: "select(0.0, 1.0, a > b)",
  reluGrad: "select(0.0, a, b > 0.0)",
};

/**
 * WGSL's `pow` is undefined for negative bases and for 0^0; Math.pow (the CPU oracle) gives real
 * results for integer exponents, so those cases are handled explicitly.
 */
const powReal = `
fn powReal(a: f32, b: f32) -> f32 {
  if (b == 0.0) { return 1.0; }
  var infBits = 0x7f800000u;
  var nanBits = 0x7fc00000u;
  if (a == 0.0) { return select(bitcast<f32>(infBits), 0.0, b > 0.0); }
  if (a > 0.0) { return pow(a, b); }
  if (floor(b) != b) { return bitcast<f32>(nanBits); }
  let m = pow(-a, b);
  return select(m, -m, (abs(b) % 2.0) == 1.0);
}
`;

/** `out[i] = value` over u32 words (the value's bit pattern). P: [n, bits]. */
export function fillShader(): string {
  return header([{ name: "out", type: "u32", write: true }]) + elementwiseMain("out[idx] = P[1];");
}

/**
 * Strided copy of 32-bit words of rank `rank`. P: [n, shape×rank, srcOffset, srcStrides×rank,
 * dstOffset, dstStrides×rank].
 */
export function copyShader(rank: number): string {
  return header([{ name: "src", type: "u32", write: false }, { name: "dst", type: "u32", write: true }]) +
    stridedOffsetFn("srcAt", rank, 1, 1 + rank) +
    stridedOffsetFn("dstAt", rank, 1, 2 + 2 * rank) +
    elementwiseMain("dst[dstAt(idx)] = src[srcAt(idx)];");
}

/** `out[i] = op(x[i])`. P: [n]. */
export function unaryShader(op: UnaryOp): string {
  return header([{ name: "x", type: "f32", write: false }, { name: "out", type: "f32", write: true }]) +
    elementwiseMain(`let v = x[idx]; out[idx] = ${unaryExpr[op]};`);
}

/** Broadcasting binary op of rank `rank`. P: [n, shape×rank, aOffset, aStrides×rank, bOffset, bStrides×rank]. */
export function binaryShader(op: BinaryOp, rank: number): string {
  return header([
    { name: "A", type: "f32", write: false },
    { name: "B", type: "f32", write: false },
    { name: "out", type: "f32", write: true },
  ]) + powReal +
    stridedOffsetFn("aAt", rank, 1, 1 + rank) +
    stridedOffsetFn("bAt", rank, 1, 2 + 2 * rank) +
    elementwiseMain(`let a = A[aAt(idx)]; let b = B[bAt(idx)]; out[idx] = ${binaryExpr[op]};`);
}

/**
 * Loop iterations one invocation may run: the software adapter (llvmpipe) silently stops a
 * shader's loops after 65535 iterations in total (nested loops share the count, measured; the
 * guards assume sequential loops do too), so kernels split longer work across invocations or
 * dispatches, or refuse it with an error.
 */
export const MAX_LOOP_ITERATIONS = 65535;

/** Elements one workgroup of the long reduction handles: 1024 loop iterations per thread. */
export const REDUCE_CHUNK = 1024 * WORKGROUP_SIZE;

/**
 * Middle-axis reduction. `perThread`: one thread per output (short reductions, P: [outputs, size,
 * inner, outOffset]). Otherwise one workgroup per (outer, chunk, inner) partial with a tree
 * reduction in workgroup memory, each chunk `P[4]` long, `P[5]` chunks per row (long reductions
 * run as several passes of this kernel).
 */
export function reduceShader(op: ReduceOp, perThread: boolean): string {
  const init = op === "sum" ? "0.0" : "negInf()";
  const step = op === "sum" ? "acc = acc + v;" : "if (v > acc || v != v) { acc = v; }";
  const combine = op === "sum"
    ? "red[t] = red[t] + red[t + k];"
    : "let v = red[t + k]; if (v > red[t] || v != v) { red[t] = v; }";
  const bindings: BindingSpec[] = [
    { name: "x", type: "f32", write: false },
    { name: "out", type: "f32", write: true },
  ];
  if (perThread) {
    return header(bindings) + elementwiseMain(`
  let size = P[1]; let inner = P[2];
  let o = idx / inner; let i = idx % inner;
  var acc: f32 = ${init};
  for (var s = 0u; s < size; s = s + 1u) { let v = x[(o * size + s) * inner + i]; ${step} }
  out[P[3] + idx] = acc;`);
  }
  return header(bindings) + `
var<workgroup> red: array<f32, ${WORKGROUP_SIZE}>;
@compute @workgroup_size(${WORKGROUP_SIZE})
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
  let idx = wid.x + wid.y * nwg.x;
  if (idx >= P[0]) { return; }
  let size = P[1]; let inner = P[2]; let chunk = P[4]; let chunks = P[5]; let t = lid.x;
  let i = idx % inner; let c = (idx / inner) % chunks; let o = idx / (inner * chunks);
  let end = min((c + 1u) * chunk, size);
  var acc: f32 = ${init};
  for (var s = c * chunk + t; s < end; s = s + ${WORKGROUP_SIZE}u) {
    let v = x[(o * size + s) * inner + i];
    ${step}
  }
  red[t] = acc;
  workgroupBarrier();
  for (var k = ${WORKGROUP_SIZE / 2}u; k > 0u; k = k / 2u) {
    if (t < k) { ${combine} }
    workgroupBarrier();
  }
  if (t == 0u) { out[P[3] + idx] = red[0]; }
}
`;
}

/** Threads per side of the GEMM workgroup (8×8 = 64 threads). */
export const GEMM_THREADS = 8;
/** Tile of the GEMM kernel: 32×32 outputs per workgroup, 4×4 per thread, depth slices of 16. */
export const GEMM_TILE = 4 * GEMM_THREADS;
/** Depth of one GEMM slice held in workgroup memory. */
const GEMM_DEPTH = 16;

/**
 * Depth handled by one GEMM dispatch. llvmpipe stops an invocation's loops after 65535 loop-header
 * evaluations in total, counted across nested loops: each 16-deep slice costs 18 (its own test and
 * 16 + 1 for the products; the tile loads are unrolled), so 2048 slices fit with room to spare.
 * Deeper products are split into several dispatches that accumulate.
 */
export const GEMM_K_CHUNK = 2048 * GEMM_DEPTH;

/**
 * How the GEMM reads one operand from global memory into workgroup memory: `vec4` loads four
 * consecutive floats at once, `scalar` one.
 */
export type GemmLoad = "scalar" | "vec4";

/**
 * The widest load an operand allows: `vec4` when its stored rows are a multiple of 4 floats long and
 * every matrix of the batch starts on a multiple of 4 floats, so each 4-float group is 16-byte aligned
 * and lies wholly inside a row (no tails to mask); `scalar` otherwise.
 *
 * @example
 * ```ts
 * import { gemmLoad } from "./kernels.ts";
 * gemmLoad(64, 0, 64 * 32); // "vec4"
 * gemmLoad(63, 0, 0); // "scalar"
 * ```
 */
export function gemmLoad(rowLength: number, offset: number, batchStride: number): GemmLoad {
  return rowLength % 4 === 0 && offset % 4 === 0 && batchStride % 4 === 0 ? "vec4" : "scalar";
}

/**
 * WGSL function `load<name>(e, …)` that copies the `e`-th element (scalar) or 4-float group (vec4)
 * of one operand's 32 × 16 tile from global memory into workgroup memory `<name>s[kk · 32 + o]`, where
 * `o` is the row of A (column of B) inside the tile and `kk` the depth. Elements past the matrix or
 * past `kEnd` load as zero. The same template serves A and B and every transposition: what differs
 * is which index is contiguous in memory.
 *
 * - `depthContiguous`: element (o, k) lives at `o · K + k` (A as stored, B transposed); otherwise at
 *   `k · rows + o` (A transposed, B as stored).
 * - In the vec4 variant, a group covers 4 consecutive k (depth-contiguous) or 4 consecutive o, and
 *   {@link gemmLoad} has guaranteed that such a group is either wholly inside or wholly outside.
 *
 * Consecutive `e` walk along the contiguous index, so neighbouring threads read neighbouring memory.
 */
function tileLoader(name: "A" | "B", depthContiguous: boolean, load: GemmLoad): string {
  const TILE = GEMM_TILE, DEPTH = GEMM_DEPTH;
  const at = depthContiguous ? "base + go * K + gk" : "base + gk * rows + go";
  const signature = `fn load${name}(e: u32, o0: u32, k0: u32, base: u32, rows: u32, K: u32, kEnd: u32)`;
  if (load === "scalar") {
    const split = depthContiguous
      ? `let o = e / ${DEPTH}u; let kk = e % ${DEPTH}u;`
      : `let o = e % ${TILE}u; let kk = e / ${TILE}u;`;
    return `
${signature} {
  ${split}
  let go = o0 + o; let gk = k0 + kk;
  var v = 0.0;
  if (go < rows && gk < kEnd) { v = ${name}[${at}]; }
  ${name}s[kk * ${TILE}u + o] = v;
}
`;
  }
  const split = depthContiguous
    ? `let o = e / ${DEPTH / 4}u; let kk = (e % ${DEPTH / 4}u) * 4u;`
    : `let o = (e % ${TILE / 4}u) * 4u; let kk = e / ${TILE / 4}u;`;
  // The group's 4 floats go to 4 depths of one row, or to 4 neighbouring rows of one depth.
  const step = depthContiguous ? `${TILE}u` : "1u";
  return `
${signature} {
  ${split}
  let go = o0 + o; let gk = k0 + kk;
  var v = vec4<f32>(0.0);
  if (go < rows && gk < kEnd) { v = ${name}[(${at}) / 4u]; }
  let s = kk * ${TILE}u + o;
  ${name}s[s] = v.x; ${name}s[s + ${step}] = v.y; ${name}s[s + 2u * ${step}] = v.z; ${name}s[s + 3u * ${step}] = v.w;
}
`;
}

/**
 * Tiled batched GEMM with workgroup memory and 4×4 register blocking; transpositions are baked in,
 * and so is the width of each operand's global loads (`loadA`, `loadB`: see {@link gemmLoad}).
 * Workgroup (x, y, z) = (column tile, row tile, batch). P: [M, N, K, aOffset, bOffset, cOffset,
 * aBatchStride, bBatchStride, cBatchStride, accumulate, batchBase, kStart, kEnd]; the product runs
 * over depth [kStart, kEnd) and adds to C when `accumulate` is set.
 *
 * Only the 4×4 register block and the tile loads are unrolled: with the depth slice unrolled too,
 * llvmpipe took about 7 s instead of 3 s to compile each variant (measured with its shader cache
 * disabled).
 */
export function gemmShader(
  transA: boolean,
  transB: boolean,
  loadA: GemmLoad = "scalar",
  loadB: GemmLoad = "scalar",
): string {
  const T = GEMM_THREADS, TILE = GEMM_TILE, DEPTH = GEMM_DEPTH;
  const range = [0, 1, 2, 3];
  const products: string[] = [];
  for (const r of range) products.push(`let a${r} = As[kk * ${TILE}u + lid.y + ${T * r}u];`);
  for (const c of range) products.push(`let b${c} = Bs[kk * ${TILE}u + lid.x + ${T * c}u];`);
  for (const r of range) {
    for (const c of range) products.push(`acc[${r * 4 + c}] = acc[${r * 4 + c}] + a${r} * b${c};`);
  }
  // Each of the 64 threads loads its share of the 512-float tiles: 8 scalars or 2 groups of 4.
  const loads = (name: "A" | "B", load: GemmLoad, args: string) => {
    const perThread = (TILE * DEPTH) / (T * T) / (load === "vec4" ? 4 : 1);
    return Array.from({ length: perThread }, (_, r) => `load${name}(tid + ${r * T * T}u, ${args});`)
      .join("\n    ");
  };
  const element = (load: GemmLoad) => (load === "vec4" ? "vec4<f32>" : "f32");
  return header([
    { name: "A", type: element(loadA), write: false },
    { name: "B", type: element(loadB), write: false },
    { name: "C", type: "f32", write: true },
  ]) + `
var<workgroup> As: array<f32, ${TILE * DEPTH}>;
var<workgroup> Bs: array<f32, ${TILE * DEPTH}>;
` + tileLoader("A", !transA, loadA) + tileLoader("B", transB, loadB) + `
@compute @workgroup_size(${T}, ${T}, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let M = P[0]; let N = P[1]; let K = P[2];
  let batch = wid.z + P[10];
  let aBase = P[3] + batch * P[6];
  let bBase = P[4] + batch * P[7];
  let cBase = P[5] + batch * P[8];
  let kEnd = P[12];
  let row0 = wid.y * ${TILE}u; let col0 = wid.x * ${TILE}u;
  let tid = lid.y * ${T}u + lid.x;
  var acc: array<f32, 16>;
  for (var t = P[11]; t < kEnd; t = t + ${DEPTH}u) {
    ${loads("A", loadA, `row0, t, aBase, M, K, kEnd`)}
    ${loads("B", loadB, `col0, t, bBase, N, K, kEnd`)}
    workgroupBarrier();
    for (var kk = 0u; kk < ${DEPTH}u; kk = kk + 1u) {
      ${products.join("\n      ")}
    }
    workgroupBarrier();
  }
  for (var q = 0u; q < 16u; q = q + 1u) {
    let gi = row0 + lid.y + ${T}u * (q / 4u); let gj = col0 + lid.x + ${T}u * (q % 4u);
    if (gi < M && gj < N) {
      let at = cBase + gi * N + gj;
      var v = acc[q];
      if (P[9] != 0u) { v = v + C[at]; }
      C[at] = v;
    }
  }
}
`;
}

/** Which row-wise kernel {@link rowShader} builds. */
export type RowKind = "softmax" | "logSoftmax" | "crossEntropy";

/**
 * Row-wise softmax family with the max shift for stability: one workgroup of 64 threads per row,
 * with tree reductions in workgroup memory for the max and the sum, so long rows (1000 classes)
 * are not left to one thread. P: [rows, cols]. `crossEntropy` also reads int32 labels and writes
 * per-row losses.
 */
export function rowShader(kind: RowKind): string {
  const bindings: BindingSpec[] = [
    { name: "x", type: "f32", write: false },
    { name: "out", type: "f32", write: true },
  ];
  if (kind === "crossEntropy") {
    bindings.push({ name: "labels", type: "i32", write: false }, {
      name: "losses",
      type: "f32",
      write: true,
    });
  }
  const write = kind === "logSoftmax"
    ? "out[s + c] = x[s + c] - mx - ls;"
    : "out[s + c] = exp(x[s + c] - mx - ls);";
  const tail = kind === "crossEntropy"
    ? "if (t == 0u) { losses[row] = -(x[s + u32(labels[row])] - mx - ls); }"
    : "";
  return header(bindings) + `
var<workgroup> red: array<f32, ${WORKGROUP_SIZE}>;
@compute @workgroup_size(${WORKGROUP_SIZE})
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
  let row = wid.x + wid.y * nwg.x;
  if (row >= P[0]) { return; }
  let cols = P[1]; let s = row * cols; let t = lid.x;
  var m = negInf();
  for (var c = t; c < cols; c = c + ${WORKGROUP_SIZE}u) { m = max(m, x[s + c]); }
  red[t] = m;
  workgroupBarrier();
  for (var k = ${WORKGROUP_SIZE / 2}u; k > 0u; k = k / 2u) {
    if (t < k) { red[t] = max(red[t], red[t + k]); }
    workgroupBarrier();
  }
  let mx = red[0];
  workgroupBarrier();
  var sum = 0.0;
  for (var c = t; c < cols; c = c + ${WORKGROUP_SIZE}u) { sum = sum + exp(x[s + c] - mx); }
  red[t] = sum;
  workgroupBarrier();
  for (var k = ${WORKGROUP_SIZE / 2}u; k > 0u; k = k / 2u) {
    if (t < k) { red[t] = red[t] + red[t + k]; }
    workgroupBarrier();
  }
  let ls = log(red[0]);
  for (var c = t; c < cols; c = c + ${WORKGROUP_SIZE}u) { ${write} }
  ${tail}
}
`;
}

/** `dLogits = (probs − onehot) · dLoss[row]`, one thread per element. P: [rows·cols, cols]. */
export function crossEntropyBackwardShader(): string {
  return header([
    { name: "probs", type: "f32", write: false },
    { name: "labels", type: "i32", write: false },
    { name: "dLoss", type: "f32", write: false },
    { name: "dx", type: "f32", write: true },
  ]) + elementwiseMain(`
  let r = idx / P[1]; let c = idx % P[1];
  let g = dLoss[r];
  var v = probs[idx] * g;
  if (i32(c) == labels[r]) { v = v - g; }
  dx[idx] = v;`);
}

/**
 * Convolution geometry words shared by the conv kernels: P[1..] = [C, H, W, kH, kW, sH, sW, pH, pW,
 * OH, OW] (P[0] is the thread count).
 */
const convGeometry = `
  let C = P[1]; let H = i32(P[2]); let W = i32(P[3]); let KH = P[4]; let KW = P[5];
  let SH = i32(P[6]); let SW = i32(P[7]); let PH = i32(P[8]); let PW = i32(P[9]);
  let OH = P[10]; let OW = P[11]; let PP = OH * OW; let CKK = C * KH * KW;`;

/** im2col of the whole batch into `col` [N, C·kH·kW, OH·OW]; one thread per column entry. */
export function im2colShader(): string {
  return header([{ name: "x", type: "f32", write: false }, { name: "col", type: "f32", write: true }]) +
    elementwiseMain(`${convGeometry}
  let p = idx % PP; let r = (idx / PP) % CKK; let n = idx / (PP * CKK);
  let c = r / (KH * KW); let ki = i32((r / KW) % KH); let kj = i32(r % KW);
  let ih = i32(p / OW) * SH - PH + ki; let iw = i32(p % OW) * SW - PW + kj;
  var v = 0.0;
  if (ih >= 0 && ih < H && iw >= 0 && iw < W) {
    v = x[((n * C + c) * u32(H) + u32(ih)) * u32(W) + u32(iw)];
  }
  col[idx] = v;`);
}

/** col2im as a gather: each input pixel sums the column entries that read it (no atomics). */
export function col2imShader(): string {
  return header([{ name: "col", type: "f32", write: false }, { name: "dx", type: "f32", write: true }]) +
    elementwiseMain(`${convGeometry}
  let w = i32(idx % u32(W)); let h = i32((idx / u32(W)) % u32(H));
  let c = (idx / u32(H * W)) % C; let n = idx / (u32(H * W) * C);
  var sum = 0.0;
  for (var ki = 0u; ki < KH; ki = ki + 1u) {
    let ohs = h + PH - i32(ki);
    if (ohs < 0 || ohs % SH != 0 || ohs / SH >= i32(OH)) { continue; }
    for (var kj = 0u; kj < KW; kj = kj + 1u) {
      let ows = w + PW - i32(kj);
      if (ows < 0 || ows % SW != 0 || ows / SW >= i32(OW)) { continue; }
      let r = (c * KH + ki) * KW + kj;
      sum = sum + col[(n * CKK + r) * PP + u32(ohs / SH) * OW + u32(ows / SW)];
    }
  }
  dx[idx] = sum;`);
}

/** Pooling geometry words: P[1..] = [H, W, kH, kW, sH, sW, pH, pW, OH, OW]. */
const poolGeometry = `
  let H = i32(P[1]); let W = i32(P[2]); let KH = i32(P[3]); let KW = i32(P[4]);
  let SH = i32(P[5]); let SW = i32(P[6]); let PH = i32(P[7]); let PW = i32(P[8]);
  let OH = i32(P[9]); let OW = i32(P[10]);`;

/** Max pooling forward, one thread per output; argmax is the index in the input plane. */
export function maxPoolShader(): string {
  return header([
    { name: "x", type: "f32", write: false },
    { name: "out", type: "f32", write: true },
    { name: "argmax", type: "i32", write: true },
  ]) + elementwiseMain(`${poolGeometry}
  let ow = i32(idx % u32(OW)); let oh = i32((idx / u32(OW)) % u32(OH)); let plane = idx / u32(OH * OW);
  let base = plane * u32(H * W);
  let h0 = oh * SH - PH; let w0 = ow * SW - PW;
  let hs = max(h0, 0); let he = min(h0 + KH, H); let ws = max(w0, 0); let we = min(w0 + KW, W);
  var best = negInf(); var bestIdx = hs * W + ws; var nan = false;
  for (var h = hs; h < he; h = h + 1) {
    for (var w = ws; w < we; w = w + 1) {
      let v = x[base + u32(h * W + w)];
      if (!nan && !(v <= best)) { best = v; bestIdx = h * W + w; nan = v != v; }
    }
  }
  out[idx] = x[base + u32(bestIdx)];
  argmax[idx] = bestIdx;`);
}

/** Output window range [lo, hi) along one axis whose windows contain input coordinate `v`. */
const windowRange = `
fn windowLo(v: i32, pad: i32, k: i32, s: i32) -> i32 {
  let t = v + pad - k + 1;
  return select((t + s - 1) / s, 0, t <= 0);
}
fn windowHi(v: i32, pad: i32, s: i32, n: i32) -> i32 { return min((v + pad) / s + 1, n); }
`;

/** Max pooling backward as a gather over the windows containing each input pixel. */
export function maxPoolBackwardShader(): string {
  return header([
    { name: "dy", type: "f32", write: false },
    { name: "argmax", type: "i32", write: false },
    { name: "dx", type: "f32", write: true },
  ]) + windowRange + elementwiseMain(`${poolGeometry}
  let w = i32(idx % u32(W)); let h = i32((idx / u32(W)) % u32(H)); let plane = idx / u32(H * W);
  let base = plane * u32(OH * OW); let me = h * W + w;
  var sum = 0.0;
  for (var oh = windowLo(h, PH, KH, SH); oh < windowHi(h, PH, SH, OH); oh = oh + 1) {
    for (var ow = windowLo(w, PW, KW, SW); ow < windowHi(w, PW, SW, OW); ow = ow + 1) {
      let o = base + u32(oh * OW + ow);
      if (argmax[o] == me) { sum = sum + dy[o]; }
    }
  }
  dx[idx] = sum;`);
}

/** Caffe divisor of output window (oh, ow): the window clipped to the padded extent. */
const avgDivisor = `
fn divisor(oh: i32, ow: i32, H: i32, W: i32, KH: i32, KW: i32, SH: i32, SW: i32, PH: i32, PW: i32) -> f32 {
  let h0 = oh * SH - PH; let h1 = min(h0 + KH, H + PH);
  let w0 = ow * SW - PW; let w1 = min(w0 + KW, W + PW);
  return f32((h1 - h0) * (w1 - w0));
}
`;

/** Average pooling forward (Caffe divisor). */
export function avgPoolShader(): string {
  return header([{ name: "x", type: "f32", write: false }, { name: "out", type: "f32", write: true }]) +
    avgDivisor + elementwiseMain(`${poolGeometry}
  let ow = i32(idx % u32(OW)); let oh = i32((idx / u32(OW)) % u32(OH)); let plane = idx / u32(OH * OW);
  let base = plane * u32(H * W);
  let h0 = oh * SH - PH; let w0 = ow * SW - PW;
  let hs = max(h0, 0); let he = min(min(h0 + KH, H + PH), H);
  let ws = max(w0, 0); let we = min(min(w0 + KW, W + PW), W);
  var sum = 0.0;
  for (var h = hs; h < he; h = h + 1) {
    for (var w = ws; w < we; w = w + 1) { sum = sum + x[base + u32(h * W + w)]; }
  }
  out[idx] = sum / divisor(oh, ow, H, W, KH, KW, SH, SW, PH, PW);`);
}

/** Average pooling backward as a gather over the windows containing each input pixel. */
export function avgPoolBackwardShader(): string {
  return header([{ name: "dy", type: "f32", write: false }, { name: "dx", type: "f32", write: true }]) +
    windowRange + avgDivisor + elementwiseMain(`${poolGeometry}
  let w = i32(idx % u32(W)); let h = i32((idx / u32(W)) % u32(H)); let plane = idx / u32(H * W);
  let base = plane * u32(OH * OW);
  var sum = 0.0;
  for (var oh = windowLo(h, PH, KH, SH); oh < windowHi(h, PH, SH, OH); oh = oh + 1) {
    for (var ow = windowLo(w, PW, KW, SW); ow < windowHi(w, PW, SW, OW); ow = ow + 1) {
      sum = sum + dy[base + u32(oh * OW + ow)] / divisor(oh, ow, H, W, KH, KW, SH, SW, PH, PW);
    }
  }
  dx[idx] = sum;`);
}

/** LRN words: P[1..] = [C, H·W, half, coef(f32), k(f32), beta(f32), cross(f32)]. */
const lrnGeometry = `
  let C = i32(P[1]); let plane = P[2]; let half = i32(P[3]);
  let coef = pf(4u); let kk = pf(5u); let beta = pf(6u); let cross = pf(7u);
  let pix = idx % plane; let c = i32((idx / plane) % u32(C)); let img = (idx / (plane * u32(C))) * u32(C) * plane;
  let lo = max(c - half, 0); let hi = min(c + half, C - 1);`;

/** Caffe across-channel LRN forward, one thread per element; writes `out` and `scale`. */
export function lrnShader(): string {
  return header([
    { name: "x", type: "f32", write: false },
    { name: "out", type: "f32", write: true },
    { name: "scale", type: "f32", write: true },
  ]) + elementwiseMain(`${lrnGeometry}
  var acc = 0.0;
  for (var j = lo; j <= hi; j = j + 1) { let v = x[img + u32(j) * plane + pix]; acc = acc + v * v; }
  let s = kk + coef * acc;
  scale[idx] = s;
  out[idx] = x[idx] * pow(s, -beta);`);
}

/** Caffe LRN backward, one thread per element. */
export function lrnBackwardShader(): string {
  return header([
    { name: "x", type: "f32", write: false },
    { name: "y", type: "f32", write: false },
    { name: "scale", type: "f32", write: false },
    { name: "dy", type: "f32", write: false },
    { name: "dx", type: "f32", write: true },
  ]) + elementwiseMain(`${lrnGeometry}
  var acc = 0.0;
  for (var j = lo; j <= hi; j = j + 1) {
    let at = img + u32(j) * plane + pix;
    acc = acc + dy[at] * y[at] / scale[at];
  }
  dx[idx] = dy[idx] * pow(scale[idx], -beta) - cross * x[idx] * acc;`);
}

/**
 * `out = (in0 + in1 + … + in(count−1)) · scale`, added strictly left to right in float32 with one
 * rounding per operation, like the host's device-order average; with `continued`, the sum starts from
 * what `out` holds (`out + in0 + …`), so more inputs than one dispatch can bind are summed in several
 * passes without changing the order. P: [n, scale (f32), apply scale (0/1)].
 */
export function orderedSumShader(count: number, continued: boolean): string {
  const inputs: BindingSpec[] = Array.from({ length: count }, (_, i) => ({
    name: `in${i}`,
    type: "f32",
    write: false,
  }));
  const first = continued ? 0 : 1;
  const adds = Array.from({ length: count - first }, (_, i) => `s = s + in${first + i}[idx];`);
  return header([{ name: "out", type: "f32", write: true }, ...inputs]) + elementwiseMain(`
  var s = ${continued ? "out[idx]" : "in0[idx]"};
  ${adds.join("\n  ")}
  if (P[2] != 0u) { s = s * pf(1u); }
  out[idx] = s;`);
}

/**
 * `first[0] = min(first[0], i)` over every `i` whose float `x[i]` is NaN or ±∞. Read as bits
 * (exponent all ones), because WGSL lets compilers assume floats are finite, so `v != v` may fold
 * away. P: [n].
 */
export function firstNonFiniteShader(): string {
  return header([
    { name: "x", type: "u32", write: false },
    { name: "first", type: "atomic<u32>", write: true },
  ]) + elementwiseMain(`
  if ((x[idx] & 0x7f800000u) == 0x7f800000u) { atomicMin(&first[0], idx); }`);
}

/** Fused Caffe SGD in place. P: [n, rate, momentum, decay]. */
export function sgdShader(): string {
  return header([
    { name: "w", type: "f32", write: true },
    { name: "g", type: "f32", write: false },
    { name: "hist", type: "f32", write: true },
  ]) + elementwiseMain(`
  let rate = pf(1u); let momentum = pf(2u); let decay = pf(3u);
  let wv = w[idx];
  var diff = g[idx];
  if (decay != 0.0) { diff = diff + wv * decay; }
  let h = hist[idx] * momentum + diff * rate;
  hist[idx] = h;
  w[idx] = wv - h;`);
}

/** Fused Adam in place. P: [n, beta1, beta2, decay, eps, 1−beta1, 1−beta2, √correction2, rate/correction1]. */
export function adamShader(): string {
  return header([
    { name: "w", type: "f32", write: true },
    { name: "g", type: "f32", write: false },
    { name: "m", type: "f32", write: true },
    { name: "v", type: "f32", write: true },
  ]) + elementwiseMain(`
  let b1 = pf(1u); let b2 = pf(2u); let decay = pf(3u); let eps = pf(4u);
  let omb1 = pf(5u); let omb2 = pf(6u); let root2 = pf(7u); let step = pf(8u);
  let wv = w[idx];
  var gv = g[idx];
  if (decay != 0.0) { gv = gv + wv * decay; }
  let mi = m[idx] * b1 + gv * omb1;
  let vi = v[idx] * b2 + gv * gv * omb2;
  m[idx] = mi;
  v[idx] = vi;
  w[idx] = wv - mi / (sqrt(vi) / root2 + eps) * step;`);
}
