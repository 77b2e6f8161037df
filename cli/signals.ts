/**
 * Stopping a run cleanly: Ctrl-C (SIGINT) or SIGTERM, which a scheduler sends, finishes the current
 * step, saves a checkpoint and exits as shells report a death by that signal (130 or 143).
 *
 * @module
 */

import { EXIT_INTERRUPTED, EXIT_TERMINATED } from "./errors.ts";

/** A signal that stops a run after a save. */
export type StopSignal = "SIGINT" | "SIGTERM";

/**
 * Listens for SIGINT and SIGTERM while installed. The first one is remembered ({@link requested});
 * a second exits at once, without saving.
 */
export class StopSignals {
  #requested: StopSignal | undefined;
  readonly #log: (line: string) => void;
  readonly #listeners: [StopSignal, () => void][];

  /** Says on `log` what happens after the first signal. */
  constructor(log: (line: string) => void) {
    this.#log = log;
    // SIGTERM cannot be listened for on Windows (Deno supports only SIGINT and SIGBREAK there).
    const signals: StopSignal[] = Deno.build.os === "windows" ? ["SIGINT"] : ["SIGINT", "SIGTERM"];
    this.#listeners = signals.map((signal) => [signal, () => this.#on(signal)]);
  }

  #on(signal: StopSignal): void {
    if (this.#requested) Deno.exit(exitStatus(signal)); // a second signal does not wait
    this.#requested = signal;
    this.#log(
      `${signal === "SIGINT" ? "interrupted" : "terminated (SIGTERM)"}: finishing the current step, ` +
        `then saving a checkpoint (${signal === "SIGINT" ? "Ctrl-C" : "a signal"} again to quit now)`,
    );
  }

  /** The first signal received, if any. */
  get requested(): StopSignal | undefined {
    return this.#requested;
  }

  /** Starts listening. */
  install(): void {
    for (const [signal, listener] of this.#listeners) Deno.addSignalListener(signal, listener);
  }

  /** Stops listening. */
  remove(): void {
    for (const [signal, listener] of this.#listeners) Deno.removeSignalListener(signal, listener);
  }
}

/**
 * The exit status after stopping on `signal`: 130 for SIGINT, 143 for SIGTERM.
 *
 * @example
 * ```ts
 * import { exitStatus } from "./signals.ts";
 * exitStatus("SIGTERM"); // 143
 * ```
 */
export function exitStatus(signal: StopSignal): number {
  return signal === "SIGTERM" ? EXIT_TERMINATED : EXIT_INTERRUPTED;
}
