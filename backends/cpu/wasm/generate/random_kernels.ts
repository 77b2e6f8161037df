/**
 * Generates the dropout-mask kernel: the engine's counter-based generator (Philox4x32-10, see
 * `engine/random.ts`) run four counter blocks at a time in SIMD lanes, each value compared with
 * the drop threshold and written as the mask's scale or zero. In TypeScript the generator has no
 * 64-bit multiply (each high word takes four 16×16-bit products): 98,304 uniforms, an AlexNet-like
 * step's two dropout masks at batch 64, took 2.6–3.3 ms on this machine; here
 * `i64x2.extmul_*_i32x4_u` gives two full products per instruction.
 *
 * Philox state: counter words 0–1 = block index (position / 4), word 2 = stream, word 3 = step;
 * key = the seed's two words, bumped by the Weyl constants each of the 10 rounds. Word w of block b
 * is position 4b + w; its top 24 bits are the uniform value's numerator, `u = (word >>> 8) / 2^24`.
 *
 * @module
 */

import { type FunctionWriter, type ModuleBuilder, ValType } from "./encoder.ts";

const { i32, f32, v128 } = ValType;

/** Philox4x32's round multipliers and key increments (Random123). */
const M0 = 0xd2511f53, M1 = 0xcd9e8d57, W0 = 0x9e3779b9, W1 = 0xbb67ae85;

/**
 * Names under which {@link emitRandomKernels} exports its functions.
 *
 * @example
 * ```ts
 * import { RANDOM_EXPORTS } from "./random_kernels.ts";
 * console.log(RANDOM_EXPORTS.dropoutMask); // "dropout_mask"
 * ```
 */
export const RANDOM_EXPORTS = {
  /**
   * `(out, count, blockLo, blockHi, skip, k0, k1, stream, step, threshold, keep: f32, scratch)`:
   * `out[i] = keep` where position `4·block + skip + i`'s numerator `word >>> 8` is at least
   * `threshold`, else 0, for i in [0, count). `block` (= blockHi·2^32 + blockLo) is a multiple of
   * 4 and `skip` is below 16: the kernel computes groups of 16 positions, and writes a group that
   * only partly lies in `out` through `scratch` (64 bytes).
   */
  dropoutMask: "dropout_mask",
} as const;

