/**
 * A promise with its settle functions in hand: how the trainers turn "device d finished group g"
 * signals into something the communication lane can await.
 *
 * @module
 */

/** A promise and the functions that settle it. */
export interface Deferred<T> {
  /** Settles when `resolve` or `reject` is called. */
  promise: Promise<T>;
  /** Fulfils `promise`. */
  resolve: (value: T) => void;
  /** Rejects `promise`. */
  reject: (error: unknown) => void;
}

/**
 * A new {@link Deferred}. Its rejection counts as handled, so a failure nobody awaited (a device
 * that failed before the lane waited on it) cannot crash the process; whoever awaits it still sees it.
 *
 * @example
 * ```ts
 * import { deferred } from "./deferred.ts";
 * const ready = deferred<void>();
 * setTimeout(() => ready.resolve(), 1);
 * await ready.promise;
 * ```
 */
export function deferred<T>(): Deferred<T> {
  let resolve!: (value: T) => void, reject!: (error: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  promise.catch(() => {});
  return { promise, resolve, reject };
}
