/**
 * Convolutions by Winograd's minimal filtering F(4×4, r×r) for 3×3 and 5×5 stride-1 filters: the
 * multiplications of each 4×4 output tile fall from 16·r² to α² (α = r + 3), 4× fewer for 3×3
 * and 6.25× for 5×5, and what is left is α² independent GEMMs, one per tile position, run by the
 * same micro-kernel as every other product. The forward pass and the input gradient (a forward
 * convolution of dy with the filters rotated and transposed, padding r − 1 − p) share one path;
 * the weight gradient is the same algebra transposed, dW = Gᵀ [Σ (A dy Aᵀ) ⊙ (Bᵀ x B)] G.
 *
 * Forward-type passes take whole images: a thread transforms an image's tiles, multiplies every
 * position and transforms back while the image's operands are in its cache. A weight gradient runs
 * in image chunks (`WinogradPlan.chunkImages`). Where its sums Z are small, the batch is cut into
 * parts (`WinogradPlan.parts`) and a thread takes a whole part: it transforms each chunk's tiles
 * into its own scratch and sums their products into the part's own Z, so a chunk never leaves the
 * core that wrote it; the parts' Z are then added in part order. Threads that shared each chunk —
 * transforming its tiles, then taking positions — spent their time moving cache lines between
 * cores: on 2 cores the AlexNet-like conv2's weight gradient ran no faster than on one (2.7–3.6
 * against 3.3 ms). Where Z is large (AlexNet's layers) one Z per part would not fit the caches, and
 * the threads still share each chunk. Z is transformed once at the end. Every output element is
 * computed whole by one thread in an order fixed by the geometry alone (the parts, the chunks, the
 * depth blocks of {@link GEMM_DEPTH}), so results are bit-identical for any thread count. The bits
 * differ from the im2col path's by the transforms' rounding, about 1e-5 of the outputs' magnitude
 * (measured against float64 in the tests).
 *
 * @module
 */

import { align64, GEMM_DEPTH, GEMM_TILE, QUAD_ROWS } from "../gemm.ts";
import type { KernelExports } from "../generate/module.ts";
import { type Claim, imagePart } from "../conv.ts";
import { type Layout, layoutOf, TABLE, tableAt, WinogradPhase, type WinogradTask } from "./plan.ts";
import { finishImage, imageOutputAt, imageOutputBytes } from "../pool_epilogue.ts";

type Transform = (
  src: number,
  lanes: number,
  count: number,
  srcStep: number,
  dst: number,
  dstStep: number,
  inStride: number,
  outStride: number,
  wrapEvery?: number,
  srcWrap?: number,
  dstWrap?: number,
) => void;

function transformOf(x: KernelExports, name: string, r: number): Transform {
  return (x as unknown as Record<string, Transform>)[`${name}_${r}`];
}

/** Depth blocks of a GEMM of `depth`: [start, length] pairs of at most {@link GEMM_DEPTH}. */
function depthBlocks(depth: number): [number, number][] {
  const out: [number, number][] = [];
  for (let start = 0; start < depth; start += GEMM_DEPTH) {
    out.push([start, Math.min(GEMM_DEPTH, depth - start)]);
  }
  return out;
}

/**
 * Byte address of channel c of quad `quad` (of the chunk) at position `pos` in V, the
 * forward-type GEMMs' packed A: per group and position, depth blocks of {@link GEMM_DEPTH}
 * channels, each holding every quad's MR-row panel of that block ([quad][channel][4 tiles]).
 */
function packedTilesAt(
  task: WinogradTask,
  L: Layout,
  gi: number,
  pos: number,
  quad: number,
  c: number,
): number {
  const block = Math.floor(c / GEMM_DEPTH), start = block * GEMM_DEPTH;
  const length = Math.min(GEMM_DEPTH, task.depth - start);
  const base = task.tilesV + (gi * L.positions + pos) * L.strides.tilesV;
  return base + 16 * (start * L.chunkQuads + quad * length + (c - start));
}

/**
 * Byte address of the transformed filters' packed B for group gi, position pos, depth block
 * starting at channel `start`: per block, NR-output panels of its depth ([panel][channel][8]).
 */
function packedFiltersAt(task: WinogradTask, L: Layout, gi: number, pos: number, start: number): number {
  return task.filters + (gi * L.positions + pos) * L.strides.filters + 4 * start * L.outputs8;
}

/** Byte address of row `row` (quad·4 + lane) of the product M at position pos, group gi. */
function productAt(task: WinogradTask, L: Layout, gi: number, pos: number, row: number): number {
  return task.tilesM + (gi * L.positions + pos) * L.strides.tilesM + 4 * row * task.outputs;
}

