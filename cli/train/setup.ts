/**
 * Starting a training run, from the checked command line to a trainer at its first step: the data,
 * the model built on this thread, the plan and the loaders are made here, and the `--resume`
 * checkpoint and `--weights` file are checked against the model, all before any device starts (a
 * wrong input costs seconds, not a start of every device); then the trainer starts, takes its
 * starting point from either file, and the run says what it is about to do.
 *
 * @module
 */

import {
  createWebGpuBackend,
  DataLoader,
  DataParallelTrainer,
  loadCaffeWeights,
  loadCheckpoint,
  type LrPolicy,
  type Network,
  type Plan,
  ScheduleError,
  SGD,
  TraceRecorder,
  validatePlan,
} from "../../mod.ts";
import { BackendDevice, type ModelSpec, type ParameterLayout } from "../../schedule/devices/mod.ts";
import { type CaffeLayerWeights, parseCaffeModel } from "../../engine/caffe/mod.ts";
import type { SafetensorsFile } from "../../engine/io/mod.ts";
import type { ParameterEntry } from "../../engine/nn/mod.ts";
import { measureLink, type MpiTransport } from "../../schedule/mpi/mod.ts";
import { type Link, resumeResiduals } from "../../schedule/runtime/mod.ts";
import { checkBuffersCarried } from "../../schedule/runtime/start.ts";
import { checkDeviceCount, DEFAULTS, type TrainArgs } from "../args.ts";
import { fitToModel, type LoadedImages, loadImages, type RunData } from "../data.ts";
import { CliError, EXIT_FAILURE } from "../errors.ts";
import { buildLocal, type ModelChoice } from "../model.ts";
import { choosePlan } from "../plan.ts";
import { shareMasterParameters } from "./evaluation.ts";

/** What the command line asks for, read and checked before any work (see `runTrain`). */
export interface RunRequest {
  /** The validated arguments; a resumed run's are merged with its checkpoint's settings. */
  args: TrainArgs;
  /** Whether this process speaks and writes files: always, except on MPI ranks other than 0. */
  root: boolean;
  /** Says a line for people: on stdout, on stderr with `--json`, nowhere on other ranks. */
  say: (line: string) => void;
  /** The MPI job, under `--transport mpi`. */
  transport: MpiTransport | undefined;
  /** The emulated link of `--link`. */
  link: Required<Link> | undefined;
  /** A line for each explicit flag that changes what the resumed checkpoint's run did. */
  resumeNotes: string[];
  /** The `--resume` checkpoint as read on rank 0, to check and load without reading it again. */
  resumeFile: SafetensorsFile | undefined;
  /** The model of `--model`, before the data fixes its class count. */
  choice: ModelChoice;
  /** The images, when choosing the model already had to load them. */
  images?: LoadedImages;
}

/** A run whose trainer has started: what the training loop and the end of the run work with. */
export interface TrainingRun extends Omit<RunRequest, "images"> {
  /** The images and their preprocessing. */
  data: RunData;
  /** The model built on this thread: for held-out evaluation and the checkpoint's model name. */
  local: Network;
  /** The plan every device executes. */
  plan: Plan;
  /** The started trainer. */
  trainer: DataParallelTrainer;
  /** Full training batches, split over the devices. */
  trainLoader: DataLoader;
  /** The held-out images, in batches of 100. */
  testLoader: DataLoader;
  /** Steps per epoch. */
  perEpoch: number;
  /** The step the run stops at: `--steps`, or the end of the last epoch, whichever comes first. */
  target: number;
  /** Records the step timeline, with `--trace` or `--report`. */
  trace: TraceRecorder | undefined;
  /** The run's learning-rate policy. */
  lr: LrPolicy;
  /** The blobs of `--weights`, read and checked on rank 0. */
  caffeWeights: CaffeLayerWeights[] | undefined;
  /** What the devices are, in words. */
  deviceKind: "CPU" | "WebGPU";
  /** What connects the devices, for every output. */
  linkText: string;
}

/**
 * Refuses, before the data loaders and devices start, a model with buffers (BatchNorm statistics)
 * on a plan that cannot carry them (a hybrid one), by the trainer's own check, naming the flags.
 */
function checkBuffersSupported(
  network: Network,
  args: { model: string; schedule: string },
  plan: Plan,
): void {
  try {
    checkBuffersCarried(network.namedBuffers().length, plan);
  } catch (error) {
    if (!(error instanceof ScheduleError)) throw error;
    throw new CliError(
      `--model ${args.model} with --schedule ${args.schedule}: ${error.reason}`,
      EXIT_FAILURE,
    );
  }
}

