/**
 * The command line of `deno task train`: flags, defaults, validation and `--help`.
 *
 * @module
 */

import { parseArgs } from "node:util";
import { type Network, summarize, ValueError } from "../mod.ts";
import { builtinModels } from "../engine/models/mod.ts";
import {
  deviceCapacity,
  type MachineSize,
  machineSize,
  parseLink,
  WIRE_FORMATS,
  type WireFormat,
} from "../schedule/runtime/mod.ts";
import { type DataPlane, inspectMpiLaunch, type MpiDetection, type MpiLaunch } from "../schedule/mpi/mod.ts";
import { MAX_SYNTHETIC_ELEMENTS, resolveDataPaths, syntheticShape } from "./data.ts";
import { CliError, closest } from "./errors.ts";
import { DEFAULT_OUTPUT_FOLDER, resolveUserPath, userDirectory } from "./paths.ts";

/** The default recipe: the AlexNet-like net on the embedded MNIST digits, measured to clear 97%. */
export const DEFAULTS = {
  model: "alexnet-like",
  data: "mnist",
  backend: "cpu",
  devices: 2,
  schedule: "overlap",
  reduce: "master",
  epochs: 4,
  batch: 64,
  lr: 0.02,
  seed: 1,
} as const;

/** The built-in schedules of `--schedule`, each with the few words `--help` says of it. */
export const BUILTIN_SCHEDULES = {
  overlap: "each group's exchange starts when its backward ends, hidden behind the next",
  sequential: "all of backward first, then every exchange: the baseline, nothing hidden",
  bucketed: "PyTorch DDP's default buckets (1 MiB, then up to 25 MiB, from the output side), overlapped",
  hybrid: "FC layers split over the devices (activations travel), the rest data-parallel",
  auto: "measures the model here, prices each plan on the link, runs the fastest",
} as const;

/** The names of {@link BUILTIN_SCHEDULES}. */
export const SCHEDULE_NAMES: readonly string[] = Object.keys(BUILTIN_SCHEDULES);

/** Everything a training run was asked to do, validated. */
export interface TrainArgs {
  /** A built-in model name or a path to a Caffe `.prototxt`. */
  model: string;
  /**
   * `mnist`, `fashion-mnist`, `cifar10:<dir>`, `mnist-idx:<dir>`, `synthetic` or `synthetic:CxHxW`;
   * a directory resolved as every path flag (see `cli/paths.ts`).
   */
  data: string;
  /** Device kind: CPU Workers, or one WebGPU device (GPUDevice) per handle. */
  backend: "cpu" | "webgpu";
  /** Device handles (Workers), or MPI ranks under `--transport mpi` (one device each). */
  devices: number;
  /**
   * `local`: every device is a Worker of this process; `mpi`: one device per MPI rank, the process
   * started by mpirun (the default there).
   */
  transport: "local" | "mpi";
  /** A name of {@link BUILTIN_SCHEDULES} or a schedule file. */
  schedule: string;
  /** Reduction mode. */
  reduce: "master" | "allreduce";
  /** Emulated link description for `parseLink`, if any. */
  link?: string;
  /** How gradients travel: `fp32` (exact) or `fp16` / `bf16` (half the bytes, lossy). */
  wire: WireFormat;
  /** With a 16-bit `wire`: carry each device's rounding error into its next step. */
  errorFeedback: boolean;
  /** Under `--transport mpi`: how gradients and parameters travel between ranks. */
  dataPlane: DataPlane;
  /** Epochs to train; absent means the default, or no epoch limit when `steps` is given. */
  epochs?: number;
  /** Stop once the run's total step count reaches this (counting resumed steps). */
  steps?: number;
  /** Global batch size: samples per update, over every device and micro-batch. */
  batch: number;
  /** Micro-batches per device per step (gradient accumulation); 1 means none. */
  accumulate: number;
  /** Kernel threads of each CPU device; absent means its share of the cores. */
  threads?: number;
  /** Nice value of the CPU devices' compute threads (Linux); absent means the runtime's default, 10. */
  computeNice?: number;
  /** Base learning rate (halved every epoch). */
  lr: number;
  /** Seed of initialisation, shuffling, augmentation and dropout. */
  seed: number;
  /** Where to save the final (or interrupted) checkpoint. */
  checkpoint?: string;
  /** Also save `checkpoint` every this many steps (after step N, 2N, …). */
  checkpointEvery?: number;
  /** With `checkpointEvery`: keep the last K snapshots as numbered files (see `cli/snapshots.ts`). */
  keep?: number;
  /** Checkpoint to continue from. */
  resume?: string;
  /** Caffe `.caffemodel` whose weights a `--model` prototxt net starts from (fine-tuning). */
  weights?: string;
  /** Where to write a Chrome trace. */
  trace?: string;
  /** Where to write the HTML report. */
  report?: string;
  /** One JSON object on stdout, progress on stderr. */
  json: boolean;
  /** Show the help and exit. */
  help: boolean;
  /** The flags the command line gave (without `--`), so a resumed run knows what to override. */
  given: readonly string[];
  /** One line each about the environment that the run goes on despite (stale MPI variables). */
  warnings: string[];
}

