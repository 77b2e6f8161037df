/**
 * Generates the transforms of the Winograd convolutions (`../winograd/phases.ts`): every one computes
 * Y = T X Tᵀ for a constant matrix T on four independent tiles at once, one per `f32x4` lane, in
 * straight-line code with T's entries as constants (zeros skipped, ±1 as additions, a row for −a
 * sharing its even and odd partial sums with the row for a). Plain multiplies and adds, never a
 * fused multiply-add, so the bits are the same on every machine that runs the module.
 *
 * What differs between the six transforms is where the lanes come from and go to:
 * - `rows`: each lane is a tile of a plane, whose rows `inStride` (or `outStride`) bytes apart are
 *   read as vectors and moved into lanes by 4×4 transposes (input tiles, dy tiles; output tiles);
 * - `positions`: the lanes are already side by side, one vector per tile position, `inStride`
 *   (or `outStride`) bytes from one position to the next (the GEMMs' operands and results);
 * - `gather`: each lane is an r×r filter read float by float, optionally rotated by 180° (the
 *   input gradient's filters); `scatter`: each lane an r×r filter gradient written float by float.
 *
 * @module
 */

import { type FunctionWriter, type ModuleBuilder, ValType } from "./encoder.ts";
import { type WinogradFilterSide, winogradMatrices } from "../winograd/matrices.ts";

const { i32, v128 } = ValType;

/** Where a transform's tiles are read from. */
type Source = "rows" | "positions" | "gather" | "gatherFlipped";
/** Where its results go. */
type Target = "rows" | "positions" | "scatter";

/**
 * The transform kernels, each exported once per filter side r as `<name>_<r>` (for example
 * `winograd_input_5`). Every one takes the same eleven i32 arguments
 * `(src, lanes, count, srcStep, dst, dstStep, inStride, outStride, wrapEvery, srcWrap, dstWrap)` and
 * runs `count` times, `src` and `dst` moving by `srcStep` and `dstStep` bytes each time and by
 * `srcWrap` and `dstWrap` more after every `wrapEvery` (0: never), so one call can walk a whole
 * image's tiles row by row; `lanes` is the address of four int32 byte offsets, one per lane, added
 * to `src` (lane-wise sources) or to `dst` (lane-wise targets).
 *
 * @example
 * ```ts
 * import { WINOGRAD_EXPORTS } from "./winograd_kernels.ts";
 * console.log(`${WINOGRAD_EXPORTS.input}_5`); // "winograd_input_5"
 * ```
 */
export const WINOGRAD_EXPORTS = {
  /** V = Bᵀ d B: α×α input tiles, rows `inStride` apart, to α² positions `outStride` apart. */
  input: "winograd_input",
  /** Ŷ = A dy Aᵀ: 4×4 output-gradient tiles, rows `inStride` apart, to α² positions. */
  gradient: "winograd_gradient",
  /** Y = Aᵀ M A: α² positions `inStride` apart to 4×4 output tiles, rows `outStride` apart. */
  output: "winograd_output",
  /** U = G g Gᵀ: r×r filters (contiguous floats) to α² positions `outStride` apart. */
  filter: "winograd_filter",
  /** The same of each filter rotated by 180° (an input gradient's filters). */
  filterFlipped: "winograd_filter_flipped",
  /** dW = Gᵀ Z G: α² positions `inStride` apart to r×r filter gradients (contiguous floats). */
  filterGradient: "winograd_filter_gradient",
} as const;

/** The filter sides kernels are generated for. */
export const WINOGRAD_SIDES: readonly WinogradFilterSide[] = [3, 5];

/** One generated transform: Y = T X Tᵀ with X `in`×`in` and Y `out`×`out`. */
interface TransformSpec {
  t: number[][];
  source: Source;
  target: Target;
}

function specs(r: WinogradFilterSide): Record<keyof typeof WINOGRAD_EXPORTS, TransformSpec> {
  const { at, g, bt } = winogradMatrices(r);
  const transpose = (rows: number[][]) => rows[0].map((_, j) => rows.map((row) => row[j]));
  return {
    input: { t: bt, source: "rows", target: "positions" },
    gradient: { t: transpose(at), source: "rows", target: "positions" },
    output: { t: at, source: "positions", target: "rows" },
    filter: { t: g, source: "gather", target: "positions" },
    filterFlipped: { t: g, source: "gatherFlipped", target: "positions" },
    filterGradient: { t: transpose(g), source: "positions", target: "scatter" },
  };
}

/**
 * Pushes Σ c·x over the terms (constants as float32 splats), starting from a term with a positive
 * coefficient where there is one, so ±1 terms cost one add or subtract each.
 */
function emitSum(f: FunctionWriter, terms: readonly [number, number][]): void {
  const first = Math.max(0, terms.findIndex(([c]) => c > 0));
  const ordered = [terms[first], ...terms.filter((_, i) => i !== first)];
  ordered.forEach(([c, x], i) => {
    const magnitude = i === 0 ? c : Math.abs(c);
    f.localGet(x);
    if (magnitude === -1) f.f32x4Neg();
    else if (magnitude !== 1) f.v128ConstF32([magnitude, magnitude, magnitude, magnitude]).f32x4Mul();
    if (i > 0) c > 0 ? f.f32x4Add() : f.f32x4Sub();
  });
}

