/**
 * Interval arithmetic shared by the simulator and the trace recorder, so that "hidden
 * communication" means the same thing for predicted and for measured timelines.
 *
 * @module
 */

/**
 * A half-open time interval `[start, end)`.
 *
 * @example
 * ```ts
 * import { type Interval, measure } from "./intervals.ts";
 * const busy: Interval[] = [{ start: 0, end: 2 }, { start: 1, end: 3 }];
 * console.log(measure(busy)); // 3
 * ```
 */
export interface Interval {
  /** Start time. */
  readonly start: number;
  /** End time, `>= start`. */
  readonly end: number;
}

/**
 * The union of `intervals` as sorted, disjoint, non-empty intervals.
 *
 * @example
 * ```ts
 * import { union } from "./intervals.ts";
 * console.log(union([{ start: 2, end: 4 }, { start: 0, end: 3 }])); // [{ start: 0, end: 4 }]
 * ```
 */
export function union(intervals: readonly Interval[]): Interval[] {
  const sorted = intervals.filter((i) => i.end > i.start).sort((a, b) => a.start - b.start);
  const out: { start: number; end: number }[] = [];
  for (const { start, end } of sorted) {
    const last = out[out.length - 1];
    if (last !== undefined && start <= last.end) last.end = Math.max(last.end, end);
    else out.push({ start, end });
  }
  return out;
}

/**
 * Total length of the union of `intervals` (overlapping parts count once).
 *
 * @example
 * ```ts
 * import { measure } from "./intervals.ts";
 * console.log(measure([{ start: 0, end: 3 }, { start: 2, end: 4 }])); // 4
 * ```
 */
export function measure(intervals: readonly Interval[]): number {
  return union(intervals).reduce((sum, i) => sum + (i.end - i.start), 0);
}

/**
 * Length of the time covered both by some interval of `a` and by some interval of `b`.
 *
 * @example
 * ```ts
 * import { overlapLength } from "./intervals.ts";
 * console.log(overlapLength([{ start: 0, end: 4 }], [{ start: 3, end: 10 }])); // 1
 * ```
 */
export function overlapLength(a: readonly Interval[], b: readonly Interval[]): number {
  const ua = union(a);
  const ub = union(b);
  let total = 0;
  let j = 0;
  for (const x of ua) {
    while (j < ub.length && ub[j].end <= x.start) j++;
    for (let k = j; k < ub.length && ub[k].start < x.end; k++) {
      total += Math.min(x.end, ub[k].end) - Math.max(x.start, ub[k].start);
    }
  }
  return total;
}