/** The flags that take a value, without `--`. */
export const STRING_FLAGS = [
  "model",
  "data",
  "backend",
  "devices",
  "transport",
  "schedule",
  "reduce",
  "link",
  "wire",
  "data-plane",
  "epochs",
  "steps",
  "batch",
  "accumulate",
  "threads",
  "compute-nice",
  "lr",
  "seed",
  "checkpoint",
  "checkpoint-every",
  "keep",
  "resume",
  "weights",
  "trace",
  "report",
] as const;
/** The flags that take none. */
export const BOOLEAN_FLAGS = ["error-feedback", "json", "help"] as const;

/** Every flag as typed, for "did you mean" hints. */
export const FLAG_NAMES: readonly string[] = [...STRING_FLAGS, ...BOOLEAN_FLAGS].map((f) => `--${f}`);

/**
 * The `--help` text.
 *
 * @example
 * ```ts
 * import { helpText } from "./args.ts";
 * console.log(helpText());
 * ```
 */
export function helpText(): string {
  const models = Object.entries(builtinModels).map(([name, m]) =>
    `      ${name.padEnd(13)} ${m.description}`
  );
  const schedules = Object.entries(BUILTIN_SCHEDULES).map(([name, words]) =>
    `      ${name.padEnd(11)} ${words}`
  );
  return `Usage: npx deno task train [options]
       mpirun -np 2 ./node_modules/.bin/deno run -A cli/train.ts --transport mpi [options]

Trains a network data-parallel on several CPU device handles (Workers), overlapping the gradient
exchange with backward under a schedule, then reports held-out accuracy. Without options: the
AlexNet-like net on the embedded MNIST digits (8,000 train / 2,000 held out), 2 devices, the overlap
schedule, batch ${DEFAULTS.batch}, SGD momentum 0.9, weight decay 5e-4, lr ${DEFAULTS.lr} halved every epoch, ${DEFAULTS.epochs} epochs.
Under mpirun (--transport mpi) every process hosts one device and only rank 0 prints and writes files.

Model and data
  --model NAME|FILE     a built-in model or a Caffe .prototxt (default ${DEFAULTS.model}):
${models.join("\n")}
  --data SOURCE         mnist | fashion-mnist | cifar10:<dir> | mnist-idx:<dir> | synthetic |
                        synthetic:CxHxW (default ${DEFAULTS.data}); synthetic is shaped for the model's
                        input, synthetic:3x32x32 gives channels x height x width (at most ${MAX_SYNTHETIC_ELEMENTS}
                        values), as a Caffe net whose Data layer reads a database needs; such a layer's
                        transform_param scale, mean_value, crop_size and mirror are applied

Parallelism
  --backend cpu|webgpu  device kind (default cpu: Workers; webgpu: one GPUDevice per device handle)
  --devices N           device handles, N >= 1 (default ${DEFAULTS.devices}; under MPI: the number of ranks);
                        at most what this machine's memory and cores hold for the model (said if exceeded)
  --threads N           kernel threads of each CPU device (default: its share of the cores it may run on,
                        cores / devices, or cores / ranks on the host under MPI)
  --compute-nice N      nice value of the CPU devices' compute threads, 0..19 (Linux; default 10: below
                        the thread that exchanges gradients, so it runs the moment it wakes; 0: level)
  --transport T         local | mpi (default local, or mpi when started by mpirun): mpi runs one device
                        per MPI rank, across processes and hosts, e.g.
                        mpirun -np 2 ./node_modules/.bin/deno run -A cli/train.ts --transport mpi
                        (OMPI_* variables without mpirun's PMIx ones are stale: a warning, or refused
                        with --transport mpi)
  --schedule S          a built-in schedule or a schedule file (default ${DEFAULTS.schedule}):
${schedules.join("\n")}
  --reduce MODE         master | allreduce (default ${DEFAULTS.reduce})
  --link BANDWIDTH      emulate a slower link (labelled emulated): NUMBER[k|M|G|T] then B/s (bytes) or
                        b/s, bit/s (bits), optionally ,LATENCY in s|ms|us|ns: 1.2GB/s, 10Gb/s,
                        800MB/s,50us; or pcie3 | pcie4 | nvlink | 10gbe | 100gbe. Local transport only
  --wire FORMAT         gradients on the wire: fp32 | fp16 | bf16 (default fp32). fp16 and bf16 halve
                        the exchanged bytes; lossy, not bit-identical to fp32; parameters stay fp32
  --error-feedback      with --wire fp16|bf16: each device adds the rounding error it left out
                        to its next step's gradients; checkpoints carry these residuals
  --data-plane P        with --transport mpi: sockets (default: direct TCP connections between the
                        ranks carry gradients and parameters) | mpi (Open MPI's collectives carry
                        everything); the same bits either way

Training
  --epochs N            epochs to train (default ${DEFAULTS.epochs}, or no limit when --steps is given)
  --steps N             stop when the total step count (resumed steps included) reaches N;
                        0 builds the model, prints its summary and exits (so it takes no --resume,
                        --trace or --report)
  --batch N             global batch, divisible by --devices (default ${DEFAULTS.batch})
  --accumulate K        gradient accumulation: each device runs its share of --batch as K micro-batches
                        and communicates after the last; the batch splits into devices × K (default 1);
                        with hybrid each micro-batch runs the split FC layers, updated after the last
  --lr X                base learning rate, halved every epoch (default ${DEFAULTS.lr})
  --seed N              seed of initialisation, shuffling and dropout (default ${DEFAULTS.seed})

Files
  --checkpoint PATH     save parameters and optimizer state at the end, on Ctrl-C and on SIGTERM
  --checkpoint-every N  also save it every N steps (after step N, 2N, …); needs --checkpoint
  --keep K              with --checkpoint-every: also keep the last K snapshots beside PATH as
                        NAME-<step>.safetensors, the step zero-padded to 6 digits (run.safetensors:
                        run-000200.safetensors); older numbered ones are deleted, PATH is the latest
  --resume PATH         continue from a checkpoint (must exist; checked first) with its data, batch,
                        lr and length, except the flags given here, which take effect from its step
  --weights PATH        fine-tune: start a --model .prototxt net from a Caffe .caffemodel's weights,
                        matched by layer name and checked before any device starts (not with --resume)
  --trace PATH          write a Chrome trace (chrome://tracing, Perfetto) of every lane
  --report PATH         write an HTML report: loss/accuracy curves and a few steps' lanes
                        (--trace and --report name different files, neither an input's)
  --json                print one JSON object on stdout (progress goes to stderr)
  --help                show this help

No flag takes an empty value, and flags that would be ignored together are refused. Relative paths
are relative to the directory the command was typed in (INIT_CWD under deno task, else the cwd).
Ctrl-C (SIGINT) or SIGTERM finishes the current step, saves a checkpoint (--checkpoint, else
${DEFAULT_OUTPUT_FOLDER}/tandem-interrupted.safetensors there, the folder made if needed) and exits with status 130
(SIGTERM: 143). Output paths are checked
before training starts; a symbolic link is followed (its target is replaced), a device such as
/dev/null is written in place. A run whose parameters or loss turn NaN or infinite stops naming the
step and tensor, rolled back; it never writes over --checkpoint (its last finite state goes beside it).`;
}

