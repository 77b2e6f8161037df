/**
 * Held-out evaluation of a run on this thread: the model built here takes the master's parameters
 * and BatchNorm statistics, and is evaluated on the held-out images.
 *
 * @module
 */

import { type DataParallelTrainer, evaluate, type Network, tensor } from "../../mod.ts";
import type { EvaluationResult } from "../../engine/mod.ts";
import { copyBuffers } from "../../schedule/devices/buffer_layout.ts";
import type { TrainingRun } from "./setup.ts";

/**
 * Copies the master's flat parameters into `model` by name, for evaluation on this thread (after
 * `trainer.syncParameters()`, which is collective under MPI).
 */
async function copyMasterInto(model: Network, trainer: DataParallelTrainer): Promise<void> {
  const flat = await trainer.masterParameters();
  const slots = new Map(trainer.layout.slots.map((s) => [s.name, s]));
  for (const entry of model.namedParameters()) {
    const slot = slots.get(entry.name);
    if (!slot) throw new Error(`parameter ${entry.name} is not in the trainer's layout`);
    const source = tensor(flat.slice(slot.offset, slot.offset + slot.size), { shape: slot.shape });
    entry.tensor.assign(source);
    source.dispose();
  }
  // Device 0's BatchNorm statistics, as Caffe's root solver tests with.
  copyBuffers(trainer.bufferLayout, model.namedBuffers(), trainer.masterBuffers(), "tensors");
}

/**
 * The held-out loss and accuracy of the master's parameters, evaluated with the run's model built
 * on this thread. Call it after `trainer.syncParameters()` (collective under MPI), on rank 0 alone.
 */
export async function evaluateMaster(
  run: Pick<TrainingRun, "local" | "trainer" | "testLoader">,
): Promise<EvaluationResult> {
  await copyMasterInto(run.local, run.trainer);
  return await evaluate(run.local, run.testLoader);
}
