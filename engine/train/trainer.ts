/**
 * One-device training building blocks: `trainStep`, `evaluate` and `fit`. They manage every tensor
 * they create, so a training loop never disposes anything by hand.
 *
 * Training position is the optimizer's iteration count: batch `i` of a run is batch `i mod n` of
 * epoch `⌊i / n⌋`, and dropout masks are keyed by `i`. Resuming from a checkpoint therefore replays
 * exactly the batches and masks an uninterrupted run would have seen.
 *
 * @module
 */

import type { Batch, DataLoader } from "../data/loader.ts";
import { TandemError } from "../errors.ts";
import type { ForwardContext, Module } from "../nn/module.ts";
import { Network } from "../nn/network.ts";
import { softmaxCrossEntropy } from "../ops/softmax.ts";
import { countCorrect, replicaStep, type StepMetrics } from "./replica_step.ts";
import type { Optimizer } from "../optim/optimizer.ts";
import { noGrad, tidy } from "../context.ts";
import type { Tensor } from "../tensor.ts";

export { countCorrect, type StepMetrics };

/** A batch as `trainStep` needs it: images and int32 labels (a loader `Batch` fits). */
export interface LabelledBatch {
  /** Float32 `[batch, C, H, W]`. */
  images: Tensor;
  /** Int32 `[batch]` class indices. */
  labels: Tensor;
}

/** Options of {@link trainStep}. */
export interface TrainStepOptions {
  /** Run seed for dropout (default 0). */
  seed?: number;
  /** Global index of the batch's first sample within the global batch (data-parallel shards). */
  sampleOffset?: number;
  /**
   * Gradient accumulation: run the batch as this many equal micro-batches before the one update
   * (default 1). The same bits as that many data-parallel devices; see `replicaStep`.
   */
  accumulate?: number;
}

async function labelsOf(batch: LabelledBatch): Promise<Int32Array> {
  return (batch as Partial<Batch>).labelValues ?? batch.labels.hostInts ??
    (await batch.labels.data()) as Int32Array;
}

/**
 * Forward, softmax cross-entropy, backward and one optimizer iteration on `batch`.
 *
 * @example
 * ```ts
 * import { trainStep } from "./trainer.ts";
 * // const { loss, correct } = await trainStep(model, optimizer, loader.batch(0, 0));
 * ```
 */
export async function trainStep(
  model: Module,
  optimizer: Optimizer,
  batch: LabelledBatch,
  options: TrainStepOptions = {},
): Promise<StepMetrics> {
  const context: ForwardContext = {
    seed: options.seed ?? 0,
    step: optimizer.iteration,
    sampleOffset: options.sampleOffset ?? 0,
  };
  const labels = await labelsOf(batch);
  let metrics: StepMetrics;
  try {
    metrics = await replicaStep(model, optimizer.parameters, batch.images, batch.labels, labels, {
      context,
      microBatches: options.accumulate,
    });
    optimizer.step();
  } finally {
    optimizer.zeroGrad();
  }
  return metrics;
}

/** Loss and accuracy over a whole evaluation pass. */
export interface EvaluationResult {
  /** Mean cross-entropy per sample. */
  loss: number;
  /** Fraction of samples classified correctly (top-1). */
  accuracy: number;
  /** Samples evaluated. */
  count: number;
}

/**
 * Evaluates `model` (in eval mode, without gradients) on every batch of `loader`'s epoch 0; the
 * model's previous mode is restored afterwards. A network is judged by its main classifier (for a
 * graph with several losses, the heaviest: GoogLeNet's `loss3`), loss unweighted.
 *
 * @example
 * ```ts
 * import { evaluate } from "./trainer.ts";
 * // const { accuracy } = await evaluate(model, testLoader);
 * ```
 */
export async function evaluate(model: Module, loader: DataLoader): Promise<EvaluationResult> {
  const wasTraining = model.training;
  model.eval();
  let totalLoss = 0, correct = 0, count = 0;
  try {
    for (const batch of loader.batches(0)) {
      const { losses, logits } = tidy(() =>
        noGrad(() => {
          // A network's main classifier (a graph's auxiliary heads do not run).
          if (model instanceof Network) {
            const out = model.lossAndLogits(batch.images, batch.labels, { reduction: "sum", heads: "main" });
            return { losses: out.loss, logits: out.logits };
          }
          const logits = model.forward(batch.images);
          return { losses: softmaxCrossEntropy(logits, batch.labels, { reduction: "sum" }), logits };
        })
      );
      const [lossSum, logitValues] = await Promise.all([losses.item(), logits.data()]);
      totalLoss += lossSum;
      correct += countCorrect(logitValues as Float32Array, batch.labelValues, logits.shape[1]);
      count += batch.labelValues.length;
      losses.dispose();
      logits.dispose();
      batch.dispose();
    }
  } finally {
    model.train(wasTraining);
  }
  return { loss: count ? totalLoss / count : NaN, accuracy: count ? correct / count : NaN, count };
}

/** Progress of one training step, for callbacks. */
export interface StepInfo extends StepMetrics {
  /** Iterations completed, this one included. */
  iteration: number;
  /** Epoch of the batch. */
  epoch: number;
  /** Seconds the step took. */
  seconds: number;
}

/** Options of {@link fit}. */
export interface FitOptions {
  /** Train until the optimizer's iteration count reaches this many epochs' worth of batches. */
  epochs?: number;
  /** Or until it reaches this many iterations (whichever limit comes first). */
  steps?: number;
  /** Run seed for dropout (default 0). */
  seed?: number;
  /** Called after every step. */
  onStep?: (info: StepInfo) => void | Promise<void>;
  /** Evaluated after the last step when given. */
  test?: DataLoader;
}

/** What {@link fit} did. */
export interface FitResult {
  /** Per-step metrics of this call. */
  history: StepInfo[];
  /** Iteration count reached. */
  iteration: number;
  /** Test evaluation, when `test` was given. */
  test?: EvaluationResult;
}

/**
 * Trains from the optimizer's current iteration (0, or where a checkpoint left off) up to
 * `epochs`/`steps`, taking batch `i mod n` of epoch `⌊i / n⌋` at iteration `i`.
 *
 * @example
 * ```ts
 * import { fit } from "./trainer.ts";
 * // const result = await fit(model, optimizer, trainLoader, { epochs: 2, test: testLoader });
 * ```
 */
export async function fit(
  model: Module,
  optimizer: Optimizer,
  loader: DataLoader,
  options: FitOptions,
): Promise<FitResult> {
  const perEpoch = loader.numBatches;
  if (perEpoch === 0) throw new TandemError("fit: the training loader yields no batches");
  const limits = [
    options.epochs !== undefined ? options.epochs * perEpoch : Infinity,
    options.steps ?? Infinity,
  ];
  const target = Math.min(...limits);
  if (!Number.isFinite(target)) throw new TandemError("fit: give epochs or steps");
  const history: StepInfo[] = [];
  while (optimizer.iteration < target) {
    const iteration = optimizer.iteration;
    const epoch = Math.floor(iteration / perEpoch);
    const started = performance.now();
    const batch = loader.batch(epoch, iteration % perEpoch);
    let metrics: StepMetrics;
    try {
      metrics = await trainStep(model, optimizer, batch, { seed: options.seed });
    } finally {
      batch.dispose();
    }
    const info = {
      ...metrics,
      iteration: iteration + 1,
      epoch,
      seconds: (performance.now() - started) / 1000,
    };
    history.push(info);
    await options.onStep?.(info);
  }
  const test = options.test ? await evaluate(model, options.test) : undefined;
  return { history, iteration: optimizer.iteration, test };
}
