/**
 * Shape arithmetic shared by every backend: output sizes of convolution and pooling, and the
 * validation that goes with them. Pure functions on plain numbers; no engine imports, so any
 * backend (or test) can use them without pulling in tensors.
 *
 * @module
 */

/**
 * Geometry that does not fit an op. The engine rethrows it as its `ShapeError`, so users catch one
 * class whichever layer found the problem.
 *
 * @example
 * ```ts
 * import { GeometryError } from "./geometry.ts";
 * const e = new GeometryError("maxPool2d", "kernel 5 larger than padded input 3");
 * console.log(e.op, e.detail);
 * ```
 */
export class GeometryError extends Error {
  constructor(readonly op: string, readonly detail: string) {
    super(`${op}: ${detail}`);
    this.name = "GeometryError";
  }
}

/** Fully resolved geometry of a 2-D convolution over an NCHW batch with OIHW weights. */
export interface Conv2dGeometry {
  /** Images in the batch (N). */
  batch: number;
  /** Input channels (C). */
  inChannels: number;
  /** Input height. */
  inHeight: number;
  /** Input width. */
  inWidth: number;
  /** Output channels (filters). */
  outChannels: number;
  /** Kernel height. */
  kernelH: number;
  /** Kernel width. */
  kernelW: number;
  /** Vertical stride. */
  strideH: number;
  /** Horizontal stride. */
  strideW: number;
  /** Zero padding above and below. */
  padH: number;
  /** Zero padding left and right. */
  padW: number;
  /** Channel groups; each output group sees only its input group. */
  groups: number;
  /** Output height. */
  outHeight: number;
  /** Output width. */
  outWidth: number;
}

/** Fully resolved geometry of a 2-D pooling over an NCHW batch. */
export interface Pool2dGeometry {
  /** Images in the batch (N). */
  batch: number;
  /** Channels (C), pooled independently. */
  channels: number;
  /** Input height. */
  inHeight: number;
  /** Input width. */
  inWidth: number;
  /** Kernel height. */
  kernelH: number;
  /** Kernel width. */
  kernelW: number;
  /** Vertical stride. */
  strideH: number;
  /** Horizontal stride. */
  strideW: number;
  /** Zero padding above and below. */
  padH: number;
  /** Zero padding left and right. */
  padW: number;
  /** Output height. */
  outHeight: number;
  /** Output width. */
  outWidth: number;
}

/** Caffe across-channel local response normalisation parameters (`size` channels, odd). */
export interface LrnParams {
  /** Channels in the window, odd, centred on each channel. */
  size: number;
  /** Scale of the squared sum; Caffe divides it by `size`. */
  alpha: number;
  /** Exponent. */
  beta: number;
  /** Additive constant (Caffe default 1). */
  k: number;
}

/** A size given either for both spatial axes or as `[h, w]`. */
export type Pair = number | readonly [number, number];

/** Options of {@link conv2dGeometry}; `groups` defaults to 1, stride to 1, padding to 0. */
export interface Conv2dOptions {
  stride?: Pair;
  padding?: Pair;
  groups?: number;
}

/** Options of {@link pool2dGeometry}; stride defaults to the kernel size, padding to 0. */
export interface Pool2dOptions {
  /** Window size (height, width; one number for both). */
  kernel: Pair;
  /** Step between windows (default: the kernel size). */
  stride?: Pair;
  /** Implicit padding on each side (default 0). */
  padding?: Pair;
}

/**
 * Single exit point for shape errors, so the engine can later redirect it to its own error class.
 */
function geometryError(op: string, message: string): never {
  throw new GeometryError(op, message);
}

function fmt(shape: readonly number[]): string {
  return `[${shape.join(", ")}]`;
}

function pair(op: string, name: string, v: Pair): [number, number] {
  const p: [number, number] = typeof v === "number" ? [v, v] : [v[0], v[1]];
  if (typeof v !== "number" && v.length !== 2) {
    geometryError(op, `${name} must be a number or [h, w], got [${v.join(", ")}]`);
  }
  return p;
}

function checkNchw(op: string, what: string, shape: readonly number[]): void {
  if (shape.length !== 4) {
    geometryError(op, `${what} must be 4-D (NCHW), got shape ${fmt(shape)}`);
  }
  for (const d of shape) {
    if (!Number.isInteger(d) || d <= 0) {
      geometryError(op, `${what} dimensions must be positive integers, got shape ${fmt(shape)}`);
    }
  }
}

