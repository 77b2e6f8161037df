/**
 * How a training run ends once its loop stops: a diverged run is refused (its last finite state kept
 * beside `--checkpoint`); an interrupted one saves a checkpoint to resume from and exits as the
 * signal asks; a finished one is evaluated on the held-out images, writes its checkpoint, trace and
 * report, and says its summary (with `--json`, the one JSON line on stdout).
 *
 * @module
 */

import type { DivergenceError, TraceRecorder } from "../../mod.ts";
import type { EvaluationResult } from "../../engine/mod.ts";
import { writeFileAtomic } from "../../engine/io/mod.ts";
import { parametersSha256 } from "../../schedule/devices/mod.ts";
import { medianFigures, type StepFigures } from "../../schedule/runtime/mod.ts";
import { CliError, EXIT_FAILURE } from "../errors.ts";
import { evaluateMaster } from "./evaluation.ts";
import { defaultOutputPath } from "../paths.ts";
import { formatDuration } from "../progress.ts";
import { writeReport } from "../report.ts";
import type { TrainingRun } from "./setup.ts";
import { exitStatus, type StopSignal } from "../signals.ts";
import { divergedCheckpointPath } from "../snapshots.ts";
import type { LoopOutcome } from "./training_loop.ts";

/**
 * The file Ctrl-C or SIGTERM saves to when no `--checkpoint` was given, in the git-ignored
 * `runs/` folder of the user's directory (see `defaultOutputPath`).
 */
export const INTERRUPTED_CHECKPOINT = "tandem-interrupted.safetensors";

/** Steps of the trace drawn in the report (the last few: past warm-up). */
const REPORT_TRACE_STEPS = 3;

/** What a finished run measured and wrote, for its report, summary and JSON line. */
interface Results {
  /** The held-out evaluation after the last step. */
  test: EvaluationResult;
  /** The fingerprint of the master's parameters. */
  sha: string;
  /** The fingerprint of device 0's BatchNorm statistics, when the model has any. */
  buffersSha: string | undefined;
  /** The files written, by what they are (`checkpoint`, `trace`, `report`). */
  files: Record<string, string>;
  /** The median step's figures. */
  stepMs: StepFigures;
  /** {@link stepMs} in words. */
  timeSplit: string;
  /** Training throughput over the loop. */
  imagesPerSecond: number;
}

/** Writes `trace` to `path` as a Chrome trace, labelled with what linked the devices. */
async function writeTrace(path: string, trace: TraceRecorder, linkLabel: string): Promise<void> {
  // The link label travels in the file so nobody mistakes an emulated timeline for a real one.
  const json = {
    ...trace.toChromeTrace(),
    otherData: { link: linkLabel },
  };
  await writeFileAtomic(path, [new TextEncoder().encode(JSON.stringify(json))]);
}

/** Refuses a run that diverged, keeping its last finite state beside `--checkpoint` when there is one. */
async function refuseDiverged(
  { args, root }: TrainingRun,
  { step, checkpoints }: LoopOutcome,
  diverged: DivergenceError,
): Promise<never> {
  // Never over --checkpoint: a good file there (an earlier run's, or this run's last snapshot)
  // must survive a run that broke. The rolled-back state is finite and goes beside it.
  let kept = "";
  if (args.checkpoint && root && diverged.rolledBack) {
    const aside = divergedCheckpointPath(args.checkpoint);
    await checkpoints.save(aside, step);
    kept =
      `; the last finite state (step ${step}) is saved in ${aside}, ${args.checkpoint} is left as it was`;
  } else if (args.checkpoint && root) {
    kept = `; nothing was saved (the step could not be rolled back), ${args.checkpoint} is left as it was`;
  }
  throw new CliError(
    `${diverged.message.replace(/^training: /, "training ")} (try a smaller --lr than ${args.lr})${kept}`,
    EXIT_FAILURE,
  );
}

/**
 * Saves the state of a run a signal stopped, to `--checkpoint` (with its snapshots) or else to
 * {@link INTERRUPTED_CHECKPOINT}, writes the trace so far, and returns the exit status of `signal`.
 */
