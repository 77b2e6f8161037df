/**
 * Generates the convolution helpers that surround the GEMM: im2col over a range of column-matrix
 * rows (so threads can split the weight gradient by rows), col2im-add, and a fill.
 *
 * The column matrix of one image has a row per (channel c, kernel row ki, kernel column kj) and a
 * column per output pixel (oh, ow); entry = x[c, oh·sH − pH + ki, ow·sW − pW + kj], zero in the
 * padding. For each row the output columns whose input column lies inside the image form one
 * range [lo, hi), so the inner loops carry no bounds test; stride-1 rows move four floats per
 * instruction.
 *
 * @module
 */

import { type FunctionWriter, type ModuleBuilder, ValType } from "./encoder.ts";

const { i32, v128 } = ValType;

/**
 * Names under which {@link emitConvKernels} exports its functions.
 *
 * @example
 * ```ts
 * import { CONV_EXPORTS } from "./conv_kernels.ts";
 * console.log(CONV_EXPORTS.im2col); // "conv_im2col"
 * ```
 */
export const CONV_EXPORTS = {
  /**
   * `(x, col, rowStart, rowEnd, H, W, OH, OW, kh, kw, sH, sW, pH, pW)`: writes rows
   * [rowStart, rowEnd) of one image's column matrix, densely (OH·OW floats per row) from `col`.
   */
  im2col: "conv_im2col",
  /** Same arguments: adds rows [rowStart, rowEnd) of `col` back onto the image `x` (col2im). */
  col2imAdd: "conv_col2im_add",
  /**
   * `(xpad, col, rows, OH, OW, kh, kw, planeBytes, rowBytes)`: col2im of a stride-1 convolution
   * onto zero-filled padded planes, `rowBytes` apart with at least kw − 1 + 4·⌈OW/4⌉ floats per
   * row, so every run of OW sums is whole vectors, the last one's lanes past OW adding +0 (the
   * last run reads up to 12 bytes past `col`). Each element gets the contributions of
   * `conv_col2im_add` in the same order.
   */
  col2imPadded: "conv_col2im_padded",
  /**
   * `(xpad, x, channels, H, W, padTop, padLeft, Hq, Wq)`: copies the H×W middle of each Hq×Wq
   * padded plane out to an image (the inverse of `pad`).
   */
  unpad: "conv_unpad",
  /** `(address, bytes)`: zero-fills. */
  fillZero: "fill_zero",
  /**
   * `(x, xpad, channels, H, W, padTop, padLeft, Hp, Wp)`: copies channels of an H×W image into the
   * middle of Hp×Wp planes whose borders are zero.
   */
  pad: "conv_pad",
  /**
   * `(xpad, dst, rowStart, rows, pixelStart, pixels, offsets, rowTable)`: packs rows
   * [rowStart, rowStart + rows) × pixels [pixelStart, pixelStart + pixels) of the column matrix
   * into NR = 8-pixel GEMM panels straight from a padded image, never writing the column matrix
   * (implicit im2col). `offsets[j]` (int32) is output pixel j's window corner within a padded
   * plane, in elements; `rowTable[r]` (int32) is row r's tap within the padded image, in bytes.
   */
  packColumns: "conv_pack_columns",
  /**
   * `(xpad, dst, rowStart, rows, pixelStart, pixels, offsets, kh, kw, planeElements, Wp)`: the
   * transpose, for the weight gradient's B = column matrixᵀ: panels of 8 column-matrix rows, one
   * pixel per depth step, straight from a padded image.
   */
  packRows: "conv_pack_rows",
} as const;

/** Parameter indices shared by im2col and col2im. */
const P = {
  x: 0,
  col: 1,
  rowStart: 2,
  rowEnd: 3,
  H: 4,
  W: 5,
  OH: 6,
  OW: 7,
  kh: 8,
  kw: 9,
  sH: 10,
  sW: 11,
  pH: 12,
  pW: 13,
} as const;

/**
 * Shared traversal: for each row and output row, computes the input row pointer and the valid
 * output-column range, then calls `inside` (input row inside the image) or `outside` (padding).
 * Locals handed to the callbacks: `src` = address of input pixel (ih, lo·sW − pW + kj), `dst` =
 * address of col entry (row, oh, 0), `lo`, `hi`.
 */
