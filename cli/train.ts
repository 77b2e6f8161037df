/**
 * `deno task train`: data-parallel training from the command line. Without options it trains the
 * AlexNet-like default on the embedded MNIST digits on two CPU device handles under the `overlap`
 * schedule and reports held-out accuracy; `--help` lists everything else.
 *
 * Every problem a user can cause (bad flags, data that does not fit the model, a checkpoint of
 * another model, a malformed schedule file, diverging training) ends as a clear message on stderr
 * and a non-zero exit status, never a stack trace.
 *
 * @module
 */

import {
  createWebGpuBackend,
  DataLoader,
  DataParallelTrainer,
  DivergenceError,
  evaluate,
  formatSummary,
  loadCaffeWeights,
  loadCheckpoint,
  type Network,
  type Plan,
  saveCheckpoint,
  ScheduleError,
  SGD,
  summarize,
  tensor,
  TraceRecorder,
  validatePlan,
} from "../mod.ts";
import {
  BackendDevice,
  type ModelSpec,
  type ParameterLayout,
  parametersSha256,
} from "../schedule/devices/mod.ts";
import { type CaffeLayerWeights, parseCaffeModel } from "../engine/caffe/mod.ts";
import { detectMpiLaunch, MpiTransport } from "../schedule/mpi/mod.ts";
import {
  medianFigures,
  parseLink,
  residualTensors,
  resumeResiduals,
  type StepFigures,
} from "../schedule/runtime/mod.ts";
import type { ParameterEntry } from "../engine/nn/mod.ts";
import { writeFileAtomic } from "../engine/io/mod.ts";
import { checkDeviceCount, DEFAULTS, helpText, parseTrainArgs } from "./args.ts";
import { copyBuffers } from "../schedule/devices/buffer_layout.ts";
import { checkBuffersCarried } from "../schedule/runtime/start.ts";
import { fitToModel, loadImages } from "./data.ts";
import { CliError, describeError, EXIT_FAILURE, EXIT_USAGE } from "./errors.ts";
import { buildLocal, chooseModelForData } from "./model.ts";
import { checkOutputs } from "./outputs.ts";
import { exitStatus, StopSignals } from "./signals.ts";
import { divergedCheckpointPath, Snapshots } from "./snapshots.ts";
import { formatDuration, Progress, stderrStyle } from "./progress.ts";
import { type StepPoint, writeReport } from "./report.ts";
import { resumeArguments } from "./resume.ts";
import { choosePlan } from "./plan.ts";
import { defaultOutputPath, showUserPaths } from "./paths.ts";

/**
 * The file Ctrl-C or SIGTERM saves to when no `--checkpoint` was given, in the git-ignored
 * `runs/` folder of the user's directory (see `defaultOutputPath`).
 */
export const INTERRUPTED_CHECKPOINT = "tandem-interrupted.safetensors";

/** Steps of the trace drawn in the report (the last few: past warm-up). */
const REPORT_TRACE_STEPS = 3;

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

/** Refuses an input file that is missing, not a file, or unreadable, naming `--flag`. */
async function checkReadable(flag: string, path: string): Promise<void> {
  let file: Deno.FsFile | undefined;
  try {
    if (!(await Deno.stat(path)).isFile) throw new CliError(`--${flag} ${path}: not a file`, EXIT_FAILURE);
    file = await Deno.open(path, { read: true });
  } catch (error) {
    if (error instanceof CliError) throw error;
    const why = error instanceof Deno.errors.NotFound
      ? "no such file"
      : error instanceof Deno.errors.PermissionDenied
      ? "permission denied"
      : (error as Error).message;
    throw new CliError(`--${flag} ${path}: cannot read it (${why})`, EXIT_FAILURE);
  } finally {
    file?.close();
  }
}

async function writeTrace(path: string, trace: TraceRecorder, linkLabel: string): Promise<void> {
  // The link label travels in the file so nobody mistakes an emulated timeline for a real one.
  const json = {
    ...trace.toChromeTrace(),
    otherData: { link: linkLabel },
  };
  await writeFileAtomic(path, [new TextEncoder().encode(JSON.stringify(json))]);
}

