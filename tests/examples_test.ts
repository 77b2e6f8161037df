/**
 * The README cannot rot silently: the Caffe nets shipped in `examples/caffe/` import through the
 * train command's own model code, every command line the README shows parses with the train
 * command's own flag parser (mpirun and `deno task cluster` launches included), the CIFAR-10 layout
 * it tells users to download is the one the loader reads, every figure it quotes is still in the
 * bench file it names, and its contents list points at its headings. Fast: nothing trains, no bench
 * runs, no dataset is downloaded.
 */

import assert from "node:assert/strict";
import "../mod.ts";
import { parseTrainArgs } from "../cli/args.ts";
import { parseClusterArgs } from "../cli/cluster.ts";
import { loadImages, syntheticShape } from "../cli/data.ts";
import { chooseModel, NEEDS_INPUT_SHAPE } from "../cli/model.ts";
import { importCaffeNet, parsePrototxt } from "../engine/caffe/mod.ts";
import { repositoryState } from "../bench/stamp.ts";

const ROOT = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
const README = Deno.readTextFileSync(`${ROOT}/README.md`);
/** A machine big enough for every README command, so the limits checked are the flags', not ours. */
const MACHINE = { cores: 8, memoryBytes: 64 * 2 ** 30 };

/** The shipped Caffe nets: file, the net's name, its input per sample, classes, parameters. */
const SHIPPED = [
  {
    file: "cifar10_quick_train_test.prototxt",
    name: "CIFAR10_quick",
    input: [3, 32, 32],
    parameters: 145_578,
  },
  { file: "lenet_train_test.prototxt", name: "LeNet", input: [1, 28, 28], parameters: 431_080 },
] as const;

Deno.test("examples: the shipped Caffe prototxts import (through the train command's model code)", async () => {
  for (const { file, name, input, parameters } of SHIPPED) {
    const path = `${ROOT}/examples/caffe/${file}`;
    // Their Data layers read databases: the input shape comes from --data, as the command does.
    assert.equal(await chooseModel(path, 1), NEEDS_INPUT_SHAPE, file);
    const choice = await chooseModel(path, 1, input);
    assert.ok(choice !== NEEDS_INPUT_SHAPE);
    assert.equal(choice.name, name);
    assert.deepEqual([...choice.inputShape], input);
    assert.equal(choice.classes, 10);
    const { network } = importCaffeNet(Deno.readTextFileSync(path), { inputShape: input, phase: "TRAIN" });
    try {
      assert.equal(network.parameterCount(), parameters, file);
    } finally {
      network.dispose();
    }
  }
  // bvlc_alexnet's import is checked layer by layer in tests/io/caffe_test.ts; here it parses.
  const alexnet = parsePrototxt(
    Deno.readTextFileSync(`${ROOT}/examples/caffe/bvlc_alexnet_train_val.prototxt`),
  );
  assert.deepEqual(alexnet.first("name")?.value, { kind: "string", value: "AlexNet" });
  assert.equal(alexnet.all("layer").length, 26);
  const notice = Deno.readTextFileSync(`${ROOT}/examples/caffe/NOTICE`);
  for (
    const word of [
      "BVLC",
      "Redistribution and use in source and binary forms",
      ...SHIPPED.map((s) => s.file),
    ]
  ) {
    assert.ok(notice.includes(word), `NOTICE names ${word}`);
  }
});

