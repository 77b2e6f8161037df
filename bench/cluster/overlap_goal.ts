/**
 * The overlap goal of the cluster bench (`bench/CLUSTER.md`), checked on its measured rows: an
 * overlapping schedule should hide the FC exchange wherever the conv backward is long enough to cover
 * it, and leave visible at most the part it cannot cover. Each row is checked against the
 * `sequential` steps that took turns with its own in the same launch (`pairedWith` in `rank.ts`), so
 * that the machine's drift between launches does not pass for hiding or for its absence.
 *
 * @module
 */

/** The figures of one measured row the goal needs (medians over the timed steps, ms). */
export interface GoalRow {
  /** The step. */
  stepMs: number;
  /** Rank 0's FC reduce and broadcast: T_fc_comm where this is the sequential reference. */
  fcCommMs: number;
  /** The conv layers' backward (every group but the FC one), the slowest rank's. */
  bodyBackwardMs: number;
}

/**
 * The share of the sequential reference's FC exchange a row hid: (T_seq − T) / T_fc_comm.
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
 * The overlap goal for one net and mode, checked on each measured row against its own sequential
 * reference `seq`: where the reference's conv backward (slowest rank) is at least as long as its FC
 * exchange (T_fc_comm), (T_seq − T) / T_fc_comm ≥ 0.8; where it is shorter, what stays visible,
 * T − (T_seq − T_fc_comm), is at most the difference T_fc_comm − conv backward. Returns one sentence
 * naming each row's figures and whether it meets the goal.
 *
 * @example
 * ```ts
 * import { overlapGoal } from "./overlap_goal.ts";
 * const seq = { stepMs: 80, fcCommMs: 33, bodyBackwardMs: 20 };
 * overlapGoal("allreduce", [{ name: "overlap", r: { stepMs: 66 }, seq }]);
 * // … overlap: the conv backward (20.0 ms) is shorter than the FC exchange (33.0 ms), so at most the
 * // difference, 13.0 ms, may stay visible: 19.0 ms (not met).
 * ```
 */
export function overlapGoal(
  mode: string,
  rows: readonly { name: string; r: Pick<GoalRow, "stepMs">; seq: GoalRow }[],
  ms: (value: number) => string = (v) => `${v.toFixed(1)} ms`,
): string {
  const verdict = (met: boolean) => (met ? "met" : "not met");
  const each = rows.map(({ name, r, seq }) => {
    const conv = seq.bodyBackwardMs, comm = seq.fcCommMs;
    const backward = `the conv backward (${ms(conv)})`;
    if (conv >= comm) {
      const hidden = hiddenShare(seq, r);
      return `${name}: ${backward} covers the FC exchange (${ms(comm)}), so the hidden fraction should ` +
        `reach 0.8: ${hidden.toFixed(2)} (${verdict(hidden >= 0.8)})`;
    }
    const allowed = comm - conv, visible = r.stepMs - (seq.stepMs - comm);
    return `${name}: ${backward} is shorter than the FC exchange (${ms(comm)}), so at most the difference, ` +
      `${ms(allowed)}, may stay visible: ${ms(visible)} (${verdict(visible <= allowed)})`;
  });
  return `**Overlap goal, ${mode}** (each row against the \`sequential\` steps that took turns with its ` +
    `own; the FC exchange is the sequential steps' T_fc_comm, the conv backward theirs, slowest rank; what ` +
    `stays visible is T − (T_seq − T_fc_comm)): ${each.join("; ")}.`;
}
