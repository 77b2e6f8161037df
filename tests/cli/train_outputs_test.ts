/**
 * `deno task train`'s output files end to end (run as a subprocess, as tests/cli/cli_test.ts does, with
 * LeNet on synthetic 28×28 images): periodic snapshots and their rotation, a checkpoint that survives
 * kill -9, SIGTERM saving like Ctrl-C, and every bad output path refused before step 1.
 */

import assert from "node:assert/strict";
import { syntheticDataset } from "../../mod.ts";
import { loadSafetensors } from "../../engine/io/mod.ts";
import { fitToModel } from "../../cli/data.ts";
import { CliError } from "../../cli/errors.ts";
import { signalOnceTraining } from "../fixtures/process.ts";

const FAST = ["--data", "synthetic", "--model", "lenet", "--batch", "8", "--devices", "2", "--seed", "3"];

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

function command(args: string[]): Deno.Command {
  return new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "cli/train.ts", ...args],
    stdout: "piped",
    stderr: "piped",
    stdin: "null",
  });
}

async function train(...args: string[]): Promise<Run> {
  const output = await command(args).output();
  const decoder = new TextDecoder();
  return { code: output.code, stdout: decoder.decode(output.stdout), stderr: decoder.decode(output.stderr) };
}

async function trainJson(...args: string[]): Promise<{ step: number; paramsSha256: string }> {
  const run = await train(...FAST, "--json", ...args);
  assert.equal(run.code, 0, run.stderr);
  return JSON.parse(run.stdout.trim());
}

/** The step a checkpoint file holds; reading it checks the whole file (header, sizes, data). */
async function savedStep(path: string): Promise<number> {
  return Number((await loadSafetensors(path)).metadata.step);
}

async function listDir(dir: string): Promise<string[]> {
  const names: string[] = [];
  for await (const entry of Deno.readDir(dir)) names.push(entry.name);
  return names.sort();
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.lstat(path);
    return true;
  } catch {
    return false;
  }
}

const dir = await Deno.realPath(await Deno.makeTempDir({ prefix: "tandem_train_outputs_test_" }));

// Mutation: not calling rotateSnapshots (cli/snapshots.ts) leaves run-000001 and run-000002; dropping
// the periodic save from cli/train/training_loop.ts leaves no run-000004. Either makes this fail.
Deno.test("train: --checkpoint-every 2 --keep 2 keeps the last two numbered snapshots and the latest", async () => {
  const runs = `${dir}/keep`;
  await Deno.mkdir(runs);
  // An older run's snapshot (rotated away), a later one (not ours: left), an unrelated file, and a
  // killed write's temporary file (removed at the next write of run.safetensors).
  for (const name of ["run-000001.safetensors", "run-000099.safetensors", "run-notes.txt"]) {
    await Deno.writeTextFile(`${runs}/${name}`, "older");
  }
  await Deno.writeTextFile(`${runs}/.run.safetensors.tmp-${crypto.randomUUID()}`, "partial");
  const checkpoint = `${runs}/run.safetensors`;
  const [snapshotted, plain] = await Promise.all([
    trainJson(
      "--steps",
      "6",
      "--checkpoint",
      checkpoint,
      "--checkpoint-every",
      "2",
      "--keep",
      "2",
      "--trace",
      "/dev/null",
    ),
    trainJson("--steps", "6"),
  ]);
  assert.equal(snapshotted.step, 6);
  // Saving mid-run (a parameter sync, then a write) changes no bit of the training.
  assert.equal(snapshotted.paramsSha256, plain.paramsSha256);
  assert.deepEqual(await listDir(runs), [
    "run-000004.safetensors",
    "run-000006.safetensors",
    "run-000099.safetensors",
    "run-notes.txt",
    "run.safetensors",
  ]);
  assert.equal(await savedStep(`${runs}/run-000004.safetensors`), 4);
  assert.equal(await savedStep(`${runs}/run-000006.safetensors`), 6);
  assert.equal(await savedStep(checkpoint), 6);
  assert.equal(await Deno.readTextFile(`${runs}/run-000099.safetensors`), "older");
  // --trace /dev/null wrote into the device, which is still a device.
  assert.ok((await Deno.lstat("/dev/null")).isCharDevice);
});

// Mutation: dropping the periodic save from cli/train/training_loop.ts means no checkpoint appears before
// the run ends by itself, and the test fails ("ended before").
Deno.test("train: after kill -9 mid-run, the periodic checkpoint loads", async () => {
  const runs = `${dir}/crash`;
  await Deno.mkdir(runs);
  const checkpoint = `${runs}/crash.safetensors`;
  const child = command([
    ...FAST,
    "--lr",
    "0.001",
    "--steps",
    "400",
    "--checkpoint",
    checkpoint,
    "--checkpoint-every",
    "3",
  ])
    .spawn();
  let ended = false;
  const status = child.status.then((s) => {
    ended = true;
    return s;
  });
  // Wait (by polling, not by timing) for the first snapshot to appear, then kill without warning.
  while (!ended && !(await exists(checkpoint))) await new Promise((r) => setTimeout(r, 50));
  assert.ok(!ended, "the run ended before any periodic checkpoint appeared");
  child.kill("SIGKILL");
  const [done] = await Promise.all([status, child.stdout.cancel(), child.stderr.cancel()]);
  assert.equal(done.signal, "SIGKILL");
  const step = await savedStep(checkpoint);
  assert.ok(step >= 3 && step % 3 === 0, `saved at step ${step}`);
  // Without --keep there are no numbered files.
  assert.ok((await listDir(runs)).every((name) => !/crash-\d+/.test(name)));
});

