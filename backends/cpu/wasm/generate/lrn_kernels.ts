/**
 * Generates Caffe's across-channel local response normalisation (forward and backward) in
 * WebAssembly SIMD with the TypeScript kernels' arithmetic bit for bit (`backends/cpu/lrn.ts`,
 * `beta = 0.75` only: WebAssembly has no `pow`, so other exponents stay in TypeScript).
 *
 * Every value is computed in float64 two pixels at a time (`f64x2` lanes), with the same operations
 * in the same order as the TypeScript code: float32 operands promoted exactly, the running sum
 * updated by adding the entering channel's term and then subtracting the leaving one's, the clamp
 * `Math.max(acc, 0)` as `f64x2.max` (NaN wins, −0 < +0, like `Math.max`), `k + coef·acc`, then
 * `r = √s` and `1 / (r·√r)`; WebAssembly's float64 add, sub, mul, div and sqrt are correctly
 * rounded like JavaScript's, never fused. Results are rounded once to float32 by
 * `f32x4.demote_f64x2_zero`, the round-to-nearest-even of a `Float32Array` store.
 *
 * Where TypeScript makes three passes over the running sums per channel (enter, leave, output),
 * the kernel makes one: each pixel's operations are independent of every other pixel's, so
 * fusing the passes changes the memory traffic, not a bit. The running sums (one float64 plane
 * per image) live in per-thread scratch; a thread computes whole images, so no result depends on
 * the thread count.
 *
 * Why WebAssembly: TypeScript runs the float64 arithmetic one pixel at a time with three passes
 * over the sums per channel; AlexNet's two LRN layers took ≈ 8% of a training step.
 *
 * @module
 */

import { type FunctionWriter, type ModuleBuilder, ValType } from "./encoder.ts";

const { i32, f64, v128 } = ValType;

/**
 * Names under which {@link emitLrnKernels} exports its functions.
 *
 * @example
 * ```ts
 * import { LRN_EXPORTS } from "./lrn_kernels.ts";
 * console.log(LRN_EXPORTS.forward); // "lrn_forward"
 * ```
 */
export const LRN_EXPORTS = {
  /**
   * `(x, out, scale, acc, images, C, plane, half, k, coef)`, the last two float64 (`coef =
   * alpha / size`): LRN forward of `images` images `[C, plane]`, writing `out` and `scale`;
   * `acc` is scratch for `plane` float64 values.
   */
  forward: "lrn_forward",
  /**
   * `(x, y, scale, dy, dx, acc, images, C, plane, half, cross)`, the last float64 (`cross =
   * 2·alpha·beta / size`): LRN backward of `images` images, writing `dx`; `acc` is scratch for
   * (2·half + 3)·plane float64 values (the sums, then a ring of size + 1 planes of terms).
   */
  backward: "lrn_backward",
} as const;

/** Pixel pairs per iteration of the main loop. */
const PAIRS = 2;

interface Cursor {
  /** i32 local: byte offset of the current pixel (pair) in the float arrays. */
  o: number;
  /** i32 local: `acc − 2·(offset of the channel's first pixel)`, so a sum is at `accBase + 2·o`. */
  accBase: number;
}

/** Pushes the float64 pair (or lone pixel, upper lane 0) promoted from floats at `base + o + at`. */
function floats(f: FunctionWriter, c: Cursor, base: number, at: number, single: boolean): void {
  f.localGet(base).localGet(c.o).i32Add();
  if (single) f.v128Load32Zero(at);
  else f.v128Load64Zero(at);
  f.f64x2PromoteLowF32x4();
}

/** `base + 2·o`: float64 planes are indexed by the float offset `o` twice over. */
function doubleAddress(f: FunctionWriter, c: Cursor, base: number): void {
  f.localGet(base).localGet(c.o).i32Add().localGet(c.o).i32Add();
}

/**
 * Pushes the float64 pair (or lone value) of the pixel(s) at `at` from a float64 plane whose
 * `base` is set as `accBase` (the running sums by default).
 */
function loadSums(f: FunctionWriter, c: Cursor, at: number, single: boolean, base = c.accBase): void {
  doubleAddress(f, c, base);
  if (single) f.v128Load64Zero(2 * at);
  else f.v128Load(2 * at);
}

