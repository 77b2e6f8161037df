/**
 * Differentiable ops of convolutional networks: `conv2d`, `maxPool2d`, `avgPool2d` and `lrn`, each
 * a forward kernel plus its gradient kernels from the backend contract.
 *
 * @module
 */

import {
  checkLrn,
  type Conv2dGeometry,
  conv2dGeometry,
  type Conv2dOptions,
  GeometryError,
  type LrnParams,
  type Pool2dGeometry,
  pool2dGeometry,
  type Pool2dOptions,
} from "../../backends/geometry.ts";
import type { Activation } from "../../backends/backend.ts";
import { recordOp } from "../autograd.ts";
import { formatShape, ShapeError, ValueError } from "../errors.ts";
import { outputTensor, type Tensor } from "../tensor.ts";
import { binaryRaw, checkOperands, reduceRaw } from "./raw.ts";

export type { Conv2dOptions, LrnParams, Pool2dOptions };

/** Runs a geometry computation, reporting its complaints as the engine's `ShapeError`. */
function geometry<T>(compute: () => T): T {
  try {
    return compute();
  } catch (error) {
    if (error instanceof GeometryError) throw new ShapeError(error.op, error.detail);
    throw error;
  }
}

/**
 * What {@link conv2d} runs after the convolution itself, in one op: an activation in its epilogue,
 * then max pooling.
 */
export interface Conv2dFusion {
  /**
   * `"relu"`: the ReLU runs in the convolution's epilogue (one pass over the output fewer) and its
   * gradient mask inside the op's backward: the bits of `relu(conv2d(…))`.
   */
  activation?: Activation;
  /**
   * Max pooling of the (activated) output, returned instead of it: the bits of
   * `maxPool2d(relu(conv2d(…)), maxPool)`. The unpooled output is dropped once pooled, and with
   * the ReLU its mask is applied to the pooled gradient (a pooled value is the value of the input
   * that won its window, so it is > 0 exactly where the ReLU passed the winner), a quarter of the
   * elements for 3×3 stride-2 windows.
   */
  maxPool?: Pool2dOptions;
}

/**
 * 2-D convolution (cross-correlation, as in every framework) of an NCHW batch with
 * `[outChannels, inChannels/groups, kh, kw]` weights, optional `[outChannels]` bias.
 *
 * @example
 * ```ts
 * import { ops, randn, zeros } from "../../mod.ts";
 * // AlexNet conv2: 96 → 256 channels, 5×5, padding 2, two groups
 * const x = randn([1, 96, 27, 27], { seed: 1 });
 * const w = randn([256, 48, 5, 5], { seed: 2, std: 0.01 });
 * const y = ops.conv2d(x, w, zeros([256]), { padding: 2, groups: 2 }); // [1, 256, 27, 27]
 * const r = ops.conv2d(x, w, zeros([256]), { padding: 2, groups: 2, activation: "relu" }); // relu(y), fused
 * const p = ops.conv2d(x, w, zeros([256]), {
 *   padding: 2,
 *   groups: 2,
 *   activation: "relu",
 *   maxPool: { kernel: 3, stride: 2 },
 * }); // maxPool2d(relu(y)), fused: [1, 256, 13, 13]
 * ```
 *
 * With the options of {@link Conv2dFusion}, the activation and a max pooling after it run in the
 * same op, with the same bits as the separate ops.
 */
