/**
 * Error-feedback residuals in checkpoints (`wire.ts`): with `--error-feedback` each device carries
 * what rounding dropped into its next step, so a run resumed without them would differ from a
 * straight one. A checkpoint stores one float32 tensor per device over the whole layout, named
 * `wire.residual.<device>` (among `saveCheckpoint`'s `extraTensors`); resuming gives every device its
 * own back, which makes N steps straight equal K steps + save + resume + N − K steps bit for bit.
 *
 * What a resume does when the checkpoint and the run disagree (each said in one line; the
 * parameters and optimizer state are restored either way, only the residuals, at most half a unit
 * in the last place of a 16-bit value each, are lost):
 * - no residuals in the checkpoint, error feedback on: every device starts from zero residuals;
 * - residuals for another number of devices: zero residuals (a device's residual belongs to its
 *   shard of the batch, so they cannot be redistributed);
 * - residuals, but error feedback off: they are ignored.
 *
 * @module
 */

import { ValueError } from "../../../engine/errors.ts";
import type { DataParallelTrainer } from "../trainer.ts";

/** Name prefix of the residual tensors: `wire.residual.0`, `wire.residual.1`, … */
export const RESIDUAL_PREFIX = "wire.residual.";

/**
 * The checkpoint tensors of `residuals` (device d's under `wire.residual.<d>`); none without.
 *
 * @example
 * ```ts
 * import { residualTensors } from "./residuals.ts";
 * console.log(Object.keys(residualTensors([new Float32Array(3), new Float32Array(3)])));
 * // ["wire.residual.0", "wire.residual.1"]
 * ```
 */
export function residualTensors(
  residuals: readonly Float32Array[] | undefined,
): Record<string, Float32Array> {
  return Object.fromEntries((residuals ?? []).map((r, d) => [`${RESIDUAL_PREFIX}${d}`, r]));
}

/**
 * The residuals in a checkpoint's extra tensors, in device order; `undefined` when it has none. A
 * set with gaps (`wire.residual.0` and `.2`, no `.1`) is a `ValueError`.
 *
 * @example
 * ```ts
 * import { residualsOf } from "./residuals.ts";
 * console.log(residualsOf({ "wire.residual.0": new Float32Array(2) })?.length); // 1
 * ```
 */
export function residualsOf(tensors: Readonly<Record<string, Float32Array>>): Float32Array[] | undefined {
  const found = new Map<number, Float32Array>();
  for (const [name, values] of Object.entries(tensors)) {
    if (!name.startsWith(RESIDUAL_PREFIX)) continue;
    const device = Number(name.slice(RESIDUAL_PREFIX.length));
    if (!Number.isInteger(device) || device < 0) {
      throw new ValueError("checkpoint", `"${name}" does not name a device's residual`);
    }
    found.set(device, values);
  }
  if (found.size === 0) return undefined;
  const out = Array.from({ length: found.size }, (_, d) => found.get(d));
  const missing = out.findIndex((r) => r === undefined);
  if (missing >= 0) {
    throw new ValueError(
      "checkpoint",
      `holds residuals of ${found.size} devices but none for device ${missing}`,
    );
  }
  return out as Float32Array[];
}

/**
 * Collective under MPI: after a checkpoint was loaded (on the master, whose `extraTensors` are the
 * loaded checkpoint's; elsewhere `undefined`), gives every device of `trainer` its saved residual,
 * or zeros where the checkpoint cannot provide them. Returns the one line to say on the master when
 * the checkpoint and the run disagree (see the module notes), else `undefined`.
 *
 * @example
 * ```ts
 * import { loadCheckpoint } from "../../../mod.ts";
 * import { resumeResiduals } from "./residuals.ts";
 * import type { DataParallelTrainer } from "../trainer.ts";
 * async function resume(trainer: DataParallelTrainer, path: string) {
 *   const loaded = await loadCheckpoint(path, { parameters: trainer.parameterEntries, optimizer: trainer.optimizer });
 *   await trainer.broadcastParameters();
 *   const note = await resumeResiduals(trainer, loaded.extraTensors);
 *   if (note) console.error(note);
 * }
 * ```
 */
export async function resumeResiduals(
  trainer: DataParallelTrainer,
  extraTensors: Readonly<Record<string, Float32Array>> | undefined,
): Promise<string | undefined> {
  const saved = trainer.rank === 0 && extraTensors ? residualsOf(extraTensors) : undefined;
  let note: string | undefined;
  let residuals = saved;
  if (trainer.rank === 0) {
    if (!trainer.errorFeedback) {
      if (saved) {
        note = `the checkpoint's error-feedback residuals (${saved.length} devices) are ignored: ` +
          `this run has no error feedback`;
      }
    } else if (!saved) {
      note = "the checkpoint holds no error-feedback residuals: every device starts from zero residuals";
    } else if (saved.length !== trainer.size) {
      note = `the checkpoint's error-feedback residuals are for ${saved.length} devices, this run has ` +
        `${trainer.size}: every device starts from zero residuals`;
      residuals = undefined;
    }
  }
  await trainer.loadResiduals(residuals);
  return note;
}