/** Stores the float64 pair `value` pushes into a float64 plane (the running sums by default). */
function storeSums(
  f: FunctionWriter,
  c: Cursor,
  at: number,
  single: boolean,
  value: () => void,
  base = c.accBase,
): void {
  doubleAddress(f, c, base);
  value();
  if (single) f.v128Store64Lane(2 * at, 0);
  else f.v128Store(2 * at);
}

/** Stores the float64 pair `value` pushes, rounded to float32, at `base + o + at`. */
function storeFloats(
  f: FunctionWriter,
  c: Cursor,
  base: number,
  at: number,
  single: boolean,
  value: () => void,
): void {
  f.localGet(base).localGet(c.o).i32Add();
  value();
  f.f32x4DemoteF64x2Zero();
  if (single) f.v128Store32Lane(at, 0);
  else f.v128Store64Lane(at, 0);
}

/**
 * `for o in [o, end)` by pixels: {@link PAIRS} pairs per iteration, then pairs, then a lone
 * pixel in lane 0 (the same code, so a tail pixel rounds exactly like the others).
 * `body(at, single)` handles the pair (or pixel) at byte `at` past `o`.
 */
function forPixels(
  f: FunctionWriter,
  o: number,
  end: number,
  body: (at: number, single: boolean) => void,
): void {
  for (const pairs of [PAIRS, 1]) {
    f.block().loop();
    f.localGet(o).i32Const(8 * pairs).i32Add().localGet(end).i32GtS().brIf(1);
    for (let p = 0; p < pairs; p++) body(8 * p, false);
    f.localGet(o).i32Const(8 * pairs).i32Add().localSet(o);
    f.br(0).end().end();
  }
  f.localGet(o).localGet(end).i32LtS().if();
  body(0, true);
  f.end();
}

/** Locals shared by both passes' channel loops (`pb`: bytes per plane, set on creation). */
interface Channels {
  images: number;
  channels: number;
  plane: number;
  half: number;
  acc: number;
  /** i32 locals. */
  pb: number;
  n: number;
  ch: number;
  start: number;
  end: number;
  image: number;
  first: number;
  cursor: Cursor;
}

function channelLocals(
  f: FunctionWriter,
  p: { images: number; channels: number; plane: number; half: number; acc: number },
): Channels {
  const l: Channels = {
    ...p,
    pb: f.local(i32),
    n: f.local(i32),
    ch: f.local(i32),
    start: f.local(i32),
    end: f.local(i32),
    image: f.local(i32),
    first: f.local(i32),
    cursor: { o: f.local(i32), accBase: f.local(i32) },
  };
  f.localGet(l.plane).i32Const(2).i32Shl().localSet(l.pb);
  return l;
}

/** `dst = base + channels · pb` for a channel count `channels()` pushes (may wrap below 0). */
function shifted(f: FunctionWriter, l: Channels, dst: number, base: number, channels: () => void): void {
  f.localGet(base);
  channels();
  f.localGet(l.pb).i32Mul().i32Add().localSet(dst);
}

/** Points the cursor at channel `ch` of the current image: `start`, `end`, `o`, `accBase`. */
function atChannel(f: FunctionWriter, l: Channels): void {
  f.localGet(l.image).localGet(l.ch).localGet(l.pb).i32Mul().i32Add().localTee(l.start).localSet(l.cursor.o);
  f.localGet(l.start).localGet(l.pb).i32Add().localSet(l.end);
  f.localGet(l.acc).localGet(l.start).i32Const(1).i32Shl().i32Sub().localSet(l.cursor.accBase);
}

/**
 * The sliding window of both passes, per image: zero the sums, add channels [0, min(half, C)),
 * then per channel c run `pixel(enter, leave)` over its pixels, `enter` when c + half < C and
 * `leave` when c − half − 1 ≥ 0 (four loop variants, chosen per channel). `channel(warm)` runs
 * before each channel's pixels, the cursor set.
 */
