/**
 * PyTorch as a benchmark peer (never a dependency of the library): runs `bench/peers/pytorch_peer.py`
 * under Debian's `/usr/bin/python3` (`python3-torch` 1.13, CPU, gloo, OpenBLAS) and reads the JSON
 * line its rank 0 prints. One process, or DistributedDataParallel over gloo with 2 processes on
 * loopback; {@link pytorchCommand} gives the argv for launching it elsewhere (e.g. under `mpirun`,
 * where each rank reads its rank and world size from Open MPI's environment).
 *
 * The peer builds Tandem's nets layer for layer (`alexnet-like`: 1×28×28, 10 classes; `cifar-quick`:
 * Caffe's cifar10_quick, 3×32×32, 10 classes; `alexnet`: 3×227×227, 1000 classes) and checks their
 * parameter counts (and cifar10_quick's ceil-mode pooled sizes 16, 8, 4) against Tandem's.
 *
 * @module
 */

/** The interpreter with Debian's torch: `python3` on PATH may be another one without it. */
export const PYTHON = "/usr/bin/python3";

/** Path of the peer script. */
export const PEER_SCRIPT: string = new URL("./pytorch_peer.py", import.meta.url).pathname;

const INSTALL_HINT = "apt-get install python3-torch libopenblas0-pthread";

/** The nets the peer builds, by Tandem's zoo names. */
export type PytorchNet = "alexnet-like" | "cifar-quick" | "alexnet";

/** What the peer measures and how. */
export interface PytorchOptions {
  /** Which of Tandem's nets (default `alexnet-like`). */
  net?: PytorchNet;
  /** Global batch, split evenly over the processes (default 64). */
  batch?: number;
  /** Timed steps (default 10). */
  steps?: number;
  /** Untimed steps first (default 3). */
  warmup?: number;
  /**
   * Intra-op threads per process, OpenMP and OpenBLAS alike (default: 2 for one process,
   * 1 per process for DDP).
   */
  threads?: number;
  /** OpenBLAS threads per process, when they should differ from `threads`. */
  blasThreads?: number;
  /** Processes: 1, or 2 for DDP over gloo on loopback (default 1); {@link pytorchCommand} takes any. */
  world?: number;
  /** Seconds the whole run may take before its processes are killed (default 600). */
  timeoutSeconds?: number;
  /** Seed of the weights and the synthetic batch (default 0). */
  seed?: number;
}

/** Options of {@link pytorchCommand}: a run's options plus where it meets its peers. */
export interface PytorchCommandOptions extends PytorchOptions {
  /** This process's rank; omit under `mpirun` (read from `OMPI_COMM_WORLD_RANK`). */
  rank?: number;
  /**
   * Rendezvous `ADDR:PORT` of rank 0 (needed when more than one process). Under `mpirun` also omit
   * `world` and it is read from `OMPI_COMM_WORLD_SIZE`.
   */
  master?: string;
}

/** The JSON line of rank 0. */
export interface PytorchResult {
  /** Always `"pytorch"`. */
  peer: "pytorch";
  /** `torch.__version__`. */
  version: string;
  /** The net timed. */
  net: PytorchNet;
  /** Processes. */
  world: number;
  /** Global batch. */
  batch: number;
  /** Samples per process. */
  perRankBatch: number;
  /** Intra-op threads per process. */
  threads: number;
  /** OpenBLAS threads per process. */
  blasThreads: number;
  /** Parameter count (equal to Tandem's, checked by the peer). */
  parameters: number;
  /** Fastest timed step, ms. */
  bestMs: number;
  /** Median timed step (the upper one for even counts, as `bench/report.ts`), ms. */
  medianMs: number;
  /** Global batch / median step. */
  imagesPerSecond: number;
  /** Every timed step, ms (rank 0's, each after a barrier under DDP). */
  stepsMs: number[];
  /** Untimed steps run first. */
  warmup: number;
  /** Peak resident memory of rank 0, MB. */
  maxRssMB: number;
  /** BLAS library, the OpenBLAS core it chose, thread counts, convolution library. */
  blas: string;
}

let availability: Promise<string | undefined> | undefined;

/** The Debian packages the peer needs: torch, and the pthreads OpenBLAS beside it. */
const PACKAGES = ["python3-torch", "libopenblas0-pthread"] as const;