function writeRowTraversal(
  f: FunctionWriter,
  body: (locals: { src: number; dst: number; lo: number; hi: number }, inside: boolean) => void,
): void {
  const r = f.local(i32), c = f.local(i32), ki = f.local(i32), kj = f.local(i32), rem = f.local(i32);
  const lo = f.local(i32), hi = f.local(i32), oh = f.local(i32), ih = f.local(i32);
  const plane = f.local(i32), src = f.local(i32), dst = f.local(i32), area = f.local(i32), t = f.local(i32);
  f.localGet(P.kh).localGet(P.kw).i32Mul().localSet(area);
  f.localGet(P.col).localSet(dst);
  f.forRange(r, () => f.localGet(P.rowStart), () => f.localGet(P.rowEnd), 1, () => {
    // c, ki, kj of this row
    f.localGet(r).localGet(area).i32DivS().localSet(c);
    f.localGet(r).localGet(c).localGet(area).i32Mul().i32Sub().localSet(rem);
    f.localGet(rem).localGet(P.kw).i32DivS().localSet(ki);
    f.localGet(rem).localGet(ki).localGet(P.kw).i32Mul().i32Sub().localSet(kj);
    f.localGet(P.x).localGet(c).localGet(P.H).i32Mul().localGet(P.W).i32Mul().i32Const(2).i32Shl().i32Add();
    f.localSet(plane);
    // lo = first ow with ow·sW − pW + kj ≥ 0: 0 if pW − kj ≤ 0, else ceil((pW − kj)/sW), at most OW
    f.localGet(P.pW).localGet(kj).i32Sub().localTee(t).i32Const(0).i32LeS().if();
    f.i32Const(0).localSet(lo);
    f.else();
    f.localGet(t).localGet(P.sW).i32Add().i32Const(1).i32Sub().localGet(P.sW).i32DivS().localSet(lo);
    f.end();
    f.localGet(lo).localGet(P.OW).i32GtS().if().localGet(P.OW).localSet(lo).end();
    // hi = 1 + last ow with ow·sW − pW + kj ≤ W − 1, clamped to [lo, OW]
    f.localGet(P.W).i32Const(1).i32Sub().localGet(P.pW).i32Add().localGet(kj).i32Sub().localTee(t);
    f.i32Const(0).i32LtS().if();
    f.i32Const(0).localSet(hi);
    f.else();
    f.localGet(t).localGet(P.sW).i32DivS().i32Const(1).i32Add().localSet(hi);
    f.end();
    f.localGet(hi).localGet(P.OW).i32GtS().if().localGet(P.OW).localSet(hi).end();
    f.localGet(hi).localGet(lo).i32LtS().if().localGet(lo).localSet(hi).end();
    f.forRange(oh, () => f.i32Const(0), () => f.localGet(P.OH), 1, () => {
      f.localGet(oh).localGet(P.sH).i32Mul().localGet(P.pH).i32Sub().localGet(ki).i32Add().localTee(ih);
      f.i32Const(0).i32LtS().localGet(ih).localGet(P.H).i32GeS().i32Or().if();
      body({ src, dst, lo, hi }, false);
      f.else();
      // src = plane + (ih·W + lo·sW − pW + kj)·4
      f.localGet(plane);
      f.localGet(ih).localGet(P.W).i32Mul().localGet(lo).localGet(P.sW).i32Mul().i32Add();
      f.localGet(P.pW).i32Sub().localGet(kj).i32Add().i32Const(2).i32Shl().i32Add().localSet(src);
      body({ src, dst, lo, hi }, true);
      f.end();
      f.localGet(dst).localGet(P.OW).i32Const(2).i32Shl().i32Add().localSet(dst);
    });
  });
}

/** `for (i = from; i < to; i++) store 0.0 at base + 4·i`. */
function writeZeroRun(f: FunctionWriter, base: number, from: () => void, to: () => void): void {
  const i = f.local(i32);
  f.forRange(i, from, to, 1, () => {
    f.localGet(base).localGet(i).i32Const(2).i32Shl().i32Add().f32Const(0).f32Store();
  });
}