/** The plan of `--schedule` and the spec the devices build (see `choosePlan`), the same on every rank. */
async function chooseRunPlan(
  { args, root, say, transport, link }: RunRequest,
  local: Network,
  baseSpec: ModelSpec,
): Promise<{ plan: Plan; spec: ModelSpec; linkBytesPerSecond?: number }> {
  // A measured (auto) schedule could differ between ranks: rank 0 measures and decides for all, at
  // the link every rank measured together (nothing else says what joins the hosts).
  const measured = transport && args.schedule === "auto" && transport.size > 1
    ? await measureLink(transport, { bytes: 4 * local.parameterCount(), dataPlane: args.dataPlane })
    : undefined;
  if (!transport || args.schedule !== "auto") return await choosePlan(args, local, baseSpec, link, say);
  const chosen = await transport.broadcastJson(
    root ? await choosePlan(args, local, baseSpec, link, say, measured) : null,
    0,
    { deadline: performance.now() + 600_000 },
    "broadcast the automatic schedule",
  ) as { plan: Plan; spec: ModelSpec };
  // The exchange's master-mode chunks follow the same rate (it would measure it again otherwise).
  return { ...chosen, linkBytesPerSecond: measured?.link.bandwidthBytesPerSecond };
}

/** The training and held-out loaders of `data`, with the steps per epoch (refused when none). */
function makeLoaders(
  args: TrainArgs,
  data: RunData,
): { trainLoader: DataLoader; testLoader: DataLoader; perEpoch: number } {
  const preprocess = {
    scale: data.scale,
    meanValue: data.meanValue,
    cropSize: data.cropSize,
    mirror: data.mirror,
  };
  const trainLoader = new DataLoader(data.train, {
    ...preprocess,
    batchSize: args.batch,
    seed: args.seed,
    deviceCount: args.devices,
    // A short last batch might not split over the devices; Caffe's solvers also see full batches only.
    dropLast: true,
  });
  const perEpoch = trainLoader.numBatches;
  if (perEpoch === 0) {
    throw new CliError(`--batch ${args.batch} is larger than the ${data.train.count} training images`);
  }
  const testLoader = new DataLoader(data.test, { ...preprocess, batchSize: 100, mode: "eval" });
  return { trainLoader, testLoader, perEpoch };
}

/**
 * Checks the `--resume` checkpoint and the `--weights` file against `local` without loading them,
 * and returns the blobs of `--weights` (read on rank 0) for {@link loadStartingPoint}.
 */
async function checkStartingPoint(
  { args, root, resumeFile }: RunRequest,
  local: Network,
  optimizerFor: (parameters: ParameterEntry[]) => SGD,
): Promise<CaffeLayerWeights[] | undefined> {
  if (resumeFile) {
    // The checkpoint is checked against the model here, before any device starts, so a wrong one
    // costs seconds; it is loaded into the trainer from the same bytes below.
    const probe = optimizerFor(local.namedParameters());
    try {
      await loadCheckpoint(args.resume!, {
        parameters: local.namedParameters(),
        buffers: local.namedBuffers(),
        optimizer: probe,
        modelName: local.name,
        dryRun: true,
        file: resumeFile,
      });
    } finally {
      probe.dispose();
    }
  }

  // A .caffemodel is read and checked against the net here, before any device starts (as a
  // checkpoint is); rank 0 loads the same blobs into the master below and broadcasts them.
  if (args.weights === undefined || !root) return undefined;
  const caffeWeights = parseCaffeModel(await Deno.readFile(args.weights), args.weights);
  loadCaffeWeights(local.namedParameters(), caffeWeights, {
    fileName: args.weights,
    dryRun: true,
    buffers: local.namedBuffers(),
  });
  return caffeWeights;
}

/** Starts the devices of `--devices` and `--backend` on `plan`, joined by the link or transport asked for. */
function createTrainer(
  { args, link, transport }: RunRequest,
  spec: ModelSpec,
  plan: Plan,
  trace: TraceRecorder | undefined,
  optimizerFor: (parameters: ParameterEntry[]) => SGD,
  linkBytesPerSecond: number | undefined,
): Promise<DataParallelTrainer> {
  return DataParallelTrainer.create({
    model: spec,
    mode: args.reduce,
    plan,
    seed: args.seed,
    accumulate: args.accumulate,
    deviceThreads: args.threads,
    computeNice: args.computeNice,
    trace,
    // WebGPU devices each get a GPUDevice of their own; CPU devices are Workers (the default).
    startDevice: args.backend === "webgpu"
      ? (index: number, model: ModelSpec, layout: ParameterLayout) =>
        BackendDevice.start(index, model, layout, (i) => createWebGpuBackend({ name: `webgpu:${i}` }))
      : undefined,
    optimizer: optimizerFor,
    devices: args.devices,
    link,
    transport,
    dataPlane: args.dataPlane,
    linkBytesPerSecond,
    wire: args.wire,
    errorFeedback: args.errorFeedback,
  });
}

/**
 * Builds and checks everything the run needs, in the order a bad input is refused (data, device
 * count, plan, BatchNorm support, batch size, checkpoint, weights), then starts the trainer. The
 * caller owns the returned trainer and model: it closes and disposes them when the run ends.
 */