/**
 * Transforms every filter of a forward-type pass into packed B at `task.filters` (zero-filled
 * first where the outputs are not whole NR panels): U = G g Gᵀ, the layer's filters for the
 * forward pass, rotated by 180° and with input and output channels swapped for the input
 * gradient. Runs once per call, before the chunks.
 *
 * @example
 * ```ts
 * import { transformFilters } from "./phases.ts";
 * // transformFilters(kernels, task, weights, flipped);
 * ```
 */
export function transformFilters(
  x: KernelExports,
  task: WinogradTask,
  weights: number,
  flipped: boolean,
): void {
  const L = layoutOf(task), r = task.r, area = 4 * r * r, nr = GEMM_TILE.nr;
  if (L.outputs8 !== task.outputs) x.fill_zero(task.filters, task.groups * L.positions * L.strides.filters);
  const transform = transformOf(x, flipped ? "winograd_filter_flipped" : "winograd_filter", r);
  const posStride = L.strides.filters;
  for (let gi = 0; gi < task.groups; gi++) {
    for (const [start, length] of depthBlocks(task.depth)) {
      const block = packedFiltersAt(task, L, gi, 0, start);
      for (let o = 0; o < task.outputs; o += 4) {
        const dst = block + 4 * (Math.floor(o / nr) * length * nr + (o % nr));
        if (!flipped) {
          // The layer's filters w[gi·K + o + lane][start + step]: lanes are filters, steps channels.
          const src = weights + area * ((gi * task.outputs + o) * task.depth + start);
          transform(src, tableAt(task, L, TABLE.filters), length, area, dst, 4 * nr, 0, posStride);
        } else {
          // Layer filters w[gi·Kf + start + step][o + lane] (Kf = the pass's depth, Cf its outputs).
          const src = weights + area * ((gi * task.depth + start) * task.outputs + o);
          transform(
            src,
            tableAt(task, L, TABLE.blocks),
            length,
            area * task.outputs,
            dst,
            4 * nr,
            0,
            posStride,
          );
        }
      }
    }
  }
}

/**
 * Runs thread `t`'s part of one Winograd phase, taking its units from `next`.
 *
 * @example
 * ```ts
 * import { runWinogradPhase } from "./phases.ts";
 * // runWinogradPhase(kernels, task, scratch, next);
 * ```
 */
export function runWinogradPhase(x: KernelExports, task: WinogradTask, scratch: number, next: Claim): void {
  const L = layoutOf(task);
  const padded = align64(scratch);
  const outPadded = align64(padded + 4 * task.groups * task.depth * L.paddedPlane + 64);
  const tile = align64(outPadded + 4 * task.groups * task.outputs * L.outPlane + 64);
  switch (task.phase) {
    case WinogradPhase.images: {
      // Each image whole on one thread, its V and M in this thread's scratch (in cache): written
      // for the batch at once, they streamed through memory and the transforms waited on it.
      const one = { ...task, images: 1 }, L1 = layoutOf(one);
      const tilesV = align64(tile + 4 * GEMM_TILE.mr * GEMM_TILE.nr);
      const tilesM = tilesV + task.groups * L1.positions * L1.strides.tilesV;
      for (let n = next(); n < task.images; n = next()) {
        const image = { ...one, first: task.first + n, tilesV, tilesM };
        forwardTiles(x, image, L1, 0, padded);
        forwardProducts(x, image, L1, tile);
        forwardOutputs(x, image, L1, 0, outPadded, scratch);
      }
      return;
    }
    case WinogradPhase.filterTiles:
      for (let n = next(); n < task.images; n = next()) filterTiles(x, task, L, n, padded, outPadded);
      return;
    case WinogradPhase.filterProducts: {
      const units = task.groups * L.positions;
      for (let u = next(); u < units; u = next()) filterProduct(x, task, L, u, tile, task.first > 0);
      return;
    }
    case WinogradPhase.filterParts: {
      const tilesV = align64(tile + 4 * GEMM_TILE.mr * GEMM_TILE.nr);
      const tilesM = tilesV +
        task.groups * L.positions * layoutOf({ ...task, images: task.chunkImages }).strides.tilesV;
      for (let p = next(); p < task.parts; p = next()) {
        filterPart(x, { ...task, tilesV, tilesM }, p, padded, outPadded, tile);
      }
      return;
    }
    case WinogradPhase.filterSum: {
      // Per group and position: Z of part 0 += each later part's, in part order.
      const units = task.groups * L.positions, floats = task.outputs * task.depth;
      const partBytes = units * L.strides.filters;
      for (let u = next(); u < units; u = next()) {
        const z = task.filters + u * L.strides.filters;
        for (let p = 1; p < task.parts; p++) x.add_scale(z, z + p * partBytes, z, floats, 1);
      }
      return;
    }
    case WinogradPhase.filterGradient: {
      const units = task.groups * task.outputs;
      for (let u = next(); u < units; u = next()) filterGradient(x, task, L, u);
      return;
    }
  }
}

