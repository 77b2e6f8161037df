/**
 * The stamp every bench report carries at its top, and the check a report makes before it embeds
 * another: one mechanism, used by every generator (`bench/report.ts`, `bench/schedule_report.ts`,
 * `bench/alexnet_scaling.ts`, `bench/mpi_report.ts`, `bench/rollback_report.ts`,
 * `bench/cluster/report.ts`, `bench/gpu/gpu_report.ts`).
 *
 * A stamp records when the figures were measured (date), on which code (the commit, whether the
 * measured sources had uncommitted changes, and a digest of those sources' content), on which
 * machine (CPU model, cores, OS, Deno) and that machine's measured 128-bit WebAssembly peak
 * (`backends/cpu/wasm/peak.ts`, the ceiling of every WebAssembly kernel, so figures from different
 * machines can be compared). It is written twice: a machine-readable HTML comment
 * (`<!-- tandem-bench-stamp {…} -->`, invisible when rendered) and the same facts as one sentence.
 *
 * A report refuses to embed a file older than the code it would describe: {@link checkEmbeddable}
 * reads the file's stamp and refuses, in one line naming the file, its date and commit and why,
 * when the stamp is missing or malformed, or when the sources that file measures are no longer the
 * content it measured (the digest differs: a commit since, listed from `git log`, or uncommitted
 * changes). Comparing content rather than only commits lets a bench be run on uncommitted code and
 * committed together with its results.
 *
 * @module
 */

import { describeWasmPeak, measureWasmPeak } from "../backends/cpu/wasm/peak.ts";
import { cpuModel } from "../backends/cpu/wasm/blocking.ts";

/** The code every bench measures; each report adds its own generator files. */
export const MEASURED_CODE: readonly string[] = ["backends", "engine", "schedule"];

/** The repository root (this file is `bench/stamp.ts`). */
export const REPOSITORY_ROOT: string = new URL("..", import.meta.url).pathname.replace(/\/$/, "");

/** The measured peak, as {@link measureWasmPeak} returns it (shape left out). */
export interface StampPeak {
  /** GFLOP/s of one thread (to 0.01). */
  perCore: number;
  /** GFLOP/s of `threads` threads at once (to 0.01). */
  allCores: number;
  /** Threads of `allCores`. */
  threads: number;
  /** `f32x4.relaxed_madd` (true) or `f32x4.mul` + `f32x4.add` (false). */
  fma: boolean;
  /** describeWasmPeak's line. */
  line: string;
}

/** What a bench report's top says about where and on what its figures were measured. */
export interface BenchStamp {
  /** Format version of the stamp. */
  version: 1;
  /** The report, relative to the repository root, e.g. `bench/SCHEDULE.md`. */
  file: string;
  /** The command that writes it, e.g. `npx deno task bench:schedule`. */
  command: string;
  /** When the measurement started, ISO 8601 UTC to the second. */
  date: string;
  /** HEAD when measured (40 hex digits), or `unknown` outside a git checkout. */
  commit: string;
  /** Whether the measured sources had uncommitted changes against `commit`. */
  dirty: boolean;
  /** The code the figures measure: repository-relative folders and files. */
  sources: string[];
  /** SHA-256 (hex) of those sources' content as measured ({@link sourcesDigest}). */
  digest: string;
  /**
   * The machine; `vectors` is its widest native vector extension ({@link nativeVectors}), absent in
   * stamps written before it was recorded.
   */
  machine: { cpu: string; cores: number; os: string; deno: string; v8: string; vectors?: string };
  /** This machine's 128-bit WebAssembly peak, or why it was not measured. */
  peak: StampPeak | { error: string };
}

/** The CPU model, as the GEMM tuning keys it (`backends/cpu/wasm/blocking.ts`). */
export { cpuModel };

