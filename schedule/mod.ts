/**
 * Schedules for data-parallel training: a text form and a typed builder that both compile to a
 * {@link Plan}, static validation, the built-in plans and a plain-text explanation. The trainer that
 * runs a plan is in `./runtime`, the cost model that predicts its timeline in `./simulator`.
 *
 * @example
 * ```ts
 * import { explain, parseSchedule, validatePlan } from "./mod.ts";
 * const plan = parseSchedule(`
 *   schedule overlap
 *   forward
 *   backward fc; reduce fc; update fc   # FC gradients travel while conv backward runs
 *   backward conv; reduce conv; update conv
 *   broadcast all
 * `, { groups: ["fc", "conv"] });
 * validatePlan(plan, { mode: "master" });
 * console.log(explain(plan, { devices: 2, mode: "master" }));
 * ```
 *
 * @module
 */

export {
  type ActionKind,
  actionLabel,
  dependenciesOf,
  isSharded,
  type Lane,
  laneOf,
  type Plan,
  type PlanAction,
  type PlanSource,
  type ReductionMode,
} from "./plan/plan.ts";
export { ScheduleError, type ScheduleErrorLocation } from "./plan/errors.ts";
export {
  formatPlan,
  loadSchedule,
  type ParseOptions,
  parseSchedule,
  schedule,
  type ScheduleTag,
} from "./plan/dsl.ts";
export { type GroupTarget, ScheduleBuilder, scheduleBuilder } from "./plan/builder.ts";
export {
  checkPlan,
  type PlanReport,
  type ShardingProblem,
  shardingProblem,
  type ValidateOptions,
  validatePlan,
} from "./plan/validate.ts";
export {
  bucketedPlan,
  type BuiltinName,
  builtinPlan,
  hybridPlan,
  overlapPlan,
  sequentialPlan,
} from "./plan/builtins.ts";
export { explain, type ExplainOptions } from "./plan/explain.ts";
export { undoableUpdates, type UndoRule } from "./plan/undo.ts";
export {
  type Buckets,
  DDP_BUCKET_BYTES,
  DDP_FIRST_BUCKET_BYTES,
  ddpBuckets,
  type LayerBytes,
} from "./plan/buckets.ts";
