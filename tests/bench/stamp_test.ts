/**
 * The bench reports' stamp and the refusal to embed a stale report (`bench/stamp.ts`), without
 * running any bench or the peak probe: stamps are built by hand, the repository is a fake or a
 * temporary folder, and the generators are checked by reading their source.
 */

import assert from "node:assert/strict";
import {
  type BenchStamp,
  checkEmbeddable,
  nativeVectors,
  readForEmbedding,
  readStamp,
  REPOSITORY_ROOT,
  type RepositoryState,
  repositoryState,
  sourcesDigest,
  stampBlock,
  withoutStampComment,
} from "../../bench/stamp.ts";

const DIGEST = "a".repeat(64);

function stamp(overrides: Partial<BenchStamp> = {}): BenchStamp {
  return {
    version: 1,
    file: "bench/SCHEDULE.md",
    command: "npx deno task bench:schedule",
    date: "2026-12-01T06:38:36Z",
    commit: "3fa681f" + "0".repeat(33),
    dirty: false,
    sources: ["backends", "engine", "schedule", "bench/schedule_report.ts"],
    digest: DIGEST,
    machine: { cpu: "AMD EPYC", cores: 2, os: "linux x86_64", deno: "2.9.6", v8: "15.0" },
    peak: { perCore: 71.2, allCores: 142.0, threads: 2, fma: true, line: "…" },
    ...overrides,
  };
}

/** A report as a generator writes it: title, stamp, figures. */
function report(s: BenchStamp | undefined): string {
  return ["# Data-parallel schedules on this machine", "", ...(s ? [stampBlock(s), ""] : []), "| a | b |", ""]
    .join("\n");
}

/**
 * A repository whose code now has digest `digest`, with `commits` since any stamp's commit
 * ("unknown": the commit is not in its history).
 */
function fakeRepository(digest: string, commits: string[] | "unknown" = []): RepositoryState {
  return {
    digest: () => Promise.resolve(digest),
    commitsSince: () => Promise.resolve(commits === "unknown" ? undefined : commits),
    lastCommit: () => Promise.resolve("3fa681f 2026-12-01"),
  };
}

Deno.test("stamp: stampBlock writes what readStamp reads, and says it in words", () => {
  const s = stamp();
  const text = report(s);
  assert.deepEqual(readStamp(text), s);
  const block = stampBlock(s);
  for (
    const words of ["2026-12-01 06:38 UTC", "commit 3fa681f", "AMD EPYC", "2 cores", "71.2 GFLOP/s", "142.0"]
  ) {
    assert.ok(block.includes(words), `${words} in ${block}`);
  }
  assert.ok(stampBlock(stamp({ dirty: true })).includes("with uncommitted changes"));
  assert.ok(stampBlock(stamp({ peak: { error: "no SIMD128" } })).includes("not measured (no SIMD128)"));
  // Embedding keeps the sentence, drops the comment (the embedding report has its own stamp).
  const embedded = withoutStampComment(text);
  assert.ok(!embedded.includes("tandem-bench-stamp"));
  assert.ok(embedded.includes("**Stamp:** measured 2026-12-01 06:38 UTC"));
  assert.ok("missing" in readStamp(embedded));
});

// Mutations: nativeVectors checking avx2 before avx512f, or stampBlock leaving the width out, fail this.
Deno.test("stamp: the widest native vectors come from the CPU flags and are said beside the peak", () => {
  assert.equal(
    nativeVectors("processor : 0\nflags : fpu sse2 avx avx2 fma avx512f avx512bw\n"),
    "AVX-512 (512-bit)",
  );
  assert.equal(nativeVectors("flags\t\t: fpu sse sse2 avx avx2 fma\n"), "AVX2 (256-bit)");
  assert.equal(nativeVectors("Features\t: fp asimd evtstrm\n"), "NEON (128-bit)");
  assert.equal(nativeVectors("model name : unknown\n"), undefined);
  assert.equal(nativeVectors(""), undefined);
  const machine = { ...stamp().machine, vectors: "AVX-512 (512-bit)" };
  assert.ok(stampBlock(stamp({ machine })).includes("native vectors up to AVX-512 (512-bit)"));
  assert.ok(!stampBlock(stamp()).includes("native vectors"), "a stamp without them says nothing of them");
});

