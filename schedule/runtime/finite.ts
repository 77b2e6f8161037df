/**
 * Divergence: how a step learns that training has left the finite numbers, and the error that says
 * where. After each update the runtime asks the backend for the first NaN or ±∞ of the group's new
 * parameters (one reduction; a GPU returns 4 bytes; none where the CPU's fused update already looked
 * in its own pass and found them finite), so a run stops at the step that broke the
 * weights — even when the loss was still finite, as with a learning rate that overflows the update —
 * and the step is rolled back like any failed step, leaving the last finite parameters and
 * optimizer state to save.
 *
 * @module
 */

import { findNonFinite, NonFiniteError, type Optimizer } from "../../engine/mod.ts";

/** What turned non-finite first. */
export type DivergedQuantity = "loss" | "parameter";

/**
 * Training diverged at `step`: the loss or a parameter became NaN or infinite. `rolledBack` says
 * whether the step was undone (in one process), leaving the parameters and optimizer state of the
 * step before, which are finite; under MPI it is not, and nothing should be saved.
 *
 * @example
 * ```ts
 * import { DivergenceError } from "./finite.ts";
 * const error = new DivergenceError(3, "parameter", "fc6.weight", "holds Infinity at element 0");
 * console.log(error.message, error.rolledBack);
 * ```
 */
export class DivergenceError extends NonFiniteError {
  /** The 1-based training step that diverged. */
  readonly step: number;
  /** Whether the loss or a parameter became non-finite first. */
  readonly quantity: DivergedQuantity;
  /** The first non-finite parameter, for `quantity: "parameter"`. */
  readonly tensor: string | undefined;
  /** True once the runtime has undone the step: what it holds now is the last finite state. */
  rolledBack = false;

  /** `detail` says what was found (value, element, the gradient's part). */
  constructor(step: number, quantity: DivergedQuantity, tensor: string | undefined, detail: string) {
    super(
      "training",
      `diverged at step ${step}: ${quantity === "loss" ? "the loss" : `parameter "${tensor}"`} ${detail}`,
    );
    this.name = "DivergenceError";
    this.step = step;
    this.quantity = quantity;
    this.tensor = tensor;
  }
}

/**
 * Throws a {@link DivergenceError} when any parameter of `group` that `optimizers` just updated in
 * iteration `iteration` (0-based) holds a NaN or ±∞, naming the first, and whether its gradient was
 * finite (then the update itself overflowed: the learning rate is too large) or not.
 */
export async function checkUpdatedGroup(
  optimizers: readonly Optimizer[],
  group: string,
  iteration: number,
): Promise<void> {
  for (const optimizer of optimizers) {
    const updated = optimizer.parameters.filter((p) => p.group === group);
    // What the update found finite in its own pass need not be read again.
    const bad = await findNonFinite(updated.filter((p) => !optimizer.checkedFinite(p.name)));
    if (!bad) continue;
    const grad = updated.find((p) => p.name === bad.name)?.tensor.grad;
    const badGrad = grad && !grad.isDisposed
      ? await findNonFinite([{ name: bad.name, tensor: grad }])
      : undefined;
    const cause = badGrad
      ? `its gradient held ${badGrad.value} at element ${badGrad.index}`
      : "its gradient was finite: the update overflowed, the learning rate is too large";
    throw new DivergenceError(
      iteration + 1,
      "parameter",
      bad.name,
      `holds ${bad.value} at element ${bad.index} after the update (${cause})`,
    );
  }
}

/** True for a device's report of a NaN or infinite loss (the engine's softmaxCrossEntropy check). */
export function isNonFiniteLoss(error: unknown): boolean {
  return error instanceof Error && /softmaxCrossEntropy: the loss of sample \d+ is/.test(error.message);
}