function slideWindow(
  f: FunctionWriter,
  l: Channels,
  warm: (at: number, single: boolean) => void,
  pixel: (enter: boolean, leave: boolean, at: number, single: boolean) => void,
  channel: (warm: boolean) => void = () => {},
): void {
  // first = min(half, C)
  f.localGet(l.half).localGet(l.channels).localGet(l.half).localGet(l.channels).i32LtS().select().localSet(
    l.first,
  );
  f.i32Const(0).localSet(l.image);
  f.forRange(l.n, () => f.i32Const(0), () => f.localGet(l.images), 1, () => {
    f.localGet(l.acc).i32Const(0).localGet(l.pb).i32Const(1).i32Shl().memoryFill();
    f.forRange(l.ch, () => f.i32Const(0), () => f.localGet(l.first), 1, () => {
      atChannel(f, l);
      channel(true);
      forPixels(f, l.cursor.o, l.end, warm);
    });
    f.forRange(l.ch, () => f.i32Const(0), () => f.localGet(l.channels), 1, () => {
      atChannel(f, l);
      channel(false);
      const variant = (enter: boolean, leave: boolean) =>
        forPixels(f, l.cursor.o, l.end, (at, single) => pixel(enter, leave, at, single));
      f.localGet(l.ch).localGet(l.half).i32Add().localGet(l.channels).i32LtS().if();
      f.localGet(l.ch).localGet(l.half).i32GtS().if();
      variant(true, true);
      f.else();
      variant(true, false);
      f.end();
      f.else();
      f.localGet(l.ch).localGet(l.half).i32GtS().if();
      variant(false, true);
      f.else();
      variant(false, false);
      f.end();
      f.end();
    });
    f.localGet(l.image).localGet(l.channels).localGet(l.pb).i32Mul().i32Add().localSet(l.image);
  });
}

/**
 * Updates the sums of a pair with the entering term (added) and the leaving one (subtracted),
 * leaving them in `a`; with neither, just loads them.
 */
function updateSums(
  f: FunctionWriter,
  c: Cursor,
  a: number,
  enter: (() => void) | undefined,
  leave: (() => void) | undefined,
  at: number,
  single: boolean,
): void {
  if (!enter && !leave) {
    loadSums(f, c, at, single);
    f.localSet(a);
    return;
  }
  storeSums(f, c, at, single, () => {
    loadSums(f, c, at, single);
    if (enter) {
      enter();
      f.f64x2Add();
    }
    if (leave) {
      leave();
      f.f64x2Sub();
    }
    f.localTee(a);
  });
}

/** Pushes `1 / (r·√r)` with `r = √s` (`s()` pushes s; `r` is a v128 local): s^(−0.75) as `negPow`. */
function negPow75(f: FunctionWriter, one: number, s: () => void, r: number): void {
  f.localGet(one);
  s();
  f.f64x2Sqrt().localTee(r).localGet(r).f64x2Sqrt().f64x2Mul().f64x2Div();
}

function writeForward(f: FunctionWriter): void {
  const [x, out, scale, acc, images, channels, plane, half, k, coef] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9];
  const l = channelLocals(f, { images, channels, plane, half, acc });
  const xE = f.local(i32), xL = f.local(i32);
  const kV = f.local(v128), coefV = f.local(v128), one = f.local(v128), zero = f.local(v128);
  const a = f.local(v128), t = f.local(v128), s = f.local(v128), r = f.local(v128), q = f.local(v128);
  const c = l.cursor;
  f.localGet(k).f64x2Splat().localSet(kV);
  f.localGet(coef).f64x2Splat().localSet(coefV);
  f.v128ConstF64([1, 1]).localSet(one);
  shifted(f, l, xE, x, () => f.localGet(half));
  shifted(f, l, xL, x, () => f.i32Const(0).localGet(half).i32Const(1).i32Add().i32Sub());
  const square = (base: number, at: number, single: boolean) => {
    floats(f, c, base, at, single);
    f.localTee(t).localGet(t).f64x2Mul();
  };
  slideWindow(
    f,
    l,
    (at, single) => updateSums(f, c, a, () => square(x, at, single), undefined, at, single),
    (enter, leave, at, single) => {
      updateSums(
        f,
        c,
        a,
        enter ? () => square(xE, at, single) : undefined,
        leave ? () => square(xL, at, single) : undefined,
        at,
        single,
      );
      // s = k + coef·max(acc, 0)
      f.localGet(kV).localGet(coefV).localGet(a).localGet(zero).f64x2Max().f64x2Mul().f64x2Add().localSet(s);
      storeFloats(f, c, scale, at, single, () => f.localGet(s));
      negPow75(f, one, () => f.localGet(s), r);
      f.localSet(q);
      storeFloats(f, c, out, at, single, () => {
        floats(f, c, x, at, single);
        f.localGet(q).f64x2Mul();
      });
    },
  );
}