/**
 * outputs[i] = Σⱼ t[i][j]·inputs[j]. Rows for points a and −a (t[q][j] = ±(−1)ʲ·t[p][j]) share
 * their even and odd partial sums E and O: E + O and ±(E − O).
 */
function emitLinear(
  f: FunctionWriter,
  t: readonly number[][],
  inputs: readonly number[],
  outputs: readonly number[],
  temps: { even: number; odd: number },
): void {
  const done = new Set<number>();
  const terms = (row: readonly number[], parity?: number) =>
    row.flatMap((
      c,
      j,
    ) => (c !== 0 && (parity === undefined || j % 2 === parity) ? [[c, inputs[j]]] : [])) as [
      number,
      number,
    ][];
  for (let p = 0; p < t.length; p++) {
    if (done.has(p)) continue;
    done.add(p);
    const even = terms(t[p], 0), odd = terms(t[p], 1);
    let partner = -1, sign = 1;
    if (even.length > 0 && odd.length > 0) {
      for (let q = p + 1; q < t.length && partner < 0; q++) {
        if (done.has(q)) continue;
        for (const s of [1, -1]) {
          if (t[q].every((c, j) => c === s * (j % 2 === 0 ? 1 : -1) * t[p][j])) {
            partner = q;
            sign = s;
            break;
          }
        }
      }
    }
    if (partner < 0) {
      const all = terms(t[p]);
      if (all.length === 0) f.v128ConstF32([0, 0, 0, 0]);
      else emitSum(f, all);
      f.localSet(outputs[p]);
      continue;
    }
    done.add(partner);
    emitSum(f, even);
    f.localSet(temps.even);
    emitSum(f, odd);
    f.localSet(temps.odd);
    f.localGet(temps.even).localGet(temps.odd).f32x4Add().localSet(outputs[p]);
    if (sign > 0) f.localGet(temps.even).localGet(temps.odd);
    else f.localGet(temps.odd).localGet(temps.even);
    f.f32x4Sub().localSet(outputs[partner]);
  }
}

/** Sets `out[j]` to the vector of column j across the four `rows` (a 4×4 transpose, 8 shuffles). */
function emitTranspose(
  f: FunctionWriter,
  rows: readonly number[],
  out: readonly number[],
  t: number[],
): void {
  f.localGet(rows[0]).localGet(rows[1]).shuffleF32Lanes([0, 4, 1, 5]).localSet(t[0]);
  f.localGet(rows[0]).localGet(rows[1]).shuffleF32Lanes([2, 6, 3, 7]).localSet(t[1]);
  f.localGet(rows[2]).localGet(rows[3]).shuffleF32Lanes([0, 4, 1, 5]).localSet(t[2]);
  f.localGet(rows[2]).localGet(rows[3]).shuffleF32Lanes([2, 6, 3, 7]).localSet(t[3]);
  const picks: [number, number, [number, number, number, number]][] = [
    [t[0], t[2], [0, 1, 4, 5]],
    [t[0], t[2], [2, 3, 6, 7]],
    [t[1], t[3], [0, 1, 4, 5]],
    [t[1], t[3], [2, 3, 6, 7]],
  ];
  out.forEach((target, j) => {
    const [a, b, lanes] = picks[j];
    f.localGet(a).localGet(b).shuffleF32Lanes(lanes).localSet(target);
  });
}