/**
 * The widest native vector extension the CPU reports (Linux `/proc/cpuinfo` flags), e.g.
 * `AVX-512 (512-bit)`, or `undefined` where the flags cannot be read. Native peers (PyTorch's oneDNN,
 * OpenBLAS) use it; WebAssembly SIMD stops at 128 bits, so a report says which width each side had.
 *
 * @example
 * ```ts
 * import { nativeVectors } from "./stamp.ts";
 * console.log(nativeVectors("flags : fpu sse sse2 avx avx2 fma")); // "AVX2 (256-bit)"
 * ```
 */
export function nativeVectors(cpuinfo: string | undefined = readCpuinfo()): string | undefined {
  const line = cpuinfo?.split("\n").find((l) => /^(flags|Features)\s*:/.test(l));
  if (!line) return undefined;
  const flags = new Set(line.split(":")[1].trim().split(/\s+/));
  if (flags.has("avx512f")) return "AVX-512 (512-bit)";
  if (flags.has("avx2")) return "AVX2 (256-bit)";
  if (flags.has("avx")) return "AVX (256-bit)";
  if (flags.has("asimd") || flags.has("neon")) return "NEON (128-bit)";
  if (flags.has("sse2")) return "SSE2 (128-bit)";
  return undefined;
}

function readCpuinfo(): string | undefined {
  try {
    return Deno.readTextFileSync("/proc/cpuinfo");
  } catch {
    return undefined;
  }
}

const MARK = "tandem-bench-stamp";
const COMMENT = new RegExp(`<!-- ${MARK} (\\{.*?\\}) -->`);

/** Runs git in `root`; its trimmed stdout, or undefined when git fails or is missing. */
async function git(root: string, args: string[]): Promise<string | undefined> {
  try {
    const { success, stdout } = await new Deno.Command("git", {
      args: ["-C", root, ...args],
      stdout: "piped",
      stderr: "null",
    }).output();
    return success ? new TextDecoder().decode(stdout).trim() : undefined;
  } catch {
    return undefined;
  }
}

/** Every file under `path` (a file or folder, relative to `root`), hidden names skipped, sorted. */
async function filesUnder(root: string, path: string): Promise<string[]> {
  let info: Deno.FileInfo;
  try {
    info = await Deno.stat(`${root}/${path}`);
  } catch {
    return []; // a source that does not exist has no content: its absence is part of the digest
  }
  if (info.isFile) return [path];
  const out: string[] = [];
  for await (const entry of Deno.readDir(`${root}/${path}`)) {
    if (entry.name.startsWith(".")) continue;
    out.push(...await filesUnder(root, `${path}/${entry.name}`));
  }
  return out.sort();
}

/**
 * SHA-256 (hex) of the content of `sources` under `root` as they are now: each file's path and
 * bytes, in path order (uncommitted changes count; git is not needed).
 *
 * @example
 * ```ts ignore
 * import { REPOSITORY_ROOT, sourcesDigest } from "./stamp.ts";
 * console.log(await sourcesDigest(REPOSITORY_ROOT, ["engine"]));
 * ```
 */