function integer(flag: string, text: string | undefined, min: number): number | undefined {
  if (text === undefined) return undefined;
  const value = Number(text);
  if (!/^\s*-?\d+\s*$/.test(text) || !Number.isSafeInteger(value)) {
    throw new CliError(`--${flag} expects an integer, got "${text}"`);
  }
  if (value < min) throw new CliError(`--${flag} must be at least ${min}, got ${value}`);
  return value;
}

function positive(flag: string, text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  const value = Number(text);
  if (!/^\s*(\d+\.?\d*|\.\d+)(e[+-]?\d+)?\s*$/i.test(text) || !Number.isFinite(value) || value <= 0) {
    throw new CliError(`--${flag} expects a positive number, got "${text}"`);
  }
  return value;
}

function oneOf<T extends string>(
  flag: string,
  text: string | undefined,
  allowed: readonly T[],
): T | undefined {
  if (text === undefined) return undefined;
  if (!allowed.includes(text as T)) {
    const hint = closest(text, allowed);
    throw new CliError(
      `--${flag} must be one of ${allowed.join(", ")}, got "${text}"${hint ? `; did you mean ${hint}?` : ""}`,
    );
  }
  return text as T;
}

/**
 * Parses and validates `argv`. Throws a {@link CliError} naming the flag for anything wrong,
 * suggesting the closest flag for an unknown one, and for flags that contradict each other. `mpi` is
 * the MPI job this process runs in, or what the environment says about one (read from mpirun's
 * environment by default): a launch makes `mpi` the default transport, and under it the device count
 * is the number of ranks; stale MPI variables are a warning, or refused with `--transport mpi`.
 * `machine` bounds `--devices` by threads (the memory bound needs the model: {@link checkDeviceCount}).
 * Every path (the `--model` and `--schedule` files, `--data` directories, `--checkpoint`,
 * `--resume`, `--trace`, `--report`) is resolved here, once, against `base`: the directory the user
 * ran the command in (`INIT_CWD` under `deno task`; see `cli/paths.ts`).
 *
 * @example
 * ```ts
 * import { parseTrainArgs } from "./args.ts";
 * const args = parseTrainArgs(["--devices", "4", "--batch", "128"]);
 * console.log(args.devices, args.schedule); // 4 overlap
 * ```
 */