function writeIm2col(f: FunctionWriter): void {
  const i = f.local(i32), s = f.local(i32);
  writeRowTraversal(f, ({ src, dst, lo, hi }, inside) => {
    if (!inside) {
      f.localGet(dst).i32Const(0).localGet(P.OW).i32Const(2).i32Shl().memoryFill();
      return;
    }
    writeZeroRun(f, dst, () => f.i32Const(0), () => f.localGet(lo));
    f.localGet(P.sW).i32Const(1).i32Eq().if();
    {
      // Four at a time while a whole vector fits, then one at a time.
      f.localGet(lo).localSet(i);
      f.localGet(src).localSet(s);
      f.block().loop();
      f.localGet(i).i32Const(4).i32Add().localGet(hi).i32GtS().brIf(1);
      f.localGet(dst).localGet(i).i32Const(2).i32Shl().i32Add().localGet(s).v128Load().v128Store();
      f.localGet(i).i32Const(4).i32Add().localSet(i);
      f.localGet(s).i32Const(16).i32Add().localSet(s);
      f.br(0).end().end();
      f.block().loop();
      f.localGet(i).localGet(hi).i32GeS().brIf(1);
      f.localGet(dst).localGet(i).i32Const(2).i32Shl().i32Add().localGet(s).f32Load().f32Store();
      f.localGet(i).i32Const(1).i32Add().localSet(i);
      f.localGet(s).i32Const(4).i32Add().localSet(s);
      f.br(0).end().end();
    }
    f.else();
    {
      f.localGet(src).localSet(s);
      f.forRange(i, () => f.localGet(lo), () => f.localGet(hi), 1, () => {
        f.localGet(dst).localGet(i).i32Const(2).i32Shl().i32Add().localGet(s).f32Load().f32Store();
        f.localGet(s).localGet(P.sW).i32Const(2).i32Shl().i32Add().localSet(s);
      });
    }
    f.end();
    writeZeroRun(f, dst, () => f.localGet(hi), () => f.localGet(P.OW));
  });
}

function writeCol2imAdd(f: FunctionWriter): void {
  const i = f.local(i32), s = f.local(i32), d = f.local(i32);
  writeRowTraversal(f, ({ src, dst, lo, hi }, inside) => {
    if (!inside) return;
    // Here `src` is the image (destination) and `dst` the column row (source).
    f.localGet(src).localSet(d);
    f.localGet(dst).localGet(lo).i32Const(2).i32Shl().i32Add().localSet(s);
    f.localGet(lo).localSet(i);
    f.localGet(P.sW).i32Const(1).i32Eq().if();
    {
      f.block().loop();
      f.localGet(i).i32Const(4).i32Add().localGet(hi).i32GtS().brIf(1);
      f.localGet(d).localGet(d).v128Load().localGet(s).v128Load().f32x4Add().v128Store();
      f.localGet(i).i32Const(4).i32Add().localSet(i);
      f.localGet(s).i32Const(16).i32Add().localSet(s);
      f.localGet(d).i32Const(16).i32Add().localSet(d);
      f.br(0).end().end();
    }
    f.end();
    f.block().loop();
    f.localGet(i).localGet(hi).i32GeS().brIf(1);
    f.localGet(d).localGet(d).f32Load().localGet(s).f32Load().f32Add().f32Store();
    f.localGet(i).i32Const(1).i32Add().localSet(i);
    f.localGet(s).i32Const(4).i32Add().localSet(s);
    f.localGet(d).localGet(P.sW).i32Const(2).i32Shl().i32Add().localSet(d);
    f.br(0).end().end();
  });
}