function checkStridePad(op: string, stride: [number, number], pad: [number, number]): void {
  for (const s of stride) {
    if (!Number.isInteger(s) || s <= 0) {
      geometryError(op, `stride must be a positive integer, got [${stride.join(", ")}]`);
    }
  }
  for (const p of pad) {
    if (!Number.isInteger(p) || p < 0) {
      geometryError(op, `padding must be a non-negative integer, got [${pad.join(", ")}]`);
    }
  }
}

/**
 * Resolves a convolution's geometry (output = floor((in + 2·pad − k) / stride) + 1, as in Caffe
 * and PyTorch) and validates the shapes.
 *
 * @example
 * ```ts
 * const g = conv2dGeometry([10, 3, 227, 227], [96, 3, 11, 11], { stride: 4 });
 * // g.outHeight === 55
 * ```
 */
export function conv2dGeometry(
  xShape: readonly number[],
  wShape: readonly number[],
  opts: Conv2dOptions = {},
): Conv2dGeometry {
  const op = "conv2d";
  checkNchw(op, "input", xShape);
  if (wShape.length !== 4) {
    geometryError(op, `weight must be 4-D [outC, inC/groups, kH, kW], got shape ${fmt(wShape)}`);
  }
  for (const d of wShape) {
    if (!Number.isInteger(d) || d <= 0) {
      geometryError(op, `weight dimensions must be positive integers, got shape ${fmt(wShape)}`);
    }
  }
  const groups = opts.groups ?? 1;
  if (!Number.isInteger(groups) || groups <= 0) {
    geometryError(op, `groups must be a positive integer, got ${groups}`);
  }
  const [stride, pad] = [pair(op, "stride", opts.stride ?? 1), pair(op, "padding", opts.padding ?? 0)];
  checkStridePad(op, stride, pad);
  const [batch, inChannels, inHeight, inWidth] = xShape;
  const [outChannels, wInChannels, kernelH, kernelW] = wShape;
  if (inChannels % groups !== 0 || outChannels % groups !== 0) {
    geometryError(
      op,
      `groups=${groups} must divide both input channels and output channels; ` +
        `input ${fmt(xShape)}, weight ${fmt(wShape)}`,
    );
  }
  if (wInChannels * groups !== inChannels) {
    geometryError(
      op,
      `channel mismatch: input ${fmt(xShape)} has ${inChannels} channels but weight ${fmt(wShape)} ` +
        `with groups=${groups} expects ${wInChannels * groups} (weight dim 1 must be inC/groups)`,
    );
  }
  const [padH, padW] = pad;
  if (kernelH > inHeight + 2 * padH || kernelW > inWidth + 2 * padW) {
    geometryError(
      op,
      `kernel ${kernelH}×${kernelW} is larger than the padded input ` +
        `${inHeight + 2 * padH}×${inWidth + 2 * padW} (input ${fmt(xShape)}, padding [${padH}, ${padW}])`,
    );
  }
  const [strideH, strideW] = stride;
  return {
    batch,
    inChannels,
    inHeight,
    inWidth,
    outChannels,
    kernelH,
    kernelW,
    strideH,
    strideW,
    padH,
    padW,
    groups,
    outHeight: Math.floor((inHeight + 2 * padH - kernelH) / strideH) + 1,
    outWidth: Math.floor((inWidth + 2 * padW - kernelW) / strideW) + 1,
  };
}

/** Caffe's pooled size: ceil rounding, then drop a last window that would start inside the padding. */
function pooledSize(input: number, kernel: number, stride: number, pad: number): number {
  let out = Math.ceil((input + 2 * pad - kernel) / stride) + 1;
  if (pad > 0 && (out - 1) * stride >= input + pad) out--;
  return out;
}

/**
 * Resolves a pooling layer's geometry with Caffe's rounding (ceil, then the padding clip), so
 * AlexNet's 3×3 stride-2 pooling maps 55 → 27 → 13 → 6.
 *
 * @example
 * ```ts
 * const g = pool2dGeometry([1, 96, 55, 55], { kernel: 3, stride: 2 });
 * // g.outHeight === 27
 * ```
 */