function writeDropoutMask(f: FunctionWriter): void {
  const [out, count, blockLo, blockHi, skip, k0, k1, stream, step, threshold, keep, scratch] = [
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
    11,
  ];
  const c = [f.local(v128), f.local(v128), f.local(v128), f.local(v128)];
  const key0 = f.local(v128), key1 = f.local(v128), m0 = f.local(v128), m1 = f.local(v128);
  const lowProduct = f.local(v128), highProduct = f.local(v128), lo0 = f.local(v128), hi0 = f.local(v128);
  const lo1 = f.local(v128), hi1 = f.local(v128), keepV = f.local(v128), thresholdV = f.local(v128);
  const t = [f.local(v128), f.local(v128), f.local(v128), f.local(v128)];
  const i = f.local(i32), lo = f.local(i32), hi = f.local(i32), j = f.local(i32), end = f.local(i32);
  f.i32Const(M0 | 0).i32x4Splat().localSet(m0);
  f.i32Const(M1 | 0).i32x4Splat().localSet(m1);
  f.localGet(keep).f32x4Splat().localSet(keepV);
  f.localGet(threshold).i32x4Splat().localSet(thresholdV);
  f.localGet(blockLo).localSet(lo);
  f.localGet(blockHi).localSet(hi);
  // i: where the group's first position falls in `out` (negative for the skipped head).
  f.i32Const(0).localGet(skip).i32Sub().localSet(i);
  f.block().loop();
  f.localGet(i).localGet(count).i32GeS().brIf(1);
  {
    // Counters of blocks lo … lo + 3 (lo is a multiple of 4: no carry inside a group).
    f.localGet(lo).i32x4Splat().v128ConstI32([0, 1, 2, 3]).i32x4Add().localSet(c[0]);
    f.localGet(hi).i32x4Splat().localSet(c[1]);
    f.localGet(stream).i32x4Splat().localSet(c[2]);
    f.localGet(step).i32x4Splat().localSet(c[3]);
    f.localGet(k0).i32x4Splat().localSet(key0);
    f.localGet(k1).i32x4Splat().localSet(key1);
    for (let round = 0; round < 10; round++) {
      // (hi, lo) = 64-bit products M·c, lanes 0–1 from extmul_low, 2–3 from extmul_high.
      for (const [word, m, low, high] of [[c[0], m0, lo0, hi0], [c[2], m1, lo1, hi1]] as const) {
        f.localGet(word).localGet(m).i64x2ExtmulLowI32x4U().localSet(lowProduct);
        f.localGet(word).localGet(m).i64x2ExtmulHighI32x4U().localSet(highProduct);
        f.localGet(lowProduct).localGet(highProduct).shuffleF32Lanes([0, 2, 4, 6]).localSet(low);
        f.localGet(lowProduct).localGet(highProduct).shuffleF32Lanes([1, 3, 5, 7]).localSet(high);
      }
      f.localGet(hi1).localGet(c[1]).v128Xor().localGet(key0).v128Xor().localSet(c[0]);
      f.localGet(lo1).localSet(c[1]);
      f.localGet(hi0).localGet(c[3]).v128Xor().localGet(key1).v128Xor().localSet(c[2]);
      f.localGet(lo0).localSet(c[3]);
      if (round < 9) {
        f.localGet(key0).i32Const(W0 | 0).i32x4Splat().i32x4Add().localSet(key0);
        f.localGet(key1).i32Const(W1 | 0).i32x4Splat().i32x4Add().localSet(key1);
      }
    }
    // Word w of the four blocks → keep or 0, then transposed so each vector is one block's 4 positions.
    for (let w = 0; w < 4; w++) {
      f.localGet(keepV);
      f.localGet(c[w]).i32Const(8).i32x4ShrU().localGet(thresholdV).i32x4GeS();
      f.v128And().localSet(c[w]);
    }
    f.localGet(c[0]).localGet(c[1]).shuffleF32Lanes([0, 4, 1, 5]).localSet(t[0]);
    f.localGet(c[0]).localGet(c[1]).shuffleF32Lanes([2, 6, 3, 7]).localSet(t[1]);
    f.localGet(c[2]).localGet(c[3]).shuffleF32Lanes([0, 4, 1, 5]).localSet(t[2]);
    f.localGet(c[2]).localGet(c[3]).shuffleF32Lanes([2, 6, 3, 7]).localSet(t[3]);
    const blocks: [number, number, [number, number, number, number]][] = [
      [t[0], t[2], [0, 1, 4, 5]],
      [t[0], t[2], [2, 3, 6, 7]],
      [t[1], t[3], [0, 1, 4, 5]],
      [t[1], t[3], [2, 3, 6, 7]],
    ];
    const storeGroup = (at: () => void) => {
      blocks.forEach(([x, y, lanes], b) => {
        at();
        f.localGet(x).localGet(y).shuffleF32Lanes(lanes).v128Store(16 * b);
      });
    };
    // A whole group inside `out`: four vector stores; else through the scratch, element by element.
    f.localGet(i).i32Const(0).i32GeS().localGet(i).i32Const(16).i32Add().localGet(count).i32LeS().i32And();
    f.if();
    storeGroup(() => f.localGet(out).localGet(i).i32Const(2).i32Shl().i32Add());
    f.else();
    storeGroup(() => f.localGet(scratch));
    // j from max(0, −i) to min(16, count − i)
    f.i32Const(0).localGet(i).i32Sub().localSet(j);
    f.localGet(j).i32Const(0).i32LtS().if().i32Const(0).localSet(j).end();
    f.localGet(count).localGet(i).i32Sub().localSet(end);
    f.localGet(end).i32Const(16).i32GtS().if().i32Const(16).localSet(end).end();
    f.block().loop();
    f.localGet(j).localGet(end).i32GeS().brIf(1);
    f.localGet(out).localGet(i).localGet(j).i32Add().i32Const(2).i32Shl().i32Add();
    f.localGet(scratch).localGet(j).i32Const(2).i32Shl().i32Add().f32Load();
    f.f32Store();
    f.localGet(j).i32Const(1).i32Add().localSet(j);
    f.br(0).end().end();
    f.end();
    // Next four blocks: the low word wraps into the high one.
    f.localGet(lo).i32Const(4).i32Add().localTee(lo).i32Eqz().if();
    f.localGet(hi).i32Const(1).i32Add().localSet(hi);
    f.end();
    f.localGet(i).i32Const(16).i32Add().localSet(i);
  }
  f.br(0).end().end();
}

/**
 * Adds the random kernels to `builder`, exported under {@link RANDOM_EXPORTS}.
 *
 * @example
 * ```ts
 * import { ModuleBuilder } from "./encoder.ts";
 * import { emitRandomKernels } from "./random_kernels.ts";
 * const builder = new ModuleBuilder().importMemory({
 *   module: "env", name: "memory", initialPages: 1, maximumPages: 16, shared: false,
 * });
 * emitRandomKernels(builder);
 * console.log(WebAssembly.validate(builder.build())); // true
 * ```
 */
export function emitRandomKernels(builder: ModuleBuilder): void {
  builder.addFunction(
    RANDOM_EXPORTS.dropoutMask,
    [i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, f32, i32],
    [],
    writeDropoutMask,
  );
}
