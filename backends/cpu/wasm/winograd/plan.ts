/**
 * Which convolutions run by Winograd's F(4×4, r×r) on the CPU kernels, and how a pass lays out:
 * its tiles and quads, the image chunks of a weight gradient, the shared and per-thread buffers
 * (one stride per tile position, an odd number of cache lines), the lane tables, and the task the
 * kernel threads receive. What the phases do with it is in `phases.ts`.
 *
 * @module
 */

import type { Conv2dGeometry } from "../../../geometry.ts";
import { align64, GEMM_TILE } from "../gemm.ts";
import { WINOGRAD_OUTPUT_TILE, type WinogradFilterSide } from "./matrices.ts";
import { POOL_EPILOGUE_FIELDS, type PoolEpilogue } from "../pool_epilogue.ts";
import { filterChunks } from "../conv.ts";

/** Which of a convolution's three passes a plan is for. */
export type WinogradPass = "forward" | "input" | "filter";

/**
 * A pass as a Winograd convolution: for `forward` and `filter` the layer's own geometry; for
 * `input` (dx = rot180(wᵀ) ⋆ dy) dy is the image, dx the output, the channel counts swapped and
 * the padding r − 1 − p.
 */
export interface WinogradPlan {
  pass: WinogradPass;
  r: WinogradFilterSide;
  /** Input tile side r + 3. */
  alpha: number;
  batch: number;
  groups: number;
  /** Depth of the forward-type GEMMs: input channels per group of the pass. */
  depth: number;
  /** Outputs per group of the pass (filters for forward, the layer's input channels for input). */
  outputs: number;
  inHeight: number;
  inWidth: number;
  outHeight: number;
  outWidth: number;
  padTop: number;
  padLeft: number;
  /** Tile rows and columns per image: ⌈out / 4⌉. */
  tileRows: number;
  tileColumns: number;
  /** Tiles per image, and the quads of four they are multiplied in (the last one padded). */
  tiles: number;
  quads: number;
  /** The zero-padded input plane the tiles are read from: (4·tileRows + r − 1) × (4·tileColumns + r − 1). */
  paddedHeight: number;
  paddedWidth: number;
  /**
   * Images per chunk of a weight gradient: as many as keep the chunk's transformed tiles (V and Ŷ)
   * within {@link CACHED_CHUNK_BYTES} or {@link CHUNK_BYTES} (by the size of the sums), at least
   * one; it depends on the geometry alone, so the sums (chunk by chunk) never depend on the thread
   * count. The whole batch for forward-type passes, which take
   * one image at a time.
   */
  chunkImages: number;
  /**
   * Image parts of a weight gradient whose sums Z are small (at most {@link CACHED_CHUNK_BYTES}):
   * the batch cut as the im2col path cuts it (`filterChunks` in `conv.ts`), each part summed
   * whole by one thread into a Z of its own, chunk by chunk in that thread's scratch, and the
   * parts' Z added in part order before the last transform. 1 (one Z, each chunk's tiles shared by
   * the threads) where Z is larger, and for forward-type passes.
   */
  parts: number;
}

/**
 * The filter side a pass would run by Winograd with, or `undefined` for the im2col path: square
 * 3×3 or 5×5 filters, stride 1, padding at most r − 1 (so the input gradient's is not negative),
 * and the pass's outputs per group a multiple of 4, at least 8 (the output transform moves four
 * channels per vector). The forward pass and the input gradient need depth · r² ≥ 64, below which
 * the output transform costs more than the multiplications it saves (on cifar10_quick's conv1, 3
 * channels of 5×5, the forward pass ran 1.3–1.4× faster than im2col; on the AlexNet-like conv1, 1
 * channel, 0.5–0.6×); the weight gradient moves four input channels per vector as well, so it
 * needs them a multiple of 4, at least 8.
 *
 * @example
 * ```ts
 * import { conv2dGeometry } from "../../../geometry.ts";
 * import { winogradSide } from "./plan.ts";
 * const conv1 = conv2dGeometry([64, 3, 32, 32], [32, 3, 5, 5], { padding: 2 });
 * winogradSide(conv1, "forward"); // 5
 * winogradSide(conv1, "filter"); // undefined
 * ```
 */
