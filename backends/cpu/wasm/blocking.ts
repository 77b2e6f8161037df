/**
 * This machine's GEMM cache blocks (MC, NC; see `gemm.ts`), resolved once per process, first
 * found first:
 *
 * 1. `TANDEM_GEMM_BLOCKS=mc,nc`, `mc,nc,inPlaceRows` or `mc,nc,inPlaceRows,fewRowsNc` in the
 *    environment (experiments, A/B runs);
 * 2. the blocks `deno task tune` measured on this machine, cached on disk and keyed by the CPU
 *    model and its cache sizes ({@link tuningFile});
 * 3. blocks derived from the cache sizes the OS reports (`/sys/devices/system/cpu/cpu0/cache/`
 *    on Linux, else the one size `/proc/cpuinfo` gives, as on virtual machines without that
 *    directory; {@link blocksForCaches});
 * 4. {@link DEFAULT_GEMM_BLOCKS}.
 *
 * The in-place rows of a fully connected layer's forward product (`GemmBlocks.inPlaceRows`) and
 * the NC of products with few rows (`GemmBlocks.fewRowsNc`) come from the first two only, else
 * {@link DEFAULT_IN_PLACE_ROWS} and NC: caches do not tell which tile a core runs fastest, nor how
 * often a block of B pays for repacking A. MC, NC and those never change a bit of any result (only
 * the depth block KC does, and it is fixed), so machines that choose differently still agree bit
 * for bit. Without read or env permission the sources that need it are skipped, never prompted
 * for. A variable or tuning file that cannot be used is skipped too, with a one-line warning
 * ({@link MachineBlocks.warning}): a stale cache must not stop a program that imports Tandem.
 *
 * @module
 */

import {
  DEFAULT_GEMM_BLOCKS,
  DEFAULT_IN_PLACE_ROWS,
  GEMM_BLOCK_LIMITS,
  GEMM_DEPTH,
  GEMM_ROW_QUANTUM,
  GEMM_TILE,
  type GemmBlocks,
  gemmBlocksProblem,
} from "./gemm.ts";

/**
 * A tuning file or `TANDEM_GEMM_BLOCKS` that cannot be used: which file or variable, what it
 * held, what was expected.
 *
 * @example
 * ```ts
 * import { GemmBlocksError } from "./blocking.ts";
 * const e = new GemmBlocksError("TANDEM_GEMM_BLOCKS", "\"96\" is not mc,nc");
 * console.log(e.message); // TANDEM_GEMM_BLOCKS: "96" is not mc,nc
 * ```
 */
export class GemmBlocksError extends Error {
  /** `source`: the file or variable; `detail`: what is wrong with it. */
  constructor(readonly source: string, readonly detail: string) {
    super(`${source}: ${detail}`);
    this.name = "GemmBlocksError";
  }
}

/** Data-cache sizes in bytes, and how many logical CPUs share the last level. */
export interface CacheSizes {
  /** L1 data cache. */
  l1d?: number;
  /** L2 (per core on current x86). */
  l2?: number;
  /** The last level. */
  l3?: number;
  /** Logical CPUs sharing the L3 (1 when unknown). */
  l3Sharers?: number;
}

/** Where this process's blocks came from. */
export type BlocksSource = "environment" | "tuned" | "caches" | "default";

const SOURCE_LABELS: Record<BlocksSource, string> = {
  environment: "TANDEM_GEMM_BLOCKS",
  tuned: "the blocks `deno task tune` measured",
  caches: "blocks from the cache sizes",
  default: "the default blocks: no cache sizes reported",
};

/** This machine's blocks, where they came from and the key a tuning is filed under. */
export interface MachineBlocks {
  /** MC and NC. */
  blocks: GemmBlocks;
  /** Where they came from. */
  source: BlocksSource;
  /** The CPU model and cache sizes, e.g. "AMD EPYC · L1d 32K · L2 512K · L3 32768K/2". */
  machine: string;
  /** The caches the OS reported (empty where it reports none). */
  caches: CacheSizes;
  /** Why a source before `source` was skipped (a bad variable or tuning file), if one was. */
  warning?: string;
}

/** Share of L2 an MC×KC block of A takes: 3/8, the 96 rows of a 256 KiB L2 the kernels were tuned on. */
const L2_SHARE = 3 / 8;
/** Share of a thread's part of L3 a KC×NC block of B takes (the rest: C, A refills, other data). */
const L3_SHARE = 1 / 4;

