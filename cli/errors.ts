/**
 * Errors of the command line and how they reach the user: every problem a user can cause ends as one
 * clear message on stderr and a non-zero exit, never a stack trace.
 *
 * @module
 */

import { CheckpointError, TandemError } from "../mod.ts";
import { editDistance } from "../engine/errors.ts";
import { showUserPaths } from "./paths.ts";

/** Exit status of a bad command line (as getopt-style tools use). */
export const EXIT_USAGE = 2;
/** Exit status of a run that failed (bad data, bad checkpoint, diverged training…). */
export const EXIT_FAILURE = 1;
/** Exit status after Ctrl-C, as shells report a SIGINT death (128 + 2). */
export const EXIT_INTERRUPTED = 130;
/** Exit status after SIGTERM (what a scheduler sends), as shells report a SIGTERM death (128 + 15). */
export const EXIT_TERMINATED = 143;

/**
 * A problem with what the user asked for, reported without a stack trace.
 *
 * @example
 * ```ts
 * import { CliError } from "./errors.ts";
 * throw new CliError("--devices must be at least 1, got 0");
 * ```
 */
export class CliError extends Error {
  /** Process exit status to use. */
  readonly exitCode: number;

  /** An error whose message is shown as is; `exitCode` defaults to {@link EXIT_USAGE}. */
  constructor(message: string, exitCode = EXIT_USAGE) {
    super(message);
    this.name = "CliError";
    this.exitCode = exitCode;
  }
}

/**
 * The message and exit status for an error the user caused, or `undefined` for a bug (whose stack
 * is worth printing). Paths the CLI resolved against the user's directory are shown relative to it
 * again, as typed (see `showUserPaths`).
 *
 * @example
 * ```ts
 * import { CliError, describeError } from "./errors.ts";
 * describeError(new CliError("bad")); // { message: "bad", exitCode: 2 }
 * ```
 */
export function describeError(error: unknown): { message: string; exitCode: number } | undefined {
  const known = knownError(error);
  return known && { message: showUserPaths(known.message), exitCode: known.exitCode };
}

function knownError(error: unknown): { message: string; exitCode: number } | undefined {
  if (error instanceof CliError) return { message: error.message, exitCode: error.exitCode };
  if (error instanceof CheckpointError) {
    // One line, however many tensors differ (a checkpoint of another model lists every one).
    const listed = error.problems.slice(0, 3).join("; ");
    const more = error.problems.length > 3 ? `; … ${error.problems.length} problems in all` : "";
    return { message: `${error.path}: checkpoint does not fit: ${listed}${more}`, exitCode: EXIT_FAILURE };
  }
  if (error instanceof TandemError) return { message: error.message, exitCode: EXIT_FAILURE };
  // File-system errors already name the operation and path, which is all a user needs.
  if (
    error instanceof Deno.errors.NotFound || error instanceof Deno.errors.PermissionDenied ||
    error instanceof Deno.errors.IsADirectory || error instanceof Deno.errors.NotADirectory
  ) {
    return { message: error.message, exitCode: EXIT_FAILURE };
  }
  return undefined;
}

/**
 * Suggests the closest of `candidates` to `word` (edit distance at most a third of its length, at
 * least 2), for "did you mean" hints.
 *
 * @example
 * ```ts
 * import { closest } from "./errors.ts";
 * closest("--epoch", ["--epochs", "--steps"]); // "--epochs"
 * ```
 */
export function closest(word: string, candidates: readonly string[]): string | undefined {
  let best: string | undefined, bestDistance = Infinity;
  for (const candidate of candidates) {
    const d = editDistance(word, candidate);
    if (d < bestDistance) [best, bestDistance] = [candidate, d];
  }
  return bestDistance <= Math.max(2, Math.floor(word.length / 3)) ? best : undefined;
}
