/**
 * The error every schedule problem raises, whether found while parsing the text, while validating a
 * plan or while building one in code. It points at the place in the schedule text, so a user with a
 * long schedule file sees the line, the column and a caret instead of an action index.
 *
 * @module
 */

import { TandemError } from "../../engine/errors.ts";

/**
 * Where a schedule problem is.
 *
 * @example
 * ```ts
 * import { ScheduleError, type ScheduleErrorLocation } from "./errors.ts";
 * const at: ScheduleErrorLocation = { schedule: "overlap", line: 0, column: 0, actionIndex: 4 };
 * console.log(new ScheduleError("reduce conv comes before backward conv", at).message);
 * ```
 */
export interface ScheduleErrorLocation {
  /** The file name, or the schedule's name when it did not come from a file. */
  readonly schedule: string;
  /** 1-based line; 0 when the plan was built in code and has no text. */
  readonly line: number;
  /** 1-based column (UTF-16 code units, a tab counts as one); 0 with `line` 0. */
  readonly column: number;
  /** The text of that line, quoted under the message with a caret. */
  readonly sourceLine?: string;
  /** 0-based index of the action in the plan, named in the message when there is no line. */
  readonly actionIndex?: number;
}

/**
 * A schedule that cannot run: bad syntax, an unknown group, or actions in an order the data does not
 * allow. The message reads
 * `schedule "my.sched" line 3, column 1: update fc comes before reduce fc` followed by the source
 * line and a caret; for plans built in code, which have no text, it names the action index instead.
 *
 * @example
 * ```ts
 * import { ScheduleError } from "./errors.ts";
 * const e = new ScheduleError("update fc comes before reduce fc", {
 *   schedule: "my.sched",
 *   line: 3,
 *   column: 1,
 *   sourceLine: "update fc; backward conv",
 * });
 * console.log(e.message);
 * // schedule "my.sched" line 3, column 1: update fc comes before reduce fc
 * //   update fc; backward conv
 * //   ^
 * ```
 */
export class ScheduleError extends TandemError {
  /** What is wrong, without the location. */
  readonly reason: string;
  /** The file name or schedule name the message quotes. */
  readonly schedule: string;
  /** 1-based line, 0 for plans built in code. */
  readonly line: number;
  /** 1-based column, 0 for plans built in code. */
  readonly column: number;
  /** The offending line's text, `""` when unknown. */
  readonly sourceLine: string;
  /** 0-based action index when the problem is an action, else `undefined`. */
  readonly actionIndex?: number;

  /** An error saying `reason` at `location`. */
  constructor(reason: string, location: ScheduleErrorLocation) {
    super(formatMessage(reason, location));
    this.reason = reason;
    this.schedule = location.schedule;
    this.line = location.line;
    this.column = location.column;
    this.sourceLine = location.sourceLine ?? "";
    this.actionIndex = location.actionIndex;
  }
}

function formatMessage(reason: string, at: ScheduleErrorLocation): string {
  const name = `schedule ${JSON.stringify(at.schedule)}`;
  if (at.line > 0) {
    const head = `${name} line ${at.line}, column ${at.column}: ${reason}`;
    if (at.sourceLine === undefined) return head;
    // Keep the line's own tabs in the caret's indent so the caret lines up in any tab width.
    const indent = at.sourceLine.slice(0, Math.max(0, at.column - 1)).replace(/[^\t]/g, " ");
    return `${head}\n  ${at.sourceLine}\n  ${indent}^`;
  }
  if (at.actionIndex !== undefined) return `${name} action ${at.actionIndex}: ${reason}`;
  return `${name}: ${reason}`;
}