/** Pads image n of the chunk (every group's channels) into `padded`. */
function padImage(x: KernelExports, task: WinogradTask, L: Layout, n: number, padded: number): void {
  const channels = task.groups * task.depth;
  const image = task.image + 4 * (task.first + n) * channels * task.inHeight * task.inWidth;
  x.conv_pad(
    image,
    padded,
    channels,
    task.inHeight,
    task.inWidth,
    task.padTop,
    task.padLeft,
    L.paddedHeight,
    L.paddedWidth,
  );
}

/** Phase 1 of a forward-type pass: image n's tiles, four to a vector, into V. */
function forwardTiles(x: KernelExports, task: WinogradTask, L: Layout, n: number, padded: number): void {
  padImage(x, task, L, n, padded);
  const transform = transformOf(x, "winograd_input", task.r);
  const posStride = L.strides.tilesV;
  for (let gi = 0; gi < task.groups; gi++) {
    for (const [start, length] of depthBlocks(task.depth)) {
      const src = padded + 4 * (gi * task.depth + start) * L.paddedPlane;
      for (let q = 0; q < L.quads; q++) {
        const dst = packedTilesAt(task, L, gi, 0, n * L.quads + q, start);
        transform(
          src,
          task.tables + 16 * q,
          length,
          4 * L.paddedPlane,
          dst,
          16,
          4 * L.paddedWidth,
          posStride,
        );
      }
    }
  }
}

/**
 * Every position's product M = V·U of one image (all its rows, each depth block added in order),
 * walking the three buffers a position stride at a time.
 */
function forwardProducts(x: KernelExports, task: WinogradTask, L: Layout, tile: number): void {
  const rows = 4 * L.chunkQuads, ldc = 4 * task.outputs;
  const { tilesV: strideV, filters: strideU, tilesM: strideM } = L.strides;
  for (let gi = 0; gi < task.groups; gi++) {
    for (let start = 0; start < task.depth; start += GEMM_DEPTH) {
      const length = Math.min(GEMM_DEPTH, task.depth - start), accumulate = start > 0 ? 1 : 0;
      let a = packedTilesAt(task, L, gi, 0, 0, start), b = packedFiltersAt(task, L, gi, 0, start);
      let c = productAt(task, L, gi, 0, 0);
      for (let pos = 0; pos < L.positions; pos++, a += strideV, b += strideU, c += strideM) {
        x.gemm_macro_quads(a, b, c, rows, task.outputs, length, ldc, accumulate, tile);
      }
    }
  }
}

/**
 * Phase 3 of a forward-type pass: image n's products back to output tiles, then bias, ReLU and any
 * pooling (the image's output then in this thread's `scratch`, see `pool_epilogue.ts`).
 */
function forwardOutputs(
  x: KernelExports,
  task: WinogradTask,
  L: Layout,
  n: number,
  outPadded: number,
  scratch: number,
): void {
  const m = L.m, channels = task.groups * task.outputs, outPlane = task.outHeight * task.outWidth;
  const image = task.first + n;
  const y = imageOutputAt(
    task,
    scratch,
    task.output,
    image,
    imageOutputBytes(channels, task.outHeight, task.outWidth),
  );
  const transform = transformOf(x, "winograd_output", task.r);
  // Whole tiles go straight into y; otherwise into padded planes whose middle is then copied out.
  const target = L.wholeTiles ? y : outPadded, plane = L.wholeTiles ? outPlane : L.outPlane;
  const rowBytes = 4 * m * L.tileColumns;
  const posStride = L.strides.tilesM;
  // One call per four outputs walks every tile: M's rows in order, the output a tile row at a time.
  for (let gi = 0; gi < task.groups; gi++) {
    const rows = productAt(task, L, gi, 0, n * 4 * L.quads);
    for (let k = 0; k < task.outputs; k += 4) {
      transform(
        rows + 4 * k,
        tableAt(task, L, TABLE.outputChannels),
        L.tiles,
        4 * task.outputs,
        target + 4 * (gi * task.outputs + k) * plane,
        4 * m,
        posStride,
        rowBytes,
        L.tileColumns,
        0,
        (m - 1) * rowBytes,
      );
    }
  }
  if (!L.wholeTiles) {
    x.conv_unpad(
      outPadded,
      y,
      channels,
      task.outHeight,
      task.outWidth,
      0,
      0,
      m * L.tileRows,
      m * L.tileColumns,
    );
  }
  finishImage(x, task, image, y, task.bias, task.relu !== 0, channels, task.outHeight, task.outWidth);
}

