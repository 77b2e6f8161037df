/**
 * Bad input of every kind, table-driven (issue 15 item 7; the table is tests/cli/bad_input_cases.ts):
 * every flag of `deno task train`, MNIST IDX and CIFAR-10 files, checkpoints, Caffe prototxt and
 * schedule files. Each case asserts: a non-zero exit status; one message whose first line holds the
 * flag, file or line (a schedule file's error alone goes on, indented, to quote the source line under
 * a caret; a checkpoint's problems are folded into the one line); nothing else on stderr; no stack trace; no file created, changed or replaced; and for
 * the early checks, the refusal within 5 s. Cases run in-process through `runTrain` (the message is
 * what cli/train.ts prints: `describeError`'s); a few subprocesses check the real exit status and
 * stderr.
 */

import assert from "node:assert/strict";
import { describeError } from "../../cli/errors.ts";
import { runTrain } from "../../cli/train.ts";
import { DataParallelTrainer, loadMnistDigitsSplit } from "../../mod.ts";
import { type BadInput, badInputs, type Fixtures, writeFixtures } from "./bad_input_cases.ts";

const EARLY_BUDGET_SECONDS = 5;

/** Every file under `dir`: size, modification time and inode, so a rewrite or replacement shows. */
async function listing(dir: string, recursive = true): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  const walk = async (path: string) => {
    for await (const entry of Deno.readDir(path)) {
      // The embedded datasets' cache lives in node_modules by design (built on first use).
      if (entry.name === "node_modules") continue;
      const full = `${path}/${entry.name}`;
      const info = await Deno.lstat(full);
      out.set(full, `${info.isDirectory ? "dir" : info.size}:${info.mtime?.getTime()}:${info.ino}`);
      if (info.isDirectory && recursive) await walk(full);
    }
  };
  await walk(dir);
  return out;
}

/** The bytes of every input file a command line names (directories: the files in them). */
async function inputBytes(argv: readonly string[], dir: string): Promise<Map<string, Uint8Array>> {
  const out = new Map<string, Uint8Array>();
  for (const arg of argv) {
    const path = arg.slice(arg.indexOf(dir));
    if (!arg.includes(dir)) continue;
    try {
      const info = await Deno.stat(path);
      if (info.isFile) out.set(path, await Deno.readFile(path));
      if (info.isDirectory) {
        for await (const entry of Deno.readDir(path)) {
          if (entry.isFile) out.set(`${path}/${entry.name}`, await Deno.readFile(`${path}/${entry.name}`));
        }
      }
    } catch (error) {
      if (!(error instanceof Deno.errors.NotFound || error instanceof Deno.errors.NotADirectory)) throw error;
    }
  }
  return out;
}

/** Runs `argv` in-process; returns what `deno task train` would print on stderr and its exit status. */
async function refuse(
  c: BadInput,
): Promise<{ message: string; exitCode: number; stderr: string[]; seconds: number; devices: number }> {
  const stderr: string[] = [];
  // Counts trainers created (which start the devices): an early check refuses before any exists.
  let devices = 0;
  const create = DataParallelTrainer.create;
  DataParallelTrainer.create = (options) => {
    devices++;
    return create.call(DataParallelTrainer, options);
  };
  const { error: consoleError } = console;
  console.error = (...parts: unknown[]) => void stderr.push(parts.map(String).join(" "));
  const saved = Object.fromEntries(Object.keys(c.env ?? {}).map((k) => [k, Deno.env.get(k)]));
  for (const [k, v] of Object.entries(c.env ?? {})) Deno.env.set(k, v);
  const started = performance.now();
  let thrown: unknown;
  try {
    const code = await runTrain(c.argv);
    assert.fail(`expected a refusal, got exit status ${code}`);
  } catch (error) {
    thrown = error;
  } finally {
    DataParallelTrainer.create = create;
    console.error = consoleError;
    for (const [k, v] of Object.entries(saved)) v === undefined ? Deno.env.delete(k) : Deno.env.set(k, v);
  }
  const seconds = (performance.now() - started) / 1000;
  const known = describeError(thrown);
  assert.ok(
    known,
    `not a user error (the CLI would print a stack trace): ${(thrown as Error)?.stack ?? thrown}`,
  );
  return { ...known, stderr, seconds, devices };
}

