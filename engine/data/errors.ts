/**
 * The data layer's error class.
 *
 * @module
 */

import { TandemError } from "../errors.ts";

/**
 * A dataset file or dataset argument that is missing, malformed or inconsistent. The message names
 * the file (or dataset), what was expected and what was found, e.g. a truncated CIFAR batch:
 * `data_batch_1.bin: expected a multiple of 3073 bytes (one label + 3072 pixels per record), found 6145`.
 *
 * @example
 * ```ts
 * import { DataError } from "./errors.ts";
 * const e = new DataError("labels.idx", "expected magic 2049, found 2051");
 * console.log(e.source, e.message); // "labels.idx", "labels.idx: expected magic 2049, found 2051"
 * ```
 */
export class DataError extends TandemError {
  /** The file path or dataset name the error is about. */
  readonly source: string;
  /** An error about `source`; the message is prefixed with it. */
  constructor(source: string, message: string) {
    super(`${source}: ${message}`);
    this.source = source;
  }
}