export function winogradSide(g: Conv2dGeometry, pass: WinogradPass): WinogradFilterSide | undefined {
  const r = g.kernelH;
  if ((r !== 3 && r !== 5) || g.kernelW !== r || g.strideH !== 1 || g.strideW !== 1) return undefined;
  if (g.padH > r - 1 || g.padW > r - 1) return undefined;
  const c = g.inChannels / g.groups, k = g.outChannels / g.groups;
  const outputs = pass === "input" ? c : k, depth = pass === "input" ? k : c;
  if (outputs % 4 !== 0 || outputs < 8 || depth * r * r < 64) return undefined;
  if (pass === "filter" && (depth % 4 !== 0 || depth < 8)) return undefined;
  return r;
}

/**
 * Bytes of one weight-gradient chunk's transformed tiles (V and Ŷ) where the layer's sums Z are
 * small enough to be read and written once per chunk (at most as many bytes): the chunk then stays
 * in a core's L2 cache between the tiles phase that writes it and the products phase that reads it.
 * With 16 MB chunks, the AlexNet-like net's conv2 took its whole batch in one 14 MB chunk, and its
 * weight gradient ran at 4.7–4.9 ms inside a training step against 3.6–4.0 with 1 MB chunks
 * (2 threads; 8.7 against 4.3 ms on 1 thread with its operands out of cache). A constant, not the
 * cache size the OS reports: the chunks set the order of the sums, which must not depend on the
 * machine.
 */
const CACHED_CHUNK_BYTES = 1 << 20;
/**
 * Bytes of one chunk's V and Ŷ where Z is larger (AlexNet's conv2–conv5, Z 3–14 MB): fewer,
 * longer chunks, each within reach of the last-level cache, so Z's traffic does not grow with the
 * chunk count (1 MB chunks ran those layers 5–11% slower).
 */
const CHUNK_BYTES = 16 << 20;

/**
 * The plan of one pass of a convolution that {@link winogradSide} accepts.
 *
 * @example
 * ```ts
 * import { conv2dGeometry } from "../../../geometry.ts";
 * import { winogradPlan } from "./plan.ts";
 * const plan = winogradPlan(conv2dGeometry([2, 8, 7, 7], [8, 8, 3, 3], { padding: 1 }), "forward");
 * console.log(plan.tileRows, plan.quads, plan.paddedWidth); // 2 1 10
 * ```
 */
export function winogradPlan(g: Conv2dGeometry, pass: WinogradPass): WinogradPlan {
  const r = winogradSide(g, pass);
  if (r === undefined) throw new RangeError(`winogradPlan: the ${pass} pass has no Winograd path`);
  const alpha = r + WINOGRAD_OUTPUT_TILE - 1, m = WINOGRAD_OUTPUT_TILE;
  const input = pass === "input";
  const inHeight = input ? g.outHeight : g.inHeight, inWidth = input ? g.outWidth : g.inWidth;
  const outHeight = input ? g.inHeight : g.outHeight, outWidth = input ? g.inWidth : g.outWidth;
  const tileRows = Math.ceil(outHeight / m), tileColumns = Math.ceil(outWidth / m);
  const tiles = tileRows * tileColumns, quads = Math.ceil(tiles / 4);
  const depth = (input ? g.outChannels : g.inChannels) / g.groups;
  const outputs = (input ? g.inChannels : g.outChannels) / g.groups;
  const perImage = 4 * alpha * alpha * g.groups * tiles * (depth + outputs);
  const smallSums = 4 * alpha * alpha * g.groups * depth * outputs <= CACHED_CHUNK_BYTES;
  return {
    pass,
    r,
    alpha,
    batch: g.batch,
    groups: g.groups,
    depth,
    outputs,
    inHeight,
    inWidth,
    outHeight,
    outWidth,
    padTop: input ? r - 1 - g.padH : g.padH,
    padLeft: input ? r - 1 - g.padW : g.padW,
    tileRows,
    tileColumns,
    tiles,
    quads,
    paddedHeight: m * tileRows + r - 1,
    paddedWidth: m * tileColumns + r - 1,
    chunkImages: pass === "filter"
      ? Math.max(
        1,
        Math.min(g.batch, Math.floor(filterChunkBytes(alpha, g.groups, depth, outputs) / perImage)),
      )
      : g.batch,
    parts: pass === "filter" && smallSums ? filterChunks(g) : 1,
  };
}

