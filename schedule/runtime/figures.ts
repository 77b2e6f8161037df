/**
 * What a step's time went into, from its lane spans, the same way for the step result, the trace,
 * the train summary and the benchmarks:
 *
 * - compute: time some device ran forward or backward;
 * - communication: time the plan's `reduce` and `broadcast` actions (and the transfers inside them)
 *   ran — moving gradients and parameters and summing them in device order, as an all-reduce does;
 * - update: time the plan's `update` actions ran, reported apart, since it is arithmetic on
 *   parameters, not a transfer;
 * - hidden communication / hidden update: the part of each that overlapped some device's compute.
 *
 * @module
 */

import { measure, overlapLength } from "./intervals.ts";

/** A lane span, as recorded by the runtime. */
export interface LaneSpan {
  /** Start, `performance.now()` milliseconds. */
  start: number;
  /** End, `performance.now()` milliseconds. */
  end: number;
  /** `compute` (forward, backward) or `comm` (reduce, update, broadcast and their transfers). */
  lane: "compute" | "comm";
  /** What ran, e.g. `backward conv`, `reduce fc`, `update fc`, `send fc gradients`. */
  name: string;
}

/** Milliseconds of one step (or the median of several), by what the time went into. */
export interface StepFigures {
  /** Wall-clock time of the step. */
  total: number;
  /** Time some device computed. */
  compute: number;
  /** Time of the reduce and broadcast actions. */
  communication: number;
  /** Communication that overlapped compute. */
  hiddenCommunication: number;
  /** Time of the update actions. */
  update: number;
  /** Update time that overlapped compute. */
  hiddenUpdate: number;
}

/** Whether a span is compute, an update, or communication. */
export function spanKind(span: LaneSpan): "compute" | "update" | "communication" {
  if (span.lane === "compute") return "compute";
  return span.name.startsWith("update ") ? "update" : "communication";
}

/**
 * The figures of one step from its spans and wall-clock time.
 *
 * @example
 * ```ts
 * import { stepFigures } from "./figures.ts";
 * const figures = stepFigures([
 *   { lane: "compute", name: "backward conv", start: 0, end: 10 },
 *   { lane: "comm", name: "reduce fc", start: 2, end: 6 },
 *   { lane: "comm", name: "update fc", start: 6, end: 7 },
 * ], 10);
 * console.log(figures.hiddenCommunication, figures.update); // 4 1
 * ```
 */
export function stepFigures(spans: readonly LaneSpan[], total: number): StepFigures {
  const compute = spans.filter((s) => spanKind(s) === "compute");
  const communication = spans.filter((s) => spanKind(s) === "communication");
  const update = spans.filter((s) => spanKind(s) === "update");
  return {
    total,
    compute: measure(compute),
    communication: measure(communication),
    hiddenCommunication: overlapLength(communication, compute),
    update: measure(update),
    hiddenUpdate: overlapLength(update, compute),
  };
}

/**
 * The median of each figure over several steps (each figure on its own).
 *
 * @example
 * ```ts
 * import { medianFigures } from "./figures.ts";
 * const one = { total: 10, compute: 8, communication: 2, hiddenCommunication: 1, update: 1, hiddenUpdate: 0 };
 * console.log(medianFigures([one, one, { ...one, total: 30 }]).total); // 10
 * ```
 */
export function medianFigures(steps: readonly StepFigures[]): StepFigures {
  const median = (key: keyof StepFigures) => {
    const values = steps.map((s) => s[key]).sort((a, b) => a - b);
    if (values.length === 0) return 0;
    const mid = values.length >> 1;
    return values.length % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
  };
  return {
    total: median("total"),
    compute: median("compute"),
    communication: median("communication"),
    hiddenCommunication: median("hiddenCommunication"),
    update: median("update"),
    hiddenUpdate: median("hiddenUpdate"),
  };
}
