/**
 * What a checkpoint of a training run holds, and the sync that must come before writing one: the
 * parameters, BatchNorm statistics and optimizer state of the master, the settings a plain
 * `--resume` continues with, and every device's error-feedback residual.
 *
 * @module
 */

import { saveCheckpoint } from "../../mod.ts";
import { residualTensors } from "../../schedule/runtime/mod.ts";
import { Snapshots } from "../snapshots.ts";
import type { TrainingRun } from "./setup.ts";

/**
 * Saves the state of `run`: {@link sync} brings it to the master (collective under MPI), then
 * {@link save} writes it (rank 0 alone), or {@link snapshots} writes `--checkpoint` and its
 * numbered snapshots.
 */
export class RunCheckpoints {
  /** The `--checkpoint` file and its numbered snapshots, when `--checkpoint` was given. */
  readonly snapshots: Snapshots | undefined;
  readonly #run: TrainingRun;
  // What a plain --resume continues with (see resume.ts).
  readonly #extra: Record<string, unknown>;
  // Every device's error-feedback residual goes into the checkpoint with the parameters; both are
  // brought to the master by every sync before a save (collective under MPI).
  #residuals: Float32Array[] | undefined;

  /** Checkpoints of `run`, to `--checkpoint` when given. */
  constructor(run: TrainingRun) {
    const { args } = run;
    this.#run = run;
    this.#extra = {
      data: args.data,
      batch: args.batch,
      devices: args.devices,
      schedule: run.plan.name,
      epochs: args.epochs,
      steps: args.steps,
    };
    this.snapshots = args.checkpoint !== undefined
      ? new Snapshots(args.checkpoint, args.keep, (path, step) => this.save(path, step))
      : undefined;
  }

  /** Brings the parameters and residuals to the master; collective under MPI. */
  async sync(): Promise<void> {
    await this.#run.trainer.syncParameters();
    this.#residuals = await this.#run.trainer.residuals();
  }

  /** Writes the state at `step`, as of the last {@link sync}, to `path`. */
  save(path: string, step: number): Promise<void> {
    const { trainer, local } = this.#run;
    return saveCheckpoint(path, {
      parameters: trainer.parameterEntries,
      buffers: trainer.bufferEntries,
      optimizer: trainer.optimizer,
      step,
      modelName: local.name,
      extra: this.#extra,
      extraTensors: residualTensors(this.#residuals),
    });
  }
}