const canRead = (path: string) => permitted({ name: "read", path });
const canEnv = (variable: string) => permitted({ name: "env", variable });

function permitted(descriptor: { name: "read"; path: string } | { name: "env"; variable: string }): boolean {
  const deno = (globalThis as { Deno?: typeof Deno }).Deno;
  try {
    return deno?.permissions?.querySync?.(descriptor).state === "granted";
  } catch {
    return false;
  }
}

function readText(path: string): string | undefined {
  if (!canRead(path)) return undefined;
  try {
    return Deno.readTextFileSync(path);
  } catch {
    return undefined;
  }
}

/** "32K", "1M", "1024" → bytes; undefined when unreadable. */
function parseSize(text: string | undefined): number | undefined {
  const match = text?.trim().match(/^(\d+)\s*([KMG]?)$/i);
  if (!match) return undefined;
  const scale = { "": 1, K: 1 << 10, M: 1 << 20, G: 1 << 30 }[match[2].toUpperCase() as "" | "K" | "M" | "G"];
  return Number(match[1]) * scale;
}

/** "0-3,8" → 5 CPUs. */
function countCpus(list: string | undefined): number {
  let count = 0;
  for (const part of list?.trim().split(",") ?? []) {
    const [a, b] = part.split("-").map(Number);
    if (Number.isInteger(a)) count += Number.isInteger(b) ? b - a + 1 : 1;
  }
  return Math.max(1, count);
}

/**
 * The data caches of the first CPU as Linux reports them under `root`, or where that directory
 * reports none (some virtual machines lack it), the one size in `cpuinfo`
 * ({@link cpuinfoCacheSizes}); empty where nothing is reported (another OS, no read permission).
 *
 * @example
 * ```ts
 * import { readCacheSizes } from "./blocking.ts";
 * console.log(readCacheSizes()); // e.g. { l1d: 32768, l2: 524288, l3: 33554432, l3Sharers: 2 }
 * ```
 */
export function readCacheSizes(
  root = "/sys/devices/system/cpu/cpu0/cache",
  cpuinfo = "/proc/cpuinfo",
): CacheSizes {
  const caches: CacheSizes = {};
  for (let index = 0; index < 8; index++) {
    const dir = `${root}/index${index}`;
    const level = readText(`${dir}/level`)?.trim(), type = readText(`${dir}/type`)?.trim();
    if (level === undefined || type === undefined) continue;
    const size = parseSize(readText(`${dir}/size`));
    if (size === undefined || type === "Instruction") continue;
    if (level === "1") caches.l1d = size;
    else if (level === "2") caches.l2 = size;
    else if (level === "3") {
      caches.l3 = size;
      caches.l3Sharers = countCpus(readText(`${dir}/shared_cpu_list`));
    }
  }
  return Object.keys(caches).length > 0 ? caches : cpuinfoCacheSizes(readText(cpuinfo));
}

/** The first `name : value` line's value in the text of `/proc/cpuinfo` (the first CPU's). */
function cpuinfoField(text: string | undefined, name: string): string | undefined {
  return text?.match(new RegExp(`^${name}\\s*:\\s*(.+)$`, "m"))?.[1].trim();
}

/**
 * The cache size in the text of Linux's `/proc/cpuinfo` ("cache size : 1024 KB"), which x86 Linux
 * fills from CPUID: on AMD and Hygon CPUs the L2 of one core, on Intel the last level (the L3,
 * shared by the package's `siblings`). Other vendors' (and other architectures', which give none)
 * is not used: empty.
 *
 * @example
 * ```ts
 * import { cpuinfoCacheSizes } from "./blocking.ts";
 * cpuinfoCacheSizes("vendor_id\t: AuthenticAMD\ncache size\t: 1024 KB\n"); // { l2: 1048576 }
 * ```
 */
export function cpuinfoCacheSizes(text: string | undefined): CacheSizes {
  const field = (name: string) => cpuinfoField(text, name);
  const size = parseSize(field("cache size")?.replace(/\s*B$/i, ""));
  if (size === undefined) return {};
  const vendor = field("vendor_id");
  if (vendor === "AuthenticAMD" || vendor === "HygonGenuine") return { l2: size };
  if (vendor === "GenuineIntel") return { l3: size, l3Sharers: Math.max(1, Number(field("siblings")) || 1) };
  return {};
}

