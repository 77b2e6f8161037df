/**
 * The compute half of one training step, written once for every place that runs it: one-device
 * training (`trainStep`), a CPU device's Worker and a device driven from the main thread (WebGPU).
 *
 * Forward, the loss (a network's `lossAndLogits`: softmax cross-entropy, or a graph's weighted sum of
 * its losses), then backward — either in one pass, leaving every gradient in its
 * parameter's `.grad`, or segmented by parameter group: after each group's gradients are final the
 * caller takes them (`onGroup`), so they can travel while the next group's backward runs. A segmented
 * backward performs the same kernels on the same values as one pass (see `autograd.ts`), which is
 * what lets the data-parallel schedules stay bit-identical.
 *
 * Gradient accumulation (`microBatches: K`) runs the batch as K contiguous micro-batches, one after
 * another, each with its own forward, mean loss and backward; the engine adds each micro-batch's
 * gradients onto `.grad` (`previous + new`, see `autograd.ts`), and after the last one every gradient
 * is multiplied by `fround(1/K)`. That is exactly what K data-parallel devices holding those
 * micro-batches compute, `(g0 + g1 + … + g(K−1)) · fround(1/K)` added in order, with the same dropout
 * masks (they are keyed by global sample): `1 device × K micro-batches` gives the bits of `K devices`.
 * It is not the bits of one pass over the whole batch, whose kernels sum the batch in one reduction
 * and scale the loss by 1/(K·m) instead of 1/m then 1/K. Segmented, only the last micro-batch's
 * backward reports groups, so nothing is communicated before the last micro-batch.
 *
 * @module
 */

import { backwardPass } from "../autograd.ts";
import type { ForwardContext, Module } from "../nn/module.ts";
import { Network } from "../nn/network.ts";
import type { ParameterEntry } from "../nn/parameter.ts";
import { softmaxCrossEntropy } from "../ops/softmax.ts";
import { tidy } from "../context.ts";
import { ShapeError } from "../errors.ts";
import { mul } from "../ops/elementwise.ts";
import { slice } from "../ops/movement.ts";
import { Tensor } from "../tensor.ts";

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
  /**
   * Gradient accumulation: run the batch as this many equal, contiguous micro-batches and average
   * their gradients (default 1: one pass). See the module notes for what it is bit-identical to.
   */
  microBatches?: number;
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
  const count = options.microBatches ?? 1;
  const batch = images.shape[0];
  if (!Number.isInteger(count) || count < 1 || batch % count !== 0) {
    throw new ShapeError(
      "replicaStep",
      `a batch of ${batch} does not split into ${count} equal micro-batches (give a whole number that divides it)`,
    );
  }
  model.train();
  try {
    return await accumulate(model, parameters, images, labels, labelValues, options, count);
  } catch (error) {
    // A failed segmented step leaves gradients behind that the next step would add onto.
    if (options.groups) clearGradients(parameters);
    throw error;
  }
}

/** The micro-batches of {@link replicaStep} in order (one when `count` is 1). */
async function accumulate(
  model: Module,
  parameters: readonly ParameterEntry[],
  images: Tensor,
  labels: Tensor,
  labelValues: Int32Array,
  options: ReplicaStepOptions,
  count: number,
): Promise<StepMetrics> {
  if (count === 1) return await microStep(model, parameters, images, labels, labelValues, options, true);
  const batch = images.shape[0];
  const size = batch / count;
  const scale = Math.fround(1 / count);
  let loss = 0, correct = 0;
  for (let k = 0; k < count; k++) {
    const last = k === count - 1;
    const values = labelValues.subarray(k * size, (k + 1) * size);
    const microImages = slice(images, [k * size, ...images.shape.slice(1).map(() => 0)], [
      size,
      ...images.shape.slice(1),
    ]);
    const microLabels = new Tensor(labels.backend, labels.backend.upload(values), [size], {
      hostInts: values,
    });
    try {
      const metrics = await microStep(model, parameters, microImages, microLabels, values, {
        ...options,
        context: { ...options.context, sampleOffset: (options.context.sampleOffset ?? 0) + k * size },
        // Earlier micro-batches leave their gradients in `.grad` for the next to add onto.
        groups: last ? options.groups : undefined,
        onForward: last ? options.onForward : undefined,
        finish: last ? (members) => averageGradients(members, scale) : undefined,
      }, last);
      loss += metrics.loss;
      correct += metrics.correct;
    } finally {
      microImages.dispose();
      microLabels.dispose();
    }
  }
  return { loss: loss / count, correct, count: batch };
}

/**
 * Multiplies each member's accumulated `.grad` by `scale` (`fround(1/K)`), as a device average does:
 * the last step of gradient accumulation, wherever micro-batches run (here and a hybrid body).
 *
 * @example
 * ```ts
 * import { averageGradients } from "./replica_step.ts";
 * // averageGradients(members, Math.fround(1 / 3)); // after the third micro-batch's backward
 * ```
 */
export function averageGradients(members: readonly ParameterEntry[], scale: number): void {
  for (const member of members) {
    const grad = member.tensor.grad;
    if (!grad) continue;
    member.tensor.grad = tidy(() => mul(grad, scale));
    grad.dispose();
  }
}

/** One forward and backward; `finish` sees each group's (or, unsegmented, every) final gradients. */
async function microStep(
  model: Module,
  parameters: readonly ParameterEntry[],
  images: Tensor,
  labels: Tensor,
  labelValues: Int32Array,
  options: ReplicaStepOptions & { finish?: (members: readonly ParameterEntry[]) => void },
  last: boolean,
): Promise<StepMetrics> {
  const { loss, logits } = tidy(() => trainingLoss(model, images, labels, options.context));
  try {
    options.onForward?.();
    const pass = backwardPass(loss);
    for (const group of options.groups ?? []) {
      const members = parameters.filter((p) => p.group === group);
      tidy(() => pass.runUntil(members.map((m) => m.tensor)));
      options.finish?.(members);
      await options.onGroup?.(group, members);
    }
    tidy(() => pass.runToEnd());
    if (options.groups) {
      // A segmented step hands every gradient to the caller; none may leak into the next step.
      clearGradients(parameters);
    } else if (last) {
      options.finish?.(parameters);
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

/**
 * The loss a training step minimises and the logits it counts hits on: a {@link Network}'s
 * {@link Network.lossAndLogits} (Caffe's weighted sum of a graph's losses; for a chain, the
 * cross-entropy of its output), else the softmax cross-entropy of any module's output.
 *
 * @example
 * ```ts
 * import { trainingLoss } from "./replica_step.ts";
 * // const { loss, logits } = tidy(() => trainingLoss(model, images, labels, { seed: 0, step: 3 }));
 * ```
 */
export function trainingLoss(
  model: Module,
  images: Tensor,
  labels: Tensor,
  context?: ForwardContext,
): { loss: Tensor; logits: Tensor } {
  if (model instanceof Network) return model.lossAndLogits(images, labels, { context });
  const logits = model.forward(images, context);
  return { loss: softmaxCrossEntropy(logits, labels), logits };
}

/** Frees every parameter's `.grad`. */
function clearGradients(parameters: readonly ParameterEntry[]): void {
  for (const p of parameters) {
    p.tensor.grad?.dispose();
    p.tensor.grad = null;
  }
}
