/**
 * Naive float64 reference implementations, written straight from the definitions with nested
 * loops. They share no code with the optimised kernels (not even the geometry helpers), so a test
 * comparing the two checks both the arithmetic and the shape rules.
 *
 * @module
 */

/** A dense row-major float64 tensor. */
export interface RefTensor {
  data: Float64Array;
  shape: number[];
}

/** A size for both spatial axes, or `[h, w]`. */
export type RefPair = number | readonly [number, number];

function hw(v: RefPair): [number, number] {
  return typeof v === "number" ? [v, v] : [v[0], v[1]];
}

/**
 * conv2d over NCHW input and [outC, inC/groups, kH, kW] weights, optional bias [outC]; output size
 * floor((in + 2·pad − k)/stride) + 1.
 */
export function conv2d(
  x: RefTensor,
  w: RefTensor,
  opts: { stride?: RefPair; padding?: RefPair; groups?: number } = {},
  bias?: Float64Array,
): RefTensor {
  const [N, C, H, W] = x.shape;
  const [O, Cg, KH, KW] = w.shape;
  const groups = opts.groups ?? 1;
  const [sh, sw] = hw(opts.stride ?? 1);
  const [ph, pw] = hw(opts.padding ?? 0);
  if (Cg * groups !== C || O % groups !== 0) throw new Error("reference conv2d: bad channels");
  const OH = Math.floor((H + 2 * ph - KH) / sh) + 1;
  const OW = Math.floor((W + 2 * pw - KW) / sw) + 1;
  const Og = O / groups;
  const y = new Float64Array(N * O * OH * OW);
  for (let n = 0; n < N; n++) {
    for (let o = 0; o < O; o++) {
      const grp = Math.floor(o / Og);
      for (let oh = 0; oh < OH; oh++) {
        for (let ow = 0; ow < OW; ow++) {
          let s = bias ? bias[o] : 0;
          for (let ci = 0; ci < Cg; ci++) {
            const c = grp * Cg + ci;
            for (let i = 0; i < KH; i++) {
              for (let j = 0; j < KW; j++) {
                const ih = oh * sh - ph + i, iw = ow * sw - pw + j;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                s += x.data[((n * C + c) * H + ih) * W + iw] * w.data[((o * Cg + ci) * KH + i) * KW + j];
              }
            }
          }
          y[((n * O + o) * OH + oh) * OW + ow] = s;
        }
      }
    }
  }
  return { data: y, shape: [N, O, OH, OW] };
}

/**
 * The gradients of {@link conv2d} (no bias) with respect to its input and its weights, given the
 * output's gradient `dy`: the same sums as the forward, each product credited to both factors.
 */
export function conv2dGradients(
  x: RefTensor,
  w: RefTensor,
  dy: RefTensor,
  opts: { stride?: RefPair; padding?: RefPair; groups?: number } = {},
): { dx: RefTensor; dw: RefTensor } {
  const [N, C, H, W] = x.shape;
  const [O, Cg, KH, KW] = w.shape;
  const [, , OH, OW] = dy.shape;
  const groups = opts.groups ?? 1, Og = O / groups;
  const [sh, sw] = hw(opts.stride ?? 1);
  const [ph, pw] = hw(opts.padding ?? 0);
  const dx = new Float64Array(x.data.length), dw = new Float64Array(w.data.length);
  for (let n = 0; n < N; n++) {
    for (let o = 0; o < O; o++) {
      const grp = Math.floor(o / Og);
      for (let oh = 0; oh < OH; oh++) {
        for (let ow = 0; ow < OW; ow++) {
          const g = dy.data[((n * O + o) * OH + oh) * OW + ow];
          for (let ci = 0; ci < Cg; ci++) {
            const c = grp * Cg + ci;
            for (let i = 0; i < KH; i++) {
              for (let j = 0; j < KW; j++) {
                const ih = oh * sh - ph + i, iw = ow * sw - pw + j;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const xi = ((n * C + c) * H + ih) * W + iw, wi = ((o * Cg + ci) * KH + i) * KW + j;
                dx[xi] += g * w.data[wi];
                dw[wi] += g * x.data[xi];
              }
            }
          }
        }
      }
    }
  }
  return { dx: { data: dx, shape: [...x.shape] }, dw: { data: dw, shape: [...w.shape] } };
}

/** Options of the reference poolings; stride defaults to the kernel, padding to 0. */
export interface RefPoolOptions {
  kernel: RefPair;
  stride?: RefPair;
  padding?: RefPair;
}

/** Caffe's pooled extent: ceil rounding, minus a last window starting at or beyond in + pad. */
function caffePooled(size: number, k: number, s: number, p: number): number {
  let out = Math.ceil((size + 2 * p - k) / s) + 1;
  if (p > 0 && (out - 1) * s >= size + p) out -= 1;
  return out;
}

