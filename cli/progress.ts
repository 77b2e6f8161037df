/**
 * Training progress on stderr: a live bar redrawn in place on a terminal, plain lines (a few per
 * epoch) when stderr is a file or pipe, so logs stay readable.
 *
 * @module
 */

/** One step's figures for the progress display. */
export interface ProgressUpdate {
  /** Total steps done (resumed steps included). */
  step: number;
  /** Epoch of the step just done (0-based). */
  epoch: number;
  /** Loss of the step. */
  loss: number;
  /** Images per second so far in this run. */
  imagesPerSecond: number;
}

const encoder = new TextEncoder();

/** Formats seconds as `1m05s` or `42s`. */
export function formatDuration(seconds: number): string {
  if (!Number.isFinite(seconds)) return "?";
  const s = Math.max(0, Math.round(seconds));
  return s >= 60 ? `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s` : `${s}s`;
}

/**
 * How progress may draw on stderr: redrawn in place only on a terminal (a pipe or file gets plain
 * lines, so logs stay readable), and erased with an ANSI code only when `NO_COLOR` is unset too
 * (otherwise a carriage return and spaces do it). No escape code ever reaches a pipe or file.
 *
 * @example
 * ```ts
 * import { Progress, stderrStyle } from "./progress.ts";
 * const progress = new Progress({ first: 0, target: 10, epochs: 1, ...stderrStyle() });
 * progress.done();
 * ```
 */
export function stderrStyle(): { live: boolean; ansi: boolean } {
  const live = Deno.stderr.isTerminal();
  return { live, ansi: live && !Deno.noColor };
}

/**
 * Shows progress towards `target` steps.
 *
 * @example
 * ```ts
 * import { Progress } from "./progress.ts";
 * const progress = new Progress({ first: 0, target: 10, epochs: 1, live: false });
 * progress.update({ step: 10, epoch: 0, loss: 0.5, imagesPerSecond: 200 });
 * progress.done();
 * ```
 */
export class Progress {
  readonly #first: number;
  readonly #target: number;
  readonly #epochs: number;
  readonly #live: boolean;
  readonly #ansi: boolean;
  readonly #every: number;
  #width = 0;
  readonly #started = performance.now();
  #drawn = false;

  /**
   * `first`: the step the run starts at (after a resume); `live`: redraw one line in place (a
   * terminal) rather than printing lines; `ansi` (default `live`): erase that line with an escape
   * code rather than spaces (see {@link stderrStyle}).
   */
  constructor(options: { first: number; target: number; epochs: number; live: boolean; ansi?: boolean }) {
    this.#first = options.first;
    this.#target = options.target;
    this.#epochs = options.epochs;
    this.#live = options.live;
    this.#ansi = options.live && (options.ansi ?? true);
    this.#every = Math.max(1, Math.round((this.#target - this.#first) / 20));
  }

  /** Redraws (terminal) or prints a line every twentieth of the run (otherwise). */
  update(u: ProgressUpdate): void {
    const done = u.step - this.#first, total = this.#target - this.#first;
    const elapsed = (performance.now() - this.#started) / 1000;
    const eta = done > 0 ? elapsed / done * (total - done) : NaN;
    const figures = `step ${u.step}/${this.#target}  epoch ${u.epoch + 1}/${this.#epochs}  ` +
      `${u.imagesPerSecond.toFixed(0)} images/s  loss ${u.loss.toFixed(4)}  ETA ${formatDuration(eta)}`;
    if (this.#live) {
      const width = 24, filled = Math.round(width * Math.min(1, total > 0 ? done / total : 1));
      const bar = "█".repeat(filled) + "░".repeat(width - filled);
      const line = `${bar} ${figures}`;
      // Without ANSI, spaces wipe what a longer previous line left.
      this.#write(this.#ansi ? `\r\x1b[2K${line}` : `\r${line.padEnd(this.#width)}`);
      this.#width = line.length;
      this.#drawn = true;
    } else if (done % this.#every === 0 || u.step === this.#target || done === 1) {
      this.#write(`${figures}\n`);
    }
  }

  /** Prints a message on its own line without breaking the bar. */
  log(message: string): void {
    this.done();
    this.#write(`${message}\n`);
  }

  /** Ends the live line. */
  done(): void {
    if (this.#drawn) this.#write("\n");
    this.#drawn = false;
  }

  #write(text: string): void {
    Deno.stderr.writeSync(encoder.encode(text));
  }
}