export function parseTrainArgs(
  argv: readonly string[],
  mpi: MpiLaunch | MpiDetection | undefined = inspectMpiLaunch(),
  machine: MachineSize = machineSize(),
  base: string = userDirectory(),
): TrainArgs {
  const detection: MpiDetection = mpi === undefined ? {} : "rank" in mpi ? { launch: mpi } : mpi;
  const launch = detection.launch;
  // node:util's own message for an unknown option has no hint, so unknown flags are caught first.
  const given = [...argv];
  for (let i = 0; i < given.length; i++) {
    const arg = given[i];
    if (arg === "--") break;
    if (!arg.startsWith("-") || arg === "-") continue;
    const flag = arg.split("=")[0];
    if (flag === "-h" || FLAG_NAMES.includes(flag)) {
      if (!arg.includes("=") && (STRING_FLAGS as readonly string[]).includes(flag.slice(2))) {
        // A value that starts with a dash (`--lr -1`, `--link -5MB/s`) is the flag's value, to be
        // refused by the flag's own check, unless it is a flag itself (`--devices --batch 8`).
        const next = given[i + 1];
        if (next?.startsWith("-") && next !== "-h" && !FLAG_NAMES.includes(next.split("=")[0])) {
          given.splice(i, 2, `${arg}=${next}`);
        } else {
          i++;
        }
      }
      continue;
    }
    const hint = closest(flag.startsWith("--") ? flag : `-${flag}`, FLAG_NAMES);
    throw new CliError(
      `unknown option ${flag}${hint ? `; did you mean ${hint}?` : ""} (see --help)`,
    );
  }
  let values: Record<string, string | boolean | undefined>, positionals: string[];
  try {
    const options: Record<string, { type: "string" | "boolean"; short?: string }> = {};
    for (const f of STRING_FLAGS) options[f] = { type: "string" };
    for (const f of BOOLEAN_FLAGS) options[f] = { type: "boolean" };
    options.help.short = "h";
    ({ values, positionals } = parseArgs({ args: given, options, strict: true, allowPositionals: true }));
  } catch (error) {
    // e.g. "Option '--devices <value>' argument missing"; one line, like every other message.
    throw new CliError(`${(error as Error).message.replace(/\s*\n\s*/g, " ")} (see --help)`);
  }
  if (positionals.length) {
    throw new CliError(`unexpected argument "${positionals[0]}"; every option is a --flag (see --help)`);
  }
  const s = (name: string) => values[name] as string | undefined;
  for (const flag of STRING_FLAGS) {
    if (s(flag) !== undefined && s(flag)!.trim() === "") {
      throw new CliError(`--${flag} needs a value, got an empty string (see --help)`);
    }
  }
  const transport = oneOf("transport", s("transport"), ["local", "mpi"] as const) ??
    (launch ? "mpi" : "local");
  let devices = integer("devices", s("devices"), 1) ?? DEFAULTS.devices;
  const warnings: string[] = [];
  if (transport === "mpi") {
    if (!launch) {
      throw new CliError(
        "--transport mpi runs one process per device: start it with mpirun, e.g. " +
          `mpirun -np 2 ./node_modules/.bin/deno run -A cli/train.ts --transport mpi (${
            detection.ignored ?? "OMPI_COMM_WORLD_SIZE is not set"
          })`,
      );
    }
    if (s("devices") !== undefined && devices !== launch.size) {
      throw new CliError(
        `--devices ${devices} does not match the ${launch.size} MPI ranks (one device per rank); ` +
          `drop --devices or run mpirun -np ${devices}`,
      );
    }
    if (s("link") !== undefined) {
      throw new CliError(
        "--link emulates a link between devices in one process; under --transport mpi the real network is the link",
      );
    }
    devices = launch.size;
  } else if (detection.ignored) {
    warnings.push(`${detection.ignored}; running as one local process`);
  } else {
    // MPI ranks may be on other hosts; in one process, every device is a thread of this machine.
    const { byThreads } = deviceCapacity({ parameters: 0 }, machine);
    if (devices > byThreads) {
      throw new CliError(
        `--devices ${devices}: at most ${byThreads} devices on this machine (${machine.cores} cores, one thread per device)`,
      );
    }
  }
  if (s("link") !== undefined) {
    try {
      parseLink(s("link")!);
    } catch (error) {
      if (!(error instanceof ValueError)) throw error;
      throw new CliError(`--link ${error.message.slice(`${error.op}: `.length)}`);
    }
  }
  const threads = integer("threads", s("threads"), 1);
  const computeNice = integer("compute-nice", s("compute-nice"), 0);
  if (computeNice !== undefined && computeNice > 19) {
    throw new CliError(`--compute-nice must be at most 19, got ${computeNice}`);
  }
  if (threads !== undefined && transport === "local" && s("backend") === "webgpu") {
    throw new CliError(
      `--threads ${threads} sets CPU devices' kernel threads: it does nothing with --backend webgpu`,
    );
  }
  const wire = oneOf("wire", s("wire"), WIRE_FORMATS) ?? "fp32";
  const dataPlane = oneOf("data-plane", s("data-plane"), ["sockets", "mpi"] as const) ?? "sockets";
  if (s("data-plane") !== undefined && transport === "local") {
    throw new CliError(
      `--data-plane ${dataPlane} chooses how MPI ranks exchange gradients: it needs --transport mpi (under mpirun)`,
    );
  }
  const errorFeedback = values["error-feedback"] === true;
  if (errorFeedback && wire === "fp32") {
    throw new CliError(
      "--error-feedback needs --wire fp16 or bf16: fp32 gradients lose nothing to feed back",
    );
  }
  if (wire !== "fp32" && transport === "local" && s("backend") === "webgpu") {
    throw new CliError(
      `--wire ${wire} is not available with --backend webgpu: its devices average their own gradients on the GPU, unrounded; use --wire fp32 or --backend cpu`,
    );
  }
  const batch = integer("batch", s("batch"), 1) ?? DEFAULTS.batch;
  if (batch % devices !== 0) {
    throw new CliError(
      `--batch ${batch} does not split evenly over ${devices} devices (${batch} % ${devices} = ${
        batch % devices
      }); use a multiple of ${devices}, e.g. ${Math.max(devices, batch - (batch % devices))}`,
    );
  }
  const accumulate = integer("accumulate", s("accumulate"), 1) ?? 1;
  if ((batch / devices) % accumulate !== 0) {
    throw new CliError(
      `--accumulate ${accumulate} does not split the ${
        batch / devices
      } samples per device (--batch ${batch} over ${devices} devices) into equal micro-batches; use a --batch divisible by ${
        devices * accumulate
      }`,
    );
  }
  const steps = integer("steps", s("steps"), 0);
  if (steps === 0) {
    // --steps 0 only prints the model's summary: a flag about training would be silently dropped.
    for (const flag of ["resume", "weights", "trace", "report"]) {
      if (s(flag) !== undefined) {
        throw new CliError(
          `--${flag} does nothing with --steps 0, which prints the model summary and trains nothing`,
        );
      }
    }
  }
  const checkpointEvery = integer("checkpoint-every", s("checkpoint-every"), 1);
  if (checkpointEvery !== undefined && s("checkpoint") === undefined) {
    throw new CliError(`--checkpoint-every ${checkpointEvery} needs --checkpoint PATH to say where to save`);
  }
  const data = s("data") ?? DEFAULTS.data;
  // Refused here, before anything loads, with the grammar (cli/data.ts owns it).
  syntheticShape(data);
  const path = (flag: string) => s(flag) === undefined ? undefined : resolveUserPath(s(flag)!, base);
  // A built-in name is a name, not a file of the user's directory.
  const nameOrPath = (flag: string, names: readonly string[], fallback: string) =>
    s(flag) === undefined ? fallback : names.includes(s(flag)!) ? s(flag)! : path(flag)!;
  if (s("weights") !== undefined && s("resume") !== undefined) {
    throw new CliError("--weights and --resume cannot be combined: the checkpoint already holds the weights");
  }
  if (s("weights") !== undefined && Object.keys(builtinModels).includes(s("model") ?? DEFAULTS.model)) {
    throw new CliError(
      `--weights loads a Caffe .caffemodel into a Caffe net: give --model a .prototxt, not the built-in "${
        s("model") ?? DEFAULTS.model
      }"`,
    );
  }
  const keep = integer("keep", s("keep"), 1);
  if (keep !== undefined && checkpointEvery === undefined) {
    throw new CliError(`--keep ${keep} keeps periodic snapshots: it needs --checkpoint-every N`);
  }
  return {
    model: nameOrPath("model", Object.keys(builtinModels), DEFAULTS.model),
    data: resolveDataPaths(data, (dir) => resolveUserPath(dir, base)),
    backend: oneOf("backend", s("backend"), ["cpu", "webgpu"] as const) ?? DEFAULTS.backend,
    devices,
    transport,
    schedule: nameOrPath("schedule", SCHEDULE_NAMES, DEFAULTS.schedule),
    reduce: oneOf("reduce", s("reduce"), ["master", "allreduce"] as const) ?? DEFAULTS.reduce,
    link: s("link"),
    wire,
    errorFeedback,
    dataPlane,
    epochs: integer("epochs", s("epochs"), 1),
    steps,
    batch,
    accumulate,
    threads,
    computeNice,
    lr: positive("lr", s("lr")) ?? DEFAULTS.lr,
    seed: integer("seed", s("seed"), 0) ?? DEFAULTS.seed,
    checkpoint: path("checkpoint"),
    checkpointEvery,
    keep,
    resume: path("resume"),
    weights: path("weights"),
    trace: path("trace"),
    report: path("report"),
    json: values.json === true,
    help: values.help === true,
    given: Object.keys(values).filter((k) => values[k] !== undefined),
    warnings,
  };
}

