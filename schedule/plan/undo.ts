/**
 * Which updates of a plan must be undoable: keep a copy of what they overwrite (the group's
 * parameters and optimizer state; `Optimizer.updateSaving` writes it, in the update's own pass where
 * the backend can), so that a step that fails after them can be undone. The executor runs by this
 * rule and the simulator prices its copies, so both see the same updates.
 *
 * An update copies only where a failure can still follow it: a device still computing (the update
 * comes before the plan's last backward), a later reduce or broadcast of an exchange whose transfers
 * can fail, or, with finite checks, the update's own check or a later one. An exchange that does not
 * undo a failed step (one device per MPI rank: a failure ends the job) never copies.
 *
 * @module
 */

import type { Plan } from "./plan.ts";

/** What decides whether a plan's updates copy for the undo. */
export interface UndoRule {
  /** The exchange undoes a failed step (devices of one process); false where a failure ends the job (MPI). */
  readonly rollsBack: boolean;
  /** A later reduce or broadcast can still fail (a peer GPU lost); copies between host buffers cannot. */
  readonly transfersCanFail: boolean;
  /** Each update's parameters are checked for NaN and ±∞ after it, a failure undoing the step. */
  readonly checkFinite: boolean;
}

/**
 * Per action of `plan`, whether it is an update that copies for the undo under `rule` (false for
 * every other action).
 *
 * @example
 * ```ts
 * import { overlapPlan } from "./builtins.ts";
 * import { undoableUpdates } from "./undo.ts";
 * const plan = overlapPlan(["fc", "conv"]);
 * const rule = { rollsBack: true, transfersCanFail: false, checkFinite: false };
 * // Only the FC group's update, which runs while the conv backward is still computing:
 * plan.actions.filter((_, i) => undoableUpdates(plan, rule)[i]).map((a) => a.group); // ["fc"]
 * ```
 */
export function undoableUpdates(plan: Plan, rule: UndoRule): boolean[] {
  const lastBackward = plan.actions.findLastIndex((s) => s.kind === "backward");
  return plan.actions.map((action, index) =>
    action.kind === "update" && rule.rollsBack &&
    (rule.checkFinite || index < lastBackward ||
      (rule.transfersCanFail &&
        plan.actions.slice(index + 1).some((s) => s.kind === "reduce" || s.kind === "broadcast")))
  );
}
