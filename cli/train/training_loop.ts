/**
 * The training loop of `deno task train`: steps from where the run starts to its target, a stop
 * signal (Ctrl-C, SIGTERM) or divergence, drawing progress, saving the periodic snapshots of
 * `--checkpoint-every` and, with `--report`, evaluating the held-out images after every epoch.
 *
 * @module
 */

import { DivergenceError } from "../../mod.ts";
import type { DataParallelStepResult, StepFigures } from "../../schedule/runtime/mod.ts";
import { RunCheckpoints } from "./checkpoints.ts";
import { evaluateMaster } from "./evaluation.ts";
import { Progress, stderrStyle } from "../progress.ts";
import type { StepPoint } from "../report.ts";
import type { TrainingRun } from "./setup.ts";
import { type StopSignal, StopSignals } from "../signals.ts";

/** What the loop did and how it ended; the master's copy of the state is whole when it returns. */
export interface LoopOutcome {
  /** The step the run started at (after a resume). */
  first: number;
  /** The step it ended at. */
  step: number;
  /** Seconds from the first step to the end of the last. */
  seconds: number;
  /** Training images seen. */
  images: number;
  /** The last step's training loss (`NaN` when no step ran). */
  lastLoss: number;
  /** Every step's training loss and accuracy. */
  points: StepPoint[];
  /** The held-out accuracy after every epoch but the last (with `--report`). */
  heldOut: { step: number; accuracy: number }[];
  /** Every step's figures but a warm-up step's. */
  timed: StepFigures[];
  /** The divergence that stopped the run, if one did. */
  diverged: DivergenceError | undefined;
  /** The signal that stopped the run, if one did. */
  stopped: StopSignal | undefined;
  /** Where the run saves its state. */
  checkpoints: RunCheckpoints;
}

/** Trains on the batch of step `i`; a divergence is returned rather than thrown. */
async function trainStep(
  { trainer, trainLoader, perEpoch }: TrainingRun,
  i: number,
): Promise<DataParallelStepResult | DivergenceError> {
  const batch = trainLoader.batch(Math.floor(i / perEpoch), i % perEpoch);
  try {
    const pixels = await batch.images.data() as Float32Array;
    return await trainer.step({
      images: pixels,
      labels: batch.labelValues,
      shape: batch.images.shape,
    });
  } catch (error) {
    if (error instanceof DivergenceError) return error;
    throw error;
  } finally {
    batch.dispose();
  }
}

/**
 * Trains `run` from its trainer's step to `run.target`, or until a stop signal or divergence ends
 * it; then (collectively under MPI) gathers the trace and syncs the master for saving and
 * evaluating.
 */
export async function trainSteps(run: TrainingRun): Promise<LoopOutcome> {
  const { args, root, transport, trainer, target, perEpoch, trace } = run;
  const first = trainer.iteration;
  const progress = root
    ? new Progress({ first, target, epochs: Math.ceil(target / perEpoch), ...stderrStyle() })
    : undefined;
  const stops = new StopSignals((line) => progress?.log(line));
  // Under mpirun, Ctrl-C is mpirun's: it stops every rank (each says what it was doing).
  if (!transport) stops.install();
  const checkpoints = new RunCheckpoints(run);

  const points: StepPoint[] = [];
  const heldOut: { step: number; accuracy: number }[] = [];
  let images = 0, lastLoss = NaN;
  const timed: StepFigures[] = [];
  let diverged: DivergenceError | undefined;
  const started = performance.now();
  try {
    while (trainer.iteration < target && !stops.requested) {
      const i = trainer.iteration;
      const epoch = Math.floor(i / perEpoch);
      const result = await trainStep(run, i);
      if (result instanceof DivergenceError) {
        diverged = result;
        break;
      }
      images += result.count;
      lastLoss = result.loss;
      // The first step pays for JIT warm-up and would skew the split of a short run.
      if (i > first || target - first === 1) timed.push(result.ms);
      points.push({ step: i + 1, loss: result.loss, accuracy: result.correct / result.count });
      progress?.update({
        step: i + 1,
        epoch,
        loss: result.loss,
        imagesPerSecond: images / ((performance.now() - started) / 1000),
      });
      if (
        checkpoints.snapshots && args.checkpointEvery && (i + 1) % args.checkpointEvery === 0 &&
        i + 1 < target
      ) {
        // Collective under MPI (every rank syncs), then rank 0 alone writes; the end saves the last.
        await checkpoints.sync();
        if (root) await checkpoints.snapshots.save(i + 1);
      }
      if (args.report && (i + 1) % perEpoch === 0 && i + 1 < target) {
        // Collective under MPI; then rank 0 alone evaluates.
        await trainer.syncParameters();
      }
      if (args.report && root && (i + 1) % perEpoch === 0 && i + 1 < target) {
        const { accuracy } = await evaluateMaster(run);
        heldOut.push({ step: i + 1, accuracy });
        progress?.log(`epoch ${epoch + 1}: held-out accuracy ${(accuracy * 100).toFixed(2)}%`);
      }
    }
  } finally {
    if (!transport) stops.remove();
    progress?.done();
  }
  // Every rank's lanes go into rank 0's trace, before rank 0 alone evaluates and writes.
  if (trace && diverged === undefined) await trainer.gatherTrace();
  const seconds = (performance.now() - started) / 1000;
  // Collective under MPI: the master's copy of the parameters (and, for a hybrid schedule, of the
  // head's optimizer state) is whole from here on, for saving and evaluating.
  await checkpoints.sync();
  return {
    first,
    step: trainer.iteration,
    seconds,
    images,
    lastLoss,
    points,
    heldOut,
    timed,
    diverged,
    stopped: stops.requested,
    checkpoints,
  };
}