// Mutation: listening for SIGINT only (StopSignals without SIGTERM) lets SIGTERM kill the process:
// status.signal is "SIGTERM", no JSON, no checkpoint, and this fails.
Deno.test("train: SIGTERM finishes the step, saves through a symlinked --checkpoint, exits 143", async () => {
  const runs = `${dir}/term`;
  await Deno.mkdir(`${runs}/real`, { recursive: true });
  const link = `${runs}/latest.safetensors`, target = `${runs}/real/term.safetensors`;
  await Deno.writeTextFile(target, "stale");
  await Deno.symlink("real/term.safetensors", link);
  const child = command([...FAST, "--json", "--lr", "0.001", "--steps", "100000", "--checkpoint", link])
    .spawn();
  // Interrupted once training is under way: progress lines go to stderr when it is not a terminal.
  const { status, stdout, progress } = await signalOnceTraining(child, "SIGTERM");
  assert.equal(status.signal, null, `killed by ${status.signal}:\n${progress}`);
  assert.equal(status.code, 143, `${stdout}\n${progress}`);
  assert.match(progress, /terminated \(SIGTERM\): finishing the current step/);
  const result = JSON.parse(stdout.trim());
  assert.equal(result.interrupted, true);
  assert.equal(result.signal, "SIGTERM");
  assert.equal(result.checkpoint, link);
  // The link is still a link; its target holds the checkpoint, which resumes.
  assert.ok((await Deno.lstat(link)).isSymlink);
  assert.equal(await savedStep(target), result.step);
  const resumed = await trainJson("--lr", "0.001", "--resume", link, "--steps", String(result.step + 1));
  assert.equal(resumed.step, result.step + 1);
});

// Mutation: dropping the checkOutputs call from runTrain lets these runs train (stdout says
// "training", the exit status is 0 or 1, files appear), so the table fails.
Deno.test("train: bad output paths are refused before step 1, one line naming flag and path", async () => {
  const bad = `${dir}/bad`;
  await Deno.mkdir(bad);
  await Deno.writeTextFile(`${bad}/file.txt`, "");
  await Deno.mkdir(`${bad}/snap-000004.safetensors`);
  const before = await listDir(bad);
  const cases: [string[], string][] = [
    [
      ["--checkpoint", `${bad}/missing/run.safetensors`],
      `--checkpoint ${bad}/missing/run.safetensors: directory ${bad}/missing does not exist; create it first`,
    ],
    [["--checkpoint", ""], "--checkpoint needs a value, got an empty string"],
    [["--trace", ""], "--trace needs a value, got an empty string"],
    [["--trace", bad], `--trace ${bad}: is a directory; expected a file path`],
    [
      ["--report", `${bad}/file.txt/report.html`],
      `--report ${bad}/file.txt/report.html: a parent in the path is not a directory`,
    ],
    [
      ["--trace", `${bad}/same`, "--report", `${bad}/./same`],
      `--report ${bad}/./same is the same file as --trace ${bad}/same; give each output its own file`,
    ],
    [["--checkpoint-every", "2"], "--checkpoint-every 2 needs --checkpoint PATH"],
    [
      ["--checkpoint", `${bad}/k.safetensors`, "--keep", "2"],
      "--keep 2 keeps periodic snapshots: it needs --checkpoint-every N",
    ],
    [
      ["--checkpoint", `${bad}/k.safetensors`, "--checkpoint-every", "2", "--keep", "0"],
      "--keep must be at least 1, got 0",
    ],
    [
      ["--checkpoint", `${bad}/snap.safetensors`, "--checkpoint-every", "2", "--keep", "1"],
      `--keep 1: snapshot ${bad}/snap-000004.safetensors is a directory; expected a file or nothing`,
    ],
    [
      [
        "--checkpoint",
        `${bad}/k.safetensors`,
        "--checkpoint-every",
        "2",
        "--keep",
        "1",
        "--trace",
        `${bad}/k-000004.safetensors`,
      ],
      `--trace ${bad}/k-000004.safetensors is named like a numbered snapshot of --checkpoint ${bad}/k.safetensors`,
    ],
  ];
  const runs = await Promise.all(cases.map(([args]) => train(...FAST, "--steps", "3", ...args)));
  runs.forEach((run, i) => {
    const [args, expected] = cases[i];
    const what = `${args.join(" ")}:\n${run.stdout}\n${run.stderr}`;
    assert.equal(run.code, 2, what);
    assert.ok(run.stderr.startsWith(`tandem train: ${expected}`), what);
    assert.equal(run.stderr.trim().split("\n").length, 1, what);
    assert.ok(!run.stdout.includes("training"), what);
  });
  assert.deepEqual(await listDir(bad), before);
});

// Mutation: removing the held-out size check from fitToModel (cli/data.ts) returns the data, and the
// mismatch would surface only at the evaluation after the last step.
Deno.test("train: held-out images of another size than the training images are refused up front", () => {
  const train = syntheticDataset({ count: 8, classes: 10, seed: 1 });
  const test = syntheticDataset({ count: 4, classes: 10, seed: 2, height: 24, width: 24 });
  assert.throws(
    () =>
      fitToModel({ train, test, description: "mixed" }, "mnist-idx:mixed", {
        inputShape: [1, 28, 28],
        classes: 10,
      }),
    (e: Error) =>
      e instanceof CliError && e.exitCode === 2 &&
      e.message ===
        "--data mnist-idx:mixed: the held-out images are 1×24×24 (C×H×W) but the training images are 1×28×28; expected one size for both splits",
  );
});

Deno.test("train outputs: cleanup", async () => {
  await Deno.remove(dir, { recursive: true });
});