/** Bytes of V and Ŷ per weight-gradient chunk for a layer of this shape (see {@link CACHED_CHUNK_BYTES}). */
function filterChunkBytes(alpha: number, groups: number, depth: number, outputs: number): number {
  const sums = 4 * alpha * alpha * groups * depth * outputs;
  return sums <= CACHED_CHUNK_BYTES ? CACHED_CHUNK_BYTES : CHUNK_BYTES;
}

/**
 * A Winograd phase as the kernel threads receive it: the plan's numbers, where the operands lie
 * (byte addresses), and which phase of which chunk to run.
 */
export interface WinogradTask extends PoolEpilogue {
  phase: number;
  /** First image of the chunk and its image count (the whole batch for `filterParts`). */
  first: number;
  images: number;
  /** A weight gradient's parts and images per chunk ({@link WinogradPlan}). */
  parts: number;
  chunkImages: number;
  r: number;
  groups: number;
  depth: number;
  outputs: number;
  inHeight: number;
  inWidth: number;
  outHeight: number;
  outWidth: number;
  padTop: number;
  padLeft: number;
  /** The pass's image (x, or dy for the input gradient) and output (y, dx, or dy for the weight gradient). */
  image: number;
  output: number;
  /** Transformed filters (forward, input gradient) or the weight gradient's sums Z. */
  filters: number;
  /** Transformed input tiles V, and products M (forward, input gradient) or transformed dy Ŷ. */
  tilesV: number;
  tilesM: number;
  /** The int32 lane tables ({@link winogradTables}). */
  tables: number;
  /** Forward: bias address (0 for none) and ReLU; weight gradient: dw. */
  bias: number;
  relu: number;
  weightGradient: number;
  scratch: number;
  scratchStride: number;
}

/**
 * The phases: a forward-type pass runs one (`images`: each image's tiles transformed, multiplied
 * and transformed back by one thread). The weight gradient, with one part, chunk by chunk
 * transforms x's and dy's tiles (`filterTiles`) and sums their products into Z
 * (`filterProducts`); with several, each thread takes whole parts, transforming and summing
 * their chunks in its own scratch into each part's Z (`filterParts`), and the parts' Z are added
 * in order (`filterSum`). Either way Z is transformed once at the end (`filterGradient`).
 */
export const WinogradPhase = {
  images: 1,
  filterTiles: 4,
  filterProducts: 5,
  filterGradient: 6,
  filterParts: 7,
  filterSum: 8,
} as const;

/** The task's fields in the order threads decode them. */
export const WINOGRAD_FIELDS = [
  "phase",
  "first",
  "images",
  "parts",
  "chunkImages",
  "r",
  "groups",
  "depth",
  "outputs",
  "inHeight",
  "inWidth",
  "outHeight",
  "outWidth",
  "padTop",
  "padLeft",
  "image",
  "output",
  "filters",
  "tilesV",
  "tilesM",
  "tables",
  "bias",
  "relu",
  "weightGradient",
  "scratch",
  "scratchStride",
  ...POOL_EPILOGUE_FIELDS,
] as const;

/** The numbers every phase derives from a task (sizes in floats unless named bytes). */
export interface Layout {
  m: number;
  alpha: number;
  positions: number;
  tileRows: number;
  tileColumns: number;
  tiles: number;
  quads: number;
  paddedHeight: number;
  paddedWidth: number;
  paddedPlane: number;
  /** Padded output planes (4·tileRows × 4·tileColumns), where the output is not whole tiles. */
  outPlane: number;
  wholeTiles: boolean;
  /** Depth blocks of the forward-type GEMMs (over channels) and of the weight gradient's (over tiles). */
  outputs8: number;
  chunkQuads: number;
  chunkTiles: number;
  /** Bytes from one tile position to the next in each shared buffer ({@link positionStrides}). */
  strides: PositionStrides;
}