function writeTransform(f: FunctionWriter, spec: TransformSpec): void {
  const [src, lanes, count, srcStep, dst, dstStep, inStride, outStride, wrapEvery, srcWrap, dstWrap] = [
    0,
    1,
    2,
    3,
    4,
    5,
    6,
    7,
    8,
    9,
    10,
  ];
  const { t, source, target } = spec;
  const outSide = t.length, inSide = t[0].length;
  const vectors = (n: number) => Array.from({ length: n }, () => f.local(v128));
  const offset = [f.local(i32), f.local(i32), f.local(i32), f.local(i32)];
  const pointer = [f.local(i32), f.local(i32), f.local(i32), f.local(i32)];
  const walk = f.local(i32), it = f.local(i32), since = f.local(i32);
  const x = Array.from({ length: inSide }, () => vectors(inSide));
  // After the row pass: rowPass[i][ν] = Σⱼ t[ν][j]·x[i][j].
  const rowPass = Array.from({ length: inSide }, () => vectors(outSide));
  const y = Array.from({ length: outSide }, () => vectors(outSide));
  const temps = { even: f.local(v128), odd: f.local(v128) };
  const loaded = vectors(4), shuffled = vectors(4), column = vectors(4);
  for (let l = 0; l < 4; l++) f.localGet(lanes).i32Load(4 * l).localSet(offset[l]);

  f.forRange(it, () => f.i32Const(0), () => f.localGet(count), 1, () => {
    if (source === "rows") {
      // pointer[l]: row i of lane l's tile.
      for (let l = 0; l < 4; l++) f.localGet(src).localGet(offset[l]).i32Add().localSet(pointer[l]);
      for (let i = 0; i < inSide; i++) {
        for (let half = 0; half * 4 < inSide; half++) {
          for (let l = 0; l < 4; l++) f.localGet(pointer[l]).v128Load(16 * half).localSet(loaded[l]);
          emitTranspose(f, loaded, column, shuffled);
          for (let j = half * 4; j < Math.min(inSide, half * 4 + 4); j++) {
            f.localGet(column[j - half * 4]).localSet(x[i][j]);
          }
        }
        if (i + 1 < inSide) {
          for (let l = 0; l < 4; l++) f.localGet(pointer[l]).localGet(inStride).i32Add().localSet(pointer[l]);
        }
        emitLinear(f, t, x[i], rowPass[i], temps);
      }
    } else {
      if (source === "positions") f.localGet(src).localSet(walk);
      else for (let l = 0; l < 4; l++) f.localGet(src).localGet(offset[l]).i32Add().localSet(pointer[l]);
      for (let i = 0; i < inSide; i++) {
        for (let j = 0; j < inSide; j++) {
          if (source === "positions") {
            f.localGet(walk).v128Load().localSet(x[i][j]);
            f.localGet(walk).localGet(inStride).i32Add().localSet(walk);
            continue;
          }
          const at = source === "gather" ? i * inSide + j : (inSide - 1 - i) * inSide + (inSide - 1 - j);
          f.localGet(pointer[0]).v128Load32Splat(4 * at);
          for (let l = 1; l < 4; l++) f.localGet(pointer[l]).f32Load(4 * at).f32x4ReplaceLane(l);
          f.localSet(x[i][j]);
        }
        emitLinear(f, t, x[i], rowPass[i], temps);
      }
    }
    // Column pass: y[ξ][ν] = Σᵢ t[ξ][i]·rowPass[i][ν].
    for (let nu = 0; nu < outSide; nu++) {
      emitLinear(f, t, rowPass.map((row) => row[nu]), y.map((row) => row[nu]), temps);
    }
    if (target === "positions") {
      f.localGet(dst).localSet(walk);
      for (let xi = 0; xi < outSide; xi++) {
        for (let nu = 0; nu < outSide; nu++) {
          f.localGet(walk).localGet(y[xi][nu]).v128Store();
          f.localGet(walk).localGet(outStride).i32Add().localSet(walk);
        }
      }
    } else if (target === "rows") {
      if (outSide !== 4) {
        throw new RangeError(`winograd: row targets need 4×4 tiles, not ${outSide}×${outSide}`);
      }
      for (let l = 0; l < 4; l++) f.localGet(dst).localGet(offset[l]).i32Add().localSet(pointer[l]);
      for (let xi = 0; xi < outSide; xi++) {
        emitTranspose(f, y[xi], column, shuffled);
        for (let l = 0; l < 4; l++) f.localGet(pointer[l]).localGet(column[l]).v128Store();
        if (xi + 1 < outSide) {
          for (let l = 0; l < 4; l++) {
            f.localGet(pointer[l]).localGet(outStride).i32Add().localSet(pointer[l]);
          }
        }
      }
    } else {
      for (let l = 0; l < 4; l++) f.localGet(dst).localGet(offset[l]).i32Add().localSet(pointer[l]);
      for (let xi = 0; xi < outSide; xi++) {
        for (let nu = 0; nu < outSide; nu++) {
          for (let l = 0; l < 4; l++) {
            f.localGet(pointer[l]).localGet(y[xi][nu]).v128Store32Lane(4 * (xi * outSide + nu), l);
          }
        }
      }
    }
    f.localGet(src).localGet(srcStep).i32Add().localSet(src);
    f.localGet(dst).localGet(dstStep).i32Add().localSet(dst);
    // Every `wrapEvery` tiles (a row of them), the extra steps to the next row's first.
    f.localGet(since).i32Const(1).i32Add().localTee(since).localGet(wrapEvery).i32Eq().if();
    f.i32Const(0).localSet(since);
    f.localGet(src).localGet(srcWrap).i32Add().localSet(src);
    f.localGet(dst).localGet(dstWrap).i32Add().localSet(dst);
    f.end();
  });
}

/**
 * Adds the Winograd transforms for every side in {@link WINOGRAD_SIDES} to `builder`.
 *
 * @example
 * ```ts
 * import { ModuleBuilder } from "./encoder.ts";
 * import { emitWinogradKernels } from "./winograd_kernels.ts";
 * emitWinogradKernels(new ModuleBuilder());
 * ```
 */
export function emitWinogradKernels(builder: ModuleBuilder): void {
  for (const r of WINOGRAD_SIDES) {
    const all = specs(r);
    for (const [key, name] of Object.entries(WINOGRAD_EXPORTS) as [keyof typeof WINOGRAD_EXPORTS, string][]) {
      builder.addFunction(`${name}_${r}`, Array(11).fill(i32), [], (f) => writeTransform(f, all[key]));
    }
  }
}
