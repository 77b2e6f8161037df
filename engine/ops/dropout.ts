/**
 * Inverted dropout with masks from the counter-based generator, keyed by position rather than call
 * order: the same (seed, stream, offset) gives the same mask on any device and after a resume.
 *
 * @module
 */

import { recordOp } from "../autograd.ts";
import { ValueError } from "../errors.ts";
import { nextGlobalKey, philoxWords, type RandomKey, uniformValues } from "../random.ts";
import { Tensor } from "../tensor.ts";
import { reshape } from "./movement.ts";
import { binaryRaw, checkOperands } from "./raw.ts";

/** Options of {@link dropout}. */
export interface DropoutOptions extends Partial<RandomKey> {
  /** Probability of zeroing an element, in [0, 1). */
  p: number;
  /** Dropout applies only in training; evaluation passes `x` through unchanged. Default true. */
  training?: boolean;
  /** First position of the mask in the random sequence (e.g. global sample index × features). */
  offset?: number;
  /**
   * `x` (`[rows, width]`) holds columns `start … start+width−1` of rows `total` wide, as a device
   * holding a slice of a layer's units does: element (r, c) takes position
   * `offset + r·total + start + c`, so the slice draws exactly the mask the whole layer would.
   * With `rows`, row r stands for row `rows[r]` of the whole layer's input (position
   * `offset + rows[r]·total + start + c`): rows gathered from several devices' micro-batches are not
   * consecutive samples.
   */
  columns?: { start: number; total: number; rows?: ArrayLike<number> };
}

/**
 * Zeroes each element with probability `p` and scales survivors by `1/(1−p)` during training, so
 * evaluation needs no rescaling (as PyTorch and Caffe do).
 *
 * @example
 * ```ts
 * import { ops, ones } from "../../mod.ts";
 * const y = ops.dropout(ones([4, 4096]), { p: 0.5, seed: 1, stream: 6 });
 * ```
 */
export function dropout(x: Tensor, options: DropoutOptions): Tensor {
  checkOperands("dropout", x);
  const { p } = options;
  if (!(p >= 0 && p < 1)) throw new ValueError("dropout", `p must be in [0, 1), got ${p}`);
  const offset = options.offset ?? 0;
  if (!Number.isSafeInteger(offset) || offset < 0) {
    throw new ValueError("dropout", `offset must be a non-negative integer, got ${offset}`);
  }
  // A view, not `x` itself, so callers can dispose the result as they would in training.
  if (options.training === false || p === 0) return reshape(x, x.shape);
  const key = options.seed !== undefined
    ? { seed: options.seed, stream: options.stream ?? 0, step: options.step ?? 0 }
    : nextGlobalKey();
  const mask = maskOf(x, key, options, p, offset);
  const out = binaryRaw("mul", x, mask, "dropout");
  recordOp("dropout", [x], out, [mask], (dy) => [binaryRaw("mul", dy, mask)]);
  mask.dispose();
  return out;
}

/**
 * The mask `keep = 1/(1−p)` where the uniform is at least p, else 0: drawn by the backend where it
 * can (the whole layer's mask as one run of positions; a block of columns as one run per row, where
 * the backend can address part of a storage), else here from {@link maskUniforms}.
 */
function maskOf(x: Tensor, key: RandomKey, options: DropoutOptions, p: number, offset: number): Tensor {
  const keep = 1 / (1 - p), backend = x.backend, columns = options.columns;
  if (columns) checkColumns(x, columns);
  if (backend.dropoutMask && (!columns || backend.view)) {
    const [k0, k1, stream, step] = philoxWords(key);
    const storage = backend.allocateUninitialized?.(x.size, "float32") ?? backend.allocate(x.size, "float32");
    // A uniform (word >>> 8)·2^-24 is at least p exactly when its numerator is at least ⌈p·2^24⌉.
    const spec = { key: [k0, k1], stream, step, offset, threshold: Math.ceil(p * 2 ** 24), keep } as const;
    let drawn: boolean;
    if (!columns) drawn = backend.dropoutMask(storage, spec);
    else {
      // Row r of the block is positions row·total + start … of the whole layer's mask: one run each
      // (a device's slice of a hybrid head; drawn here in TypeScript, 64 rows of 384 took ≈ 1 ms).
      const [rows, width] = x.shape;
      drawn = true;
      for (let r = 0; r < rows && drawn; r++) {
        const row = columns.rows ? columns.rows[r] : r;
        const part = backend.view!(storage, r * width, width);
        drawn = backend.dropoutMask(part, { ...spec, offset: offset + row * columns.total + columns.start });
        backend.release(part);
      }
    }
    if (drawn) return new Tensor(backend, storage, x.shape);
    backend.release(storage);
  }
  const uniforms = maskUniforms(x, key, options);
  const values = new Float32Array(x.size);
  for (let i = 0; i < values.length; i++) values[i] = uniforms[i] >= p ? keep : 0;
  return new Tensor(backend, backend.upload(values), x.shape);
}

/** Refuses a block of columns that does not fit `x` (`[rows, width]`), in one line. */
function checkColumns(x: Tensor, columns: NonNullable<DropoutOptions["columns"]>): void {
  const [, width] = x.shape;
  const rowsGiven = columns.rows;
  if (
    x.rank !== 2 || columns.start < 0 || columns.start + width > columns.total ||
    (rowsGiven !== undefined && rowsGiven.length !== x.shape[0])
  ) {
    throw new ValueError(
      "dropout",
      `columns ${columns.start}…${columns.start + width - 1} of rows ${columns.total} wide${
        rowsGiven ? ` (${rowsGiven.length} rows)` : ""
      } do not fit ${JSON.stringify(x.shape)}`,
    );
  }
}

/** The uniforms behind the mask: one run, or one run per row for a block of columns. */
function maskUniforms(x: Tensor, key: RandomKey, options: DropoutOptions): Float32Array {
  const offset = options.offset ?? 0;
  const columns = options.columns;
  if (!columns) return uniformValues(x.size, key, offset);
  const [rows, width] = x.shape;
  const out = new Float32Array(x.size);
  for (let r = 0; r < rows; r++) {
    const row = columns.rows ? columns.rows[r] : r;
    out.set(uniformValues(width, key, offset + row * columns.total + columns.start), r * width);
  }
  return out;
}