/**
 * Installs whichever of {@link PACKAGES} is missing with apt (root only), printing one line first;
 * resolves with why that could not be done, or `undefined` when nothing was missing or it worked.
 * OpenBLAS counts as missing too: without it Debian's torch falls back to the reference BLAS,
 * which ran its FC layers 2.3× slower here, an unfair peer.
 */
async function installMissing(): Promise<string | undefined> {
  const missing: string[] = [];
  for (const name of PACKAGES) {
    const status = await run("dpkg-query", ["-W", "-f=${Status}", name]);
    if (!status?.ok || !status.stdout.includes("install ok installed")) missing.push(name);
  }
  if (missing.length === 0) return undefined;
  if (Deno.uid?.() !== 0) {
    return `${missing.join(" and ")} not installed, and not root to install (${INSTALL_HINT})`;
  }
  console.log(`PyTorch peer: installing ${missing.join(" ")} with apt-get …`);
  const env = { DEBIAN_FRONTEND: "noninteractive" };
  const update = await run("apt-get", ["update", "-qq"], env);
  const install = await run("apt-get", ["install", "-y", "-qq", ...missing], env);
  if (install?.ok) return undefined;
  const why = install ? lastLine(install.stderr) || "exit status not 0" : "apt-get not found";
  return `apt-get install ${missing.join(" ")} failed: ${why}${
    update?.ok ? "" : " (apt-get update failed too)"
  }`;
}

/** Runs a command to its end; `undefined` when it does not exist. */
async function run(
  command: string,
  args: string[],
  env?: Record<string, string>,
): Promise<{ ok: boolean; stdout: string; stderr: string } | undefined> {
  try {
    const out = await new Deno.Command(command, {
      args,
      env,
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    })
      .output();
    const text = new TextDecoder();
    return { ok: out.success, stdout: text.decode(out.stdout), stderr: text.decode(out.stderr) };
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return undefined;
    throw error;
  }
}

/**
 * Why the PyTorch peer cannot run here, or `undefined` when it can (`/usr/bin/python3` imports
 * torch and torch has gloo). Installs `python3-torch` and `libopenblas0-pthread` with apt first
 * where either is missing and this process is root. Checked once per process.
 *
 * @example
 * ```ts
 * import { pytorchAvailable } from "./pytorch.ts";
 * const why = await pytorchAvailable();
 * console.log(why ?? "PyTorch peer ready");
 * ```
 */
export function pytorchAvailable(): Promise<string | undefined> {
  availability ??= (async () => {
    const notInstalled = await installMissing();
    let output: Deno.CommandOutput;
    try {
      output = await new Deno.Command(PYTHON, {
        args: [
          "-c",
          "import torch, torch.distributed as d; print(torch.__version__, d.is_available() and d.is_gloo_available())",
        ],
        stdin: "null",
        stdout: "piped",
        stderr: "piped",
      }).output();
    } catch (error) {
      if (error instanceof Deno.errors.NotFound) {
        return notInstalled ?? `${PYTHON} not found (${INSTALL_HINT})`;
      }
      return `${PYTHON} did not start: ${(error as Error).message}`;
    }
    if (!output.success) {
      const stderr = new TextDecoder().decode(output.stderr);
      if (/No module named '?torch/.test(stderr)) {
        return notInstalled ?? `python3-torch is not installed (${INSTALL_HINT})`;
      }
      return `${PYTHON} cannot import torch: ${lastLine(stderr) || `exit ${output.code}`}`;
    }
    const [version, gloo] = new TextDecoder().decode(output.stdout).trim().split(/\s+/);
    if (gloo !== "True") return `torch ${version} has no gloo backend (torch.distributed)`;
    // torch imports, but without the pthreads OpenBLAS it would be timed on the reference BLAS.
    return notInstalled;
  })();
  return availability;
}

function lastLine(text: string): string {
  return text.trim().split("\n").filter((l) => l.trim()).at(-1)?.trim() ?? "";
}

/**
 * The argv that runs the peer with `options` (`[python, script, flags…]`), for a caller that
 * launches it itself, e.g. one rank per host under `mpirun` (leave out `world` and `rank` there:
 * the peer reads Open MPI's environment; give `master` as rank 0's reachable `ADDR:PORT`).
 *
 * @example
 * ```ts
 * import { pytorchCommand } from "./pytorch.ts";
 * const argv = pytorchCommand({ net: "alexnet-like", batch: 64, threads: 1, master: "10.0.0.1:29500" });
 * // new Deno.Command("mpirun", { args: ["-np", "2", "--host", "a,b", ...argv] })
 * ```
 */