export function pool2dGeometry(
  xShape: readonly number[],
  opts: Pool2dOptions,
  op: string = "pool2d",
): Pool2dGeometry {
  checkNchw(op, "input", xShape);
  const [kernelH, kernelW] = pair(op, "kernel", opts.kernel);
  if (!Number.isInteger(kernelH) || !Number.isInteger(kernelW) || kernelH <= 0 || kernelW <= 0) {
    geometryError(op, `kernel must be a positive integer, got [${kernelH}, ${kernelW}]`);
  }
  const stride = pair(op, "stride", opts.stride ?? [kernelH, kernelW]);
  const pad = pair(op, "padding", opts.padding ?? 0);
  checkStridePad(op, stride, pad);
  const [strideH, strideW] = stride;
  const [padH, padW] = pad;
  // A pad as wide as the kernel would allow a window lying entirely in the padding.
  if (padH >= kernelH || padW >= kernelW) {
    geometryError(
      op,
      `padding [${padH}, ${padW}] must be smaller than the kernel [${kernelH}, ${kernelW}]`,
    );
  }
  const [batch, channels, inHeight, inWidth] = xShape;
  if (kernelH > inHeight + 2 * padH || kernelW > inWidth + 2 * padW) {
    geometryError(
      op,
      `kernel ${kernelH}×${kernelW} is larger than the padded input ` +
        `${inHeight + 2 * padH}×${inWidth + 2 * padW} (input ${fmt(xShape)}, padding [${padH}, ${padW}])`,
    );
  }
  return {
    batch,
    channels,
    inHeight,
    inWidth,
    kernelH,
    kernelW,
    strideH,
    strideW,
    padH,
    padW,
    outHeight: pooledSize(inHeight, kernelH, strideH, padH),
    outWidth: pooledSize(inWidth, kernelW, strideW, padW),
  };
}

/**
 * Validates LRN parameters and an NCHW shape; the size must be odd (as Caffe requires) so the
 * window is centred and the backward pass can reuse the forward window.
 *
 * @example
 * ```ts
 * checkLrn([2, 96, 55, 55], { size: 5, alpha: 1e-4, beta: 0.75, k: 1 });
 * ```
 */
export function checkLrn(shape: readonly number[], p: LrnParams): void {
  const op = "lrn";
  checkNchw(op, "input", shape);
  if (!Number.isInteger(p.size) || p.size <= 0 || p.size % 2 === 0) {
    geometryError(op, `size must be a positive odd integer, got ${p.size}`);
  }
  if (!Number.isFinite(p.alpha) || !Number.isFinite(p.beta) || !Number.isFinite(p.k)) {
    geometryError(op, `alpha, beta and k must be finite, got ${p.alpha}, ${p.beta}, ${p.k}`);
  }
  if (p.k <= 0 || p.alpha < 0) {
    // k > 0 and alpha ≥ 0 keep the scale strictly positive, so scale^(−beta) is defined.
    geometryError(op, `k must be positive and alpha non-negative, got k=${p.k}, alpha=${p.alpha}`);
  }
}

/**
 * True when a strided view of `shape` reads its elements in dense row-major order (size-1 axes may
 * have any stride), so a kernel can use a flat loop or one copy.
 *
 * @example
 * ```ts
 * import { isDenseView } from "./geometry.ts";
 * isDenseView({ strides: [3, 1] }, [2, 3]); // true
 * ```
 */
export function isDenseView(
  view: { readonly strides: readonly number[] },
  shape: readonly number[],
): boolean {
  let expected = 1;
  for (let d = shape.length - 1; d >= 0; d--) {
    if (shape[d] !== 1 && view.strides[d] !== expected) return false;
    expected *= shape[d];
  }
  return true;
}

/**
 * True for a 1×1, stride-1, unpadded convolution, whose input already is its column matrix.
 *
 * @example
 * ```ts
 * import { conv2dGeometry, isPointwise } from "./geometry.ts";
 * isPointwise(conv2dGeometry([1, 8, 5, 5], [4, 8, 1, 1])); // true
 * ```
 */
export function isPointwise(g: Conv2dGeometry): boolean {
  return g.kernelH === 1 && g.kernelW === 1 && g.strideH === 1 && g.strideW === 1 && g.padH === 0 &&
    g.padW === 0;
}
