/**
 * The train command's habits (issue 17 item 5): relative paths resolve from the directory the user
 * ran the command in (`INIT_CWD` under `deno task`) and messages show them as typed; an output
 * nobody named goes to the `runs/` folder there; `--help` names the commands the README uses and
 * every built-in schedule; the `auto` explanation names the groups and split of the plan it
 * returns; no ANSI escape reaches a pipe. Each test names the mutation it was seen to catch.
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import { helpText, parseTrainArgs, SCHEDULE_NAMES, type TrainArgs } from "../../cli/args.ts";
import { choosePlan } from "../../cli/plan.ts";
import { userDirectory } from "../../cli/paths.ts";
import { buildModel, type ModelSpec } from "../../schedule/devices/mod.ts";
import { signalOnceTraining } from "../fixtures/process.ts";

const decoder = new TextDecoder();
const root = Deno.cwd();

/** `deno run cli/train.ts` from the repository root, as `deno task train` runs it, with `env`. */
async function train(args: string[], env: Record<string, string> = {}) {
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "cli/train.ts", ...args],
    env,
    stdout: "piped",
    stderr: "piped",
    stdin: "null",
  }).output();
  return { code: output.code, stdout: decoder.decode(output.stdout), stderr: decoder.decode(output.stderr) };
}

const exists = (path: string) => Deno.stat(path).then(() => true, () => false);

const TINY = `name: "tiny"
layer { name: "in" type: "Input" top: "data" input_param { shape { dim: 1 dim: 1 dim: 8 dim: 8 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 10 } }
`;
const SCHEDULE = "forward\nbackward all\nreduce all\nupdate all\nbroadcast all\n";
const FAST = ["--data", "synthetic", "--batch", "8", "--devices", "1"];

Deno.test("cli habits: every path flag resolves against INIT_CWD, and messages show it as typed", async () => {
  const user = await Deno.makeTempDir({ prefix: "tandem_habits_user_" });
  try {
    await Deno.writeTextFile(join(user, "tiny.prototxt"), TINY);
    await Deno.writeTextFile(join(user, "plain.sched"), SCHEDULE);
    // Mutation tried: userDirectory ignoring INIT_CWD (always Deno.cwd()) made this run look for
    // tiny.prototxt in the repository root and fail; with the files there, they would land there.
    const first = await train([
      ...FAST,
      ...["--model", "tiny.prototxt", "--schedule", "plain.sched", "--steps", "2"],
      ...["--checkpoint", "run.safetensors", "--trace", "trace.json", "--report", "report.html"],
    ], { INIT_CWD: user });
    assert.equal(first.code, 0, first.stderr);
    for (const name of ["run.safetensors", "trace.json", "report.html"]) {
      assert.ok(await exists(join(user, name)), `${name} is not in INIT_CWD`);
      assert.ok(!(await exists(join(root, name))), `${name} landed in the repository root`);
    }
    // The summary line names the files as typed, not as the resolved absolute paths.
    assert.match(
      first.stdout,
      /^files: checkpoint run\.safetensors, trace trace\.json, report report\.html$/m,
    );
    const resumed = await train(
      [...FAST, "--model", "tiny.prototxt", "--resume", "run.safetensors", "--steps", "3"],
      { INIT_CWD: user },
    );
    assert.equal(resumed.code, 0, resumed.stderr);
    assert.match(resumed.stdout, /^resumed from run\.safetensors at step 2$/m);
    // Mutation tried: showUserPaths returning the text unchanged made this say the absolute path.
    const refused = await train(
      [...FAST, "--model", "lenet", "--steps", "2", "--trace", "nowhere/trace.json"],
      { INIT_CWD: user },
    );
    assert.equal(refused.code, 2);
    assert.match(
      refused.stderr,
      /^tandem train: --trace nowhere\/trace\.json: directory nowhere does not exist/,
    );
    assert.ok(!refused.stderr.includes(user), refused.stderr);
  } finally {
    await Deno.remove(user, { recursive: true });
  }
});