export function pytorchCommand(options: PytorchCommandOptions = {}): string[] {
  const args = [PYTHON, PEER_SCRIPT, "--net", options.net ?? "alexnet-like"];
  const flag = (name: string, value: number | string | undefined) => {
    if (value !== undefined) args.push(`--${name}`, String(value));
  };
  flag("batch", options.batch ?? 64);
  flag("steps", options.steps ?? 10);
  flag("warmup", options.warmup ?? 3);
  flag("threads", options.threads ?? ((options.world ?? 1) > 1 ? 1 : 2));
  flag("blas-threads", options.blasThreads);
  flag("world", options.world);
  flag("rank", options.rank);
  flag("master", options.master);
  flag("seed", options.seed);
  // Collectives give up a little before the caller's own timeout, so the error says why.
  if (options.timeoutSeconds !== undefined) flag("timeout", Math.max(10, options.timeoutSeconds - 5));
  return args;
}

/** A TCP port free on loopback right now (the peer's rank 0 binds it a moment later). */
function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  return port;
}

/**
 * Runs the peer: one process (`world` 1, default 2 threads), or DDP over gloo with 2 processes on
 * loopback (`world` 2, default 1 thread each), and returns rank 0's figures. Throws with the peer's
 * one-line error when a process fails, and kills every process after `timeoutSeconds`.
 *
 * @example
 * ```ts
 * import { runPytorch } from "./pytorch.ts";
 * const one = await runPytorch({ net: "alexnet-like", batch: 64, threads: 2 });
 * const ddp = await runPytorch({ net: "alexnet-like", batch: 64, world: 2 });
 * console.log(one.medianMs, ddp.medianMs);
 * ```
 */
export async function runPytorch(options: PytorchOptions = {}): Promise<PytorchResult> {
  const why = await pytorchAvailable();
  if (why) throw new Error(`PyTorch peer unavailable: ${why}`);
  const world = options.world ?? 1;
  if (world !== 1 && world !== 2) {
    throw new Error(`runPytorch: world must be 1 or 2 (use pytorchCommand for more), got ${world}`);
  }
  const timeoutSeconds = options.timeoutSeconds ?? 600;
  const master = world > 1 ? `127.0.0.1:${freePort()}` : undefined;
  const children = Array.from({ length: world }, (_, rank) => {
    const [command, ...args] = pytorchCommand({
      ...options,
      timeoutSeconds,
      ...(world > 1 ? { world, rank, master } : {}),
    });
    return new Deno.Command(command, { args, stdin: "null", stdout: "piped", stderr: "piped" }).spawn();
  });
  let timedOut = false;
  const killAll = () => {
    for (const child of children) {
      try {
        child.kill("SIGKILL");
      } catch {
        // already exited
      }
    }
  };
  const timer = setTimeout(() => {
    timedOut = true;
    killAll();
  }, timeoutSeconds * 1000);
  try {
    // When one rank fails the others would wait for it in a collective: stop them at once.
    const outputs = await Promise.all(children.map(async (child) => {
      const output = await child.output();
      if (!output.success) killAll();
      return output;
    }));
    if (timedOut) throw new Error(`PyTorch peer timed out after ${timeoutSeconds} s`);
    const failed = outputs.map((o, rank) => ({ o, rank })).filter(({ o }) => !o.success);
    if (failed.length) {
      // Prefer a rank that failed on its own over one killed because another failed.
      const first = failed.find(({ o }) => o.signal !== "SIGKILL") ?? failed[0];
      const message = lastLine(new TextDecoder().decode(first.o.stderr)) ||
        `exit ${first.o.code}${first.o.signal ? ` (${first.o.signal})` : ""}`;
      throw new Error(`PyTorch peer rank ${first.rank} failed: ${message}`);
    }
    const line = lastLine(new TextDecoder().decode(outputs[0].stdout));
    try {
      return JSON.parse(line) as PytorchResult;
    } catch {
      throw new Error(`PyTorch peer printed no JSON line: ${JSON.stringify(line.slice(0, 200))}`);
    }
  } finally {
    clearTimeout(timer);
  }
}