/**
 * Byte address of tile τ (of the chunk), channel c at position pos in the weight gradient's V, its
 * packed B: per group and position, depth blocks of {@link GEMM_DEPTH} tiles, each NR-channel
 * panels of its tiles ([panel][tile][8 channels]).
 */
function filterTilesAt(
  task: WinogradTask,
  L: Layout,
  gi: number,
  pos: number,
  tau: number,
  c: number,
): number {
  const nr = GEMM_TILE.nr, depth8 = Math.ceil(task.depth / nr) * nr;
  const block = Math.floor(tau / GEMM_DEPTH), start = block * GEMM_DEPTH;
  const length = Math.min(GEMM_DEPTH, L.chunkTiles - start);
  const base = task.tilesV + (gi * L.positions + pos) * L.strides.tilesV + 4 * start * depth8;
  return base + 4 * (Math.floor(c / nr) * length * nr + (tau - start) * nr + (c % nr));
}

/** The same for transformed dy, the weight gradient's packed A ([panel][tile][4 outputs]). */
function filterGradientsAt(
  task: WinogradTask,
  L: Layout,
  gi: number,
  pos: number,
  tau: number,
  k: number,
): number {
  const mr = QUAD_ROWS, block = Math.floor(tau / GEMM_DEPTH), start = block * GEMM_DEPTH;
  const length = Math.min(GEMM_DEPTH, L.chunkTiles - start);
  const base = task.tilesM + (gi * L.positions + pos) * L.strides.tilesM + 4 * start * task.outputs;
  return base + 4 * (Math.floor(k / mr) * length * mr + (tau - start) * mr + (k % mr));
}

/**
 * Phase 1 of a weight gradient: image n's x tiles (four channels to a vector) into V and its dy
 * tiles (four outputs to a vector) into Ŷ, a tile row at a time, split where a depth block ends.
 */
function filterTiles(
  x: KernelExports,
  task: WinogradTask,
  L: Layout,
  n: number,
  padded: number,
  dyPadded: number,
): void {
  const m = L.m;
  padImage(x, task, L, n, padded);
  const channels = task.groups * task.outputs, outPlane = task.outHeight * task.outWidth;
  let dy = task.output + 4 * (task.first + n) * channels * outPlane,
    dyRow = task.outWidth,
    dyPlane = outPlane;
  if (!L.wholeTiles) {
    x.conv_pad(
      dy,
      dyPadded,
      channels,
      task.outHeight,
      task.outWidth,
      0,
      0,
      m * L.tileRows,
      m * L.tileColumns,
    );
    dy = dyPadded;
    dyRow = m * L.tileColumns;
    dyPlane = L.outPlane;
  }
  const input = transformOf(x, "winograd_input", task.r),
    gradient = transformOf(x, "winograd_gradient", task.r);
  const vStride = L.strides.tilesV, yStride = L.strides.tilesM;
  const first = n * L.tiles, last = first + L.tiles - 1;
  if (Math.floor(first / GEMM_DEPTH) === Math.floor(last / GEMM_DEPTH)) {
    // The image's tiles lie in one depth block: one call per four channels walks them all.
    const inputWrap = 4 * m * (L.paddedWidth - L.tileColumns), dyWrap = 4 * m * (dyRow - L.tileColumns);
    for (let gi = 0; gi < task.groups; gi++) {
      for (let c = 0; c < task.depth; c += 4) {
        const src = padded + 4 * (gi * task.depth + c) * L.paddedPlane;
        const dst = filterTilesAt(task, L, gi, 0, first, c);
        input(
          src,
          tableAt(task, L, TABLE.inputChannels),
          L.tiles,
          4 * m,
          dst,
          4 * GEMM_TILE.nr,
          4 * L.paddedWidth,
          vStride,
          L.tileColumns,
          inputWrap,
          0,
        );
      }
      for (let k = 0; k < task.outputs; k += 4) {
        const src = dy + 4 * (gi * task.outputs + k) * dyPlane;
        const dst = filterGradientsAt(task, L, gi, 0, first, k);
        gradient(
          src,
          tableAt(task, L, TABLE.gradientChannels),
          L.tiles,
          4 * m,
          dst,
          4 * QUAD_ROWS,
          4 * dyRow,
          yStride,
          L.tileColumns,
          dyWrap,
          0,
        );
      }
    }
    return;
  }
  for (let gi = 0; gi < task.groups; gi++) {
    for (let ty = 0; ty < L.tileRows; ty++) {
      // Tiles [τ0, τ0 + tileColumns) of the chunk, cut where a depth block ends.
      const row0 = n * L.tiles + ty * L.tileColumns;
      for (let tau = row0; tau < row0 + L.tileColumns;) {
        const end = Math.min(row0 + L.tileColumns, (Math.floor(tau / GEMM_DEPTH) + 1) * GEMM_DEPTH);
        const tx = tau - row0;
        for (let c = 0; c < task.depth; c += 4) {
          const src = padded + 4 * ((gi * task.depth + c) * L.paddedPlane + m * ty * L.paddedWidth + m * tx);
          const dst = filterTilesAt(task, L, gi, 0, tau, c);
          input(
            src,
            tableAt(task, L, TABLE.inputChannels),
            end - tau,
            4 * m,
            dst,
            4 * GEMM_TILE.nr,
            4 * L.paddedWidth,
            vStride,
          );
        }
        for (let k = 0; k < task.outputs; k += 4) {
          const src = dy + 4 * ((gi * task.outputs + k) * dyPlane + m * ty * dyRow + m * tx);
          const dst = filterGradientsAt(task, L, gi, 0, tau, k);
          gradient(
            src,
            tableAt(task, L, TABLE.gradientChannels),
            end - tau,
            4 * m,
            dst,
            4 * QUAD_ROWS,
            4 * dyRow,
            yStride,
          );
        }
        tau = end;
      }
    }
  }
}