function roundDown(value: number, quantum: number, [low, high]: readonly [number, number]): number {
  return Math.min(high, Math.max(low, Math.floor(value / quantum) * quantum));
}

/**
 * Blocks for these caches: MC so an MC×KC block of A fills 3/8 of L2 (96 rows on 256 KiB, 192 on
 * 512 KiB), NC so a KC×NC block of B fills a quarter of one thread's share of L3; a size the OS
 * does not report keeps its default.
 *
 * @example
 * ```ts
 * import { blocksForCaches } from "./blocking.ts";
 * blocksForCaches({ l2: 512 << 10, l3: 32 << 20, l3Sharers: 8 }); // { mc: 192, nc: 1024 }
 * ```
 */
export function blocksForCaches(caches: CacheSizes): GemmBlocks {
  const rowBytes = 4 * GEMM_DEPTH;
  const mc = caches.l2
    ? roundDown((L2_SHARE * caches.l2) / rowBytes, GEMM_ROW_QUANTUM, GEMM_BLOCK_LIMITS.mc)
    : DEFAULT_GEMM_BLOCKS.mc;
  const nc = caches.l3
    ? roundDown(
      (L3_SHARE * caches.l3) / (caches.l3Sharers ?? 1) / rowBytes,
      GEMM_TILE.nr,
      GEMM_BLOCK_LIMITS.nc,
    )
    : DEFAULT_GEMM_BLOCKS.nc;
  return { mc, nc };
}

function sizeLabel(bytes: number | undefined): string {
  return bytes === undefined ? "?" : `${Math.round(bytes / 1024)}K`;
}

/**
 * The key a tuning is filed under: the CPU model (`/proc/cpuinfo` on Linux, else the platform)
 * and its cache sizes, so virtual machines that hide the model still tell their hosts apart.
 *
 * @example
 * ```ts
 * import { machineKey } from "./blocking.ts";
 * machineKey({ l1d: 32768, l2: 524288, l3: 33554432, l3Sharers: 2 }, "AMD EPYC");
 * // "AMD EPYC · L1d 32K · L2 512K · L3 32768K/2"
 * ```
 */
export function machineKey(caches: CacheSizes, model = cpuModel()): string {
  const l3 = caches.l3 === undefined ? "?" : `${sizeLabel(caches.l3)}/${caches.l3Sharers ?? 1}`;
  return `${model} · L1d ${sizeLabel(caches.l1d)} · L2 ${sizeLabel(caches.l2)} · L3 ${l3}`;
}

/**
 * The CPU model (`/proc/cpuinfo` on Linux), else the platform, e.g. "AMD EPYC" or "darwin aarch64".
 *
 * @example
 * ```ts
 * import { cpuModel } from "./blocking.ts";
 * console.log(cpuModel());
 * ```
 */
export function cpuModel(): string {
  const name = cpuinfoField(readText("/proc/cpuinfo"), "model name");
  if (name) return name;
  const deno = (globalThis as { Deno?: typeof Deno }).Deno;
  return deno ? `${deno.build.os} ${deno.build.arch}` : "unknown CPU";
}

function env(variable: string): string | undefined {
  return canEnv(variable) ? Deno.env.get(variable) : undefined;
}

/**
 * Where tunings are cached: `$TANDEM_CACHE_DIR`, else `$XDG_CACHE_HOME/tandem`, else
 * `$HOME/.cache/tandem`, as `gemm-blocks.json`; undefined without any of them.
 *
 * @example
 * ```ts
 * import { tuningFile } from "./blocking.ts";
 * console.log(tuningFile()); // e.g. "/root/.cache/tandem/gemm-blocks.json"
 * ```
 */
export function tuningFile(): string | undefined {
  const dir = env("TANDEM_CACHE_DIR") ??
    (env("XDG_CACHE_HOME") ? `${env("XDG_CACHE_HOME")}/tandem` : undefined) ??
    (env("HOME") ? `${env("HOME")}/.cache/tandem` : undefined);
  return dir === undefined ? undefined : `${dir}/gemm-blocks.json`;
}

/** One machine's entry in a tuning file. */
export interface TunedBlocks extends GemmBlocks {
  /** The 1-thread GFLOP/s the tuner measured with these blocks (geometric mean over its products). */
  gflops: number;
  /** The same with the blocks the machine would use untuned. */
  untunedGflops: number;
  /** ISO time of the tuning. */
  tuned: string;
}