// `deno task test` exports INIT_CWD to every child: a train command a test starts in its own
// directory must not write into the task's. Mutation: userDirectory taking INIT_CWD whatever the
// working directory (the divergence, resume and output tests then write their files into the
// repository's root under `npx deno task test`).
Deno.test("cli habits: INIT_CWD counts only where deno task runs commands (the project's root)", () => {
  const root = new URL("../..", import.meta.url).pathname.replace(/\/$/, "");
  assert.equal(userDirectory("/home/me/sub", root), "/home/me/sub");
  assert.equal(userDirectory("/home/me/sub", "/tmp/elsewhere"), "/tmp/elsewhere");
  assert.equal(userDirectory(undefined, root), root);
  assert.equal(userDirectory("  ", root), root);
});

Deno.test("cli habits: parseTrainArgs resolves each path flag once, and built-in names stay names", () => {
  const base = "/home/someone/project/sub";
  const args: TrainArgs = parseTrainArgs(
    [
      ...["--model", "net.prototxt", "--data", "cifar10:data/cifar", "--schedule", "my.sched"],
      ...["--checkpoint", "run.safetensors", "--resume", "../old.safetensors", "--trace", "/tmp/t.json"],
      ...["--report", "out/r.html"],
    ],
    {},
    undefined,
    base,
  );
  assert.equal(args.model, `${base}/net.prototxt`);
  assert.equal(args.data, `cifar10:${base}/data/cifar`);
  assert.equal(args.schedule, `${base}/my.sched`);
  assert.equal(args.checkpoint, `${base}/run.safetensors`);
  assert.equal(args.resume, "/home/someone/project/old.safetensors");
  assert.equal(args.trace, "/tmp/t.json");
  assert.equal(args.report, `${base}/out/r.html`);
  const names = parseTrainArgs(
    ["--model", "lenet", "--data", "synthetic:1x28x28", "--schedule", "auto"],
    {},
    undefined,
    base,
  );
  assert.deepEqual([names.model, names.data, names.schedule], ["lenet", "synthetic:1x28x28", "auto"]);
  // Where the user's directory is the working directory, every path stays exactly as typed.
  const here = parseTrainArgs(
    ["--checkpoint", "run.safetensors", "--data", "mnist-idx:d"],
    {},
    undefined,
    root,
  );
  assert.deepEqual([here.checkpoint, here.data], ["run.safetensors", "mnist-idx:d"]);
});

Deno.test("cli habits: Ctrl-C without --checkpoint saves into runs/ under INIT_CWD, made on demand", async () => {
  const user = await Deno.makeTempDir({ prefix: "tandem_habits_ctrlc_" });
  try {
    const child = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", "cli/train.ts", ...FAST, "--model", "lenet", "--lr", "0.001", "--steps", "100000"],
      env: { INIT_CWD: user },
      stdout: "piped",
      stderr: "piped",
      stdin: "null",
    }).spawn();
    const { status, stdout, progress } = await signalOnceTraining(child, "SIGINT");
    assert.equal(status.code, 130, `${stdout}\n${progress}`);
    // Mutation tried: defaultOutputPath joining the name to the user's directory itself (no runs/
    // folder) left the file beside the user's files and this failed.
    assert.ok(await exists(join(user, "runs", "tandem-interrupted.safetensors")), stdout);
    assert.deepEqual([...Deno.readDirSync(user)].map((e) => e.name), ["runs"]);
    assert.match(
      stdout,
      /checkpoint saved to runs\/tandem-interrupted\.safetensors \(continue with --resume runs\//,
    );
    assert.ok(!(await exists(join(root, "runs", "tandem-interrupted.safetensors"))));
  } finally {
    await Deno.remove(user, { recursive: true });
  }
  // The folder is git-ignored where it is made inside the repository.
  assert.match(await Deno.readTextFile(join(root, ".gitignore")), /^runs\/$/m);
});

Deno.test("cli habits: --help names the README's commands and says a few words of every schedule", () => {
  const help = helpText();
  assert.match(help, /^Usage: npx deno task train \[options\]$/m);
  assert.ok(help.includes("mpirun -np 2 ./node_modules/.bin/deno run -A cli/train.ts --transport mpi"));
  assert.deepEqual(SCHEDULE_NAMES, ["overlap", "sequential", "bucketed", "hybrid", "auto"]);
  for (const name of SCHEDULE_NAMES) assert.match(help, new RegExp(`^ {6}${name} +\\S.{20,}$`, "m"), name);
  assert.ok(help.includes("synthetic:CxHxW"));
});

