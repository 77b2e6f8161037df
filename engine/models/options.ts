/**
 * Options shared by the model factories.
 *
 * @module
 */

import { ValueError } from "../errors.ts";

/**
 * What every model factory accepts.
 *
 * @example
 * ```ts
 * import type { ModelOptions } from "./options.ts";
 * const options: ModelOptions = { seed: 7, classes: 10 };
 * ```
 */
export interface ModelOptions {
  /** Initialisation seed (default 0): the same seed gives bit-identical parameters everywhere. */
  seed?: number;
  /** Number of output classes (the last layer's width); each model has its own default. */
  classes?: number;
}

/**
 * Reads `options.classes`, checking it is a positive integer.
 *
 * @example
 * ```ts
 * import { classesOf } from "./options.ts";
 * classesOf({ classes: 10 }, 1000, "alexnet"); // 10
 * ```
 */
export function classesOf(options: ModelOptions, fallback: number, model: string): number {
  const classes = options.classes ?? fallback;
  if (!Number.isInteger(classes) || classes < 1) {
    throw new ValueError(model, `classes must be a positive integer, got ${classes}`);
  }
  return classes;
}