function writeCol2imPadded(f: FunctionWriter): void {
  const [xpad, col, rows, OH, OW, kh, kw, planeBytes, rowBytes] = [0, 1, 2, 3, 4, 5, 6, 7, 8];
  const r = f.local(i32), ki = f.local(i32), kj = f.local(i32), base = f.local(i32), oh = f.local(i32);
  const d = f.local(i32), s = f.local(i32), end = f.local(i32), runBytes = f.local(i32);
  const channelBase = f.local(i32), lastLanes = f.local(v128);
  // Whole vectors per run: ⌈OW/4⌉·16 bytes; the last one adds its lanes past OW as +0 (a sum
  // that starts at +0 is never −0, so x + 0 is x).
  f.localGet(OW).i32Const(3).i32Add().i32Const(2).i32ShrS().i32Const(4).i32Shl().localSet(runBytes);
  f.v128ConstI32([0, 1, 2, 3]);
  f.localGet(OW).localGet(runBytes).i32Const(2).i32ShrS().i32Sub().i32Const(4).i32Add().i32x4Splat();
  f.i32x4LtS().localSet(lastLanes);
  f.localGet(col).localSet(s);
  f.localGet(xpad).localSet(channelBase);
  f.i32Const(0).localSet(ki);
  f.i32Const(0).localSet(kj);
  f.forRange(r, () => f.i32Const(0), () => f.localGet(rows), 1, () => {
    // base = channel's plane + ki rows + kj floats
    f.localGet(channelBase).localGet(ki).localGet(rowBytes).i32Mul().i32Add().localGet(kj).i32Const(2)
      .i32Shl()
      .i32Add().localSet(base);
    f.forRange(oh, () => f.i32Const(0), () => f.localGet(OH), 1, () => {
      f.localGet(base).localGet(oh).localGet(rowBytes).i32Mul().i32Add().localTee(d);
      f.localGet(runBytes).i32Add().i32Const(16).i32Sub().localSet(end);
      f.block().loop();
      f.localGet(d).localGet(end).i32GeS().brIf(1);
      f.localGet(d).localGet(d).v128Load().localGet(s).v128Load().f32x4Add().v128Store();
      f.localGet(d).i32Const(16).i32Add().localSet(d);
      f.localGet(s).i32Const(16).i32Add().localSet(s);
      f.br(0).end().end();
      f.localGet(d).localGet(d).v128Load().localGet(s).v128Load().localGet(lastLanes).v128And().f32x4Add();
      f.v128Store();
      f.localGet(s).i32Const(16).i32Add().localSet(s);
      // The next run starts OW floats on, not where the vectors stopped.
      f.localGet(s).localGet(runBytes).i32Sub().localGet(OW).i32Const(2).i32Shl().i32Add().localSet(s);
    });
    // Next row: kj + 1, wrapping into the next kernel row, then the next channel.
    f.localGet(kj).i32Const(1).i32Add().localTee(kj).localGet(kw).i32Eq().if();
    f.i32Const(0).localSet(kj);
    f.localGet(ki).i32Const(1).i32Add().localTee(ki).localGet(kh).i32Eq().if();
    f.i32Const(0).localSet(ki);
    f.localGet(channelBase).localGet(planeBytes).i32Add().localSet(channelBase);
    f.end();
    f.end();
  });
}

function writeUnpad(f: FunctionWriter): void {
  const [xpad, x, channels, H, W, padTop, padLeft, Hq, Wq] = [0, 1, 2, 3, 4, 5, 6, 7, 8];
  const c = f.local(i32), h = f.local(i32), dst = f.local(i32);
  f.localGet(x).localSet(dst);
  f.forRange(c, () => f.i32Const(0), () => f.localGet(channels), 1, () => {
    f.forRange(h, () => f.i32Const(0), () => f.localGet(H), 1, () => {
      f.localGet(dst);
      // xpad + ((c·Hq + h + padTop)·Wq + padLeft)·4
      f.localGet(xpad);
      f.localGet(c).localGet(Hq).i32Mul().localGet(h).i32Add().localGet(padTop).i32Add().localGet(Wq)
        .i32Mul();
      f.localGet(padLeft).i32Add().i32Const(2).i32Shl().i32Add();
      f.localGet(W).i32Const(2).i32Shl().memoryCopy();
      f.localGet(dst).localGet(W).i32Const(2).i32Shl().i32Add().localSet(dst);
    });
  });
}

