/**
 * Held-out evaluation of a run on this thread: the model built here takes the master's parameters
 * and BatchNorm statistics, and is evaluated on the held-out images.
 *
 * @module
 */

import { type DataParallelTrainer, evaluate, type Network, type Tensor, tensor } from "../../mod.ts";
import type { EvaluationResult } from "../../engine/mod.ts";
import { copyBuffers } from "../../schedule/devices/buffer_layout.ts";
import type { TrainingRun } from "./setup.ts";

/** Parameters {@link shareMasterParameters} put over the master's. */
const shared = new WeakSet<Tensor>();

/**
 * Puts `model`'s parameters over the master's (the trainer's parameter entries) where both lie on
 * this thread's backend, as they do with CPU devices: evaluation then reads them in place, and the
 * model holds no copy of its own. For bvlc_alexnet that copy is 233 MB of the CPU backend's 2 GiB
 * kernel memory, which two devices' parameters and gradients, the master's average, momentum and
 * undo copies already all but fill. Elsewhere (WebGPU devices, whose backend makes no views) the
 * parameters stay the model's, and evaluation copies the master's in.
 */
export function shareMasterParameters(model: Network, trainer: DataParallelTrainer): void {
  const master = new Map(trainer.parameterEntries.map((e) => [e.name, e.tensor]));
  for (const entry of model.namedParameters()) {
    const source = master.get(entry.name);
    const backend = entry.tensor.backend;
    if (source?.backend !== backend || source.size !== entry.tensor.size || !backend.view) continue;
    // A view: disposing the model later frees nothing of the master's.
    entry.tensor.rebind(backend.view(source.storage, 0, source.size));
    shared.add(entry.tensor);
  }
}

/**
 * Copies the master's flat parameters into `model` by name, for evaluation on this thread (after
 * `trainer.syncParameters()`, which is collective under MPI), except those it shares already (see
 * {@link shareMasterParameters}).
 */
async function copyMasterInto(model: Network, trainer: DataParallelTrainer): Promise<void> {
  const apart = model.namedParameters().filter((e) => !shared.has(e.tensor));
  if (apart.length > 0) {
    const flat = await trainer.masterParameters();
    const slots = new Map(trainer.layout.slots.map((s) => [s.name, s]));
    for (const entry of apart) {
      const slot = slots.get(entry.name);
      if (!slot) throw new Error(`parameter ${entry.name} is not in the trainer's layout`);
      const source = tensor(flat.slice(slot.offset, slot.offset + slot.size), { shape: slot.shape });
      entry.tensor.assign(source);
      source.dispose();
    }
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