interface TuningFileContents {
  version: 1;
  machines: Record<string, TunedBlocks>;
}

function readTuningFile(file: string): TuningFileContents | undefined {
  if (!canRead(file)) return undefined;
  let text: string;
  try {
    text = Deno.readTextFileSync(file);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return undefined;
    throw new GemmBlocksError(file, `cannot be read (${(error as Error).message})`);
  }
  let contents: unknown;
  try {
    contents = JSON.parse(text);
  } catch {
    throw new GemmBlocksError(
      file,
      "is not JSON; expected a tuning written by `deno task tune` (delete it to retune)",
    );
  }
  const c = contents as Partial<TuningFileContents>;
  if (c?.version !== 1 || typeof c.machines !== "object" || c.machines === null) {
    throw new GemmBlocksError(
      file,
      'expected { "version": 1, "machines": { … } } as `deno task tune` writes it',
    );
  }
  for (const [key, entry] of Object.entries(c.machines)) {
    const problem = gemmBlocksProblem(entry ?? {});
    if (problem) throw new GemmBlocksError(file, `machine "${key}": ${problem}`);
  }
  return c as TuningFileContents;
}

/**
 * The blocks tuned for `machine` in `file`, or undefined (no file, no entry for this machine).
 * Throws a {@link GemmBlocksError} naming the file when it is not a tuning file.
 *
 * @example
 * ```ts
 * import { readTunedBlocks } from "./blocking.ts";
 * readTunedBlocks("/tmp/none.json", "AMD EPYC · L1d 32K · L2 512K · L3 32768K/2"); // undefined
 * ```
 */
export function readTunedBlocks(file: string, machine: string): TunedBlocks | undefined {
  return readTuningFile(file)?.machines[machine];
}

/**
 * Files `entry` for `machine` in `file`, keeping other machines' entries; the file is replaced
 * whole (written beside it, then renamed), so a reader never sees half of one.
 *
 * @example
 * ```ts
 * import { writeTunedBlocks } from "./blocking.ts";
 * // writeTunedBlocks(file, machineKey(readCacheSizes()), { mc: 192, nc: 2048, gflops: 34, untunedGflops: 33, tuned: new Date().toISOString() });
 * ```
 */
export function writeTunedBlocks(file: string, machine: string, entry: TunedBlocks): void {
  const problem = gemmBlocksProblem(entry);
  if (problem) throw new GemmBlocksError(file, `refusing to write ${problem}`);
  const contents: TuningFileContents = readTuningFile(file) ?? { version: 1, machines: {} };
  contents.machines[machine] = entry;
  Deno.mkdirSync(file.slice(0, file.lastIndexOf("/")) || ".", { recursive: true });
  // Written beside it and renamed, as engine/io's writeFileAtomic does: the backends sit below the
  // engine and cannot import it, and a tuning file is small enough to write synchronously.
  const temporary = `${file}.${Deno.pid}.tmp`;
  Deno.writeTextFileSync(temporary, JSON.stringify(contents, null, 2) + "\n");
  Deno.renameSync(temporary, file);
}

/**
 * `"mc,nc"`, `"mc,nc,inPlaceRows"` or `"mc,nc,inPlaceRows,fewRowsNc"` as blocks, or a
 * {@link GemmBlocksError} naming the variable.
 */
function parseBlocksVariable(variable: string, text: string): GemmBlocks {
  const parts = text.split(",").map((part) => Number(part.trim()));
  if (parts.length < 2 || parts.length > 4 || parts.some((part) => !Number.isFinite(part))) {
    throw new GemmBlocksError(
      variable,
      `${JSON.stringify(text)} is not mc,nc, mc,nc,inPlaceRows or mc,nc,inPlaceRows,fewRowsNc ` +
        "(e.g. 96,2048 or 96,2048,6 or 96,2048,6,1024)",
    );
  }
  const [mc, nc, inPlaceRows, fewRowsNc] = parts;
  const blocks: GemmBlocks = {
    mc,
    nc,
    ...(inPlaceRows === undefined ? {} : { inPlaceRows }),
    ...(fewRowsNc === undefined ? {} : { fewRowsNc }),
  };
  const problem = gemmBlocksProblem(blocks);
  if (problem) throw new GemmBlocksError(variable, problem);
  return blocks;
}