export async function startRun(request: RunRequest): Promise<TrainingRun> {
  const { images, ...asked } = request;
  const { args, choice, transport, link } = asked;
  const data = fitToModel(images ?? await loadImages(args.data, choice, args.seed), args.data, choice);
  const baseSpec = choice.spec(data.train.classes);
  const local = await buildLocal(baseSpec);
  try {
    checkDeviceCount(args, local);
    const { plan, spec, linkBytesPerSecond } = await chooseRunPlan(request, local, baseSpec);
    validatePlan(plan, { mode: args.reduce });
    checkBuffersSupported(local, args, plan);
    const { trainLoader, testLoader, perEpoch } = makeLoaders(args, data);
    const epochLimit = args.epochs ?? (args.steps !== undefined ? Infinity : DEFAULTS.epochs);
    const target = Math.min(epochLimit * perEpoch, args.steps ?? Infinity);
    const trace = args.trace || args.report ? new TraceRecorder() : undefined;
    // Halved every epoch, as examples/mnist.ts.
    const lr = { policy: "step" as const, baseLr: args.lr, gamma: 0.5, stepSize: perEpoch };
    // Momentum and weight decay as Caffe's reference solvers.
    const optimizerFor = (parameters: ParameterEntry[]) =>
      new SGD(parameters, { lr, momentum: 0.9, weightDecay: 5e-4 });
    const caffeWeights = await checkStartingPoint(request, local, optimizerFor);
    const deviceKind = args.backend === "cpu" ? "CPU" : "WebGPU";
    // What connects the devices, for every output: emulation is always labelled as such.
    const linkText = transport
      ? `MPI (Open MPI, ${args.devices} ranks${
        args.dataPlane === "sockets" ? ", gradients over sockets" : ""
      })`
      : link
      ? link.label
      : "shared memory";
    const trainer = await createTrainer(request, spec, plan, trace, optimizerFor, linkBytesPerSecond);
    shareMasterParameters(local, trainer);
    return {
      ...asked,
      data,
      local,
      plan,
      trainer,
      trainLoader,
      testLoader,
      perEpoch,
      target,
      trace,
      lr,
      caffeWeights,
      deviceKind,
      linkText,
    };
  } catch (error) {
    local.dispose();
    throw error;
  }
}

/**
 * Loads the run's starting point into the trainer and every device: the `--resume` checkpoint
 * (parameters, optimizer state, error-feedback residuals) or the `--weights` of a Caffe net.
 * Collective under MPI.
 */
export async function loadStartingPoint(run: TrainingRun): Promise<void> {
  const { args, root, say, trainer, resumeFile, caffeWeights } = run;
  if (args.resume) {
    // Only rank 0 reads the file (other hosts need not have it); the broadcast brings the rest along.
    const loaded = root
      ? await loadCheckpoint(args.resume, {
        parameters: trainer.parameterEntries,
        buffers: trainer.bufferEntries,
        optimizer: trainer.optimizer,
        modelName: run.local.name,
        file: resumeFile,
      })
      : undefined;
    // The checkpoint restored its own lr policy; the run's (the same unless --lr or --batch was
    // given) takes over from the resumed step, on every optimizer of every rank.
    trainer.setLrPolicy(run.lr);
    await trainer.broadcastParameters();
    say(`resumed from ${args.resume} at step ${loaded?.step}`);
    for (const note of run.resumeNotes) say(`  ${note}`);
    // Collective under MPI: every device takes its saved error-feedback residual back.
    const note = await resumeResiduals(trainer, loaded?.extraTensors);
    if (note) say(note);
  }
  if (args.weights !== undefined) {
    if (caffeWeights) {
      loadCaffeWeights(trainer.parameterEntries, caffeWeights, {
        fileName: args.weights,
        buffers: trainer.bufferEntries,
      });
    }
    await trainer.broadcastParameters();
    say(`fine-tuning from ${args.weights}`);
  }
}

/** Says what the run trains, on what, how, and from which step to which. */
export function announceRun(run: TrainingRun): void {
  const { args, say, trainer, transport, plan, perEpoch, target } = run;
  // Said only when not the exact default: a lossy run must not pass for an fp32 one.
  const wireText = args.wire === "fp32"
    ? ""
    : `, ${args.wire} gradients on the wire${args.errorFeedback ? " with error feedback" : ""} (lossy)`;
  const first = trainer.iteration;
  const parameterCount = trainer.layout.total;
  const bufferCount = trainer.bufferLayout.total;
  say(
    `training ${run.choice.name} (${parameterCount.toLocaleString("en-US")} parameters${
      bufferCount ? `, ${bufferCount.toLocaleString("en-US")} BatchNorm statistics` : ""
    }) on ${run.data.description}`,
  );
  const where = transport
    ? `${args.devices} MPI rank${args.devices === 1 ? "" : "s"}, one ${run.deviceKind} device each`
    : `${args.devices} ${run.deviceKind} device${args.devices === 1 ? "" : "s"}`;
  say(
    `  ${where}, schedule ${plan.name}, ${args.reduce} ` +
      `reduction, link ${run.linkText}${wireText}; batch ${args.batch} ` +
      `(${args.batch / args.devices} per device${
        args.accumulate > 1
          ? ` in ${args.accumulate} micro-batches of ${args.batch / args.devices / args.accumulate}`
          : ""
      }), lr ${args.lr} halved every epoch (${perEpoch} steps)`,
  );
  if (first >= target) say(`already at step ${first}, which reaches the target of ${target} steps`);
}