export async function sourcesDigest(root: string, sources: readonly string[]): Promise<string> {
  const files = [...new Set((await Promise.all(sources.map((s) => filesUnder(root, s)))).flat())].sort();
  const encoder = new TextEncoder();
  const parts: Uint8Array[] = [];
  for (const file of files) {
    const bytes = await Deno.readFile(`${root}/${file}`);
    parts.push(encoder.encode(`${file}\0${bytes.length}\0`), bytes);
  }
  const all = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let offset = 0;
  for (const p of parts) {
    all.set(p, offset);
    offset += p.length;
  }
  const hash = new Uint8Array(await crypto.subtle.digest("SHA-256", all));
  return Array.from(hash, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** What {@link measureStamp} needs to know about the report. */
export interface StampRequest {
  /** The report, relative to the repository root, e.g. `bench/SCHEDULE.md`. */
  file: string;
  /** The command that writes it. */
  command: string;
  /** The generator's own files, measured besides {@link MEASURED_CODE}. */
  sources: readonly string[];
}

/**
 * Takes the stamp of a run starting now: date, commit, the sources' digest and this machine with
 * its measured peak (about 1.5 s; measured once per process and shared with any other caller of
 * `measureWasmPeak`, so a report's own percentages of peak and its stamp agree).
 *
 * @example
 * ```ts ignore
 * import { measureStamp } from "./stamp.ts";
 * const stamp = await measureStamp({ file: "bench/X.md", command: "npx deno task bench:x", sources: ["bench/x.ts"] });
 * ```
 */
export async function measureStamp(
  request: StampRequest,
  root: string = REPOSITORY_ROOT,
): Promise<BenchStamp> {
  const sources = [...new Set([...MEASURED_CODE, ...request.sources])];
  const [commit, status, digest] = await Promise.all([
    git(root, ["rev-parse", "HEAD"]),
    git(root, ["status", "--porcelain", "--", ...sources]),
    sourcesDigest(root, sources),
  ]);
  let peak: BenchStamp["peak"];
  try {
    const p = await measureWasmPeak();
    peak = {
      perCore: Math.round(p.perCore * 100) / 100,
      allCores: Math.round(p.allCores * 100) / 100,
      threads: p.threads,
      fma: p.fma,
      line: describeWasmPeak(p),
    };
  } catch (error) {
    peak = { error: (error as Error).message };
  }
  return {
    version: 1,
    file: request.file,
    command: request.command,
    date: new Date().toISOString().replace(/\.\d+Z$/, "Z"),
    commit: commit ?? "unknown",
    dirty: status === undefined ? true : status !== "",
    sources,
    digest,
    machine: {
      cpu: cpuModel(),
      cores: navigator.hardwareConcurrency,
      os: `${Deno.build.os} ${Deno.build.arch}`,
      deno: Deno.version.deno,
      v8: Deno.version.v8,
      vectors: nativeVectors(),
    },
    peak,
  };
}

/** `2026-12-01 06:38 UTC` from a stamp's date. */
export function stampDate(stamp: Pick<BenchStamp, "date">): string {
  return `${stamp.date.slice(0, 16).replace("T", " ")} UTC`;
}

/** `commit 8838991` or `commit 8838991 with uncommitted changes`. */
function stampCommit(stamp: Pick<BenchStamp, "commit" | "dirty">): string {
  const short = stamp.commit === "unknown" ? "unknown" : stamp.commit.slice(0, 7);
  return `commit ${short}${stamp.dirty ? " with uncommitted changes" : ""}`;
}

/** The peak as a phrase: `71.2 GFLOP/s on 1 thread, 142.0 on 2 (f32x4.relaxed_madd)`. */
export function stampPeak(stamp: Pick<BenchStamp, "peak">): string {
  const p = stamp.peak;
  if ("error" in p) return `not measured (${p.error})`;
  return `${p.perCore.toFixed(1)} GFLOP/s on 1 thread, ${p.allCores.toFixed(1)} on ${p.threads} ` +
    `(${p.fma ? "f32x4.relaxed_madd" : "f32x4.mul + f32x4.add"})`;
}

/**
 * The stamp as a report's top writes it, after the title: the machine-readable comment, then one
 * paragraph saying the same.
 *
 * @example
 * ```ts ignore
 * import { measureStamp, stampBlock } from "./stamp.ts";
 * const lines = ["# My report", "", stampBlock(await measureStamp(request)), ""];
 * ```
 */
export function stampBlock(stamp: BenchStamp): string {
  const m = stamp.machine;
  return [
    `<!-- ${MARK} ${JSON.stringify(stamp)} -->`,
    "",
    `**Stamp:** measured ${stampDate(stamp)} at ${
      stampCommit(stamp)
    } by \`${stamp.command}\`, on ${m.cpu}, ` +
    `${m.cores} cores, ${m.os}, Deno ${m.deno}${
      m.vectors ? `, native vectors up to ${m.vectors} (what native peers such as PyTorch use)` : ""
    }; this machine's 128-bit WebAssembly peak (measured by ` +
    `\`backends/cpu/wasm/peak.ts\` in the same run): ${stampPeak(stamp)}. The figures measure ` +
    `${stamp.sources.map((s) => `\`${s}\``).join(", ")} as they were then.`,
  ].join("\n");
}

/** One line for a console or an HTML report's facts. */
export function stampSummary(stamp: BenchStamp): string {
  return `${stampDate(stamp)}, ${stampCommit(stamp)}, ${stamp.machine.cpu} (${stamp.machine.cores} cores), ` +
    `peak ${stampPeak(stamp)}`;
}

/** Why a stamp could not be read. */
export interface StampMissing {
  /** What is wrong, e.g. "no stamp" or "a malformed stamp (…)". */
  missing: string;
}

/**
 * The first stamp in `text` (a report's own, at its top), or why there is none.
 *
 * @example
 * ```ts ignore
 * import { readStamp } from "./stamp.ts";
 * const stamp = readStamp(Deno.readTextFileSync("bench/SCHEDULE.md"));
 * if ("missing" in stamp) console.log(stamp.missing);
 * ```
 */
export function readStamp(text: string): BenchStamp | StampMissing {
  const found = text.match(COMMENT);
  if (!found) return { missing: "no stamp" };
  let value: unknown;
  try {
    value = JSON.parse(found[1]);
  } catch (error) {
    return { missing: `a malformed stamp (${(error as Error).message})` };
  }
  const s = value as Partial<BenchStamp>;
  const wrong = s === null || typeof s !== "object"
    ? "not an object"
    : s.version !== 1
    ? `version ${JSON.stringify(s.version)}, expected 1`
    : typeof s.date !== "string" || Number.isNaN(Date.parse(s.date))
    ? "no date"
    : typeof s.commit !== "string"
    ? "no commit"
    : !Array.isArray(s.sources) || s.sources.length === 0
    ? "no sources"
    : typeof s.digest !== "string" || !/^[0-9a-f]{64}$/.test(s.digest)
    ? "no digest"
    : typeof s.machine !== "object" || s.machine === null
    ? "no machine"
    : typeof s.peak !== "object" || s.peak === null
    ? "no peak"
    : undefined;
  return wrong ? { missing: `a malformed stamp (${wrong})` } : s as BenchStamp;
}

/** The report's text without any stamp comment (for embedding: the embedding report has its own). */
export function withoutStampComment(text: string): string {
  return text.replace(new RegExp(`^<!-- ${MARK} .*? -->\\n\\n?`, "gm"), "");
}

/** What {@link checkEmbeddable} asks of the repository (git and the files), injectable for tests. */
export interface RepositoryState {
  /** Digest of `sources`' content now ({@link sourcesDigest}). */
  digest(sources: readonly string[]): Promise<string>;
  /**
   * Short hashes and subjects of the commits after `commit` that touch `sources` (`git log`), or
   * undefined when `commit` is unknown here.
   */
  commitsSince(commit: string, sources: readonly string[]): Promise<string[] | undefined>;
  /** `3fa681f 2026-12-01`: the last commit of `file` and its date (`git log -1`), or undefined. */
  lastCommit(file: string): Promise<string | undefined>;
}

/** This checkout: the digest from the files, the commits from `git log`. */
export function repositoryState(root: string = REPOSITORY_ROOT): RepositoryState {
  return {
    digest: (sources) => sourcesDigest(root, sources),
    async commitsSince(commit, sources) {
      if (!/^[0-9a-f]{40}$/.test(commit)) return undefined;
      if ((await git(root, ["cat-file", "-e", `${commit}^{commit}`])) === undefined) return undefined;
      const log = await git(root, ["log", "--format=%h %s", `${commit}..HEAD`, "--", ...sources]);
      return log === undefined ? undefined : log.split("\n").filter((l) => l !== "");
    },
    async lastCommit(file) {
      return (await git(root, ["log", "-1", "--format=%h %cs", "--", file])) || undefined;
    },
  };
}

/** The result of {@link checkEmbeddable}: the stamp when the file may be embedded, else one line why not. */
export type Embeddable = { stamp: BenchStamp; refusal?: undefined } | { stamp?: BenchStamp; refusal: string };

/**
 * Whether the report `file` (its `text`, written by `command`) may be embedded by another report:
 * it must carry a stamp, and the sources it measured must still be the content it measured.
 * Otherwise one line: the file, its date and commit, why, and the command that would refresh it.
 *
 * @example
 * ```ts ignore
 * import { checkEmbeddable, repositoryState } from "./stamp.ts";
 * const check = await checkEmbeddable("bench/SCHEDULE.md", text, repositoryState());
 * if (check.refusal) console.error(check.refusal);
 * ```
 */
export async function checkEmbeddable(
  file: string,
  text: string,
  repo: RepositoryState,
  command?: string,
): Promise<Embeddable> {
  const stamp = readStamp(text);
  if ("missing" in stamp) {
    const last = await repo.lastCommit(file);
    return {
      refusal:
        `refusing to embed ${file} (${
          last ? `last committed at ${last}` : "never committed"
        }): it has ${stamp.missing}, so the code and the machine its figures measured are unknown; rerun ` +
        `${command ? `\`${command}\`` : "its bench"}, which stamps it`,
    };
  }
  const digest = await repo.digest(stamp.sources);
  if (digest === stamp.digest) return { stamp };
  const commits = await repo.commitsSince(stamp.commit, stamp.sources);
  const why = commits === undefined
    ? `its commit is not in this checkout's history and the code differs`
    : commits.length === 0
    ? "uncommitted changes since"
    : `${commits.length} commit${commits.length > 1 ? "s" : ""} since (${
      commits.slice(0, 3).map((c) => c.split(" ")[0]).join(", ")
    }${commits.length > 3 ? ", …" : ""})`;
  return {
    stamp,
    refusal: `refusing to embed ${file} (measured ${stampDate(stamp)} at ${stampCommit(stamp)}): the code ` +
      `it measures (${stamp.sources.join(", ")}) changed after it: ${why}; rerun \`${stamp.command}\``,
  };
}

/** What {@link readForEmbedding} gives: the file's text (stamp comment removed) and stamp, or the refusal. */
export type EmbeddedReport = { text: string; stamp: BenchStamp; refusal?: undefined } | {
  text?: undefined;
  stamp?: BenchStamp;
  refusal: string;
};

/**
 * Reads the report `file` (relative to `root`) for embedding in another: its text without its stamp
 * comment (the stamp sentence stays, so the embedded part says where it came from) when
 * {@link checkEmbeddable} accepts it, else the refusal line (a missing file included).
 *
 * @example
 * ```ts ignore
 * import { readForEmbedding, repositoryState } from "./stamp.ts";
 * const schedule = await readForEmbedding("bench/SCHEDULE.md", "npx deno task bench:schedule", repositoryState());
 * ```
 */
export async function readForEmbedding(
  file: string,
  command: string,
  repo: RepositoryState,
  root: string = REPOSITORY_ROOT,
): Promise<EmbeddedReport> {
  let text: string;
  try {
    text = await Deno.readTextFile(`${root}/${file}`);
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
    return { refusal: `refusing to embed ${file}: not found; run \`${command}\`` };
  }
  const check = await checkEmbeddable(file, text, repo, command);
  return check.refusal === undefined ? { text: withoutStampComment(text), stamp: check.stamp } : check;
}