/** The fenced `sh` blocks of the README, one command per line (continuations joined, comments cut). */
function readmeCommands(): string[] {
  const commands: string[] = [];
  for (const [, body] of README.matchAll(/^```sh\n([\s\S]*?)^```/gm)) {
    const joined = body.replace(/\\\n\s*/g, " ");
    for (const line of joined.split("\n")) {
      const command = line.replace(/(^|\s)#.*$/, "").trim();
      if (command) commands.push(command);
    }
  }
  return commands;
}

/** The words of a README command (no quotes are used there: checked). */
function words(command: string): string[] {
  assert.ok(!/["'$`]/.test(command), `the README command ${command} needs a shell's quoting: keep it plain`);
  return command.split(/\s+/);
}

/** `-np N` of an mpirun command. */
function ranksOf(argv: string[]): number {
  const i = argv.indexOf("-np");
  return i >= 0 ? Number(argv[i + 1]) : 1;
}

const launch = (size: number) => ({ rank: 0, size, localRank: 0, localSize: size });

// Mutations tried, each fails here: a misspelt flag in a README command (--stpes 200), and a shipped
// net's file misnamed in one (examples/caffe/lenet.prototxt).
Deno.test("examples: every train, mpirun and cluster command in the README parses", () => {
  const parsed: string[] = [];
  for (const command of readmeCommands()) {
    for (const segment of command.split(/\s*(?:&&|\|)\s*/)) {
      const argv = words(segment);
      /** Where `deno task <name>` is in the command, else -1. */
      const task = (name: string) => argv.findIndex((w, i) => w === name && argv[i - 1] === "task");
      const script = argv.findIndex((w) => w.endsWith("cli/train.ts"));
      const train = task("train"), cluster = task("cluster");
      if (script < 0 && train < 0 && cluster < 0) continue; // mkdir, curl, bench tasks
      try {
        if (script >= 0) {
          parseTrainArgs(
            argv.slice(script + 1),
            argv[0] === "mpirun" ? launch(ranksOf(argv)) : {},
            MACHINE,
            ROOT,
          );
        } else if (train >= 0) {
          const args = parseTrainArgs(argv.slice(train + 1), {}, MACHINE, ROOT);
          // A shipped file the README names is there (paths come back as typed when relative).
          if (args.model.includes("examples/")) {
            const file = args.model.startsWith("/") ? args.model : `${ROOT}/${args.model}`;
            assert.ok(Deno.statSync(file).isFile, `${args.model} is not there`);
          }
        } else {
          const own = parseClusterArgs(argv.slice(cluster + 1));
          assert.ok(own !== "help");
          parseTrainArgs(own.train, launch(own.hosts), MACHINE, ROOT);
        }
      } catch (error) {
        assert.fail(`README command refused: ${segment}\n  ${(error as Error).message}`);
      }
      parsed.push(segment);
    }
  }
  // The README shows the shipped nets, CIFAR-10, fine-tuning, MPI and the cluster: all were parsed.
  for (
    const needle of [
      "cifar10_quick_train_test",
      "cifar10:",
      "lenet_train_test",
      "--weights",
      "mpirun",
      "cluster",
    ]
  ) {
    assert.ok(parsed.some((p) => p.includes(needle)), `no parsed README command with ${needle}`);
  }
});

Deno.test("examples: the CIFAR-10 layout the README downloads is the one --data cifar10: reads", async () => {
  // The README: the binary version's archive, extracted into data/, read as cifar10:data/cifar-10-batches-bin.
  assert.ok(README.includes("https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"));
  const given = README.match(/--data (cifar10:\S+)/)?.[1];
  assert.equal(given, "cifar10:data/cifar-10-batches-bin");
  const root = await Deno.makeTempDir();
  try {
    // What the archive holds (cifar-10-batches-bin/), here with 3 records of 1 + 3072 bytes per file.
    const dir = `${root}/data/cifar-10-batches-bin`;
    await Deno.mkdir(dir, { recursive: true });
    const record = (label: number) =>
      Uint8Array.from({ length: 3073 }, (_, i) => (i === 0 ? label : i % 251));
    for (
      const name of [
        "data_batch_1",
        "data_batch_2",
        "data_batch_3",
        "data_batch_4",
        "data_batch_5",
        "test_batch",
      ]
    ) {
      await Deno.writeFile(`${dir}/${name}.bin`, new Uint8Array([...record(1), ...record(2), ...record(3)]));
    }
    for (const source of [given, "cifar10:data"]) {
      const args = parseTrainArgs(["--data", source], {}, MACHINE, root);
      const images = await loadImages(args.data, undefined, 1);
      assert.equal(images.train.count, 15, source);
      assert.equal(images.test.count, 3, source);
      assert.deepEqual([images.train.channels, images.train.height, images.train.width], [3, 32, 32]);
    }
    assert.deepEqual(syntheticShape("synthetic:3x32x32"), [3, 32, 32]);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

/** Numbers as written, thousands separators dropped, not parts of names such as fp16 or 848b141. */
function numbers(text: string): string[] {
  // ISO dates: 2026-12-01T06:38:36Z has the numbers 06 and 38 as 2026-12-01 06:38 does.
  const plain = text.replace(/(\d),(\d{3})/g, "$1$2").replace(/(\d)T(\d)/g, "$1 $2").replace(
    /(\d)Z\b/g,
    "$1",
  );
  return [...plain.matchAll(/(?<![\w.])\d+(?:\.\d+)*(?![\w])/g)].map((m) => m[0]);
}

/** The README's figure blocks: `<!-- figures: FILE -->` … `<!-- /figures -->`. */
function figureBlocks(): { file: string; text: string }[] {
  return [...README.matchAll(/<!-- figures: (\S+) -->([\s\S]*?)<!-- \/figures -->/g)].map((m) => ({
    file: m[1],
    text: m[2],
  }));
}

// Mutation tried: changing one figure of the README's kernel table (130.7 → 131.7) fails here,
// naming the number and the file; so does quoting a figure outside a block ("12 images/s").
Deno.test("examples: every figure the README quotes is in the bench file it names", async () => {
  const blocks = figureBlocks();
  assert.ok(blocks.length >= 7, `only ${blocks.length} figure blocks`);
  const repo = repositoryState(ROOT);
  for (const { file, text } of blocks) {
    assert.match(file, /^bench\/[A-Z_]+\.md$/);
    const source = Deno.readTextFileSync(`${ROOT}/${file}`);
    // A file without a date of its own is dated by its commit (git log), which the block names.
    const committed = (await repo.lastCommit(file)) ?? "";
    const known = new Set([...numbers(source), ...numbers(committed)]);
    assert.ok(text.includes(`\`${file}\``), `the block of ${file} names it`);
    assert.match(text, /\d{4}-\d{2}-\d{2}/, `the block of ${file} gives its date`);
    const stray = numbers(text).filter((n) => !known.has(n));
    assert.deepEqual(
      stray,
      [],
      `README quotes ${stray.join(", ")} as from ${file}, which no longer holds it`,
    );
  }
  // Outside the blocks (and code), no measured rate: every one is quoted from a file.
  const outside = README.replace(/<!-- figures: [\s\S]*?<!-- \/figures -->/g, "")
    .replace(/^```[\s\S]*?^```/gm, "")
    .replace(/`[^`\n]*`/g, "");
  const unquoted = outside.match(/\d[\d,.]*\s*(?:GFLOP\/s|images\/s)/g);
  assert.equal(unquoted, null, `figures outside a figures block: ${unquoted?.join("; ")}`);
});

/** GitHub's anchor of a heading. */
const anchor = (heading: string) =>
  heading.trim().toLowerCase().replace(/[^\p{L}\p{N}\s_-]/gu, "").replace(/\s/g, "-");

Deno.test("examples: the README starts with its contents and the quick start; its links resolve", () => {
  const headings = [...README.matchAll(/^(#{2,6}) (.+)$/gm)].map((m) => m[2]);
  assert.deepEqual(headings.slice(0, 2), ["Contents", "Quick start"]);
  const anchors = new Set(headings.map(anchor));
  for (const [, target] of README.matchAll(/\]\(#([^)]+)\)/g)) {
    assert.ok(anchors.has(target), `no heading for #${target}`);
  }
  // Installing from JSR is offered only after saying the package is not yet published.
  const unpublished = README.indexOf("not yet published");
  assert.ok(unpublished >= 0 && unpublished < README.indexOf("deno add jsr:@tandem/core"));
  // Users have no ../shared/ folder.
  assert.ok(!README.includes("shared/"), "the README points into shared/");
});
