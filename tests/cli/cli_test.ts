/**
 * End-to-end tests of `deno task train` (cli/train.ts), run as a subprocess with small, fast settings:
 * LeNet on synthetic 28×28 images, a few steps of batch 8 on 2 devices.
 */

import assert from "node:assert/strict";
import { signalOnceTraining } from "../fixtures/process.ts";
import "../fixtures/webgpu_driver.ts";

import { runSlowTests, slowTest } from "../fixtures/slow.ts";

const FAST = ["--data", "synthetic", "--model", "lenet", "--batch", "8", "--devices", "2", "--seed", "3"];

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

async function train(...args: string[]): Promise<Run> {
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "cli/train.ts", ...args],
    stdout: "piped",
    stderr: "piped",
    stdin: "null",
  }).output();
  const decoder = new TextDecoder();
  return { code: output.code, stdout: decoder.decode(output.stdout), stderr: decoder.decode(output.stderr) };
}

interface Result {
  loss: number;
  accuracy: number;
  parameters: number;
  step: number;
  imagesPerSecond: number;
  paramsSha256: string;
  schedule: string;
  groups: string[];
  stepMs: Record<string, number>;
  files: Record<string, string>;
}

/** Runs to completion with --json and returns the one JSON object stdout must hold. */
async function trainJson(...args: string[]): Promise<Result> {
  const run = await train(...FAST, "--json", ...args);
  assert.equal(run.code, 0, run.stderr);
  const lines = run.stdout.trim().split("\n");
  assert.equal(lines.length, 1, `stdout must be exactly one JSON line, got:\n${run.stdout}`);
  return JSON.parse(lines[0]);
}

/** A failing run: non-zero exit, the expected words on stderr, nothing like a stack trace. */
function assertCleanFailure(run: Run, ...expected: (string | RegExp)[]): void {
  assert.notEqual(run.code, 0, `expected failure, got success:\n${run.stdout}`);
  for (const e of expected) {
    if (typeof e === "string") assert.ok(run.stderr.includes(e), `stderr lacks "${e}":\n${run.stderr}`);
    else assert.match(run.stderr, e);
  }
  assert.doesNotMatch(run.stderr, /^\s+at .*:\d+:\d+\)?$/m, `stack trace on stderr:\n${run.stderr}`);
  assert.doesNotMatch(run.stderr, /unexpected error/);
}

const dir = await Deno.makeTempDir({ prefix: "tandem_cli_test_" });

