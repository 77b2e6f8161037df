/**
 * Error classes users can catch. Each message names the op or layer, what was given and what was
 * expected, so a wrong shape deep in a network points straight at its cause.
 *
 * @module
 */

/**
 * Base class of every error Tandem throws on purpose.
 *
 * @example
 * ```ts
 * import { TandemError } from "./errors.ts";
 * try { throw new TandemError("boom"); } catch (e) { console.log(e instanceof TandemError); }
 * ```
 */
export class TandemError extends Error {
  /** An error with `message`; its `name` is the concrete class's name. */
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/**
 * Shapes or arguments that do not fit an op.
 *
 * @example
 * ```ts
 * import { ShapeError } from "./errors.ts";
 * const e = new ShapeError("matmul", "inner dimensions differ: a [2, 3], b [4, 5]");
 * console.log(e.op, e.message);
 * ```
 */
export class ShapeError extends TandemError {
  /** The op that rejected its input. */
  readonly op: string;
  /** An error about `op`; the message is prefixed with the op's name. */
  constructor(op: string, message: string) {
    super(`${op}: ${message}`);
    this.op = op;
  }
}

/**
 * An argument value outside its valid range (labels, probabilities, counts).
 *
 * @example
 * ```ts
 * import { ValueError } from "./errors.ts";
 * console.log(new ValueError("dropout", "p must be in [0, 1), got 1.5").message);
 * ```
 */
export class ValueError extends TandemError {
  /** The op that rejected its input. */
  readonly op: string;
  /** An error about `op`; the message is prefixed with the op's name. */
  constructor(op: string, message: string) {
    super(`${op}: ${message}`);
    this.op = op;
  }
}

/**
 * A NaN or infinity where a finite number is required (e.g. logits of a loss).
 *
 * @example
 * ```ts
 * import { NonFiniteError } from "./errors.ts";
 * console.log(new NonFiniteError("softmaxCrossEntropy", "logits hold NaN at [0, 3]").message);
 * ```
 */
export class NonFiniteError extends TandemError {
  /** The op that found the value. */
  readonly op: string;
  /** An error about `op`; the message is prefixed with the op's name. */
  constructor(op: string, message: string) {
    super(`${op}: ${message}`);
    this.op = op;
  }
}

/**
 * A tensor used after `dispose()`, or a gradient graph used after it was freed.
 *
 * @example
 * ```ts
 * import { DisposedError } from "./errors.ts";
 * console.log(new DisposedError("tensor [2, 2] was disposed").name);
 * ```
 */
export class DisposedError extends TandemError {}

/** Formats a shape as `[2, 3]` for messages. */
export function formatShape(shape: readonly number[]): string {
  return `[${shape.join(", ")}]`;
}

/**
 * Levenshtein distance between two strings, for "did you mean" hints in messages.
 *
 * @example
 * ```ts
 * import { editDistance } from "./errors.ts";
 * editDistance("updat", "update"); // 1
 * ```
 */
export function editDistance(a: string, b: string): number {
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const current = [i];
    for (let j = 1; j <= b.length; j++) {
      current[j] = Math.min(
        previous[j] + 1,
        current[j - 1] + 1,
        previous[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1),
      );
    }
    previous = current;
  }
  return previous[b.length];
}
