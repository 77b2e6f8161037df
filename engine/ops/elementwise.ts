/**
 * Differentiable elementwise math with NumPy broadcasting. Plain numbers are accepted wherever a
 * tensor is and become scalars on the other operand's backend.
 *
 * @module
 */

import { recordOp } from "../autograd.ts";
import type { Tensor } from "../tensor.ts";
import { binaryRaw, checkOperands, fullRaw, sumToShape, unaryRaw } from "./raw.ts";

/** A tensor or a plain number. */
export type TensorLike = Tensor | number;

/**
 * Runs a binary op on tensor operands, turning plain numbers into scalar tensors that are disposed
 * afterwards (a recorded op that saved one keeps its storage alive for backward).
 */
function binary(op: string, a: TensorLike, b: TensorLike, body: (a: Tensor, b: Tensor) => Tensor): Tensor {
  if (typeof a === "number" && typeof b === "number") {
    throw new TypeError(`${op}: at least one operand must be a tensor`);
  }
  const anchor = (typeof a === "number" ? b : a) as Tensor;
  const ta = typeof a === "number" ? fullRaw(anchor, [], a) : a;
  const tb = typeof b === "number" ? fullRaw(anchor, [], b) : b;
  try {
    checkOperands(op, ta, tb);
    return body(ta, tb);
  } finally {
    if (ta !== a) ta.dispose();
    if (tb !== b) tb.dispose();
  }
}

/**
 * `a + b`, broadcasting.
 *
 * @example
 * ```ts
 * import { ops, tensor } from "../../mod.ts";
 * const y = ops.add(tensor([[1, 2], [3, 4]]), tensor([10, 20])); // [[11, 22], [13, 24]]
 * ```
 */
export function add(a: TensorLike, b: TensorLike): Tensor {
  return binary("add", a, b, (ta, tb) => {
    const out = binaryRaw("add", ta, tb);
    recordOp("add", [ta, tb], out, [], (dy) => [
      ta.requiresGrad ? sumToShape(dy, ta.shape) : null,
      tb.requiresGrad ? sumToShape(dy, tb.shape) : null,
    ]);
    return out;
  });
}

/**
 * `a − b`, broadcasting.
 *
 * @example
 * ```ts
 * import { ops, tensor } from "../../mod.ts";
 * const y = ops.sub(tensor([5, 7]), 1); // [4, 6]
 * ```
 */
export function sub(a: TensorLike, b: TensorLike): Tensor {
  return binary("sub", a, b, (ta, tb) => {
    const out = binaryRaw("sub", ta, tb);
    recordOp("sub", [ta, tb], out, [], (dy) => {
      let gb: Tensor | null = null;
      if (tb.requiresGrad) {
        const negated = unaryRaw("neg", dy);
        gb = sumToShape(negated, tb.shape);
        if (gb !== negated) negated.dispose();
      }
      return [ta.requiresGrad ? sumToShape(dy, ta.shape) : null, gb];
    });
    return out;
  });
}

/**
 * `a · b` elementwise, broadcasting.
 *
 * @example
 * ```ts
 * import { ops, tensor } from "../../mod.ts";
 * const y = ops.mul(tensor([1, 2, 3]), 2); // [2, 4, 6]
 * ```
 */
export function mul(a: TensorLike, b: TensorLike): Tensor {
  return binary("mul", a, b, (ta, tb) => {
    const out = binaryRaw("mul", ta, tb);
    recordOp("mul", [ta, tb], out, [ta, tb], (dy) => [
      ta.requiresGrad ? productGradient(dy, tb, ta.shape) : null,
      tb.requiresGrad ? productGradient(dy, ta, tb.shape) : null,
    ]);
    return out;
  });
}

/** `sumToShape(dy · other, shape)`, disposing the full-size product when it was reduced. */
function productGradient(dy: Tensor, other: Tensor, shape: readonly number[]): Tensor {
  const product = binaryRaw("mul", dy, other);
  const reduced = sumToShape(product, shape);
  if (reduced !== product) product.dispose();
  return reduced;
}

/**
 * `a / b` elementwise, broadcasting.
 *
 * @example
 * ```ts
 * import { ops, tensor } from "../../mod.ts";
 * const y = ops.div(tensor([1, 2]), 4); // [0.25, 0.5]
 * ```
 */
export function div(a: TensorLike, b: TensorLike): Tensor {
  return binary("div", a, b, (ta, tb) => {
    const out = binaryRaw("div", ta, tb);
    recordOp("div", [ta, tb], out, [tb, out], (dy) => {
      const ga = ta.requiresGrad ? quotientGradient(dy, tb, ta.shape) : null;
      let gb: Tensor | null = null;
      if (tb.requiresGrad) {
        // d(a/b)/db = −(a/b)/b
        const ratio = binaryRaw("div", out, tb);
        const scaled = binaryRaw("mul", dy, ratio);
        const negated = unaryRaw("neg", scaled);
        gb = sumToShape(negated, tb.shape);
        for (const t of [ratio, scaled, negated]) if (t !== gb) t.dispose();
      }
      return [ga, gb];
    });
    return out;
  });
}

function quotientGradient(dy: Tensor, divisor: Tensor, shape: readonly number[]): Tensor {
  const quotient = binaryRaw("div", dy, divisor);
  const reduced = sumToShape(quotient, shape);
  if (reduced !== quotient) quotient.dispose();
  return reduced;
}

/**
 * `a ^ b` elementwise, broadcasting. The gradient with respect to `b` uses `ln a` and is only
 * defined for positive `a`.
 *
 * @example
 * ```ts
 * import { ops, tensor } from "../../mod.ts";
 * const y = ops.pow(tensor([2, 3]), 2); // [4, 9]
 * ```
 */
