/**
 * Shared WGSL building blocks of the WebGPU backend: the parameter block every kernel reads, the
 * flat-index prologue of 1-D kernels (with the 2-D dispatch fold), and the strided-offset decoder.
 * Kernel templates compose these strings instead of repeating them, so an indexing fix lands once.
 *
 * Every kernel binds its parameters at binding 0 as a read-only `array<u32>`; floats and signed
 * integers travel as bit patterns and are read back with `pf` / `pi`.
 *
 * @module
 */

/** Threads per workgroup of every 1-D kernel. */
export const WORKGROUP_SIZE = 64;

/** Most workgroups one dispatch dimension may hold (WebGPU's default limit). */
export const MAX_WORKGROUPS_PER_DIM = 65535;

/**
 * WGSL element type of a storage binding. `vec4<f32>` lets a kernel read four consecutive floats in
 * one load where the data is 16-byte aligned (see the GEMM's operand loads); `atomic<u32>` lets
 * every thread fold into one word (the first non-finite index).
 */
export type WgslElement = "f32" | "i32" | "u32" | "vec4<f32>" | "atomic<u32>";

/** One buffer binding of a kernel: its WGSL name, element type and whether the kernel writes it. */
export interface BindingSpec {
  /** Variable name in WGSL. */
  name: string;
  /** Element type. */
  type: WgslElement;
  /** True when the kernel writes the buffer. */
  write: boolean;
}

/**
 * The declarations every kernel starts with: the parameter block (binding 0), the buffer bindings
 * (1, 2, …) and the `pf` / `pi` accessors for float and signed parameters.
 *
 * @example
 * ```ts
 * import { header } from "./wgsl.ts";
 * const code = header([{ name: "x", type: "f32", write: false }]);
 * ```
 */
export function header(bindings: readonly BindingSpec[]): string {
  const lines = ["@group(0) @binding(0) var<storage, read> P: array<u32>;"];
  bindings.forEach((b, i) => {
    const access = b.write ? "read_write" : "read";
    lines.push(`@group(0) @binding(${i + 1}) var<storage, ${access}> ${b.name}: array<${b.type}>;`);
  });
  lines.push(
    "fn pf(i: u32) -> f32 { return bitcast<f32>(P[i]); }",
    "fn pi(i: u32) -> i32 { return bitcast<i32>(P[i]); }",
    // A literal -inf is a const-evaluation overflow in WGSL; the bit pattern is not.
    "fn negInf() -> f32 { var bits = 0xff800000u; return bitcast<f32>(bits); }",
  );
  return lines.join("\n") + "\n";
}

/**
 * A 1-D kernel entry point: `idx` is the flat thread index, folded over a 2-D grid of workgroups
 * (x then y) so counts beyond 65535 workgroups still fit; threads at or past `P[0]` return.
 *
 * @example
 * ```ts
 * import { elementwiseMain } from "./wgsl.ts";
 * const code = elementwiseMain("out[idx] = 1.0;");
 * ```
 */
export function elementwiseMain(body: string): string {
  return `
@compute @workgroup_size(${WORKGROUP_SIZE})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let idx = gid.x + gid.y * nwg.x * ${WORKGROUP_SIZE}u;
  if (idx >= P[0]) { return; }
  ${body}
}
`;
}

/**
 * WGSL function `name(i) -> u32` mapping a flat row-major index over the shape stored at
 * `P[shapeAt ..]` to `offset + Σ index_d · stride_d`, with the view's offset at `P[viewAt]` and its
 * strides at `P[viewAt + 1 ..]`. Unrolled for `rank`, which is part of the pipeline key.
 *
 * @example
 * ```ts
 * import { stridedOffsetFn } from "./wgsl.ts";
 * const fn = stridedOffsetFn("srcOffset", 2, 1, 3); // shape at P[1..3), view at P[3..6)
 * ```
 */
export function stridedOffsetFn(name: string, rank: number, shapeAt: number, viewAt: number): string {
  const lines = [`fn ${name}(i: u32) -> u32 {`, "  var rem = i;", `  var off = pi(${viewAt}u);`];
  for (let d = rank - 1; d >= 0; d--) {
    lines.push(
      `  { let n = P[${shapeAt + d}u]; let c = rem % n; rem = rem / n; ` +
        `off = off + i32(c) * pi(${viewAt + 1 + d}u); }`,
    );
  }
  lines.push("  return u32(off);", "}");
  return lines.join("\n") + "\n";
}

/**
 * Workgroup grid for `threads` threads of {@link WORKGROUP_SIZE}: one row of up to 65535 groups,
 * then as many rows as needed.
 *
 * @example
 * ```ts
 * import { grid1d } from "./wgsl.ts";
 * grid1d(1e8); // [65535, 24, 1]
 * ```
 */
export function grid1d(threads: number): [number, number, number] {
  return gridOf(Math.ceil(threads / WORKGROUP_SIZE));
}

/**
 * Grid of `groups` workgroups folded as in {@link grid1d}; kernels recover the flat workgroup index
 * as `wid.x + wid.y · nwg.x`.
 *
 * @example
 * ```ts
 * import { gridOf } from "./wgsl.ts";
 * gridOf(70000); // [65535, 2, 1]
 * ```
 */
export function gridOf(groups: number): [number, number, number] {
  groups = Math.max(1, groups);
  if (groups <= MAX_WORKGROUPS_PER_DIM) return [groups, 1, 1];
  return [MAX_WORKGROUPS_PER_DIM, Math.ceil(groups / MAX_WORKGROUPS_PER_DIM), 1];
}

/**
 * Little-endian parameter block builder; `u32`, `i32` and `f32` append one 4-byte word each.
 *
 * @example
 * ```ts
 * import { Params } from "./wgsl.ts";
 * const p = new Params().u32(10).f32(0.5);
 * ```
 */
export class Params {
  private words: number[] = [];
  private kinds: ("u" | "i" | "f")[] = [];
  /** Appends an unsigned integer. */
  u32(v: number): this {
    this.words.push(v);
    this.kinds.push("u");
    return this;
  }
  /** Appends a signed integer. */
  i32(v: number): this {
    this.words.push(v);
    this.kinds.push("i");
    return this;
  }
  /** Appends a float (rounded to float32). */
  f32(v: number): this {
    this.words.push(v);
    this.kinds.push("f");
    return this;
  }
  /** Number of words so far. */
  get length(): number {
    return this.words.length;
  }
  /** Writes the words into `view` at byte `offset`. */
  writeTo(view: DataView, offset: number): void {
    this.words.forEach((w, i) => {
      const at = offset + 4 * i;
      const kind = this.kinds[i];
      if (kind === "f") view.setFloat32(at, w, true);
      else if (kind === "i") view.setInt32(at, w, true);
      else view.setUint32(at, w, true);
    });
  }
}