function writePad(f: FunctionWriter): void {
  const [x, xpad, channels, H, W, padTop, padLeft, Hp, Wp] = [0, 1, 2, 3, 4, 5, 6, 7, 8];
  const c = f.local(i32), h = f.local(i32), src = f.local(i32), dst = f.local(i32), i = f.local(i32);
  const rowBytes = f.local(i32);
  f.localGet(xpad).i32Const(0).localGet(channels).localGet(Hp).i32Mul().localGet(Wp).i32Mul().i32Const(2)
    .i32Shl();
  f.memoryFill();
  f.localGet(W).i32Const(2).i32Shl().localSet(rowBytes);
  f.localGet(x).localSet(src);
  f.forRange(c, () => f.i32Const(0), () => f.localGet(channels), 1, () => {
    f.forRange(h, () => f.i32Const(0), () => f.localGet(H), 1, () => {
      // dst = xpad + ((c·Hp + h + padTop)·Wp + padLeft)·4
      f.localGet(xpad);
      f.localGet(c).localGet(Hp).i32Mul().localGet(h).i32Add().localGet(padTop).i32Add().localGet(Wp)
        .i32Mul();
      f.localGet(padLeft).i32Add().i32Const(2).i32Shl().i32Add().localSet(dst);
      f.i32Const(0).localSet(i);
      f.block().loop();
      f.localGet(i).i32Const(16).i32Add().localGet(rowBytes).i32GtS().brIf(1);
      f.localGet(dst).localGet(i).i32Add().localGet(src).localGet(i).i32Add().v128Load().v128Store();
      f.localGet(i).i32Const(16).i32Add().localSet(i);
      f.br(0).end().end();
      f.block().loop();
      f.localGet(i).localGet(rowBytes).i32GeS().brIf(1);
      f.localGet(dst).localGet(i).i32Add().localGet(src).localGet(i).i32Add().f32Load().f32Store();
      f.localGet(i).i32Const(4).i32Add().localSet(i);
      f.br(0).end().end();
      f.localGet(src).localGet(rowBytes).i32Add().localSet(src);
    });
  });
}

/**
 * Implicit im2col into GEMM B panels (NR = 8 pixels wide, one row of the column matrix per depth
 * step). Column-matrix row r = (c, ki, kj) starts `rowTable[r]` bytes into the padded image (the
 * table holds `(c·plane + ki·Wp + kj)·4`), and pixel j adds `offsets[j]` elements: the padding is
 * already zeros, so no bounds are tested. A panel of eight pixels that are consecutive input
 * columns (stride 1, one output row) moves as two vector loads per row, one crossing an output row
 * as two such runs blended; any other panel gathers lane by lane, zero past the last pixel. Each
 * kind has a row loop of its own: a row costs one table load and its copies, where walking
 * (c, ki, kj) and choosing the kind at every row took 18% of an AlexNet-like forward pass.
 */