/** Where {@link resolveMachineBlocks} looks (tests point it elsewhere). */
export interface BlocksLookup {
  /** `TANDEM_GEMM_BLOCKS`'s value, if set. */
  override?: string;
  /** The tuning file, if any. */
  file?: string;
  /** The caches the OS reports. */
  caches: CacheSizes;
  /** The CPU model (default: this machine's). */
  model?: string;
}

/**
 * The blocks a lookup resolves to, by the order in the module comment.
 *
 * @example
 * ```ts
 * import { resolveMachineBlocks } from "./blocking.ts";
 * resolveMachineBlocks({ caches: { l2: 256 << 10 } }).blocks; // { mc: 96, nc: 2048 }
 * ```
 */
export function resolveMachineBlocks(lookup: BlocksLookup): MachineBlocks {
  const { caches } = lookup;
  const machine = machineKey(caches, lookup.model);
  const warnings: string[] = [];
  const found = (blocks: GemmBlocks, source: BlocksSource): MachineBlocks => ({
    blocks,
    source,
    machine,
    caches,
    ...(warnings.length ? { warning: `${warnings.join("; ")}; using ${SOURCE_LABELS[source]} instead` } : {}),
  });
  const attempt = <T>(read: () => T): T | undefined => {
    try {
      return read();
    } catch (error) {
      if (!(error instanceof GemmBlocksError)) throw error;
      warnings.push(error.message);
      return undefined;
    }
  };
  const override = lookup.override === undefined
    ? undefined
    : attempt(() => parseBlocksVariable("TANDEM_GEMM_BLOCKS", lookup.override!));
  if (override) return found(override, "environment");
  const file = lookup.file;
  const tuned = file === undefined ? undefined : attempt(() => readTunedBlocks(file, machine));
  if (tuned) {
    const { mc, nc, inPlaceRows, fewRowsNc } = tuned;
    return found({
      mc,
      nc,
      ...(inPlaceRows === undefined ? {} : { inPlaceRows }),
      ...(fewRowsNc === undefined ? {} : { fewRowsNc }),
    }, "tuned");
  }
  if (caches.l2 !== undefined || caches.l3 !== undefined) return found(blocksForCaches(caches), "caches");
  return found({ ...DEFAULT_GEMM_BLOCKS }, "default");
}

let resolved: MachineBlocks | undefined;
let warned = false;

/**
 * This machine's GEMM blocks, resolved on first call and kept for the process; a
 * {@link MachineBlocks.warning} is printed once, to stderr.
 *
 * @example
 * ```ts
 * import { machineGemmBlocks } from "./blocking.ts";
 * const { blocks, source } = machineGemmBlocks();
 * console.log(`MC ${blocks.mc}, NC ${blocks.nc} (${source})`);
 * ```
 */
export function machineGemmBlocks(): MachineBlocks {
  resolved ??= resolveMachineBlocks({
    override: env("TANDEM_GEMM_BLOCKS"),
    file: tuningFile(),
    caches: readCacheSizes(),
  });
  if (resolved.warning && !warned) console.warn(`tandem: ${resolved.warning}`);
  warned = true;
  return resolved;
}

/**
 * One line for reports: "MC 192, NC 4096 (1024 for few rows), KC 256, in-place rows 6 (blocks from
 * the cache sizes; AMD EPYC · L1d 32K · …)"; in-place rows 0 means W packed
 * (`GemmBlocks.inPlaceRows`); the few rows' NC is named only where it differs
 * (`GemmBlocks.fewRowsNc`).
 *
 * @example
 * ```ts
 * import { describeMachineBlocks, machineGemmBlocks } from "./blocking.ts";
 * console.log(describeMachineBlocks(machineGemmBlocks()));
 * ```
 */
export function describeMachineBlocks(m: MachineBlocks): string {
  const rows = m.blocks.inPlaceRows ?? DEFAULT_IN_PLACE_ROWS, few = m.blocks.fewRowsNc ?? m.blocks.nc;
  const nc = few === m.blocks.nc ? `${m.blocks.nc}` : `${m.blocks.nc} (${few} for few rows)`;
  return `MC ${m.blocks.mc}, NC ${nc}, KC ${GEMM_DEPTH}, in-place rows ${rows} (${
    SOURCE_LABELS[m.source]
  }; ${m.machine})`;
}
