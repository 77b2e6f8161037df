/**
 * Periodic checkpoints, as Caffe's `snapshot`: `--checkpoint run.safetensors --checkpoint-every N`
 * rewrites `run.safetensors` every N steps; with `--keep K` each one is also kept as a numbered file
 * beside it, `run-000200.safetensors` (the step zero-padded to 6 digits, longer when it needs more),
 * and only the last K numbered ones stay.
 *
 * @module
 */

import { basename, dirname, join } from "node:path";

const EXTENSION = ".safetensors";

/** `path` split into directory, stem and extension (`.safetensors`, or none when it has another). */
function parts(path: string): { directory: string; stem: string; extension: string } {
  const name = basename(path);
  const extension = name.endsWith(EXTENSION) && name.length > EXTENSION.length ? EXTENSION : "";
  return { directory: dirname(path), stem: name.slice(0, name.length - extension.length), extension };
}

/**
 * Where a diverged run keeps its last finite state: beside `--checkpoint`, never over it
 * (`run.safetensors` → `run.before-divergence.safetensors`).
 *
 * @example
 * ```ts
 * import { divergedCheckpointPath } from "./snapshots.ts";
 * divergedCheckpointPath("out/run.safetensors"); // "out/run.before-divergence.safetensors"
 * ```
 */
export function divergedCheckpointPath(checkpoint: string): string {
  const { directory, stem, extension } = parts(checkpoint);
  return join(directory, `${stem}.before-divergence${extension}`);
}

/**
 * The numbered snapshot of `checkpoint` at `step`, in the same directory as the path given (not
 * that of a symbolic link's target).
 *
 * @example
 * ```ts
 * import { snapshotPath } from "./snapshots.ts";
 * snapshotPath("runs/run.safetensors", 200); // "runs/run-000200.safetensors"
 * ```
 */
export function snapshotPath(checkpoint: string, step: number): string {
  const { directory, stem, extension } = parts(checkpoint);
  return join(directory, `${stem}-${String(step).padStart(6, "0")}${extension}`);
}

/**
 * The step of a file name in `checkpoint`'s directory that is one of its numbered snapshots, or
 * `undefined` for any other name.
 *
 * @example
 * ```ts
 * import { snapshotStep } from "./snapshots.ts";
 * snapshotStep("run.safetensors", "run-000200.safetensors"); // 200
 * ```
 */
export function snapshotStep(checkpoint: string, name: string): number | undefined {
  const { stem, extension } = parts(checkpoint);
  if (!name.startsWith(`${stem}-`) || !name.endsWith(extension)) return undefined;
  const digits = name.slice(stem.length + 1, name.length - extension.length);
  return /^\d{6,}$/.test(digits) ? Number(digits) : undefined;
}

/**
 * Deletes numbered snapshots of `checkpoint` beyond the `keep` latest at or before `step`. Only
 * regular files named as {@link snapshotPath} names them; numbered files of later steps (another
 * run's) are left alone. Returns the paths deleted.
 */
export async function rotateSnapshots(checkpoint: string, keep: number, step: number): Promise<string[]> {
  const { directory } = parts(checkpoint);
  const found: { step: number; path: string }[] = [];
  for await (const entry of Deno.readDir(directory)) {
    const at = snapshotStep(checkpoint, entry.name);
    if (entry.isFile && at !== undefined && at <= step) {
      found.push({ step: at, path: join(directory, entry.name) });
    }
  }
  found.sort((a, b) => b.step - a.step);
  const doomed = found.slice(keep).map((f) => f.path);
  for (const path of doomed) await Deno.remove(path);
  return doomed;
}

/**
 * Where one run saves its checkpoints: `save(step)` writes the numbered snapshot (with `keep`),
 * then `checkpoint` itself, then rotates; a second save at the same step writes nothing.
 */
export class Snapshots {
  readonly #checkpoint: string;
  readonly #keep: number | undefined;
  readonly #write: (path: string, step: number) => Promise<void>;
  #saved: number | undefined;

  /** Snapshots of `checkpoint`; `write` saves the run's state at a step to a path. */
  constructor(
    checkpoint: string,
    keep: number | undefined,
    write: (path: string, step: number) => Promise<void>,
  ) {
    this.#checkpoint = checkpoint;
    this.#keep = keep;
    this.#write = write;
  }

  /** Saves the state at `step` (see the class). Only the rank that writes files calls it. */
  async save(step: number): Promise<void> {
    if (this.#saved === step) return;
    // Numbered first: a kill between the two writes leaves both files whole, the latest one older.
    if (this.#keep !== undefined) await this.#write(snapshotPath(this.#checkpoint, step), step);
    await this.#write(this.#checkpoint, step);
    this.#saved = step;
    if (this.#keep !== undefined) await rotateSnapshots(this.#checkpoint, this.#keep, step);
  }
}