Deno.test("cli: --json prints one object with the run's figures; --trace and --report write files", async () => {
  const trace = `${dir}/trace.json`, report = `${dir}/report.html`;
  const result = await trainJson(
    "--steps",
    "4",
    "--schedule",
    "overlap",
    "--trace",
    trace,
    "--report",
    report,
  );
  assert.equal(result.step, 4);
  assert.equal(result.parameters, 431_080);
  assert.ok(Number.isFinite(result.loss) && result.loss > 0);
  assert.ok(result.accuracy >= 0 && result.accuracy <= 1);
  assert.ok(result.imagesPerSecond > 0);
  assert.match(result.paramsSha256, /^[0-9a-f]{64}$/);
  assert.deepEqual(result.files, { trace, report });
  // Medians per step, the update apart from the communication; each hidden part within its whole.
  const ms = result.stepMs;
  assert.deepEqual(
    Object.keys(ms).sort(),
    ["communication", "compute", "hiddenCommunication", "hiddenUpdate", "total", "update"],
  );
  for (const [key, value] of Object.entries(ms)) assert.ok(Number.isFinite(value) && value >= 0, key);
  assert.ok(ms.update > 0 && ms.communication > 0 && ms.compute > 0 && ms.total >= ms.compute);
  assert.ok(ms.hiddenCommunication <= ms.communication && ms.hiddenUpdate <= ms.update);
  const chrome = JSON.parse(await Deno.readTextFile(trace));
  for (const name of ["backward conv", "backward fc", "reduce fc", "update fc", "broadcast conv"]) {
    assert.ok(chrome.traceEvents.some((e: { name: string }) => e.name === name), `trace lacks ${name}`);
  }
  const html = await Deno.readTextFile(report);
  assert.match(html, /Training loss[\s\S]*<svg[\s\S]*device 1 communication/);
  assert.doesNotMatch(html, /<script|src="http/);

  // The lossless promise, end to end: the schedule changes timing, never a bit of the parameters.
  const sequential = await trainJson("--steps", "4", "--schedule", "sequential");
  assert.equal(sequential.paramsSha256, result.paramsSha256);
});

// Mutation tried: `--schedule bucketed` as overlap over the model's own groups (fc, conv), as before,
// fails here on the groups.
Deno.test("cli: --schedule bucketed regroups the layers into PyTorch DDP's default buckets and trains the bits of sequential", async () => {
  const bucketed = await trainJson("--steps", "3", "--schedule", "bucketed");
  const sequential = await trainJson("--steps", "3", "--schedule", "sequential");
  assert.equal(bucketed.schedule, "bucketed");
  // LeNet: ip2 and ip1 (1.6 MB) fill the first bucket of 1 MiB, the convolutions the next.
  assert.deepEqual(bucketed.groups, ["bucket1", "bucket2"]);
  assert.deepEqual(sequential.groups, ["fc", "conv"]);
  assert.equal(bucketed.paramsSha256, sequential.paramsSha256);
});

Deno.test("cli: --steps 0 builds the model and prints its summary", async () => {
  const run = await train("--model", "lenet", "--steps", "0");
  assert.equal(run.code, 0, run.stderr);
  assert.match(run.stdout, /total: 431,080 parameters/);
  assert.match(run.stdout, /conv1/);
});

// Slow (three train commands): runs with the slow tests. The default set resumes through the train
// command bit for bit in resume_test.ts.
Deno.test("cli: resuming at step 4 and going on to 6 equals a straight run to 6", slowTest, async () => {
  const checkpoint = `${dir}/four.safetensors`;
  const four = await trainJson("--steps", "4", "--checkpoint", checkpoint);
  assert.equal(four.step, 4);
  const [resumed, straight] = await Promise.all([
    trainJson("--steps", "6", "--resume", checkpoint),
    trainJson("--steps", "6"),
  ]);
  assert.equal(resumed.step, 6);
  assert.equal(resumed.paramsSha256, straight.paramsSha256);
  assert.notEqual(resumed.paramsSha256, four.paramsSha256);
});

// Mutation: dropping `accumulate: args.accumulate` from cli/train/setup.ts runs one pass of 8 on the one
// device, and the hashes differ.
Deno.test("cli: --devices 1 --accumulate 2 trains the same bits as --devices 2", async () => {
  const [accumulated, parallel] = await Promise.all([
    trainJson("--steps", "3", "--devices", "1", "--accumulate", "2"),
    trainJson("--steps", "3"),
  ]);
  assert.equal(accumulated.paramsSha256, parallel.paramsSha256);
});

// Hybrid on one device gives data-parallel's bits, accumulating too (hybrid_test.ts); here through
// the command. Mutation: dropping `accumulate: args.accumulate` from cli/train/setup.ts makes the hybrid
// run one pass of 8 and the hashes differ.
Deno.test("cli: --schedule hybrid --devices 1 --accumulate 2 trains the bits of --devices 2", async () => {
  const [hybrid, parallel] = await Promise.all([
    trainJson("--steps", "3", "--devices", "1", "--accumulate", "2", "--schedule", "hybrid"),
    trainJson("--steps", "3"),
  ]);
  assert.equal(hybrid.paramsSha256, parallel.paramsSha256);
});

Deno.test("cli: bad inputs fail with a clear message and no stack trace", async () => {
  const schedule = `${dir}/broken.sched`;
  await Deno.writeTextFile(
    schedule,
    "# fc first\nforward\nbackward fc; reduce fc; update fc\nbackward conv\nreduce conv\nupdat conv\nbroadcast all\n",
  );
  const lenetCheckpoint = `${dir}/lenet.safetensors`;
  const saved = await train(...FAST, "--steps", "1", "--checkpoint", lenetCheckpoint);
  assert.equal(saved.code, 0, saved.stderr);

  const cases: [string[], (string | RegExp)[]][] = [
    [["--epoch", "2"], ["unknown option --epoch", "did you mean --epochs?"]],
    [["--devices", "0"], ["--devices must be at least 1, got 0"]],
    [["--batch", "9", "--devices", "2"], ["--batch 9 does not split evenly over 2 devices"]],
    [["--batch", "8", "--devices", "2", "--accumulate", "3"], [
      "--accumulate 3 does not split the 4 samples",
    ]],
    [["--accumulate", "0"], ["--accumulate must be at least 1, got 0"]],
    [["--model", "lenett"], ['unknown model "lenett"', "did you mean lenet?"]],
    [["--model", "cifar-quick", "--data", "mnist"], ["1×28×28", "3×32×32"]],
    [[...FAST, "--steps", "2", "--schedule", schedule], ["line 6", "updat conv", "^"]],
    [
      [
        "--data",
        "synthetic",
        "--model",
        "alexnet-like",
        "--batch",
        "8",
        "--steps",
        "2",
        "--resume",
        lenetCheckpoint,
      ],
      ["checkpoint does not fit", "wrong model name"],
    ],
  ];
  const runs = await Promise.all(cases.map(([args]) => train(...args)));
  runs.forEach((run, i) => assertCleanFailure(run, ...cases[i][1]));
});

const adapter = await navigator.gpu?.requestAdapter().catch(() => null);
if (!adapter) console.log("cli: no WebGPU adapter, skipping the --backend webgpu run");

Deno.test({
  name: "cli: --backend webgpu trains on two GPU devices and agrees with the CPU devices",
  // Slow (two train commands, one on the software adapter): runs with the slow tests. The default set
  // trains two WebGPU devices against two CPU devices in process (webgpu_data_parallel_test.ts).
  ignore: !runSlowTests || !adapter,
  fn: async () => {
    const [gpu, cpu] = await Promise.all([
      trainJson("--steps", "3", "--backend", "webgpu"),
      trainJson("--steps", "3"),
    ]);
    assert.equal(gpu.step, 3);
    assert.ok(Math.abs(gpu.loss - cpu.loss) <= 1e-4 * Math.abs(cpu.loss), `loss ${gpu.loss} vs ${cpu.loss}`);
  },
});

Deno.test("cli: Ctrl-C finishes the step, saves a checkpoint that resumes, and exits 130", async () => {
  const checkpoint = `${dir}/interrupted.safetensors`;
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      "cli/train.ts",
      ...FAST,
      "--lr",
      "0.001",
      "--steps",
      "100000",
      "--checkpoint",
      checkpoint,
    ],
    stdout: "piped",
    stderr: "piped",
    stdin: "null",
  }).spawn();
  // Interrupted once training is under way: progress lines go to stderr when it is not a terminal.
  const { status, stdout, progress } = await signalOnceTraining(child, "SIGINT");
  assert.equal(status.code, 130, `${stdout}\n${progress}`);
  assert.match(stdout, /interrupted at step (\d+); checkpoint saved to .*interrupted\.safetensors/);
  const step = Number(/interrupted at step (\d+)/.exec(stdout)![1]);
  // The saved run continues from where it stopped.
  const resumed = await trainJson("--lr", "0.001", "--resume", checkpoint, "--steps", String(step + 2));
  assert.equal(resumed.step, step + 2);
});

Deno.test("cli: cleanup", async () => {
  await Deno.remove(dir, { recursive: true });
});