async function saveInterrupted(
  { args, say, trace, link }: TrainingRun,
  { step, checkpoints }: LoopOutcome,
  signal: StopSignal,
): Promise<number> {
  const path = args.checkpoint ?? await defaultOutputPath(INTERRUPTED_CHECKPOINT);
  await (checkpoints.snapshots ? checkpoints.snapshots.save(step) : checkpoints.save(path, step));
  if (args.trace && trace) {
    await writeTrace(args.trace, trace, link ? link.label : "shared memory (no emulation)");
  }
  say(`interrupted at step ${step}; checkpoint saved to ${path} (continue with --resume ${path})`);
  if (args.json) {
    console.log(JSON.stringify({ interrupted: true, signal, step, checkpoint: path }));
  }
  return exitStatus(signal);
}

/** The median step's time and how much of its communication and update was hidden, in words. */
function describeStepTime(stepMs: StepFigures): string {
  const percent = (part: number, whole: number) => whole > 0 ? (100 * part / whole).toFixed(0) : "0";
  return `${stepMs.total.toFixed(1)} ms per step (median): compute ${stepMs.compute.toFixed(1)} ms; ` +
    `communication ${stepMs.communication.toFixed(1)} ms, ${
      stepMs.hiddenCommunication.toFixed(1)
    } ms of it ` +
    `hidden (${percent(stepMs.hiddenCommunication, stepMs.communication)}%); update ${
      stepMs.update.toFixed(1)
    } ms, ${stepMs.hiddenUpdate.toFixed(1)} ms of it hidden (${
      percent(stepMs.hiddenUpdate, stepMs.update)
    }%)`;
}

/**
 * Evaluates the finished run on the held-out images, fingerprints its state and writes its
 * `--checkpoint` and `--trace` (rank 0 alone).
 */
async function measureAndSave(run: TrainingRun, outcome: LoopOutcome): Promise<Results> {
  const { args, trainer, trace, link, transport, linkText } = run;
  const { step, checkpoints } = outcome;
  const test = await evaluateMaster(run);
  outcome.heldOut.push({ step, accuracy: test.accuracy });
  const sha = await parametersSha256(trainer.layout, await trainer.masterParameters());
  // Device 0's BatchNorm statistics, fingerprinted as the parameters are.
  const buffersSha = trainer.bufferLayout.total
    ? await parametersSha256(trainer.bufferLayout, trainer.masterBuffers())
    : undefined;
  const files: Record<string, string> = {};
  if (checkpoints.snapshots && args.checkpoint !== undefined) {
    await checkpoints.snapshots.save(step);
    files.checkpoint = args.checkpoint;
  }
  if (args.trace && trace) {
    await writeTrace(args.trace, trace, link || transport ? linkText : "shared memory (no emulation)");
    files.trace = args.trace;
  }
  // Medians per step: a garbage collection or a late Worker does not move them.
  const stepMs = medianFigures(outcome.timed);
  const imagesPerSecond = outcome.seconds > 0 ? outcome.images / outcome.seconds : 0;
  return { test, sha, buffersSha, files, stepMs, timeSplit: describeStepTime(stepMs), imagesPerSecond };
}

