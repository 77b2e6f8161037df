/**
 * Errors of reading and writing tensor files and checkpoints.
 *
 * @module
 */

import { TandemError } from "../errors.ts";

/**
 * A safetensors file (or byte buffer) that is malformed, or tensors that cannot be written in the
 * format. The message starts with the file and says what is wrong.
 *
 * @example
 * ```ts
 * import { SafetensorsError } from "./errors.ts";
 * const e = new SafetensorsError("model.safetensors", "header length 9000 reaches beyond the file");
 * console.log(e.source, e.message);
 * ```
 */
export class SafetensorsError extends TandemError {
  /** The file path, or a description of the bytes (`"<bytes>"`). */
  readonly source: string;
  /** An error about `source`; the message is prefixed with it. */
  constructor(source: string, message: string, options?: { cause?: unknown }) {
    super(`${source}: ${message}`);
    this.source = source;
    if (options?.cause !== undefined) this.cause = options.cause;
  }
}

/**
 * A checkpoint that does not fit the model or optimizer it is loaded into. `problems` lists every
 * mismatch found (missing, unexpected, shape or dtype differences, wrong model name, optimizer
 * state), so one failed load shows all of them; nothing was modified.
 *
 * @example
 * ```ts
 * import { CheckpointError } from "./errors.ts";
 * const e = new CheckpointError("ckpt.safetensors", ['missing: parameter "fc.bias" [10] F32']);
 * console.log(e.problems.length);
 * ```
 */
export class CheckpointError extends TandemError {
  /** The checkpoint file. */
  readonly path: string;
  /** Every mismatch, one sentence each. */
  readonly problems: readonly string[];
  /** An error listing `problems` of the checkpoint at `path`. */
  constructor(path: string, problems: readonly string[]) {
    super(
      `${path}: checkpoint does not fit (${problems.length} problem${
        problems.length === 1 ? "" : "s"
      }):\n  ` +
        problems.join("\n  "),
    );
    this.path = path;
    this.problems = Object.freeze([...problems]);
  }
}

/**
 * An output path that cannot be written: empty, a directory, a socket, a link loop, a missing or
 * unwritable directory, or a write the file system refused. The message is one line: the path as
 * given, then what was found and what was expected.
 *
 * @example
 * ```ts
 * import { OutputPathError } from "./errors.ts";
 * const e = new OutputPathError("runs/", "is a directory; expected a file path");
 * console.log(e.path, e.message);
 * ```
 */
export class OutputPathError extends TandemError {
  /** The path as the caller gave it. */
  readonly path: string;
  /** What is wrong, without the path. */
  readonly problem: string;
  /** An error about `path`; the message is prefixed with it. */
  constructor(path: string, problem: string, options?: { cause?: unknown }) {
    super(`${path === "" ? '""' : path}: ${problem}`);
    this.path = path;
    this.problem = problem;
    if (options?.cause !== undefined) this.cause = options.cause;
  }
}