function writePackColumns(f: FunctionWriter): void {
  const [xpad, dst, rowStart, rows, pixelStart, pixels, offsets, rowTable] = [0, 1, 2, 3, 4, 5, 6, 7];
  const j0 = f.local(i32),
    end = f.local(i32),
    count = f.local(i32),
    first = f.local(i32),
    contiguous = f.local(i32);
  const r = f.local(i32), lane = f.local(i32), src = f.local(i32), row = f.local(i32), rowEnd = f.local(i32);
  const full = f.local(i32), split = f.local(i32), second = f.local(i32);
  const maskLo = f.local(v128), maskHi = f.local(v128);
  /** Byte address in the padded image of each lane's window for a full panel, hoisted out of the rows. */
  const lanePointers = Array.from({ length: 8 }, () => f.local(i32));
  f.localGet(pixelStart).localGet(pixels).i32Add().localSet(end);
  /** `for (row = table of rowStart; row < table end; row += 4, dst += 32) body()`, `r` = the row's offset. */
  const rowLoop = (body: () => void) => {
    f.localGet(rowTable).localGet(rowStart).i32Const(2).i32Shl().i32Add().localSet(row);
    f.localGet(row).localGet(rows).i32Const(2).i32Shl().i32Add().localSet(rowEnd);
    f.block().loop();
    f.localGet(row).localGet(rowEnd).i32GeS().brIf(1);
    f.localGet(row).i32Load().localSet(r);
    body();
    f.localGet(dst).i32Const(32).i32Add().localSet(dst);
    f.localGet(row).i32Const(4).i32Add().localSet(row);
    f.br(0).end().end();
  };
  f.forRange(j0, () => f.localGet(pixelStart), () => f.localGet(end), 8, () => {
    f.localGet(end).localGet(j0).i32Sub().localTee(count).i32Const(8).i32GtS().if().i32Const(8).localSet(
      count,
    ).end();
    f.localGet(offsets).localGet(j0).i32Const(2).i32Shl().i32Add().i32Load().localSet(first);
    f.i32Const(0).localSet(contiguous);
    f.i32Const(0).localSet(split);
    f.localGet(count).i32Const(8).i32Eq().localSet(full);
    f.localGet(full).if();
    f.localGet(offsets).localGet(j0).i32Const(2).i32Shl().i32Add().i32Load(28).localGet(first).i32Sub();
    f.i32Const(7).i32Eq().localSet(contiguous);
    // A full panel across output rows (every panel when the output is narrower than 8): each
    // lane's window start once, so a row of the panel is eight plain loads and stores.
    lanePointers.forEach((pointer, l) => {
      f.localGet(xpad).localGet(offsets).localGet(j0).i32Const(2).i32Shl().i32Add().i32Load(4 * l);
      f.i32Const(2).i32Shl().i32Add().localSet(pointer);
    });
    // A panel crossing one output-row boundary (stride 1: every other panel of a 14-wide output,
    // every panel of a 7-wide one) is two contiguous runs: lanes [0, split) from the first,
    // [split, 8) from the second, read as vectors and blended. `second` is where lane 0 would
    // be read in the second run; split stays 0 where the panel is not two runs.
    for (let l = 7; l >= 1; l--) {
      f.localGet(lanePointers[l]).localGet(lanePointers[0]).i32Const(4 * l).i32Add().i32Ne().if();
      f.i32Const(l).localSet(split);
      f.localGet(lanePointers[l]).i32Const(4 * l).i32Sub().localSet(second);
      f.end();
    }
    for (let l = 1; l <= 7; l++) {
      f.localGet(split).i32Const(l).i32LeS().localGet(split).i32Const(0).i32GtS().i32And();
      f.localGet(lanePointers[l]).localGet(second).i32Const(4 * l).i32Add().i32Ne().i32And().if();
      f.i32Const(0).localSet(split);
      f.end();
    }
    f.v128ConstI32([0, 1, 2, 3]).localGet(split).i32x4Splat().i32x4LtS().localSet(maskLo);
    f.v128ConstI32([4, 5, 6, 7]).localGet(split).i32x4Splat().i32x4LtS().localSet(maskHi);
    f.end();
    f.localGet(contiguous).if();
    rowLoop(() => {
      f.localGet(lanePointers[0]).localGet(r).i32Add().localSet(src);
      f.localGet(dst).localGet(src).v128Load(0).v128Store(0);
      f.localGet(dst).localGet(src).v128Load(16).v128Store(16);
    });
    f.else();
    f.localGet(split).if();
    rowLoop(() => {
      for (const half of [0, 16]) {
        f.localGet(dst);
        f.localGet(lanePointers[0]).localGet(r).i32Add().v128Load(half);
        f.localGet(second).localGet(r).i32Add().v128Load(half);
        f.localGet(half === 0 ? maskLo : maskHi).v128Bitselect().v128Store(half);
      }
    });
    f.else();
    f.localGet(full).if();
    rowLoop(() => {
      lanePointers.forEach((pointer, l) => {
        f.localGet(dst).localGet(pointer).localGet(r).i32Add().f32Load().f32Store(4 * l);
      });
    });
    f.else();
    // The last panel, short of pixels: lane by lane, zeros past the last pixel.
    rowLoop(() => {
      f.forRange(lane, () => f.i32Const(0), () => f.i32Const(8), 1, () => {
        f.localGet(lane).localGet(count).i32LtS().if();
        f.localGet(dst).localGet(lane).i32Const(2).i32Shl().i32Add();
        f.localGet(xpad);
        f.localGet(offsets).localGet(j0).localGet(lane).i32Add().i32Const(2).i32Shl().i32Add().i32Load();
        f.i32Const(2).i32Shl().i32Add().localGet(r).i32Add().f32Load().f32Store();
        f.else();
        f.localGet(dst).localGet(lane).i32Const(2).i32Shl().i32Add().f32Const(0).f32Store();
        f.end();
      });
    });
    f.end();
    f.end();
    f.end();
  });
}