/**
 * Backward keeps each channel's term (dy·y)/scale from when it enters the window to when it
 * leaves, in a ring of size + 1 float64 planes after the sums: one division per element instead
 * of two, and the value subtracted is the very one added, as when TypeScript recomputes it.
 */
function writeBackward(f: FunctionWriter): void {
  const [x, y, scale, dy, dx, acc, images, channels, plane, half, cross] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
  const l = channelLocals(f, { images, channels, plane, half, acc });
  const yE = f.local(i32), sE = f.local(i32), dyE = f.local(i32);
  const ring = f.local(i32), slots = f.local(i32), enterBase = f.local(i32), leaveBase = f.local(i32);
  const crossV = f.local(v128), one = f.local(v128), a = f.local(v128), r = f.local(v128), t = f.local(v128);
  const c = l.cursor;
  f.localGet(cross).f64x2Splat().localSet(crossV);
  f.v128ConstF64([1, 1]).localSet(one);
  f.localGet(acc).localGet(l.pb).i32Const(1).i32Shl().i32Add().localSet(ring);
  f.localGet(half).i32Const(1).i32Shl().i32Const(2).i32Add().localSet(slots);
  for (const [dst, base] of [[yE, y], [sE, scale], [dyE, dy]]) {
    shifted(f, l, dst, base, () => f.localGet(half));
  }
  /** `dst` = base of channel `channel()`'s ring slot, indexed like the sums. */
  const slotBase = (dst: number, channel: () => void) => {
    f.localGet(ring);
    channel();
    f.localGet(slots).i32RemU().localGet(l.pb).i32Mul().i32Const(1).i32Shl().i32Add();
    f.localGet(l.start).i32Const(1).i32Shl().i32Sub().localSet(dst);
  };
  // (dy·y) / scale, kept in `t` and stored in the entering channel's slot.
  const term = (dyP: number, yP: number, sP: number, at: number, single: boolean) => {
    storeSums(f, c, at, single, () => {
      floats(f, c, dyP, at, single);
      floats(f, c, yP, at, single);
      f.f64x2Mul();
      floats(f, c, sP, at, single);
      f.f64x2Div().localTee(t);
    }, enterBase);
  };
  slideWindow(
    f,
    l,
    (at, single) => {
      term(dy, y, scale, at, single);
      updateSums(f, c, a, () => f.localGet(t), undefined, at, single);
    },
    (enter, leave, at, single) => {
      if (enter) term(dyE, yE, sE, at, single);
      updateSums(
        f,
        c,
        a,
        enter ? () => f.localGet(t) : undefined,
        leave ? () => loadSums(f, c, at, single, leaveBase) : undefined,
        at,
        single,
      );
      // dx = dy·scale^(−0.75) − (cross·x)·acc
      storeFloats(f, c, dx, at, single, () => {
        floats(f, c, dy, at, single);
        negPow75(f, one, () => floats(f, c, scale, at, single), r);
        f.f64x2Mul();
        f.localGet(crossV);
        floats(f, c, x, at, single);
        f.f64x2Mul().localGet(a).f64x2Mul();
        f.f64x2Sub();
      });
    },
    (warm) => {
      if (warm) {
        slotBase(enterBase, () => f.localGet(l.ch));
        return;
      }
      slotBase(enterBase, () => f.localGet(l.ch).localGet(half).i32Add());
      // c − half − 1 + (2·half + 2) = c + half + 1: the same slot, never negative.
      slotBase(leaveBase, () => f.localGet(l.ch).localGet(half).i32Add().i32Const(1).i32Add());
    },
  );
}

/**
 * Adds the LRN kernels to `builder`, exported under {@link LRN_EXPORTS}.
 *
 * @example
 * ```ts
 * import { ModuleBuilder } from "./encoder.ts";
 * import { emitLrnKernels } from "./lrn_kernels.ts";
 * const builder = new ModuleBuilder().importMemory({
 *   module: "env", name: "memory", initialPages: 1, maximumPages: 16, shared: false,
 * });
 * emitLrnKernels(builder);
 * console.log(WebAssembly.validate(builder.build())); // true
 * ```
 */
export function emitLrnKernels(builder: ModuleBuilder): void {
  builder.addFunction(
    LRN_EXPORTS.forward,
    [i32, i32, i32, i32, i32, i32, i32, i32, f64, f64],
    [],
    writeForward,
  );
  builder.addFunction(
    LRN_EXPORTS.backward,
    [i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, f64],
    [],
    writeBackward,
  );
}