export function layoutOf(task: WinogradTask): Layout {
  const m = WINOGRAD_OUTPUT_TILE, alpha = task.r + m - 1;
  const tileRows = Math.ceil(task.outHeight / m), tileColumns = Math.ceil(task.outWidth / m);
  const tiles = tileRows * tileColumns, quads = Math.ceil(tiles / 4);
  const paddedHeight = m * tileRows + task.r - 1, paddedWidth = m * tileColumns + task.r - 1;
  return {
    m,
    alpha,
    positions: alpha * alpha,
    tileRows,
    tileColumns,
    tiles,
    quads,
    paddedHeight,
    paddedWidth,
    paddedPlane: paddedHeight * paddedWidth,
    outPlane: m * tileRows * m * tileColumns,
    wholeTiles: task.outHeight % m === 0 && task.outWidth % m === 0,
    outputs8: Math.ceil(task.outputs / GEMM_TILE.nr) * GEMM_TILE.nr,
    chunkQuads: task.images * quads,
    chunkTiles: task.images * tiles,
    strides: positionStrides(
      task.phase >= WinogradPhase.filterTiles,
      task.images,
      tiles,
      task.depth,
      task.outputs,
    ),
  };
}

/** Per tile position, the bytes of the transformed filters (or Z), of V and of M (or Ŷ). */
interface PositionStrides {
  filters: number;
  tilesV: number;
  tilesM: number;
}

/**
 * Bytes per tile position in each shared buffer, rounded up to an odd number of cache lines: a
 * transform writes (or reads) all α² positions of a tile one stride apart, and with strides of a
 * power of two (128 KiB for cifar10_quick's conv2) every one of them fell in the same cache sets,
 * which made the transforms 3–7× slower.
 */
function positionStrides(
  filterPass: boolean,
  images: number,
  tiles: number,
  depth: number,
  outputs: number,
): PositionStrides {
  const nr = GEMM_TILE.nr, quads = Math.ceil(tiles / 4);
  const oddLines = (bytes: number) => 64 * (Math.ceil(bytes / 64) | 1);
  const whole = (n: number) => Math.ceil(n / nr) * nr;
  if (filterPass) {
    return {
      filters: oddLines(4 * outputs * depth),
      tilesV: oddLines(4 * images * tiles * whole(depth)),
      tilesM: oddLines(4 * images * tiles * outputs),
    };
  }
  return {
    filters: oddLines(4 * whole(outputs) * depth),
    tilesV: oddLines(16 * images * quads * depth),
    tilesM: oddLines(16 * images * quads * outputs),
  };
}

/**
 * The int32 tables the transforms read their lane offsets from, in bytes: each quad's four tile
 * corners in a padded plane (the last quad's missing tiles repeat its last), then four lanes
 * of consecutive channels in a padded input plane, in a padded (or whole) dy plane, in an output
 * plane, of consecutive filters, of consecutive input channels of one filter, and of consecutive
 * r×r blocks.
 *
 * @example
 * ```ts
 * import { conv2dGeometry } from "../../../geometry.ts";
 * import { winogradPlan, winogradTables } from "./plan.ts";
 * winogradTables(winogradPlan(conv2dGeometry([1, 8, 8, 8], [8, 8, 3, 3], { padding: 1 }), "forward")).length;
 * ```
 */