function pool(
  x: RefTensor,
  opts: RefPoolOptions,
  reduce: (vals: number[], divisor: number) => number,
  divisorExtent: (start: number, k: number, size: number, pad: number) => number,
): RefTensor {
  const [N, C, H, W] = x.shape;
  const [KH, KW] = hw(opts.kernel);
  const [sh, sw] = hw(opts.stride ?? opts.kernel);
  const [ph, pw] = hw(opts.padding ?? 0);
  const OH = caffePooled(H, KH, sh, ph), OW = caffePooled(W, KW, sw, pw);
  const y = new Float64Array(N * C * OH * OW);
  for (let n = 0; n < N; n++) {
    for (let c = 0; c < C; c++) {
      for (let oh = 0; oh < OH; oh++) {
        for (let ow = 0; ow < OW; ow++) {
          const vals: number[] = [];
          for (let i = 0; i < KH; i++) {
            for (let j = 0; j < KW; j++) {
              const ih = oh * sh - ph + i, iw = ow * sw - pw + j;
              if (ih >= 0 && ih < H && iw >= 0 && iw < W) vals.push(x.data[((n * C + c) * H + ih) * W + iw]);
            }
          }
          const div = divisorExtent(oh * sh - ph, KH, H, ph) * divisorExtent(ow * sw - pw, KW, W, pw);
          y[((n * C + c) * OH + oh) * OW + ow] = reduce(vals, div);
        }
      }
    }
  }
  return { data: y, shape: [N, C, OH, OW] };
}

/** Max pooling, Caffe semantics: Caffe output size; only in-bounds pixels compete (padding never wins). */
export function maxPool2d(x: RefTensor, opts: RefPoolOptions): RefTensor {
  return pool(x, opts, (vals) => Math.max(...vals), () => 1);
}

/**
 * Average pooling, Caffe semantics: the sum of the in-bounds pixels divided by the window's extent
 * clipped to [−pad, in + pad) (so padding inside that range counts as zeros).
 */
export function avgPool2d(x: RefTensor, opts: RefPoolOptions): RefTensor {
  return pool(
    x,
    opts,
    (vals, div) => vals.reduce((a, b) => a + b, 0) / div,
    (start, k, size, pad) => Math.min(start + k, size + pad) - start,
  );
}

/** LRN parameters (same fields as the backend's `LrnParams`). */
export interface RefLrnParams {
  size: number;
  alpha: number;
  beta: number;
  k: number;
}

/**
 * Caffe across-channel LRN: y = x·(k + alpha/size·Σ x²)^(−beta), the sum over the `size` channels
 * centred on c, clipped to [0, C).
 */
export function lrn(x: RefTensor, p: RefLrnParams): RefTensor {
  const [N, C, H, W] = x.shape;
  const half = Math.floor((p.size - 1) / 2);
  const at = (n: number, c: number, h: number, w: number) => ((n * C + c) * H + h) * W + w;
  const y = new Float64Array(x.data.length);
  for (let n = 0; n < N; n++) {
    for (let c = 0; c < C; c++) {
      for (let h = 0; h < H; h++) {
        for (let w = 0; w < W; w++) {
          let sq = 0;
          for (let cc = c - half; cc <= c - half + p.size - 1; cc++) {
            if (cc >= 0 && cc < C) sq += x.data[at(n, cc, h, w)] ** 2;
          }
          const scale = p.k + (p.alpha / p.size) * sq;
          y[at(n, c, h, w)] = x.data[at(n, c, h, w)] * scale ** -p.beta;
        }
      }
    }
  }
  return { data: y, shape: [...x.shape] };
}

/** Softmax over the last axis: exp(x − max) / Σ exp(x − max). */
export function softmax(x: RefTensor): RefTensor {
  const ls = logSoftmax(x);
  return { data: ls.data.map(Math.exp), shape: ls.shape };
}

/** Log-softmax over the last axis: x − max − log Σ exp(x − max). */
export function logSoftmax(x: RefTensor): RefTensor {
  const D = x.shape[x.shape.length - 1];
  const rows = x.data.length / D;
  const y = new Float64Array(x.data.length);
  for (let r = 0; r < rows; r++) {
    let max = -Infinity;
    for (let j = 0; j < D; j++) max = Math.max(max, x.data[r * D + j]);
    let sum = 0;
    for (let j = 0; j < D; j++) sum += Math.exp(x.data[r * D + j] - max);
    const lse = max + Math.log(sum);
    for (let j = 0; j < D; j++) y[r * D + j] = x.data[r * D + j] - lse;
  }
  return { data: y, shape: [...x.shape] };
}

/** Mean over the batch of −log softmax(logits)[label]; logits [N, C], labels N class indices. */
export function softmaxCrossEntropy(logits: RefTensor, labels: ArrayLike<number>): number {
  const [N, C] = logits.shape;
  if (logits.shape.length !== 2 || labels.length !== N) {
    throw new Error("reference softmaxCrossEntropy: expects logits [N, C] and N labels");
  }
  const ls = logSoftmax(logits);
  let loss = 0;
  for (let n = 0; n < N; n++) {
    const label = labels[n];
    if (!Number.isInteger(label) || label < 0 || label >= C) {
      throw new Error(`reference softmaxCrossEntropy: label ${label} out of range [0, ${C})`);
    }
    loss -= ls.data[n * C + label];
  }
  return loss / N;
}