/**
 * Runs the command line `argv` and returns the exit status. Errors a user can cause are thrown as
 * `CliError`/`TandemError` for the caller to print.
 *
 * @example
 * ```ts ignore
 * import { runTrain } from "./train.ts";
 * Deno.exit(await runTrain(["--data", "synthetic", "--model", "lenet", "--steps", "4", "--batch", "8"]));
 * ```
 */
export async function runTrain(argv: readonly string[]): Promise<number> {
  const parsed = parseTrainArgs(argv);
  // Under MPI every rank runs this same command; rank 0 speaks and writes files for all of them.
  const root = parsed.transport === "local" || detectMpiLaunch()?.rank === 0;
  if (parsed.help) {
    if (root) console.log(helpText());
    return 0;
  }
  if (root) { for (const warning of parsed.warnings) console.error(`tandem train: warning: ${warning}`); }
  // Only rank 0 reads the checkpoint (other hosts need not have it); a missing one fails before any work.
  if (parsed.resume !== undefined && root) await checkReadable("resume", parsed.resume);
  if (parsed.weights !== undefined && root) await checkReadable("weights", parsed.weights);
  const transport = parsed.transport === "mpi" ? MpiTransport.init() : undefined;
  // A resumed run continues with its checkpoint's settings, except the flags given here.
  const { args, notes: resumeNotes, file: resumeFile } = parsed.resume
    ? await resumeArguments(argv, parsed, transport)
    : { args: parsed, notes: [], file: undefined };
  // Before any expensive work: a bad output path costs a second, not the run. Rank 0 writes them all.
  if (root && args.steps !== 0) await checkOutputs(args);
  // With --json, stdout carries exactly one JSON object; everything for people goes to stderr.
  const say = !root
    ? () => {}
    : args.json
    ? (line: string) => console.error(showUserPaths(line))
    : (line: string) => console.log(showUserPaths(line));
  const link = args.link ? parseLink(args.link) : undefined;
  const { choice, images } = await chooseModelForData(args);

  if (args.steps === 0) {
    const network = await buildLocal(choice.spec());
    const summary = summarize(network, network.inputShape);
    say(`${choice.name}: input ${network.inputShape.join("×")}, ${network.classes} classes`);
    say(formatSummary(summary));
    if (args.json && root) {
      console.log(JSON.stringify({
        model: choice.name,
        parameters: summary.parameters,
        flops: summary.flops,
        groups: summary.groups,
        step: 0,
      }));
    }
    network.dispose();
    return 0;
  }

  const data = fitToModel(images ?? await loadImages(args.data, choice, args.seed), args.data, choice);
  const baseSpec = choice.spec(data.train.classes);
  const local = await buildLocal(baseSpec);
  try {
    checkDeviceCount(args, local);
  } catch (error) {
    local.dispose();
    throw error;
  }
  // A measured (auto) schedule could differ between ranks: rank 0 measures and decides for all.
  const { plan, spec } = transport && args.schedule === "auto"
    ? await transport.broadcastJson(
      root ? await choosePlan(args, local, baseSpec, link, say) : null,
      0,
      { deadline: performance.now() + 600_000 },
      "broadcast the automatic schedule",
    ) as { plan: Plan; spec: ModelSpec }
    : await choosePlan(args, local, baseSpec, link, say);
  validatePlan(plan, { mode: args.reduce });
  try {
    checkBuffersSupported(local, args, plan);
  } catch (error) {
    local.dispose();
    throw error;
  }

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
  const epochLimit = args.epochs ?? (args.steps !== undefined ? Infinity : DEFAULTS.epochs);
  const target = Math.min(epochLimit * perEpoch, args.steps ?? Infinity);
  const trace = args.trace || args.report ? new TraceRecorder() : undefined;
  // Halved every epoch, as examples/mnist.ts.
  const lr = { policy: "step" as const, baseLr: args.lr, gamma: 0.5, stepSize: perEpoch };
  // Momentum and weight decay as Caffe's reference solvers.
  const optimizerFor = (parameters: ParameterEntry[]) =>
    new SGD(parameters, { lr, momentum: 0.9, weightDecay: 5e-4 });
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
    } catch (error) {
      local.dispose();
      throw error;
    } finally {
      probe.dispose();
    }
  }

  // A .caffemodel is read and checked against the net here, before any device starts (as a
  // checkpoint is); rank 0 loads the same blobs into the master below and broadcasts them.
  let caffeWeights: CaffeLayerWeights[] | undefined;
  if (args.weights !== undefined && root) {
    try {
      caffeWeights = parseCaffeModel(await Deno.readFile(args.weights), args.weights);
      loadCaffeWeights(local.namedParameters(), caffeWeights, {
        fileName: args.weights,
        dryRun: true,
        buffers: local.namedBuffers(),
      });
    } catch (error) {
      local.dispose();
      throw error;
    }
  }

  const common = {
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
  };
  const deviceKind = args.backend === "cpu" ? "CPU" : "WebGPU";
  // What connects the devices, for every output: emulation is always labelled as such.
  const linkText = transport
    ? `MPI (Open MPI, ${args.devices} ranks${args.dataPlane === "sockets" ? ", gradients over sockets" : ""})`
    : link
    ? link.label
    : "shared memory";
  const trainer = await DataParallelTrainer.create({
    ...common,
    devices: args.devices,
    link,
    transport,
    dataPlane: args.dataPlane,
    wire: args.wire,
    errorFeedback: args.errorFeedback,
  });
  // Said only when not the exact default: a lossy run must not pass for an fp32 one.
  const wireText = args.wire === "fp32"
    ? ""
    : `, ${args.wire} gradients on the wire${args.errorFeedback ? " with error feedback" : ""} (lossy)`;
  try {
    if (args.resume) {
      // Only rank 0 reads the file (other hosts need not have it); the broadcast brings the rest along.
      const loaded = root
        ? await loadCheckpoint(args.resume, {
          parameters: trainer.parameterEntries,
          buffers: trainer.bufferEntries,
          optimizer: trainer.optimizer,
          modelName: local.name,
          file: resumeFile,
        })
        : undefined;
      // The checkpoint restored its own lr policy; the run's (the same unless --lr or --batch was
      // given) takes over from the resumed step, on every optimizer of every rank.
      trainer.setLrPolicy(lr);
      await trainer.broadcastParameters();
      say(`resumed from ${args.resume} at step ${loaded?.step}`);
      for (const note of resumeNotes) say(`  ${note}`);
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
    const first = trainer.iteration;
    const parameterCount = trainer.layout.total;
    const bufferCount = trainer.bufferLayout.total;
    say(
      `training ${choice.name} (${parameterCount.toLocaleString("en-US")} parameters${
        bufferCount ? `, ${bufferCount.toLocaleString("en-US")} BatchNorm statistics` : ""
      }) on ${data.description}`,
    );
    const where = transport
      ? `${args.devices} MPI rank${args.devices === 1 ? "" : "s"}, one ${deviceKind} device each`
      : `${args.devices} ${deviceKind} device${args.devices === 1 ? "" : "s"}`;
    say(
      `  ${where}, schedule ${plan.name}, ${args.reduce} ` +
        `reduction, link ${linkText}${wireText}; batch ${args.batch} ` +
        `(${args.batch / args.devices} per device${
          args.accumulate > 1
            ? ` in ${args.accumulate} micro-batches of ${args.batch / args.devices / args.accumulate}`
            : ""
        }), lr ${args.lr} halved every epoch (${perEpoch} steps)`,
    );
    if (first >= target) say(`already at step ${first}, which reaches the target of ${target} steps`);

    const progress = root
      ? new Progress({ first, target, epochs: Math.ceil(target / perEpoch), ...stderrStyle() })
      : undefined;
    const stops = new StopSignals((line) => progress?.log(line));
    // Under mpirun, Ctrl-C is mpirun's: it stops every rank (each says what it was doing).
    if (!transport) stops.install();
    // What a plain --resume continues with (see resume.ts).
    const extra = {
      data: args.data,
      batch: args.batch,
      devices: args.devices,
      schedule: plan.name,
      epochs: args.epochs,
      steps: args.steps,
    };
    // Every device's error-feedback residual goes into the checkpoint with the parameters; both are
    // brought to the master by every sync before a save (collective under MPI).
    let residuals: Float32Array[] | undefined;
    const syncForSave = async () => {
      await trainer.syncParameters();
      residuals = await trainer.residuals();
    };
    const save = (path: string, step: number) =>
      saveCheckpoint(path, {
        parameters: trainer.parameterEntries,
        buffers: trainer.bufferEntries,
        optimizer: trainer.optimizer,
        step,
        modelName: local.name,
        extra,
        extraTensors: residualTensors(residuals),
      });
    const snapshots = args.checkpoint !== undefined
      ? new Snapshots(args.checkpoint, args.keep, save)
      : undefined;

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
        const batch = trainLoader.batch(epoch, i % perEpoch);
        let result;
        try {
          const pixels = await batch.images.data() as Float32Array;
          result = await trainer.step({
            images: pixels,
            labels: batch.labelValues,
            shape: batch.images.shape,
          });
        } catch (error) {
          if (error instanceof DivergenceError) {
            diverged = error;
            break;
          }
          throw error;
        } finally {
          batch.dispose();
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
        if (snapshots && args.checkpointEvery && (i + 1) % args.checkpointEvery === 0 && i + 1 < target) {
          // Collective under MPI (every rank syncs), then rank 0 alone writes; the end saves the last.
          await syncForSave();
          if (root) await snapshots.save(i + 1);
        }
        if (args.report && (i + 1) % perEpoch === 0 && i + 1 < target) {
          // Collective under MPI; then rank 0 alone evaluates.
          await trainer.syncParameters();
        }
        if (args.report && root && (i + 1) % perEpoch === 0 && i + 1 < target) {
          await copyMasterInto(local, trainer);
          const { accuracy } = await evaluate(local, testLoader);
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
    await syncForSave();
    const step = trainer.iteration;

    if (diverged) {
      // Never over --checkpoint: a good file there (an earlier run's, or this run's last snapshot)
      // must survive a run that broke. The rolled-back state is finite and goes beside it.
      let kept = "";
      if (args.checkpoint && root && diverged.rolledBack) {
        const aside = divergedCheckpointPath(args.checkpoint);
        await save(aside, step);
        kept =
          `; the last finite state (step ${step}) is saved in ${aside}, ${args.checkpoint} is left as it was`;
      } else if (args.checkpoint && root) {
        kept =
          `; nothing was saved (the step could not be rolled back), ${args.checkpoint} is left as it was`;
      }
      throw new CliError(
        `${diverged.message.replace(/^training: /, "training ")} (try a smaller --lr than ${args.lr})${kept}`,
        EXIT_FAILURE,
      );
    }
    if (stops.requested) {
      const path = args.checkpoint ?? await defaultOutputPath(INTERRUPTED_CHECKPOINT);
      await (snapshots ? snapshots.save(step) : save(path, step));
      if (args.trace && trace) {
        await writeTrace(args.trace, trace, link ? link.label : "shared memory (no emulation)");
      }
      say(`interrupted at step ${step}; checkpoint saved to ${path} (continue with --resume ${path})`);
      if (args.json) {
        console.log(JSON.stringify({ interrupted: true, signal: stops.requested, step, checkpoint: path }));
      }
      return exitStatus(stops.requested);
    }

    if (!root) return 0;
    await copyMasterInto(local, trainer);
    const test = await evaluate(local, testLoader);
    heldOut.push({ step, accuracy: test.accuracy });
    const sha = await parametersSha256(trainer.layout, await trainer.masterParameters());
    // Device 0's BatchNorm statistics, fingerprinted as the parameters are.
    const buffersSha = bufferCount
      ? await parametersSha256(trainer.bufferLayout, trainer.masterBuffers())
      : undefined;
    const files: Record<string, string> = {};
    if (snapshots && args.checkpoint !== undefined) {
      await snapshots.save(step);
      files.checkpoint = args.checkpoint;
    }
    if (args.trace && trace) {
      await writeTrace(args.trace, trace, link || transport ? linkText : "shared memory (no emulation)");
      files.trace = args.trace;
    }
    // Medians per step: a garbage collection or a late Worker does not move them.
    const stepMs = medianFigures(timed);
    const percent = (part: number, whole: number) => whole > 0 ? (100 * part / whole).toFixed(0) : "0";
    const timeSplit =
      `${stepMs.total.toFixed(1)} ms per step (median): compute ${stepMs.compute.toFixed(1)} ms; ` +
      `communication ${stepMs.communication.toFixed(1)} ms, ${
        stepMs.hiddenCommunication.toFixed(1)
      } ms of it ` +
      `hidden (${percent(stepMs.hiddenCommunication, stepMs.communication)}%); update ${
        stepMs.update.toFixed(1)
      } ms, ${stepMs.hiddenUpdate.toFixed(1)} ms of it hidden (${
        percent(stepMs.hiddenUpdate, stepMs.update)
      }%)`;
    const imagesPerSecond = seconds > 0 ? images / seconds : 0;
    if (args.report) {
      const lastSteps = new Set(Array.from({ length: REPORT_TRACE_STEPS }, (_, k) => step - 1 - k));
      await writeReport(args.report, {
        title: `${choice.name} on ${args.data}: ${(test.accuracy * 100).toFixed(2)}% held out`,
        facts: [
          ["model", `${choice.name} (${parameterCount.toLocaleString("en-US")} parameters)`],
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
        steps: points,
        heldOut,
        spans: trace!.spans.filter((s) => lastSteps.has(s.step)),
      });
      files.report = args.report;
    }

    const summary = [
      `held-out accuracy ${(test.accuracy * 100).toFixed(2)}% (loss ${
        test.loss.toFixed(4)
      }) on ${test.count} ` +
      `images after step ${step} (${(step / perEpoch).toFixed(2)} epochs)`,
      `throughput ${imagesPerSecond.toFixed(0)} images/s; ${step - first} steps in ${
        formatDuration(seconds)
      }`,
      `step time ${timeSplit}${link ? ` over an emulated link (${link.label})` : ""}`,
      `parameters sha256 ${sha}${buffersSha ? `, BatchNorm statistics sha256 ${buffersSha}` : ""}`,
      Object.keys(files).length
        ? `files: ${Object.entries(files).map(([k, v]) => `${k} ${v}`).join(", ")}`
        : "files: none written (see --checkpoint, --trace, --report)",
    ];
    for (const line of summary) say(line);
    if (args.json) {
      console.log(JSON.stringify({
        loss: test.loss,
        accuracy: test.accuracy,
        trainLoss: lastLoss,
        parameters: parameterCount,
        step,
        epochs: step / perEpoch,
        imagesPerSecond,
        seconds,
        paramsSha256: sha,
        ...(buffersSha ? { buffers: bufferCount, buffersSha256: buffersSha } : {}),
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
      }));
    }
    return 0;
  } finally {
    await trainer.close();
    local.dispose();
  }
}

if (import.meta.main) {
  let code: number;
  try {
    code = await runTrain(Deno.args);
  } catch (error) {
    const mpi = MpiTransport.current;
    const rank = mpi?.rank ?? detectMpiLaunch()?.rank ?? 0;
    // Under mpirun every rank parses the same command line, so a usage error is said once, by rank
    // 0; anything else may be this rank's alone (a file missing on its host, its device failing).
    const usage = error instanceof CliError && error.exitCode === EXIT_USAGE;
    const speak = rank === 0 || !usage;
    const prefix = rank === 0 ? "tandem train" : `tandem train (MPI rank ${rank})`;
    const known = describeError(error);
    if (known) {
      if (speak) console.error(`${prefix}: ${known.message}`);
      code = known.exitCode;
    } else {
      console.error(`${prefix}: unexpected error (a bug; please report it):`, error);
      code = EXIT_FAILURE;
    }
    // The other ranks may be waiting in a collective for this one: end the whole job now.
    if (mpi) mpi.abort(code);
  }
  MpiTransport.current?.finalize();
  // Exit explicitly: device Workers or a pending timer must not keep a finished run alive.
  Deno.exit(code);
}