export function conv2d(
  x: Tensor,
  weight: Tensor,
  bias?: Tensor | null,
  options: Conv2dOptions & Conv2dFusion = {},
): Tensor {
  checkOperands("conv2d", x, weight, ...(bias ? [bias] : []));
  const relu = options.activation === "relu";
  if (options.activation !== undefined && !relu) {
    throw new ValueError(
      "conv2d",
      `activation ${JSON.stringify(options.activation)}: expected "relu" or none`,
    );
  }
  const g = geometry(() => conv2dGeometry(x.shape, weight.shape, options));
  if (bias && (bias.rank !== 1 || bias.shape[0] !== g.outChannels)) {
    throw new ShapeError(
      "conv2d",
      `bias ${formatShape(bias.shape)} does not match ${g.outChannels} output channels`,
    );
  }
  const shape = [g.batch, g.outChannels, g.outHeight, g.outWidth];
  // Checked before any work: a bad pooling window fails as maxPool2d would, with nothing computed.
  const pool = options.maxPool && geometry(() => pool2dGeometry(shape, options.maxPool!, "maxPool2d"));
  const inputs = bias ? [x, weight, bias] : [x, weight];
  if (!pool) {
    const out = outputTensor(x.backend, shape);
    // The bias is added by the convolution itself, in its epilogue (one pass over the output
    // fewer); its gradient sums dy over batch and pixels, as the broadcast add's would.
    x.backend.conv2dForward(x.storage, weight.storage, out.storage, g, bias?.storage, options.activation);
    recordOp("conv2d", inputs, out, relu ? [x, weight, out] : [x, weight], (gradient) => {
      // The ReLU's own backward, on the output it kept: what a separate relu node would hand on.
      const dy = relu ? binaryRaw("reluGrad", gradient, out, "conv2d") : gradient;
      const grads = convolutionGradients(x, weight, bias, g, dy);
      if (dy !== gradient) dy.dispose();
      return grads;
    });
    return out;
  }
  const pooledShape = [pool.batch, pool.channels, pool.outHeight, pool.outWidth];
  const pooled = outputTensor(x.backend, pooledShape);
  const argmax = outputTensor(x.backend, pooledShape, "int32");
  // The backward needs only the pooled output and the winners, so a backend that pools each image
  // as it is computed never writes the convolution's output to memory (AlexNet-like conv1: 6.4 MB
  // written and read back per step).
  const fused = x.backend.conv2dForwardMaxPool?.(
    x.storage,
    weight.storage,
    pooled.storage,
    argmax.storage,
    g,
    pool,
    bias?.storage,
    options.activation,
  );
  if (!fused) {
    const out = outputTensor(x.backend, shape);
    x.backend.conv2dForward(x.storage, weight.storage, out.storage, g, bias?.storage, options.activation);
    x.backend.maxPool2dForward(out.storage, pooled.storage, argmax.storage, pool);
    out.dispose();
  }
  recordOp("conv2d", inputs, pooled, relu ? [x, weight, argmax, pooled] : [x, weight, argmax], (gradient) => {
    const direct = pooledWeightGradients(
      x,
      weight,
      bias,
      g,
      pool,
      gradient,
      argmax,
      relu ? pooled : undefined,
    );
    if (direct) return direct;
    const dy = outputTensor(x.backend, shape);
    // The bias gradient's first reduction (each plane of dy summed), in the same pass where the
    // backend offers it: dy (6.4 MB on the AlexNet-like conv1) is not read back from memory.
    const offered = x.backend.maxPool2dBackwardFused !== undefined;
    let planeSums = offered && bias?.requiresGrad
      ? outputTensor(x.backend, [g.batch, g.outChannels])
      : undefined;
    const fused = x.backend.maxPool2dBackwardFused?.(gradient.storage, argmax.storage, dy.storage, pool, {
      reluOf: relu ? pooled.storage : undefined,
      planeSums: planeSums?.storage,
    });
    if (!fused) {
      planeSums?.dispose();
      planeSums = undefined;
      // The ReLU's mask on the pooled gradient: each input element gets the gradients of the
      // windows it won, all masked alike by its own value (their pooled value), so it gets all of
      // them where the ReLU passed it and +0 elsewhere: the bits of the ReLU's backward after the
      // pooling's.
      const pooledDy = relu ? binaryRaw("reluGrad", gradient, pooled, "conv2d") : gradient;
      x.backend.maxPool2dBackward(pooledDy.storage, argmax.storage, dy.storage, pool);
      if (pooledDy !== gradient) pooledDy.dispose();
    }
    const grads = convolutionGradients(x, weight, bias, g, dy, planeSums);
    dy.dispose();
    planeSums?.dispose();
    return grads;
  });
  argmax.dispose(); // kept alive by the recorded op when gradients are needed
  return pooled;
}

/**
 * A pooled convolution's gradients straight from the pooled gradient, where x needs none (a first
 * layer) and the backend offers it (see `Backend.conv2dBackwardFilterPooled`): the convolution's
 * output gradient is never scattered (6.4 MB written and read back on the AlexNet-like conv1).
 * `undefined` where the backend declines.
 */
function pooledWeightGradients(
  x: Tensor,
  weight: Tensor,
  bias: Tensor | null | undefined,
  g: Conv2dGeometry,
  pool: Pool2dGeometry,
  gradient: Tensor,
  argmax: Tensor,
  reluOf: Tensor | undefined,
): (Tensor | null)[] | undefined {
  if (x.requiresGrad || !weight.requiresGrad || !x.backend.conv2dBackwardFilterPooled) return undefined;
  const dw = outputTensor(x.backend, weight.shape);
  const planeSums = bias?.requiresGrad ? outputTensor(x.backend, [g.batch, g.outChannels]) : undefined;
  const done = x.backend.conv2dBackwardFilterPooled(
    x.storage,
    gradient.storage,
    argmax.storage,
    dw.storage,
    g,
    pool,
    {
      reluOf: reluOf?.storage,
      planeSums: planeSums?.storage,
    },
  );
  if (!done) {
    dw.dispose();
    planeSums?.dispose();
    return undefined;
  }
  const db = planeSums ? reduceRaw("sum", planeSums, [0], false, "conv2d") : null;
  planeSums?.dispose();
  return bias ? [null, dw, db] : [null, dw];
}