/**
 * Phase 2 of a weight gradient: one position's Z (+)= Ŷᵀ·V over the chunk's depth blocks; the
 * first block overwrites Z unless `onto` (a later chunk of the same Z), every later one adds.
 */
function filterProduct(
  x: KernelExports,
  task: WinogradTask,
  L: Layout,
  unit: number,
  tile: number,
  onto: boolean,
): void {
  const gi = Math.floor(unit / L.positions), pos = unit % L.positions;
  const z = task.filters + unit * L.strides.filters;
  for (let start = 0; start < L.chunkTiles; start += GEMM_DEPTH) {
    const length = Math.min(GEMM_DEPTH, L.chunkTiles - start);
    const a = filterGradientsAt(task, L, gi, pos, start, 0), b = filterTilesAt(task, L, gi, pos, start, 0);
    const accumulate = onto || start > 0 ? 1 : 0;
    x.gemm_macro_quads(a, b, z, task.outputs, task.depth, length, 4 * task.depth, accumulate, tile);
  }
}

/**
 * Part `p` of a weight gradient in parts, whole on this thread: its images chunk by chunk, each
 * chunk's tiles into `task`'s V and Ŷ (this thread's scratch) and their products summed into the
 * part's own Z, in chunk order.
 */
function filterPart(
  x: KernelExports,
  task: WinogradTask,
  p: number,
  padded: number,
  dyPadded: number,
  tile: number,
): void {
  const [n0, n1] = imagePart(task.images, task.parts, p), whole = layoutOf(task);
  const partZ = task.filters + p * task.groups * whole.positions * whole.strides.filters;
  for (let first = n0; first < n1; first += task.chunkImages) {
    const chunk = { ...task, first, images: Math.min(task.chunkImages, n1 - first), filters: partZ };
    const L = layoutOf(chunk);
    for (let n = 0; n < chunk.images; n++) filterTiles(x, chunk, L, n, padded, dyPadded);
    for (let u = 0; u < task.groups * L.positions; u++) filterProduct(x, chunk, L, u, tile, first > n0);
  }
}

/** Phase 3 of a weight gradient (after the last chunk): dW = Gᵀ Z G for one filter. */
function filterGradient(x: KernelExports, task: WinogradTask, L: Layout, unit: number): void {
  const gi = Math.floor(unit / task.outputs), k = unit % task.outputs, area = 4 * task.r * task.r;
  const z = task.filters + gi * L.positions * L.strides.filters + 4 * k * task.depth;
  const dw = task.weightGradient + area * (gi * task.outputs + k) * task.depth;
  transformOf(x, "winograd_filter_gradient", task.r)(
    z,
    tableAt(task, L, TABLE.filterChannels),
    task.depth / 4,
    16,
    dw,
    4 * area,
    L.strides.filters,
    0,
  );
}
