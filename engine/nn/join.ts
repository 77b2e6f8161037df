/**
 * Layers that join several blobs into one, the nodes where a graph's branches meet: `Concat`
 * (Caffe `Concat`) and `Eltwise` (Caffe `Eltwise`: SUM with optional coefficients, PROD, MAX). Each
 * is a composition of differentiable engine ops, so its gradient is the engine's and it runs on every
 * backend.
 *
 * @module
 */

import { formatShape, ShapeError } from "../errors.ts";
import * as ops from "../ops/mod.ts";
import type { Tensor } from "../tensor.ts";
import { type ForwardContext, type LayerDescription, Module } from "./module.ts";

/**
 * A layer of several inputs. A `Graph` calls {@link JoinModule.forwardAll} with its bottoms in
 * order; `forward(x)` is the one-input case.
 *
 * @example
 * ```ts
 * import { Concat, JoinModule } from "./join.ts";
 * const join: JoinModule = new Concat(1);
 * ```
 */
export abstract class JoinModule extends Module {
  /** Applies the layer to its inputs, in the order of the node's bottoms. */
  abstract forwardAll(inputs: readonly Tensor[], context?: ForwardContext): Tensor;
  /** Output shape and per-sample FLOPs for these input shapes (batch axis included). */
  abstract describeAll(inputShapes: readonly (readonly number[])[]): LayerDescription;

  /** The layer on one input. */
  forward(x: Tensor, context?: ForwardContext): Tensor {
    return this.forwardAll([x], context);
  }

  /** Output shape and FLOPs for one input. */
  describe(inputShape: readonly number[]): LayerDescription {
    return this.describeAll([inputShape]);
  }
}

const perSample = (shape: readonly number[]) => shape.slice(1).reduce((a, b) => a * b, 1);

/**
 * Joins its inputs along `axis` (Caffe `Concat`, default axis 1: channels). Every other dimension
 * must agree.
 *
 * @example
 * ```ts
 * import { Concat } from "./join.ts";
 * import { zeros } from "../creation.ts";
 * const y = new Concat().forwardAll([zeros([2, 64, 28, 28]), zeros([2, 128, 28, 28])]); // [2, 192, 28, 28]
 * ```
 */
export class Concat extends JoinModule {
  /** Layer type. */
  readonly kind = "Concat";
  /** A concatenation along `axis` (negative counts from the end). */
  constructor(readonly axis = 1) {
    super();
  }

  /** Concatenates the inputs. */
  forwardAll(inputs: readonly Tensor[]): Tensor {
    return inputs.length === 1 ? ops.reshape(inputs[0], inputs[0].shape) : ops.concat(inputs, this.axis);
  }

  /** Output shape (FLOPs: none, it only copies). */
  describeAll(shapes: readonly (readonly number[])[]): LayerDescription {
    const first = shapes[0];
    const axis = this.axis < 0 ? this.axis + first.length : this.axis;
    if (axis < 0 || axis >= first.length) {
      throw new ShapeError("Concat", `axis ${this.axis} does not exist in ${formatShape(first)}`);
    }
    for (const shape of shapes) {
      if (shape.length !== first.length || shape.some((d, i) => i !== axis && d !== first[i])) {
        throw new ShapeError(
          "Concat",
          `input shapes ${shapes.map((s) => formatShape(s)).join(", ")} differ outside axis ${axis}`,
        );
      }
    }
    const out = [...first];
    out[axis] = shapes.reduce((n, s) => n + s[axis], 0);
    return { outputShape: out, flops: 0 };
  }
}

/** Caffe's Eltwise operations. */
export type EltwiseOperation = "SUM" | "PROD" | "MAX";

/**
 * Elementwise join of same-shaped inputs (Caffe `Eltwise`): `SUM` (`Σ coeff_i · x_i`, coefficients
 * default 1), `PROD` (`Π x_i`) or `MAX` (the largest, its gradient routed to the first input that
 * holds it, as Caffe's argmax does; see `ops.maximum`).
 *
 * @example
 * ```ts
 * import { Eltwise } from "./join.ts";
 * const residual = new Eltwise("SUM");
 * const difference = new Eltwise("SUM", [1, -1]);
 * ```
 */
export class Eltwise extends JoinModule {
  /** Layer type. */
  readonly kind = "Eltwise";
  /** An elementwise join; `coefficients` (SUM only) weigh the inputs in order. */
  constructor(readonly operation: EltwiseOperation = "SUM", readonly coefficients?: readonly number[]) {
    super();
    if (coefficients && operation !== "SUM") {
      throw new ShapeError("Eltwise", `coefficients apply to SUM only, not ${operation}`);
    }
  }

  /** Joins the inputs. */
  forwardAll(inputs: readonly Tensor[]): Tensor {
    if (this.coefficients && this.coefficients.length !== inputs.length) {
      throw new ShapeError(
        "Eltwise",
        `${this.coefficients.length} coefficients for ${inputs.length} inputs (give one per input)`,
      );
    }
    // Caffe: top = 0, then top += coeff_i · bottom_i in order (a coefficient of 1 multiplies exactly).
    const term = (i: number) => {
      const c = this.coefficients?.[i] ?? 1;
      return c === 1 ? inputs[i] : ops.mul(inputs[i], c);
    };
    // Temporaries are freed as soon as they are used (the graph keeps what backward needs).
    const owned = new Set<Tensor>();
    const own = (t: Tensor) => (inputs.includes(t) ? t : (owned.add(t), t));
    let out = own(this.operation === "SUM" ? term(0) : inputs[0]);
    for (let i = 1; i < inputs.length; i++) {
      const operand = this.operation === "SUM" ? own(term(i)) : inputs[i];
      const next = this.operation === "SUM"
        ? ops.add(out, operand)
        : this.operation === "PROD"
        ? ops.mul(out, operand)
        : ops.maximum(out, operand);
      for (const t of [out, operand]) {
        if (owned.delete(t)) t.dispose();
      }
      out = next;
    }
    return inputs.includes(out) ? ops.reshape(out, out.shape) : out;
  }

  /** Output shape and FLOPs (one per input element after the first). */
  describeAll(shapes: readonly (readonly number[])[]): LayerDescription {
    const first = shapes[0];
    for (const shape of shapes) {
      if (shape.length !== first.length || shape.some((d, i) => d !== first[i])) {
        throw new ShapeError(
          "Eltwise",
          `input shapes ${
            shapes.map((s) => formatShape(s)).join(", ")
          } differ (${this.operation} needs equal shapes)`,
        );
      }
    }
    return { outputShape: [...first], flops: perSample(first) * Math.max(1, shapes.length - 1) };
  }
}