/**
 * A convolution's gradients from `dy`, the gradient of its output (any activation's mask applied);
 * `planeSums` (`[batch, channels]`), where given, are dy's planes already summed.
 */
function convolutionGradients(
  x: Tensor,
  weight: Tensor,
  bias: Tensor | null | undefined,
  g: Conv2dGeometry,
  dy: Tensor,
  planeSums?: Tensor,
): (Tensor | null)[] {
  let dx: Tensor | null = null, dw: Tensor | null = null, db: Tensor | null = null;
  if (x.requiresGrad) {
    dx = outputTensor(x.backend, x.shape);
    x.backend.conv2dBackwardInput(dy.storage, weight.storage, dx.storage, g);
  }
  if (weight.requiresGrad) {
    dw = outputTensor(x.backend, weight.shape);
    x.backend.conv2dBackwardFilter(x.storage, dy.storage, dw.storage, g);
  }
  // Over H and W, then over N (reduceRaw's order for [0, 2, 3]); the second step alone from sums.
  if (bias?.requiresGrad) {
    db = planeSums
      ? reduceRaw("sum", planeSums, [0], false, "conv2d")
      : reduceRaw("sum", dy, [0, 2, 3], false, "conv2d");
  }
  return bias ? [dx, dw, db] : [dx, dw];
}

/**
 * Max pooling over NCHW with Caffe's output size (rounded up), e.g. AlexNet's overlapping 3×3
 * stride 2 pooling: 55 → 27 → 13 → 6.
 *
 * @example
 * ```ts
 * import { ops, zeros } from "../../mod.ts";
 * const y = ops.maxPool2d(zeros([1, 96, 55, 55]), { kernel: 3, stride: 2 }); // [1, 96, 27, 27]
 * ```
 */
export function maxPool2d(x: Tensor, options: Pool2dOptions): Tensor {
  checkOperands("maxPool2d", x);
  const g = geometry(() => pool2dGeometry(x.shape, options, "maxPool2d"));
  const shape = [g.batch, g.channels, g.outHeight, g.outWidth];
  const out = outputTensor(x.backend, shape);
  const argmax = outputTensor(x.backend, shape, "int32");
  x.backend.maxPool2dForward(x.storage, out.storage, argmax.storage, g);
  recordOp("maxPool2d", [x], out, [argmax], (dy) => {
    const dx = outputTensor(x.backend, x.shape);
    x.backend.maxPool2dBackward(dy.storage, argmax.storage, dx.storage, g);
    return [dx];
  });
  argmax.dispose(); // kept alive by the recorded op when gradients are needed
  return out;
}

/**
 * Average pooling over NCHW with Caffe's output size and divisor (the window clipped to the padded
 * input counts, padding included).
 *
 * @example
 * ```ts
 * import { ops, zeros } from "../../mod.ts";
 * const y = ops.avgPool2d(zeros([1, 32, 16, 16]), { kernel: 3, stride: 2 }); // [1, 32, 8, 8]
 * ```
 */
export function avgPool2d(x: Tensor, options: Pool2dOptions): Tensor {
  checkOperands("avgPool2d", x);
  const g = geometry(() => pool2dGeometry(x.shape, options, "avgPool2d"));
  const out = outputTensor(x.backend, [g.batch, g.channels, g.outHeight, g.outWidth]);
  x.backend.avgPool2dForward(x.storage, out.storage, g);
  recordOp("avgPool2d", [x], out, [], (dy) => {
    const dx = outputTensor(x.backend, x.shape);
    x.backend.avgPool2dBackward(dy.storage, dx.storage, g);
    return [dx];
  });
  return out;
}

/**
 * Local response normalisation across channels, as Caffe defines it:
 * `y = x / (k + alpha/size · Σ x²)^beta` over `size` channels centred on each channel.
 *
 * @example
 * ```ts
 * import { ops, randn } from "../../mod.ts";
 * const y = ops.lrn(randn([1, 96, 55, 55], { seed: 1 }), { size: 5, alpha: 1e-4, beta: 0.75, k: 1 });
 * ```
 */
export function lrn(x: Tensor, params: Partial<LrnParams> & { size: number }): Tensor {
  checkOperands("lrn", x);
  const p: LrnParams = {
    size: params.size,
    alpha: params.alpha ?? 1e-4,
    beta: params.beta ?? 0.75,
    k: params.k ?? 1,
  };
  geometry(() => checkLrn(x.shape, p));
  const out = outputTensor(x.backend, x.shape);
  const scale = outputTensor(x.backend, x.shape);
  x.backend.lrnForward(x.storage, out.storage, scale.storage, x.shape, p);
  recordOp("lrn", [x], out, [x, out, scale], (dy) => {
    const dx = outputTensor(x.backend, x.shape);
    x.backend.lrnBackward(x.storage, out.storage, scale.storage, dy.storage, dx.storage, x.shape, p);
    return [dx];
  });
  scale.dispose();
  return out;
}