Deno.test("stamp: a missing or malformed stamp is said, not guessed", () => {
  assert.deepEqual(readStamp(report(undefined)), { missing: "no stamp" });
  const bad = (text: string) => {
    const r = readStamp(text);
    assert.ok("missing" in r && r.missing.startsWith("a malformed stamp"), JSON.stringify(r));
  };
  bad("<!-- tandem-bench-stamp {not json} -->");
  bad(`<!-- tandem-bench-stamp ${JSON.stringify({ ...stamp(), version: 2 })} -->`);
  bad(`<!-- tandem-bench-stamp ${JSON.stringify({ ...stamp(), digest: "abc" })} -->`);
  bad(`<!-- tandem-bench-stamp ${JSON.stringify({ ...stamp(), date: "yesterday" })} -->`);
  bad(`<!-- tandem-bench-stamp ${JSON.stringify({ ...stamp(), sources: [] })} -->`);
});

// Mutations tried, each fails this test: accepting a missing stamp (checkEmbeddable returning the
// file as embeddable when readStamp says "no stamp"); comparing commits instead of content
// (accepting whenever `git log` lists no commit since the stamp, which lets uncommitted changes
// through); and leaving the commits' hashes out of the refusal.
Deno.test("stamp: a report refuses to embed a file without a stamp or measured on other code", async () => {
  const file = "bench/SCHEDULE.md", command = "npx deno task bench:schedule";

  const unstamped = await checkEmbeddable(file, report(undefined), fakeRepository(DIGEST), command);
  assert.equal(unstamped.stamp, undefined);
  assert.equal(
    unstamped.refusal,
    "refusing to embed bench/SCHEDULE.md (last committed at 3fa681f 2026-12-01): it has no stamp, so the " +
      "code and the machine its figures measured are unknown; rerun `npx deno task bench:schedule`, which " +
      "stamps it",
  );

  const same = await checkEmbeddable(file, report(stamp()), fakeRepository(DIGEST), command);
  assert.equal(same.refusal, undefined);
  assert.deepEqual(same.stamp, stamp());

  const committed = await checkEmbeddable(
    file,
    report(stamp()),
    fakeRepository("b".repeat(64), ["1234567 faster GEMM", "89abcde LRN in SIMD", "fedcba9 x", "7654321 y"]),
    command,
  );
  assert.equal(
    committed.refusal,
    "refusing to embed bench/SCHEDULE.md (measured 2026-12-01 06:38 UTC at commit 3fa681f): the code it " +
      "measures (backends, engine, schedule, bench/schedule_report.ts) changed after it: 4 commits since " +
      "(1234567, 89abcde, fedcba9, …); rerun `npx deno task bench:schedule`",
  );

  // No commit since, but the files differ: uncommitted changes are other code too.
  const uncommitted = await checkEmbeddable(file, report(stamp()), fakeRepository("b".repeat(64), []));
  assert.match(uncommitted.refusal ?? "", /changed after it: uncommitted changes since; rerun/);

  // The stamp's commit is unknown here (another clone's history).
  const foreign = await checkEmbeddable(file, report(stamp()), fakeRepository("b".repeat(64), "unknown"));
  assert.match(foreign.refusal ?? "", /its commit is not in this checkout's history/);

  // Measured on uncommitted code that was then committed as it was: the same content, accepted.
  const dirtyThenCommitted = await checkEmbeddable(
    file,
    report(stamp({ dirty: true })),
    fakeRepository(DIGEST, ["1234567 the change measured"]),
  );
  assert.equal(dirtyThenCommitted.refusal, undefined);
});

// Mutation tried: hashing only the files' bytes, not their paths, let a renamed file keep the digest.
Deno.test("stamp: the sources' digest follows content and names, not times", async () => {
  const root = await Deno.makeTempDir();
  try {
    await Deno.mkdir(`${root}/engine/ops`, { recursive: true });
    await Deno.writeTextFile(`${root}/engine/ops/a.ts`, "export const a = 1;\n");
    await Deno.writeTextFile(`${root}/engine/b.ts`, "export const b = 2;\n");
    const first = await sourcesDigest(root, ["engine"]);
    assert.match(first, /^[0-9a-f]{64}$/);
    await Deno.writeTextFile(`${root}/engine/b.ts`, "export const b = 2;\n"); // rewritten, same bytes
    assert.equal(await sourcesDigest(root, ["engine"]), first);
    await Deno.writeTextFile(`${root}/engine/.b.ts.swp`, "editor junk"); // hidden: not code
    assert.equal(await sourcesDigest(root, ["engine"]), first);
    await Deno.writeTextFile(`${root}/engine/b.ts`, "export const b = 3;\n");
    const changed = await sourcesDigest(root, ["engine"]);
    assert.notEqual(changed, first);
    await Deno.rename(`${root}/engine/b.ts`, `${root}/engine/c.ts`);
    assert.notEqual(await sourcesDigest(root, ["engine"]), changed);
    // Other folders do not count; a source that is absent counts as empty.
    await Deno.writeTextFile(`${root}/README.md`, "words");
    assert.equal(await sourcesDigest(root, ["engine", "missing"]), await sourcesDigest(root, ["engine"]));
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("stamp: readForEmbedding gives the text without its comment, or one line why not", async () => {
  const root = await Deno.makeTempDir();
  try {
    await Deno.mkdir(`${root}/bench`);
    const missing = await readForEmbedding(
      "bench/SCHEDULE.md",
      "npx deno task bench:schedule",
      fakeRepository(DIGEST),
      root,
    );
    assert.equal(
      missing.refusal,
      "refusing to embed bench/SCHEDULE.md: not found; run `npx deno task bench:schedule`",
    );
    await Deno.writeTextFile(`${root}/bench/SCHEDULE.md`, report(stamp()));
    const fresh = await readForEmbedding("bench/SCHEDULE.md", "x", fakeRepository(DIGEST), root);
    assert.equal(fresh.refusal, undefined);
    assert.ok(fresh.text?.includes("**Stamp:** measured") && !fresh.text.includes("tandem-bench-stamp"));
    const stale = await readForEmbedding("bench/SCHEDULE.md", "x", fakeRepository("c".repeat(64)), root);
    assert.equal(stale.text, undefined);
    assert.match(
      stale.refusal ?? "",
      /^refusing to embed bench\/SCHEDULE\.md \(measured 2026-12-01 06:38 UTC/,
    );
    // The refusal is one line.
    assert.ok(!(stale.refusal ?? "").includes("\n"));
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("stamp: this checkout's git answers for a stamp taken at HEAD", async () => {
  const head = await new Deno.Command("git", {
    args: ["-C", REPOSITORY_ROOT, "rev-parse", "HEAD"],
    stdout: "piped",
  })
    .output().then((o) => o.success ? new TextDecoder().decode(o.stdout).trim() : undefined).catch(() =>
      undefined
    );
  if (!head) return; // not a git checkout (a published copy): nothing to check
  const repo = repositoryState();
  assert.deepEqual(await repo.commitsSince(head, ["engine"]), []);
  assert.equal(await repo.commitsSince("f".repeat(40), ["engine"]), undefined);
  assert.match((await repo.lastCommit("README.md")) ?? "", /^[0-9a-f]{7,} \d{4}-\d{2}-\d{2}$/);
});

/** Every generator of a bench report, and the report file it writes. */
const GENERATORS: [string, string][] = [
  ["bench/report.ts", "bench/RESULTS.md"],
  ["bench/schedule_report.ts", "bench/SCHEDULE.md"],
  ["bench/alexnet_scaling.ts", "bench/ALEXNET_SCALING.md"],
  ["bench/mpi_report.ts", "bench/MPI.md"],
  ["bench/rollback_report.ts", "bench/ROLLBACK.md"],
  ["bench/cluster/report.ts", "bench/CLUSTER.md"],
  ["bench/gpu/gpu_report.ts", "bench/gpu/run.sh (stdout)"],
];

// Mutation tried: a generator writing its own date line instead of the stamp fails here.
Deno.test("stamp: every bench generator stamps its file through bench/stamp.ts", async () => {
  for (const [generator, file] of GENERATORS) {
    const source = await Deno.readTextFile(`${REPOSITORY_ROOT}/${generator}`);
    assert.ok(source.includes("measureStamp("), `${generator} takes a stamp`);
    assert.ok(source.includes(`file: "${file}"`), `${generator} stamps ${file}`);
    assert.ok(
      generator.endsWith("gpu_report.ts") ? source.includes("stamp,") : source.includes("stampBlock("),
      `${generator} writes the stamp`,
    );
    assert.ok(!/new Date\(\)/.test(source), `${generator} dates its file through the stamp only`);
  }
  // The one report that embeds others reads them through the refusal, never directly.
  const results = await Deno.readTextFile(`${REPOSITORY_ROOT}/bench/report.ts`);
  assert.equal(results.match(/readForEmbedding\(EMBEDDED\./g)?.length, 2);
  assert.ok(!/readTextFile\([^)]*(SCHEDULE|ALEXNET_SCALING)/.test(results));
});