export function pow(a: TensorLike, b: TensorLike): Tensor {
  return binary("pow", a, b, (ta, tb) => {
    const out = binaryRaw("pow", ta, tb);
    recordOp("pow", [ta, tb], out, [ta, tb, out], (dy) => {
      let ga: Tensor | null = null, gb: Tensor | null = null;
      if (ta.requiresGrad) {
        // b · a^(b−1), written as b · out / a would divide by zero at a = 0.
        const one = fullRaw(tb, [], 1);
        const exponent = binaryRaw("sub", tb, one);
        one.dispose();
        const power = binaryRaw("pow", ta, exponent);
        const local = binaryRaw("mul", tb, power);
        const full = binaryRaw("mul", dy, local);
        ga = sumToShape(full, ta.shape);
        for (const t of [exponent, power, local, full]) if (t !== ga) t.dispose();
      }
      if (tb.requiresGrad) {
        const logA = unaryRaw("log", ta);
        const local = binaryRaw("mul", out, logA);
        const full = binaryRaw("mul", dy, local);
        gb = sumToShape(full, tb.shape);
        for (const t of [logA, local, full]) if (t !== gb) t.dispose();
      }
      return [ga, gb];
    });
    return out;
  });
}

/**
 * `−x`.
 *
 * @example
 * ```ts
 * import { ops, tensor } from "../../mod.ts";
 * const y = ops.neg(tensor([1, -2])); // [-1, 2]
 * ```
 */
export function neg(x: Tensor): Tensor {
  checkOperands("neg", x);
  const out = unaryRaw("neg", x);
  recordOp("neg", [x], out, [], (dy) => [unaryRaw("neg", dy)]);
  return out;
}

/**
 * `eˣ`.
 *
 * @example
 * ```ts
 * import { ops, tensor } from "../../mod.ts";
 * const y = ops.exp(tensor([0, 1])); // [1, 2.718…]
 * ```
 */
export function exp(x: Tensor): Tensor {
  checkOperands("exp", x);
  const out = unaryRaw("exp", x);
  recordOp("exp", [x], out, [out], (dy) => [binaryRaw("mul", dy, out)]);
  return out;
}

/**
 * Natural logarithm.
 *
 * @example
 * ```ts
 * import { ops, tensor } from "../../mod.ts";
 * const y = ops.log(tensor([1, Math.E])); // [0, 1]
 * ```
 */
export function log(x: Tensor): Tensor {
  checkOperands("log", x);
  const out = unaryRaw("log", x);
  recordOp("log", [x], out, [x], (dy) => [binaryRaw("div", dy, x)]);
  return out;
}

/**
 * Square root.
 *
 * @example
 * ```ts
 * import { ops, tensor } from "../../mod.ts";
 * const y = ops.sqrt(tensor([4, 9])); // [2, 3]
 * ```
 */
export function sqrt(x: Tensor): Tensor {
  checkOperands("sqrt", x);
  const out = unaryRaw("sqrt", x);
  recordOp("sqrt", [x], out, [out], (dy) => {
    const twice = binaryRaw("add", out, out);
    const gradient = binaryRaw("div", dy, twice);
    twice.dispose();
    return [gradient];
  });
  return out;
}

/**
 * Rectified linear unit, `max(x, 0)`; the gradient at exactly 0 is 0 (as in Caffe and PyTorch).
 *
 * @example
 * ```ts
 * import { ops, tensor } from "../../mod.ts";
 * const y = ops.relu(tensor([-1, 2])); // [0, 2]
 * ```
 */
export function relu(x: Tensor): Tensor {
  checkOperands("relu", x);
  const out = unaryRaw("relu", x);
  recordOp("relu", [x], out, [out], (dy) => [binaryRaw("reluGrad", dy, out)]);
  return out;
}

/**
 * Elementwise maximum of `a` and `b`, broadcasting, with Caffe's routing of the gradient (Eltwise
 * MAX): each output's gradient goes to one operand only, `b` where `b > a` strictly and `a`
 * otherwise, so on a tie the first operand takes it all. (A composition such as `a + relu(b − a)`
 * routes the same way but can miss the maximum by a rounding; `max` over a stacked axis shares a
 * tie's gradient; hence this op, on the backends' `max` and `greater` kernels.)
 *
 * @example
 * ```ts
 * import { ops, tensor } from "../../mod.ts";
 * const y = ops.maximum(tensor([1, 5, 2]), tensor([3, 5, 0])); // [3, 5, 2]; the tie's gradient goes to a
 * ```
 */
export function maximum(a: TensorLike, b: TensorLike): Tensor {
  return binary("maximum", a, b, (ta, tb) => {
    const out = binaryRaw("max", ta, tb, "maximum");
    recordOp("maximum", [ta, tb], out, [ta, tb], (dy) => {
      // 1 where b wins (b > a), else 0: exact masks, so dy·mask and dy − dy·mask are exact too.
      const bWins = binaryRaw("greater", tb, ta);
      const toB = binaryRaw("mul", dy, bWins);
      let ga: Tensor | null = null, gb: Tensor | null = null;
      if (ta.requiresGrad) {
        const toA = binaryRaw("sub", dy, toB);
        ga = sumToShape(toA, ta.shape);
        if (ga !== toA) toA.dispose();
      }
      if (tb.requiresGrad) gb = sumToShape(toB, tb.shape);
      bWins.dispose();
      if (gb !== toB) toB.dispose();
      return [ga, gb];
    });
    return out;
  });
}