Deno.test("cli habits: the auto explanation names the groups and the split of the plan it returns", async () => {
  // Mutations tried, each failing here: judge.ts naming the head's first layer from the AlexNet-like
  // suffix (suffixNames[0]) instead of the split's boundary, and describeGroups listing the groups
  // in reverse order.
  for (const model of ["alexnet-like", "lenet"] as const) {
    const spec: ModelSpec = { kind: "builtin", name: model, options: { seed: 1 } };
    const local = await buildModel(spec);
    try {
      const args = parseTrainArgs(
        ["--model", model, "--schedule", "auto", "--batch", "8"],
        {},
        undefined,
        root,
      );
      const lines: string[] = [];
      const { plan } = await choosePlan(args, local, spec, undefined, (line) => lines.push(line));
      const assignment = (plan as unknown as { assignment: Record<string, string> }).assignment;
      const withParameters = new Set(local.namedParameters().map((p) => p.name.split(".")[0]));
      const members = (g: string) =>
        Object.keys(assignment).filter((l) => assignment[l] === g && withParameters.has(l));
      const range = (names: string[]) => names.length === 1 ? names[0] : `${names[0]}..${names.at(-1)}`;
      const groups = plan.groups.map((g) => `${g} (${range(members(g))})`);
      const said = lines.join("\n");
      const chosen = /^auto schedule: (\S+) over groups (.*) \(priced at/m.exec(said);
      assert.ok(chosen, said);
      assert.equal(chosen[1], plan.name);
      const split = plan.groups.length === 2 ? `; split before ${members(plan.groups[0])[0]}` : "";
      assert.equal(chosen[2], `${groups.join(", ")}${split}`, said);
      // The why line's split, when it gives one, is the same cut with the same groups.
      const why = /Split before (\S+) into (.*?) and (.*?\)):/.exec(said);
      if (why && plan.name === "overlap") {
        assert.deepEqual([why[1], why[2], why[3]], [members(plan.groups[0])[0], groups[0], groups[1]], said);
      }
    } finally {
      local.dispose();
    }
  }
});

Deno.test("cli habits: auto prices its candidates in the --reduce mode the run uses", async () => {
  // Mutation tried: choosePlan calling autoSchedule without the mode priced an allreduce run as
  // master ("with 2 devices (master)"), and this test failed.
  const spec: ModelSpec = { kind: "builtin", name: "alexnet-like", options: { seed: 1 } };
  const local = await buildModel(spec);
  try {
    for (const reduce of ["master", "allreduce"]) {
      const args = parseTrainArgs(
        [
          "--model",
          "alexnet-like",
          "--schedule",
          "auto",
          "--batch",
          "8",
          "--devices",
          "2",
          "--reduce",
          reduce,
        ],
        {},
        undefined,
        root,
      );
      const lines: string[] = [];
      await choosePlan(args, local, spec, undefined, (line) => lines.push(line));
      const said = lines.join("\n");
      const modes = [...said.matchAll(/with 2 devices \((\w+)\)/g)].map((m) => m[1]);
      assert.ok(modes.length > 0, said);
      assert.deepEqual([...new Set(modes)], [reduce], said);
    }
  } finally {
    local.dispose();
  }
});

Deno.test("cli habits: no ANSI escape reaches piped stdout or stderr", async () => {
  // Mutation tried: stderrStyle saying live (as on a terminal) put "\x1b[2K" in the piped stderr.
  const runs = [
    await train([...FAST, "--model", "lenet", "--steps", "3"]),
    await train(["--help"]),
    await train(["--devices", "0"]),
    await train([...FAST, "--model", "lenet", "--steps", "2", "--trace", "/nonexistent/t.json"]),
  ];
  assert.equal(runs[0].code, 0, runs[0].stderr);
  assert.match(runs[0].stderr, /^step 3\/3 /m);
  assert.equal(runs[2].code, 2);
  for (const run of runs) {
    assert.ok(!`${run.stdout}${run.stderr}`.includes("\x1b["), JSON.stringify(run.stderr));
  }
});