/**
 * Refuses, before any device starts, a device count whose memory this machine cannot hold for
 * `network` (see `deviceCapacity` for the estimate), with the limit and what it rests on.
 *
 * @example
 * ```ts ignore
 * import { checkDeviceCount } from "./args.ts";
 * checkDeviceCount(args, network); // throws CliError for --devices 1000
 * ```
 */
export function checkDeviceCount(
  args: Pick<TrainArgs, "devices" | "transport" | "batch" | "accumulate">,
  network: Network,
  machine: MachineSize = machineSize(),
): void {
  if (args.transport !== "local") return;
  const summary = summarize(network, network.inputShape);
  const activationsPerSample = summary.rows.reduce(
    (n, row) => n + row.outputShape.slice(1).reduce((a, b) => a * b, 1),
    0,
  );
  const capacity = deviceCapacity({
    parameters: summary.parameters,
    activationsPerSample,
    samplesPerDevice: args.batch / args.devices / args.accumulate,
  }, machine);
  if (args.devices > capacity.maxDevices) {
    const gib = (bytes: number) => (bytes / 2 ** 30).toFixed(1);
    throw new CliError(
      `--devices ${args.devices}: at most ${capacity.maxDevices} devices for this model on this machine ` +
        `(${gib(machine.memoryBytes)} GiB memory, ${machine.cores} cores; about ${
          (capacity.bytesPerDevice / 2 ** 20).toFixed(0)
        } MiB per device)`,
    );
  }
}
