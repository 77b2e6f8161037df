/**
 * The overlap goal of the cluster bench (`bench/CLUSTER.md`), checked on its measured rows: an
 * overlapping schedule should hide the FC exchange wherever the conv backward is long enough to cover
 * it, and leave visible at most the part it cannot cover.
 *
 * @module
 */

/** The figures of one measured row the goal needs (medians over the timed steps, ms). */
export interface GoalRow {
  /** The step. */
  stepMs: number;
  /** Rank 0's FC reduce and broadcast: T_fc_comm of the sequential row. */
  fcCommMs: number;
  /** The conv layers' backward (every group but the FC one), the slowest rank's. */
  bodyBackwardMs: number;
}

/**
 * The share of the sequential row's FC exchange a row hid: (T_seq − T) / T_fc_comm.
 *
 * @example
 * ```ts
 * import { hiddenShare } from "./overlap_goal.ts";
 * hiddenShare({ stepMs: 100, fcCommMs: 40, bodyBackwardMs: 50 }, { stepMs: 66 }); // 0.85
 * ```
 */
export function hiddenShare(seq: GoalRow, row: Pick<GoalRow, "stepMs">): number {
  return (seq.stepMs - row.stepMs) / seq.fcCommMs;
}

/**
 * The overlap goal for one net and mode, checked on the measured rows: where the conv
 * backward (the sequential row's, slowest rank) is at least as long as the FC exchange (its T_fc_comm),
 * (T_seq − T) / T_fc_comm ≥ 0.8; where it is shorter, what stays visible, T − (T_seq − T_fc_comm), is
 * at most the difference T_fc_comm − conv backward. Returns one sentence naming each row's figure
 * and whether it meets the goal.
 *
 * @example
 * ```ts
 * import { overlapGoal } from "./overlap_goal.ts";
 * const seq = { stepMs: 80, fcCommMs: 33, bodyBackwardMs: 20 };
 * overlapGoal("allreduce", seq, [{ name: "overlap", r: { stepMs: 66, fcCommMs: 40, bodyBackwardMs: 30 } }]);
 * // … at most the difference, 13.0 ms: overlap 19.0 ms (not met).
 * ```
 */
export function overlapGoal(
  mode: string,
  seq: GoalRow,
  rows: readonly { name: string; r: GoalRow }[],
  ms: (value: number) => string = (v) => `${v.toFixed(1)} ms`,
): string {
  const conv = seq.bodyBackwardMs, comm = seq.fcCommMs;
  const verdict = (met: boolean) => (met ? "met" : "not met");
  const backward = `the conv backward (${ms(conv)}, sequential row, slowest rank)`;
  if (conv >= comm) {
    const each = rows.map(({ name, r }) => {
      const hidden = hiddenShare(seq, r);
      return `${name} ${hidden.toFixed(2)} (${verdict(hidden >= 0.8)})`;
    });
    return `**Overlap goal, ${mode}:** ${backward} covers the FC exchange (${ms(comm)}), so the hidden ` +
      `fraction should reach 0.8: ${each.join(", ")}.`;
  }
  const allowed = comm - conv;
  const each = rows.map(({ name, r }) => {
    const visible = r.stepMs - (seq.stepMs - comm);
    return `${name} ${ms(visible)} (${verdict(visible <= allowed)})`;
  });
  return `**Overlap goal, ${mode}:** ${backward} is shorter than the FC exchange (${ms(comm)}), so what ` +
    `stays visible, T − (T_seq − T_fc_comm), should be at most the difference, ${ms(allowed)}: ${
      each.join(", ")
    }.`;
}