/** Writes the `--report` page of a finished run. */
async function writeRunReport(run: TrainingRun, outcome: LoopOutcome, results: Results): Promise<void> {
  const { args, choice, data, trainer, transport, plan, deviceKind, linkText } = run;
  const { first, step } = outcome;
  const { test, timeSplit, imagesPerSecond } = results;
  const lastSteps = new Set(Array.from({ length: REPORT_TRACE_STEPS }, (_, k) => step - 1 - k));
  await writeReport(args.report!, {
    title: `${choice.name} on ${args.data}: ${(test.accuracy * 100).toFixed(2)}% held out`,
    facts: [
      ["model", `${choice.name} (${trainer.layout.total.toLocaleString("en-US")} parameters)`],
      ["data", data.description],
      [
        "devices",
        transport
          ? `${args.devices} MPI ranks, one ${deviceKind} device each`
          : `${args.devices} ${args.backend === "cpu" ? "CPU Workers" : "WebGPU devices"}`,
      ],
      ["schedule", `${plan.name}, ${args.reduce} reduction`],
      ["link", linkText],
      ["batch / lr", `${args.batch} / ${args.lr} halved every epoch`],
      ["steps", `${first} → ${step}`],
      ["held-out accuracy", `${(test.accuracy * 100).toFixed(2)}% (loss ${test.loss.toFixed(4)})`],
      ["throughput", `${imagesPerSecond.toFixed(0)} images/s`],
      [
        "step time",
        `${timeSplit} (${linkText})`,
      ],
    ],
    steps: outcome.points,
    heldOut: outcome.heldOut,
    spans: run.trace!.spans.filter((s) => lastSteps.has(s.step)),
  });
}

/** The summary a finished run says: accuracy, throughput, step time, fingerprints, files. */
function summaryLines(run: TrainingRun, outcome: LoopOutcome, results: Results): string[] {
  const { perEpoch, link } = run;
  const { first, step, seconds } = outcome;
  const { test, sha, buffersSha, files, timeSplit, imagesPerSecond } = results;
  return [
    `held-out accuracy ${(test.accuracy * 100).toFixed(2)}% (loss ${
      test.loss.toFixed(4)
    }) on ${test.count} ` +
    `images after step ${step} (${(step / perEpoch).toFixed(2)} epochs)`,
    `throughput ${imagesPerSecond.toFixed(0)} images/s; ${step - first} steps in ${formatDuration(seconds)}`,
    `step time ${timeSplit}${link ? ` over an emulated link (${link.label})` : ""}`,
    `parameters sha256 ${sha}${buffersSha ? `, BatchNorm statistics sha256 ${buffersSha}` : ""}`,
    Object.keys(files).length
      ? `files: ${Object.entries(files).map(([k, v]) => `${k} ${v}`).join(", ")}`
      : "files: none written (see --checkpoint, --trace, --report)",
  ];
}

/** The one JSON object `--json` prints on stdout for a finished run. */
function jsonSummary(run: TrainingRun, outcome: LoopOutcome, results: Results): string {
  const { args, trainer, plan, link, choice, perEpoch } = run;
  const { step } = outcome;
  const { test, sha, buffersSha, files, stepMs } = results;
  return JSON.stringify({
    loss: test.loss,
    accuracy: test.accuracy,
    trainLoss: outcome.lastLoss,
    parameters: trainer.layout.total,
    step,
    epochs: step / perEpoch,
    imagesPerSecond: results.imagesPerSecond,
    seconds: outcome.seconds,
    paramsSha256: sha,
    ...(buffersSha ? { buffers: trainer.bufferLayout.total, buffersSha256: buffersSha } : {}),
    model: choice.name,
    data: args.data,
    devices: args.devices,
    accumulate: args.accumulate,
    transport: args.transport,
    schedule: plan.name,
    groups: plan.groups,
    reduce: args.reduce,
    wire: args.wire,
    errorFeedback: args.errorFeedback,
    link: link ? { label: link.label, emulated: true } : null,
    stepMs,
    files,
  });
}

/**
 * Ends `run` after its loop (see the module comment) and returns the exit status: throws a
 * {@link CliError} for a diverged run; only rank 0 evaluates and writes a finished one.
 */
export async function finishRun(run: TrainingRun, outcome: LoopOutcome): Promise<number> {
  if (outcome.diverged) await refuseDiverged(run, outcome, outcome.diverged);
  if (outcome.stopped) return await saveInterrupted(run, outcome, outcome.stopped);
  if (!run.root) return 0;
  const results = await measureAndSave(run, outcome);
  if (run.args.report) {
    await writeRunReport(run, outcome, results);
    results.files.report = run.args.report;
  }
  for (const line of summaryLines(run, outcome, results)) run.say(line);
  if (run.args.json) console.log(jsonSummary(run, outcome, results));
  return 0;
}