export function winogradTables(plan: WinogradPlan): Int32Array {
  const m = WINOGRAD_OUTPUT_TILE, { r, tiles, quads, tileColumns, paddedWidth } = plan;
  const out = new Int32Array(4 * quads + 4 * TABLE.count);
  for (let q = 0; q < quads; q++) {
    for (let l = 0; l < 4; l++) {
      const t = Math.min(4 * q + l, tiles - 1), ty = Math.floor(t / tileColumns), tx = t % tileColumns;
      out[4 * q + l] = 4 * (m * ty * paddedWidth + m * tx);
    }
  }
  const whole = plan.outHeight % m === 0 && plan.outWidth % m === 0;
  const outPlane = whole ? plan.outHeight * plan.outWidth : m * plan.tileRows * m * tileColumns;
  const paddedPlane = plan.paddedHeight * paddedWidth;
  // dy of the weight gradient is the pass's output: whole, or padded to whole tiles.
  const strides = [paddedPlane, outPlane, outPlane, plan.depth * r * r, r * r, r * r];
  strides.forEach((stride, i) => {
    for (let l = 0; l < 4; l++) out[4 * quads + 4 * i + l] = 4 * l * stride;
  });
  return out;
}

/** Where each four-lane table lies after the quads' corners, in tables of four. */
export const TABLE = {
  inputChannels: 0,
  gradientChannels: 1,
  outputChannels: 2,
  filters: 3,
  filterChannels: 4,
  blocks: 5,
  count: 6,
} as const;

export function tableAt(task: WinogradTask, layout: Layout, which: number): number {
  return task.tables + 16 * (layout.quads + which);
}

/**
 * Bytes of one thread's scratch: the padded input image, a padded output (forward-type passes
 * whose output is not whole tiles) or padded dy (weight gradient), the macro-kernel's edge tile,
 * and where the thread transforms what it multiplies: one image's V and M (forward-type passes),
 * one chunk's V and Ŷ (a weight gradient in parts).
 *
 * @example
 * ```ts
 * import { conv2dGeometry } from "../../../geometry.ts";
 * import { winogradPlan, winogradThreadBytes } from "./plan.ts";
 * winogradThreadBytes(winogradPlan(conv2dGeometry([1, 8, 7, 7], [8, 8, 3, 3], { padding: 1 }), "forward"));
 * ```
 */
export function winogradThreadBytes(plan: WinogradPlan): number {
  const m = WINOGRAD_OUTPUT_TILE;
  const padded = 4 * plan.groups * plan.depth * plan.paddedHeight * plan.paddedWidth + 64;
  const out = 4 * plan.groups * plan.outputs * m * plan.tileRows * m * plan.tileColumns + 64;
  const filter = plan.pass === "filter";
  const strides = filter
    ? positionStrides(true, plan.chunkImages, plan.tiles, plan.depth, plan.outputs)
    : positionStrides(false, 1, plan.tiles, plan.depth, plan.outputs);
  const tiles = filter && plan.parts === 1
    ? 0
    : plan.groups * plan.alpha * plan.alpha * (strides.tilesV + strides.tilesM);
  return 64 + align64(padded) + align64(out) + align64(4 * GEMM_TILE.mr * GEMM_TILE.nr) + tiles + 64;
}

/**
 * Bytes of the shared buffers: transformed filters (or the weight gradient's Z, one per part),
 * and one chunk's transformed tiles V and products M (or transformed dy Ŷ; none with several
 * parts, whose chunks are in each thread's scratch).
 *
 * @example
 * ```ts
 * import { conv2dGeometry } from "../../../geometry.ts";
 * import { winogradPlan, winogradSharedBytes } from "./plan.ts";
 * winogradSharedBytes(winogradPlan(conv2dGeometry([2, 8, 8, 8], [8, 8, 3, 3], { padding: 1 }), "forward"));
 * ```
 */
export function winogradSharedBytes(plan: WinogradPlan): { filters: number; tilesV: number; tilesM: number } {
  const count = plan.alpha * plan.alpha * plan.groups;
  const strides = positionStrides(
    plan.pass === "filter",
    plan.chunkImages,
    plan.tiles,
    plan.depth,
    plan.outputs,
  );
  if (plan.pass !== "filter") return { filters: count * strides.filters, tilesV: 0, tilesM: 0 };
  if (plan.parts > 1) return { filters: plan.parts * count * strides.filters, tilesV: 0, tilesM: 0 };
  return {
    filters: count * strides.filters,
    tilesV: count * strides.tilesV + 64,
    tilesM: count * strides.tilesM + 64,
  };
}
