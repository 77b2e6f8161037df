/**
 * `--resume` does what it says: a plain resume continues with the checkpoint's lr, batch and run
 * length, bit for bit as the straight run; an explicit `--lr` or `--batch` takes effect from the
 * resumed step, on every optimizer, and is said in one line.
 *
 * Each test names the mutation it was seen to catch.
 */

import assert from "node:assert/strict";
import { loadSafetensors } from "../../engine/io/mod.ts";

const dir = await Deno.makeTempDir({ prefix: "tandem_resume_test_" });
const RUN = ["--model", "lenet", "--data", "synthetic", "--devices", "2", "--seed", "5", "--json"];

async function train(...args: string[]): Promise<{ sha: string; stderr: string }> {
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", new URL("../../cli/train.ts", import.meta.url).pathname, ...RUN, ...args],
    cwd: dir,
    stdout: "piped",
    stderr: "piped",
    stdin: "null",
  }).output();
  const stderr = new TextDecoder().decode(output.stderr);
  assert.equal(output.code, 0, stderr);
  return { sha: JSON.parse(new TextDecoder().decode(output.stdout)).paramsSha256, stderr };
}

/** The lr policy a checkpoint's optimizer saved. */
async function lrOf(path: string): Promise<{ baseLr: number; stepSize: number }> {
  const { metadata } = await loadSafetensors(`${dir}/${path}`);
  return JSON.parse(metadata.optimizer).hyper.lr;
}

const straight = await train("--lr", "0.05", "--batch", "16", "--steps", "6");
const first = await train(
  "--lr",
  "0.05",
  "--batch",
  "16",
  "--steps",
  "3",
  "--checkpoint",
  "half.safetensors",
);

// Mutation: not carrying the checkpoint's settings (resumeArguments returning the parsed args):
// the resumed run then trains at the default lr 0.02 and batch 64, and the bits differ.
Deno.test("resume: without flags, the checkpoint's lr, batch and length carry on bit for bit", async () => {
  const resumed = await train("--resume", "half.safetensors", "--steps", "6");
  assert.equal(resumed.sha, straight.sha);
  assert.match(resumed.stderr, /lr 0\.05 halved every epoch/);
  assert.doesNotMatch(resumed.stderr, /overriding|instead of/);
  assert.notEqual(first.sha, straight.sha);
});

// Mutation: not calling `trainer.setLrPolicy` after loading (the master keeps the checkpoint's
// lr 0.05: the bits equal the straight run's and the saved policy says 0.05).
Deno.test("resume: an explicit --lr takes effect from the resumed step and is said", async () => {
  const resumed = await train(
    "--resume",
    "half.safetensors",
    "--steps",
    "6",
    "--lr",
    "0.001",
    "--checkpoint",
    "lr.safetensors",
  );
  assert.match(resumed.stderr, /overriding the checkpoint's lr 0\.05 with 0\.001/);
  assert.match(resumed.stderr, /lr 0\.001 halved every epoch/);
  assert.notEqual(resumed.sha, straight.sha);
  assert.equal((await lrOf("lr.safetensors")).baseLr, 0.001);
});

// Mutation: leaving the checkpoint's step size (no setLrPolicy): the saved policy keeps the old
// halving period.
Deno.test("resume: an explicit --batch is said, and the lr halves every epoch of the new batch", async () => {
  const resumed = await train(
    "--resume",
    "half.safetensors",
    "--steps",
    "5",
    "--batch",
    "8",
    "--checkpoint",
    "batch.safetensors",
  );
  assert.match(resumed.stderr, /batch 8 instead of the checkpoint's 16/);
  const before = await lrOf("half.safetensors"), after = await lrOf("batch.safetensors");
  assert.equal(after.stepSize, before.stepSize * 2);
  assert.equal(after.baseLr, 0.05);
});

Deno.test("resume: cleanup", async () => {
  await Deno.remove(dir, { recursive: true });
});
