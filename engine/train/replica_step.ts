/**
 * The compute half of one training step, written once for every place that runs it: one-device
 * training (`trainStep`), a CPU device's Worker and a device driven from the main thread (WebGPU).
 *
 * Forward, softmax cross-entropy, then backward — either in one pass, leaving every gradient in its
 * parameter's `.grad`, or segmented by parameter group: after each group's gradients are final the
 * caller takes them (`onGroup`), so they can travel while the next group's backward runs. A segmented
 * backward performs the same kernels on the same values as one pass (see `autograd.ts`), which is
 * what lets the data-parallel schedules stay bit-identical.
 *
 * @module
 */

import { backwardPass } from "../autograd.ts";
import type { ForwardContext, Module } from "../nn/module.ts";
import type { ParameterEntry } from "../nn/parameter.ts";
import { softmaxCrossEntropy } from "../ops/softmax.ts";
import { tidy } from "../runtime.ts";
import type { Tensor } from "../tensor.ts";

/** Loss and top-1 hits of one batch. */
export interface StepMetrics {
  /** Mean cross-entropy over the batch. */
  loss: number;
  /** Samples whose highest logit is the label. */
  correct: number;
  /** Samples in the batch. */
  count: number;
}

/** Options of {@link replicaStep}. */
export interface ReplicaStepOptions {
  /** Dropout key: run seed, iteration and the batch's first global sample. */
  context: ForwardContext;
  /**
   * Groups to backward one after another, in order. Omitted: one uninterrupted backward, and every
   * gradient stays in its parameter's `.grad` for the caller's optimizer.
   */
  groups?: readonly string[];
  /**
   * Called as soon as `group`'s gradients are final, with its parameters (`.grad` set, or `null`
   * when nothing reached a parameter). The caller takes the gradients; whatever `.grad` is left is
   * freed after the backward ends.
   */
  onGroup?: (group: string, members: readonly ParameterEntry[]) => void | Promise<void>;
  /**
   * Called once the forward and the loss are queued, before the backward starts: where a caller's
   * forward timing ends.
   */
  onForward?: () => void;
}

/**
 * Counts rows of `logits` (`[batch, classes]`, row-major) whose arg-max equals the label.
 *
 * @example
 * ```ts
 * import { countCorrect } from "./replica_step.ts";
 * countCorrect(new Float32Array([0.1, 0.9, 0.8, 0.2]), new Int32Array([1, 1]), 2); // 1
 * ```
 */
export function countCorrect(logits: Float32Array, labels: Int32Array, classes: number): number {
  let correct = 0;
  for (let row = 0; row < labels.length; row++) {
    let best = 0;
    for (let c = 1; c < classes; c++) if (logits[row * classes + c] > logits[row * classes + best]) best = c;
    if (best === labels[row]) correct++;
  }
  return correct;
}

/**
 * Forward, loss and backward of `model` (in training mode) on one batch; see the module notes.
 * Returns the loss and hits; frees every tensor it made.
 *
 * @example
 * ```ts
 * import { replicaStep } from "./replica_step.ts";
 * // const metrics = await replicaStep(model, model.namedParameters(), images, labels, labelValues, {
 * //   context: { seed: 0, step: 0, sampleOffset: 0 },
 * //   groups: ["fc", "conv"],
 * //   onGroup: (group, members) => ship(group, members),
 * // });
 * ```
 */
export async function replicaStep(
  model: Module,
  parameters: readonly ParameterEntry[],
  images: Tensor,
  labels: Tensor,
  labelValues: Int32Array,
  options: ReplicaStepOptions,
): Promise<StepMetrics> {
  model.train();
  const { loss, logits } = tidy(() => {
    const logits = model.forward(images, options.context);
    return { loss: softmaxCrossEntropy(logits, labels), logits };
  });
  try {
    options.onForward?.();
    const pass = backwardPass(loss);
    for (const group of options.groups ?? []) {
      const members = parameters.filter((p) => p.group === group);
      tidy(() => pass.runUntil(members.map((m) => m.tensor)));
      await options.onGroup?.(group, members);
    }
    tidy(() => pass.runToEnd());
    if (options.groups) {
      // A segmented step hands every gradient to the caller; none may leak into the next step.
      for (const p of parameters) {
        p.tensor.grad?.dispose();
        p.tensor.grad = null;
      }
    }
    const [lossValue, logitValues] = await Promise.all([loss.item(), logits.data()]);
    return {
      loss: lossValue,
      correct: countCorrect(logitValues as Float32Array, labelValues, logits.shape[1]),
      count: labelValues.length,
    };
  } finally {
    loss.dispose();
    logits.dispose();
  }
}