/** The assertions every case makes; see the module comment. */
async function check(c: BadInput, f: Fixtures): Promise<void> {
  const before = await listing(f.dir);
  const cwd = await listing(Deno.cwd(), false);
  const inputs = await inputBytes(c.argv, f.dir);
  const { message, exitCode, stderr, seconds, devices } = await refuse(c);
  assert.notEqual(exitCode, 0);
  // Mutation: dropping the checkpoint's dry run before DataParallelTrainer.create in cli/train/setup.ts
  // (the ckpt-* rows then create the trainer, and its devices, before the refusal).
  assert.equal(devices, 0, "the devices started before the refusal");
  assert.deepEqual(stderr, [], "nothing but the message may reach stderr");
  const [first, ...rest] = message.split("\n");
  for (const word of c.says) {
    if (typeof word === "string") assert.ok(first.includes(word), `"${first}" lacks "${word}"`);
    else assert.match(first, word);
  }
  assert.ok(first.length > 0 && first.length <= 600, `message line of ${first.length} characters`);
  for (const line of rest) assert.match(line, /^\s+\S/, `a second message line:\n${message}`);
  if (c.detail) assert.ok(message.includes(c.detail), `no "${c.detail}" in:\n${message}`);
  assert.doesNotMatch(message, /^\s+at .*(:\d+:\d+\)?|<anonymous>)$/m, `stack trace:\n${message}`);
  assert.doesNotMatch(message, /Uncaught|RangeError|TypeError/);
  const budget = c.budgetSeconds ?? EARLY_BUDGET_SECONDS;
  assert.ok(seconds < budget, `took ${seconds.toFixed(1)} s, over the ${budget} s budget`);
  assert.deepEqual(await listing(f.dir), before, "files in the temporary directory changed");
  assert.deepEqual(await listing(Deno.cwd(), false), cwd, "files in the working directory changed");
  for (const [path, bytes] of inputs) assert.deepEqual(await Deno.readFile(path), bytes, `${path} changed`);
}

// Built once: the first load of the embedded digits writes their cache (seconds), not a refusal's cost.
await loadMnistDigitsSplit();
const dir = await Deno.makeTempDir({ prefix: "tandem_bad_input_" });
const fixtures = await writeFixtures(dir, runTrain);
const cases = badInputs(fixtures);

Deno.test({
  name: `bad input: ${cases.length} cases, each refused in one line with nothing written`,
  // Device Workers of the late (checkpoint) rows end after their close resolves.
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async (t) => {
    assert.ok(cases.length >= 150, `only ${cases.length} cases`);
    assert.equal(new Set(cases.map((c) => c.name)).size, cases.length, "case names must be unique");
    for (const c of cases) await t.step(c.name, () => check(c, fixtures));
  },
});

async function train(args: string[], env: Record<string, string> = {}) {
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--no-check", "cli/train.ts", ...args],
    env: { NO_COLOR: "1", ...env },
    stdout: "piped",
    stderr: "piped",
    stdin: "null",
  }).output();
  return { code: output.code, stderr: new TextDecoder().decode(output.stderr).trimEnd().split("\n") };
}

Deno.test("bad input: as a process, usage errors exit 2 and a deep prototxt exits 1, one line each", async () => {
  const [usage, deep, stale] = await Promise.all([
    train(["--steps", "0", "--resume", fixtures.missing]),
    train(["--model", fixtures["prototxt-deep-nesting"], "--data", "synthetic", "--steps", "0"]),
    // Stale OMPI_* variables: one warning line, then the summary of --steps 0 on stdout.
    train(["--model", "lenet", "--steps", "0"], { OMPI_COMM_WORLD_SIZE: "2", OMPI_COMM_WORLD_RANK: "0" }),
  ]);
  assert.equal(usage.code, 2, usage.stderr.join("\n"));
  assert.deepEqual(usage.stderr, [
    "tandem train: --resume does nothing with --steps 0, which prints the model summary and trains nothing",
  ]);
  assert.equal(deep.code, 1, deep.stderr.join("\n"));
  assert.equal(deep.stderr.length, 1, deep.stderr.join("\n"));
  assert.match(
    deep.stderr[0],
    /^tandem train: .*deep-nesting\.prototxt:101:3: messages nest deeper than 100 levels$/,
  );
  assert.equal(stale.code, 0, stale.stderr.join("\n"));
  assert.equal(stale.stderr.length, 1, stale.stderr.join("\n"));
  assert.match(
    stale.stderr[0],
    /^tandem train: warning: OMPI_COMM_WORLD_SIZE=2 .* running as one local process$/,
  );
});

Deno.test("bad input: cleanup", async () => {
  await Deno.remove(dir, { recursive: true });
});