/**
 * Implicit im2col into the weight gradient's B panels: lanes are eight column-matrix rows
 * (c, ki, kj), depth steps are pixels. Where four consecutive pixels are consecutive input
 * columns (stride 1, one output row), each lane loads them as one vector and the eight vectors
 * are transposed with shuffles into four depth steps of eight lanes; elsewhere, and for panels
 * short of eight rows, elements move one at a time (zero past the last row).
 */
function writePackRows(f: FunctionWriter): void {
  const [xpad, dst, rowStart, rows, pixelStart, pixels, offsets, kh, kw, plane, Wp] = [
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
  const l0 = f.local(i32), count = f.local(i32), p = f.local(i32), end = f.local(i32), off = f.local(i32);
  const c = f.local(i32), ki = f.local(i32), kj = f.local(i32), rem = f.local(i32), area = f.local(i32);
  const lane = f.local(i32), r = f.local(i32);
  const base = Array.from({ length: 8 }, () => f.local(i32));
  const v = Array.from({ length: 8 }, () => f.local(v128));
  const t = Array.from({ length: 4 }, () => f.local(v128));
  f.localGet(kh).localGet(kw).i32Mul().localSet(area);
  f.localGet(pixelStart).localGet(pixels).i32Add().localSet(end);
  f.forRange(l0, () => f.i32Const(0), () => f.localGet(rows), 8, () => {
    f.localGet(rows).localGet(l0).i32Sub().localTee(count).i32Const(8).i32GtS().if().i32Const(8).localSet(
      count,
    ).end();
    f.localGet(count).i32Const(8).i32Eq().if();
    {
      // Byte address of each lane's row corner: xpad + 4·(c·plane + ki·Wp + kj).
      for (let l = 0; l < 8; l++) {
        f.localGet(rowStart).localGet(l0).i32Add().i32Const(l).i32Add().localTee(r);
        f.localGet(area).i32DivS().localSet(c);
        f.localGet(r).localGet(c).localGet(area).i32Mul().i32Sub().localSet(rem);
        f.localGet(rem).localGet(kw).i32DivS().localSet(ki);
        f.localGet(rem).localGet(ki).localGet(kw).i32Mul().i32Sub().localSet(kj);
        f.localGet(xpad);
        f.localGet(c).localGet(plane).i32Mul().localGet(ki).localGet(Wp).i32Mul().i32Add().localGet(kj)
          .i32Add();
        f.i32Const(2).i32Shl().i32Add().localSet(base[l]);
      }
      f.localGet(pixelStart).localSet(p);
      f.block().loop();
      f.localGet(p).localGet(end).i32GeS().brIf(1);
      f.localGet(offsets).localGet(p).i32Const(2).i32Shl().i32Add().i32Load().i32Const(2).i32Shl().localSet(
        off,
      );
      // Four more pixels that are consecutive input columns? (flag in `lane`)
      f.i32Const(0).localSet(lane);
      f.localGet(p).i32Const(4).i32Add().localGet(end).i32LeS().if();
      f.localGet(offsets).localGet(p).i32Const(2).i32Shl().i32Add().i32Load(12);
      f.localGet(offsets).localGet(p).i32Const(2).i32Shl().i32Add().i32Load().i32Sub().i32Const(3).i32Eq();
      f.localSet(lane);
      f.end();
      f.localGet(lane).if();
      {
        for (let l = 0; l < 8; l++) f.localGet(base[l]).localGet(off).i32Add().v128Load().localSet(v[l]);
        for (let g = 0; g < 2; g++) {
          const [a, b, cc, d] = [v[4 * g], v[4 * g + 1], v[4 * g + 2], v[4 * g + 3]];
          f.localGet(a).localGet(b).shuffleF32Lanes([0, 4, 1, 5]).localSet(t[0]);
          f.localGet(a).localGet(b).shuffleF32Lanes([2, 6, 3, 7]).localSet(t[1]);
          f.localGet(cc).localGet(d).shuffleF32Lanes([0, 4, 1, 5]).localSet(t[2]);
          f.localGet(cc).localGet(d).shuffleF32Lanes([2, 6, 3, 7]).localSet(t[3]);
          const columns: [number, number, [number, number, number, number]][] = [
            [t[0], t[2], [0, 1, 4, 5]],
            [t[0], t[2], [2, 3, 6, 7]],
            [t[1], t[3], [0, 1, 4, 5]],
            [t[1], t[3], [2, 3, 6, 7]],
          ];
          columns.forEach(([x, y, lanes], step) => {
            f.localGet(dst).localGet(x).localGet(y).shuffleF32Lanes(lanes).v128Store(step * 32 + g * 16);
          });
        }
        f.localGet(dst).i32Const(128).i32Add().localSet(dst);
        f.localGet(p).i32Const(4).i32Add().localSet(p);
      }
      f.else();
      {
        for (let l = 0; l < 8; l++) {
          f.localGet(dst).localGet(base[l]).localGet(off).i32Add().f32Load().f32Store(l * 4);
        }
        f.localGet(dst).i32Const(32).i32Add().localSet(dst);
        f.localGet(p).i32Const(1).i32Add().localSet(p);
      }
      f.end();
      f.br(0).end().end();
    }
    f.else();
    {
      // A panel short of eight rows: element by element, zero lanes past the last row.
      f.forRange(p, () => f.localGet(pixelStart), () => f.localGet(end), 1, () => {
        f.localGet(offsets).localGet(p).i32Const(2).i32Shl().i32Add().i32Load().localSet(off);
        f.forRange(lane, () => f.i32Const(0), () => f.i32Const(8), 1, () => {
          f.localGet(lane).localGet(count).i32LtS().if();
          f.localGet(rowStart).localGet(l0).i32Add().localGet(lane).i32Add().localTee(r);
          f.localGet(area).i32DivS().localSet(c);
          f.localGet(r).localGet(c).localGet(area).i32Mul().i32Sub().localSet(rem);
          f.localGet(rem).localGet(kw).i32DivS().localSet(ki);
          f.localGet(rem).localGet(ki).localGet(kw).i32Mul().i32Sub().localSet(kj);
          f.localGet(dst).localGet(lane).i32Const(2).i32Shl().i32Add();
          f.localGet(xpad);
          f.localGet(c).localGet(plane).i32Mul().localGet(ki).localGet(Wp).i32Mul().i32Add().localGet(kj)
            .i32Add();
          f.localGet(off).i32Add().i32Const(2).i32Shl().i32Add().f32Load().f32Store();
          f.else();
          f.localGet(dst).localGet(lane).i32Const(2).i32Shl().i32Add().f32Const(0).f32Store();
          f.end();
        });
        f.localGet(dst).i32Const(32).i32Add().localSet(dst);
      });
    }
    f.end();
  });
}

/**
 * Adds im2col, col2im-add and fill to `builder`, exported under {@link CONV_EXPORTS}.
 *
 * @example
 * ```ts
 * import { ModuleBuilder } from "./encoder.ts";
 * import { emitConvKernels } from "./conv_kernels.ts";
 * const builder = new ModuleBuilder().importMemory({
 *   module: "env", name: "memory", initialPages: 1, maximumPages: 16, shared: false,
 * });
 * emitConvKernels(builder);
 * console.log(WebAssembly.validate(builder.build())); // true
 * ```
 */
export function emitConvKernels(builder: ModuleBuilder): void {
  builder.addFunction(CONV_EXPORTS.im2col, Array(14).fill(i32), [], writeIm2col);
  builder.addFunction(CONV_EXPORTS.col2imAdd, Array(14).fill(i32), [], writeCol2imAdd);
  builder.addFunction(CONV_EXPORTS.fillZero, [i32, i32], [], (f) => {
    f.localGet(0).i32Const(0).localGet(1).memoryFill();
  });
  builder.addFunction(CONV_EXPORTS.pad, Array(9).fill(i32), [], writePad);
  builder.addFunction(CONV_EXPORTS.packColumns, Array(8).fill(i32), [], writePackColumns);
  builder.addFunction(CONV_EXPORTS.packRows, Array(11).fill(i32), [], writePackRows);
  builder.addFunction(CONV_EXPORTS.col2imPadded, Array(9).fill(i32), [], writeCol2imPadded);
  builder.addFunction(CONV_EXPORTS.unpad, Array(9).fill(i32), [], writeUnpad);
}
