/**
 * The table of tests/cli/bad_input_test.ts: bad command lines of `deno task train` and the files they
 * name (MNIST IDX and CIFAR-10 data, checkpoints, Caffe prototxt, schedule files), each with the
 * words its one-line message must hold. `writeFixtures` builds every file in a temporary directory.
 */

import { decodeSafetensors, encodeSafetensors, type HostTensor } from "../../engine/io/mod.ts";
import { BOOLEAN_FLAGS, STRING_FLAGS } from "../../cli/args.ts";
import protobuf from "protobufjs";

/** One bad input: what to run, and what the message must say (its flag, file or line). */
export interface BadInput {
  /** Shown as the step name. */
  name: string;
  /** The command line of `deno task train`. */
  argv: string[];
  /** Every one must be in the message's first line. */
  says: (string | RegExp)[];
  /** Must be in the message's indented lines (an error class that lists problems). */
  detail?: string;
  /** Seconds the refusal may take; the default is the early-check budget of 5 s. */
  budgetSeconds?: number;
  /** Environment variables set around the run (then restored). */
  env?: Record<string, string>;
}

/** The files the cases name. */
export interface Fixtures {
  dir: string;
  tinyModel: string;
  tinyCheckpoint: string;
  [name: string]: string;
}

const encoder = new TextEncoder();

function idx(magic: number, dims: number[], payload: Uint8Array): Uint8Array {
  const bytes = new Uint8Array(4 + 4 * dims.length + payload.length);
  const view = new DataView(bytes.buffer);
  view.setUint32(0, magic);
  dims.forEach((d, i) => view.setUint32(4 + 4 * i, d));
  bytes.set(payload, 4 + 4 * dims.length);
  return bytes;
}

const images = (count: number) => idx(2051, [count, 28, 28], new Uint8Array(count * 784).fill(7));
const labels = (count: number, value = 3) => idx(2049, [count], new Uint8Array(count).fill(value));

/** A valid MNIST IDX directory's four files, with `change` applied. */
function mnistFiles(change: Record<string, Uint8Array | null> = {}): Record<string, Uint8Array | null> {
  return {
    "train-images-idx3-ubyte": images(16),
    "train-labels-idx1-ubyte": labels(16),
    "t10k-images-idx3-ubyte": images(8),
    "t10k-labels-idx1-ubyte": labels(8),
    ...change,
  };
}

const CIFAR_FILES = [
  "data_batch_1.bin",
  "data_batch_2.bin",
  "data_batch_3.bin",
  "data_batch_4.bin",
  "data_batch_5.bin",
];
const record = (label = 1, count = 1) => {
  const bytes = new Uint8Array(3073 * count).fill(9);
  for (let r = 0; r < count; r++) bytes[3073 * r] = label;
  return bytes;
};

function cifarFiles(change: Record<string, Uint8Array | null> = {}): Record<string, Uint8Array | null> {
  const files: Record<string, Uint8Array | null> = { "test_batch.bin": record(1, 2) };
  for (const f of CIFAR_FILES) files[f] = record(2, 4);
  return { ...files, ...change };
}

async function writeDir(path: string, files: Record<string, Uint8Array | null>): Promise<string> {
  await Deno.mkdir(path, { recursive: true });
  for (const [name, bytes] of Object.entries(files)) {
    if (bytes) await Deno.writeFile(`${path}/${name}`, bytes);
  }
  return path;
}

/** A safetensors file with `header` (JSON text or raw bytes) and `data`, length field as given. */
function safetensors(header: string | Uint8Array, data = new Uint8Array(0), length?: bigint): Uint8Array {
  const json = typeof header === "string" ? encoder.encode(header) : header;
  const bytes = new Uint8Array(8 + json.length + data.length);
  new DataView(bytes.buffer).setBigUint64(0, length ?? BigInt(json.length), true);
  bytes.set(json, 8);
  bytes.set(data, 8 + json.length);
  return bytes;
}

/** The prototxt of a 1×8×8 net (conv 2×3×3, FC 10) whose checkpoints are a few KB. */
export const TINY_PROTOTXT = `name: "tiny"
layer { name: "in" type: "Input" top: "data" input_param { shape { dim: 1 dim: 1 dim: 8 dim: 8 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 2 kernel_size: 3 } }
layer { name: "ip" type: "InnerProduct" bottom: "c" top: "ip" inner_product_param { num_output: 10 } }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
`;

const INPUT =
  'layer { name: "in" type: "Input" top: "data" input_param { shape { dim: 1 dim: 1 dim: 8 dim: 8 } } }\n';

/** Bad prototxt files: name → [text, words of the message]. */
const PROTOTXT: Record<string, [string, (string | RegExp)[]]> = {
  "unterminated-string": ['name: "tiny\n', [":1:7:"]],
  "unclosed-layer": [`${INPUT}layer { name: "ip" type: "InnerProduct"\n`, [
    ":3:1:",
    "opened at line 2, column 7",
  ]],
  "stray-brace": [`${INPUT}}\n`, [":2:1:", "field name"]],
  "missing-colon": [`name "tiny"\n${INPUT}`, [":1:6:", '":"']],
  "bad-number": [`${INPUT.replace("dim: 8 dim: 8", "dim: 8x dim: 8")}`, [":1:", "8x"]],
  "unknown-layer": [
    `${INPUT}layer { name: "x" type: "Convolutionn" bottom: "data" top: "x" }\n`,
    [":2:", "Convolutionn"],
  ],
  "deep-nesting": [`${"a {\n".repeat(5_000)}${"}\n".repeat(5_000)}`, [":101:3:", "nest deeper than 100"]],
  "deep-list": [`${"a: [{ ".repeat(3_000)}`, [":1:", "nest deeper than 100"]],
  "zero-outputs": [
    `${INPUT}layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 0 } }\n`,
    [":2:", "num_output"],
  ],
  "negative-kernel": [
    `${INPUT}layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 2 kernel_size: -3 } }\n`,
    [":2:", "kernel"],
  ],
  "kernel-too-big": [
    `${INPUT}layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 2 kernel_size: 9 } }\n`,
    ["c"],
  ],
  "unknown-pool": [
    `${INPUT}layer { name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param { pool: FOO kernel_size: 2 } }\n`,
    [":2:", "FOO"],
  ],
  "unknown-bottom": [
    `${INPUT}layer { name: "ip" type: "InnerProduct" bottom: "nothing" top: "ip" inner_product_param { num_output: 10 } }\n`,
    [":2:", "nothing"],
  ],
  "binary": ["\u0000\u0001\u0002PK\u0003\u0004", [":1:1:"]],
  "eltwise-operation": [
    `${INPUT}layer { name: "e" type: "Eltwise" bottom: "data" bottom: "data" top: "e" eltwise_param { operation: MIN } }\n`,
    [":2:", 'layer "e"', "MIN", "PROD, SUM, MAX"],
  ],
  "concat-shapes": [
    `${INPUT}layer { name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param { kernel_size: 2 stride: 2 } }\n` +
    `layer { name: "cat" type: "Concat" bottom: "data" bottom: "p" top: "cat" }\n`,
    [":3:", 'layer "cat" (Concat)', '"data" [1, 8, 8]', '"p" [1, 4, 4]'],
  ],
  "bottom-read-early": [
    `${INPUT}layer { name: "a" type: "Eltwise" bottom: "data" bottom: "b" top: "a" }\n` +
    `layer { name: "b" type: "ReLU" bottom: "a" top: "b" }\n`,
    [":2:", 'reads blob "b"', 'layer "b" (line 3) writes it later'],
  ],
};

/** Bad schedule files (for LeNet's groups fc, conv): name → [text, words of the message]. */
const SCHEDULES: Record<string, [string, (string | RegExp)[]]> = {
  "typo": ["forward\nbackward fc; reduce fc; updat fc\n", ["line 2", "updat"]],
  "unknown-group": ["forward\nbackward fcc\n", ["line 2", "fcc"]],
  "deep-nesting": [`forward\n${"(".repeat(5_000)}\n`, ["line 2", "unexpected character"]],
  "deep-brackets": [`backward ${"[".repeat(5_000)}fc\n`, ["line 1", "unexpected character"]],
  "wrong-groups": ["groups conv, fc\nforward\n", ["line 1", "conv, fc"]],
  "shard-all": ["shard all\nforward\n", ["line 1", "all"]],
  "shard-late": ["forward\nshard fc\n", ["line 2", "shard"]],
  "two-names": ["schedule a b\nforward\n", ["line 1"]],
  "reduce-before-backward": [
    "forward\nreduce fc\nbackward fc; update fc; broadcast fc\nbackward conv; reduce conv; update conv; broadcast conv\n",
    ["line 2", "reduce fc"],
  ],
  "no-update": ["forward\nbackward all\nreduce all\nbroadcast all\n", [/update/]],
  "empty": ["# nothing\n", ["empty.sched"]],
  "binary": ["\u0000\u0001\u00ff", ["line 1"]],
};

/**
 * Writes every fixture into `dir` (and trains the tiny net for one step to have a real checkpoint,
 * through `train`).
 */
export async function writeFixtures(
  dir: string,
  train: (argv: string[]) => Promise<number>,
): Promise<Fixtures> {
  const f: Fixtures = { dir, tinyModel: `${dir}/tiny.prototxt`, tinyCheckpoint: `${dir}/tiny.safetensors` };
  await Deno.writeTextFile(f.tinyModel, TINY_PROTOTXT);
  const code = await train([
    "--model",
    f.tinyModel,
    "--data",
    "synthetic",
    "--steps",
    "1",
    "--devices",
    "1",
    "--batch",
    "8",
    "--checkpoint",
    f.tinyCheckpoint,
  ]);
  if (code !== 0) throw new Error(`the fixture run failed with ${code}`);
  f.emptyDir = `${dir}/empty`;
  await Deno.mkdir(f.emptyDir);
  f.missing = `${dir}/missing`;

  // .caffemodel files for the tiny net, encoded by protobufjs (not by our reader's code): ip's weight
  // blob as [3] instead of [10, 72], and the same bytes cut short.
  const pb = protobuf.parse(`syntax = "proto2";
    message BlobShape { repeated int64 dim = 1 [packed = true]; }
    message BlobProto { optional BlobShape shape = 7; repeated float data = 5 [packed = true]; }
    message LayerParameter { optional string name = 1; repeated BlobProto blobs = 7; }
    message NetParameter { repeated LayerParameter layer = 100; }`).root.lookupType("NetParameter");
  const wrongShape = pb.encode(pb.fromObject({
    layer: [{ name: "ip", blobs: [{ shape: { dim: [3] }, data: [1, 2, 3] }] }],
  })).finish();
  f.weightsWrongShape = `${dir}/wrong-shape.caffemodel`;
  await Deno.writeFile(f.weightsWrongShape, wrongShape);
  f.weightsTruncated = `${dir}/truncated.caffemodel`;
  await Deno.writeFile(f.weightsTruncated, wrongShape.subarray(0, wrongShape.length - 5));

  // MNIST IDX directories, one per defect.
  const mnist: Record<string, Record<string, Uint8Array | null>> = {
    "mnist-bad-magic": mnistFiles({
      "train-images-idx3-ubyte": idx(2049, [16, 28, 28], new Uint8Array(16 * 784)),
    }),
    "mnist-short-header": mnistFiles({ "train-images-idx3-ubyte": new Uint8Array([0, 0, 8, 3, 0, 0]) }),
    "mnist-truncated": mnistFiles({ "train-images-idx3-ubyte": images(16).subarray(0, 1000) }),
    "mnist-trailing": mnistFiles({ "t10k-images-idx3-ubyte": new Uint8Array([...images(8), 1, 2, 3]) }),
    "mnist-label-count": mnistFiles({ "train-labels-idx1-ubyte": labels(15) }),
    "mnist-label-range": mnistFiles({ "t10k-labels-idx1-ubyte": labels(8, 12) }),
    "mnist-no-labels": mnistFiles({ "train-labels-idx1-ubyte": null }),
    "mnist-empty-file": mnistFiles({ "t10k-images-idx3-ubyte": new Uint8Array(0) }),
    "mnist-bad-gzip": mnistFiles({
      "train-images-idx3-ubyte": null,
      "train-images-idx3-ubyte.gz": new Uint8Array([0x1f, 0x8b, 8, 0, 1, 2, 3, 4, 5, 6]),
    }),
    "mnist-huge-dims": mnistFiles({
      "train-images-idx3-ubyte": idx(2051, [4_000_000_000, 28, 28], new Uint8Array(8)),
    }),
    "mnist-wrong-size": mnistFiles({
      "train-images-idx3-ubyte": idx(2051, [16, 20, 20], new Uint8Array(16 * 400)),
      "t10k-images-idx3-ubyte": idx(2051, [8, 20, 20], new Uint8Array(8 * 400)),
    }),
    // Held-out digits of another size than the training ones (found only after the last step, once).
    "mnist-test-size": mnistFiles({
      "t10k-images-idx3-ubyte": idx(2051, [8, 24, 24], new Uint8Array(8 * 576)),
    }),
  };
  for (const [name, files] of Object.entries(mnist)) f[name] = await writeDir(`${dir}/${name}`, files);

  const cifar: Record<string, Record<string, Uint8Array | null>> = {
    "cifar-short-record": cifarFiles({ "data_batch_3.bin": new Uint8Array(3072) }),
    "cifar-partial-record": cifarFiles({ "data_batch_1.bin": new Uint8Array(3073 * 2 + 5) }),
    "cifar-empty-file": cifarFiles({ "test_batch.bin": new Uint8Array(0) }),
    "cifar-label-range": cifarFiles({ "data_batch_2.bin": record(10, 4) }),
    "cifar-gzip": cifarFiles({
      "data_batch_5.bin": (() => {
        const bytes = record(1, 1);
        bytes.set([0x1f, 0x8b], 0);
        return bytes;
      })(),
    }),
    "cifar-no-test": cifarFiles({ "test_batch.bin": null }),
    "cifar-no-train": cifarFiles({ "data_batch_4.bin": null }),
  };
  for (const [name, files] of Object.entries(cifar)) f[name] = await writeDir(`${dir}/${name}`, files);
  f.cifarGood = await writeDir(`${dir}/cifar-good`, cifarFiles());

  // Checkpoints of the tiny net, broken one way each.
  const good = await Deno.readFile(f.tinyCheckpoint);
  const { tensors, metadata } = decodeSafetensors(good);
  const rewrite = async (
    name: string,
    change: (t: Map<string, HostTensor>, m: Record<string, string>) => void,
  ) => {
    const t = new Map(tensors), m = { ...metadata };
    change(t, m);
    const collection: Record<string, HostTensor> = Object.fromEntries(t);
    f[name] = `${dir}/${name}.safetensors`;
    await Deno.writeFile(f[name], await encodeSafetensors(collection, m));
  };
  const raw = async (name: string, bytes: Uint8Array) => {
    f[name] = `${dir}/${name}.safetensors`;
    await Deno.writeFile(f[name], bytes);
  };
  await raw("ckpt-empty", new Uint8Array(0));
  await raw("ckpt-short", good.subarray(0, 5));
  await raw("ckpt-truncated", good.subarray(0, good.length - 100));
  await raw("ckpt-trailing", new Uint8Array([...good, 0, 0, 0, 0]));
  await raw("ckpt-huge-length", safetensors("{}", new Uint8Array(0), 1n << 40n));
  await raw("ckpt-length-past-end", safetensors("{}", new Uint8Array(0), 4096n));
  await raw("ckpt-not-json", safetensors("{not json at all}"));
  await raw("ckpt-array-header", safetensors("[1, 2, 3]"));
  await raw("ckpt-deep-header", safetensors(`{"a":${"[".repeat(5_000)}${"]".repeat(5_000)}}`));
  await raw("ckpt-not-utf8", safetensors(new Uint8Array([0x7b, 0xff, 0xfe, 0x7d])));
  await raw("ckpt-text", encoder.encode("this is not a checkpoint, just some text\n"));
  await rewrite("ckpt-wrong-model", (_, m) => (m.model_name = "lenet"));
  await rewrite("ckpt-wrong-format", (_, m) => (m.format = "something-else"));
  await rewrite("ckpt-bad-step", (_, m) => (m.step = "-3"));
  await rewrite("ckpt-bad-optimizer-json", (_, m) => (m.optimizer = "{"));
  await rewrite(
    "ckpt-deep-optimizer-json",
    (_, m) => (m.optimizer = `${"[".repeat(10_000)}${"]".repeat(10_000)}`),
  );
  await rewrite("ckpt-missing-tensor", (t) => t.delete("conv.bias"));
  await rewrite(
    "ckpt-extra-tensor",
    (t) => t.set("extra", { dtype: "F32", shape: [1], data: new Float32Array(1) }),
  );
  await rewrite("ckpt-wrong-dtype", (t) => {
    const bias = t.get("ip.bias")!;
    t.set("ip.bias", { dtype: "F16", shape: bias.shape, data: new Uint16Array(bias.shape[0]) });
  });
  await rewrite(
    "ckpt-wrong-shape",
    (t) => t.set("ip.bias", { dtype: "F32", shape: [5], data: new Float32Array(5) }),
  );
  // A diverged run's weight (saveCheckpoint refuses to write one; another tool might not).
  await rewrite("ckpt-nan-weight", (t) => {
    const bias = t.get("ip.bias")!;
    const data = Float32Array.from(bias.data as Float32Array);
    data[1] = NaN;
    t.set("ip.bias", { ...bias, data });
  });

  for (const [name, [text]] of Object.entries(PROTOTXT)) {
    f[`prototxt-${name}`] = `${dir}/${name}.prototxt`;
    await Deno.writeTextFile(f[`prototxt-${name}`], text);
  }
  // A Data layer reading a database declares no input shape; one whose mean_value count fits no image.
  const ip =
    'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 10 } }\n';
  f.dbNet = `${dir}/db_net.prototxt`;
  await Deno.writeTextFile(
    f.dbNet,
    `layer { name: "d" type: "Data" top: "data" top: "label" data_param { source: "train_lmdb" backend: LMDB batch_size: 8 } }\n${ip}`,
  );
  f.meanNet = `${dir}/mean_net.prototxt`;
  await Deno.writeTextFile(
    f.meanNet,
    `layer { name: "d" type: "Data" top: "data" top: "label" transform_param { crop_size: 8 force_gray: true mean_value: 1 mean_value: 2 } }\n${ip}`,
  );
  // A net with BatchNorm statistics (buffers), for the hybrid schedule, which cannot carry them yet.
  f.bnNet = `${dir}/bn_net.prototxt`;
  await Deno.writeTextFile(
    f.bnNet,
    `${INPUT}layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 2 kernel_size: 3 } }\n` +
      'layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c" }\n' +
      'layer { name: "ip" type: "InnerProduct" bottom: "c" top: "ip" inner_product_param { num_output: 10 } }\n',
  );
  for (const [name, [text]] of Object.entries(SCHEDULES)) {
    f[`sched-${name}`] = `${dir}/${name}.sched`;
    await Deno.writeTextFile(f[`sched-${name}`], text);
  }
  return f;
}

/** Small, fast settings every case starts from: LeNet on synthetic images, one step on 2 devices. */
const FAST = ["--model", "lenet", "--data", "synthetic", "--batch", "8", "--devices", "2", "--steps", "1"];
const TINY = (
  f: Fixtures,
) => ["--model", f.tinyModel, "--data", "synthetic", "--batch", "8", "--devices", "1"];

/** Every case of the table, naming files of `f`. */
export function badInputs(f: Fixtures): BadInput[] {
  const cases: BadInput[] = [];
  const add = (name: string, argv: string[], ...says: (string | RegExp)[]) =>
    cases.push({ name, argv, says });

  // Unknown flags and stray arguments.
  add("unknown --epoch", ["--epoch", "2"], "--epoch", "did you mean --epochs?");
  add("unknown --device", ["--device", "2"], "--device", "did you mean --devices?");
  add("unknown --lrate", ["--lrate", "0.1"], "unknown option --lrate");
  add("unknown short -x", ["-x"], "unknown option -x");
  add("unknown --Model", ["--Model", "lenet"], "--Model", "did you mean --model?");
  add("positional argument", ["lenet"], 'unexpected argument "lenet"');
  add("positional after flags", [...FAST, "extra"], 'unexpected argument "extra"');

  // Every flag that takes a value (the CLI's own list, so a new flag gets its rows): missing, and
  // empty (--checkpoint "" is an output-path row).
  for (const flag of STRING_FLAGS) {
    add(`--${flag} without a value`, [`--${flag}`], `--${flag}`, "argument missing");
  }
  for (const flag of STRING_FLAGS.filter((f) => f !== "checkpoint")) {
    add(`--${flag} ""`, [`--${flag}`, ""], `--${flag} needs a value`);
  }
  // Boolean flags take none.
  for (const flag of BOOLEAN_FLAGS) add(`--${flag}=yes`, [`--${flag}=yes`], `--${flag}`);

  // Integer flags.
  const minimum: Record<string, number> = {
    devices: 1,
    epochs: 1,
    steps: 0,
    batch: 1,
    accumulate: 1,
    seed: 0,
  };
  for (const [flag, min] of Object.entries(minimum)) {
    add(`--${flag} abc`, [`--${flag}`, "abc"], `--${flag} expects an integer, got "abc"`);
    add(`--${flag} 1.5`, [`--${flag}`, "1.5"], `--${flag} expects an integer, got "1.5"`);
    add(`--${flag} 1e3`, [`--${flag}`, "1e3"], `--${flag} expects an integer, got "1e3"`);
    add(`--${flag} 2^70`, [`--${flag}`, "1180591620717411303424"], `--${flag} expects an integer`);
    add(`--${flag} below ${min}`, [`--${flag}`, String(min - 1)], `--${flag} must be at least ${min}`);
  }
  for (const lr of ["0", "-1", "abc", "0x10", "Infinity", "1e400", "NaN", "1,5"]) {
    add(`--lr ${lr}`, ["--lr", lr], "--lr expects a positive number", `"${lr}"`);
  }

  // Flags with a fixed set of values.
  add("--backend gpu", ["--backend", "gpu"], "--backend must be one of cpu, webgpu");
  add("--backend CPU", ["--backend", "CPU"], "--backend", '"CPU"');
  add("--transport tcp", ["--transport", "tcp"], "--transport must be one of local, mpi");
  add("--transport mpl", ["--transport", "mpl"], "did you mean mpi?");
  add("--reduce mean", ["--reduce", "mean"], "--reduce must be one of master, allreduce");
  add("--reduce all-reduce", ["--reduce", "all-reduce"], "--reduce", "did you mean allreduce?");
  add("--wire fp8", ["--wire", "fp8"], "--wire must be one of fp32, fp16, bf16");
  add("--wire FP16", ["--wire", "FP16"], "--wire", '"FP16"');

  // --link: the strict grammar (issue 15 item 3).
  for (
    const link of [
      "-5MB/s",
      "1-2GB/s",
      "10GB",
      "0GB/s",
      "1e9B/s",
      "12gb/s",
      "1GB/s,",
      "1GB/s,-5us",
      "pcie-3",
      "10Gb/s!",
    ]
  ) {
    add(`--link ${link}`, ["--link", link], "--link", JSON.stringify(link), "B/s (bytes)");
  }
  add("--link=-5MB/s", ["--link=-5MB/s"], "--link", '"-5MB/s"');

  // Contradictions.
  add("--error-feedback without wire", ["--error-feedback"], "--error-feedback needs --wire fp16 or bf16");
  add("--data-plane without MPI", ["--data-plane", "mpi"], "--data-plane mpi", "needs --transport mpi");
  add("--data-plane unknown", ["--data-plane", "udp"], "--data-plane", "udp", "sockets", "mpi");
  add(
    "--wire fp16 --backend webgpu",
    ["--wire", "fp16", "--backend", "webgpu"],
    "--wire fp16",
    "--backend webgpu",
  );
  add(
    "--threads 2 --backend webgpu",
    ["--threads", "2", "--backend", "webgpu"],
    "--threads 2",
    "--backend webgpu",
  );
  add("--transport mpi without mpirun", ["--transport", "mpi"], "--transport mpi", "start it with mpirun");
  add("--batch 9 over 2", ["--batch", "9", "--devices", "2"], "--batch 9 does not split evenly over 2");
  add("--accumulate 3 of 4", ["--batch", "8", "--devices", "2", "--accumulate", "3"], "--accumulate 3");
  add("--accumulate 0", ["--accumulate", "0"], "--accumulate must be at least 1, got 0");
  add("--threads 0", ["--threads", "0"], "--threads must be at least 1, got 0");
  add("--compute-nice 20", ["--compute-nice", "20"], "--compute-nice must be at most 19, got 20");
  add("--compute-nice -1", ["--compute-nice", "-1"], "--compute-nice must be at least 0, got -1");
  add("--steps 0 --resume missing", ["--steps", "0", "--resume", f.missing], "--resume", "--steps 0");
  add("--steps 0 --trace", ["--steps", "0", "--trace", `${f.dir}/t.json`], "--trace", "--steps 0");
  add("--steps 0 --report", ["--steps", "0", "--report", `${f.dir}/r.html`], "--report", "--steps 0");
  add(
    "--trace = --report",
    [...FAST, "--trace", `${f.dir}/same`, "--report", `${f.dir}/same`],
    "--trace",
    "--report",
  );
  add(
    "--trace = --resume",
    [...FAST, "--resume", f.tinyCheckpoint, "--trace", f.tinyCheckpoint],
    "--trace",
    "--resume",
  );
  add("--report = --model", ["--model", f.tinyModel, "--report", f.tinyModel], "--report", "--model");
  add(
    "--report = --schedule",
    [...FAST, "--schedule", f["sched-typo"], "--report", f["sched-typo"]],
    "--report",
  );
  add("--devices 100000", ["--devices", "100000", "--batch", "100000"], "--devices 100000: at most", "cores");
  add("--devices 0", ["--devices", "0"], "--devices must be at least 1, got 0");
  // Stale MPI variables (issue 15 item 3): a launch needs mpirun's PMIx variables too.
  cases.push({
    name: "--transport mpi with stale OMPI_* variables",
    argv: ["--transport", "mpi"],
    env: { OMPI_COMM_WORLD_SIZE: "2", OMPI_COMM_WORLD_RANK: "0" },
    says: ["--transport mpi", "OMPI_COMM_WORLD_SIZE=2", "PMIX_RANK is not set"],
  });

  // --model and --data.
  add("--model unknown", ["--model", "lenett"], '--model: unknown model "lenett"', "did you mean lenet?");
  add(
    "--model missing prototxt",
    ["--model", `${f.dir}/none.prototxt`],
    "--model",
    "none.prototxt: no such file",
  );
  add("--model a directory", ["--model", f.emptyDir], "--model", "unknown model");
  add("--data unknown", ["--data", "imagenet"], "--data must be one of", '"imagenet"');
  add("--data mnist-idx without dir", ["--data", "mnist-idx:"], "--data mnist-idx:<dir> needs a directory");
  add("--data cifar10 without dir", ["--data", "cifar10:"], "--data cifar10:<dir> needs a directory");
  add("--data mnist-idx missing dir", [...FAST, "--data", `mnist-idx:${f.missing}`], f.missing);
  add("--data cifar10 missing dir", ["--model", "cifar-quick", "--data", `cifar10:${f.missing}`], f.missing);
  add("--data mnist-idx empty dir", [...FAST, "--data", `mnist-idx:${f.emptyDir}`], f.emptyDir, "found none");
  add(
    "--data cifar10 empty dir",
    ["--model", "cifar-quick", "--data", `cifar10:${f.emptyDir}`],
    f.emptyDir,
    "missing",
  );
  for (const bad of ["3x32", "0x28x28", "3x28x28x1", "1.5x28x28", "", "3x28xx28"]) {
    add(
      `--data synthetic:${bad}`,
      [...FAST, "--data", `synthetic:${bad}`],
      `--data synthetic:${bad}:`,
      "expected synthetic:CxHxW",
      `got "${bad}"`,
    );
  }
  add(
    "--data synthetic too large",
    [...FAST, "--data", "synthetic:4096x4096x4096"],
    "--data synthetic:4096x4096x4096",
    "expected synthetic:CxHxW of at most",
  );
  add(
    "--data synthetic for a net without an input shape",
    ["--model", f.dbNet, "--data", "synthetic", "--steps", "1"],
    "--data synthetic",
    "does not declare one",
    "synthetic:CxHxW",
  );
  add(
    "--data synthetic:CxHxW wrong for the net's crop",
    ["--model", f.meanNet, "--data", "synthetic:1x4x4", "--steps", "1"],
    "--data synthetic:1x4x4",
    "1×4×4",
    "1×8×8",
  );
  add(
    "transform_param mean_value count",
    ["--model", f.meanNet, "--data", "synthetic", "--steps", "1"],
    "--data synthetic",
    "2 mean_value entries",
    "expected 1 or 1",
  );
  add("model and data disagree", ["--model", "cifar-quick", "--data", "mnist"], "1×28×28", "3×32×32");
  add(
    "lenet on CIFAR images",
    ["--model", "lenet", "--data", `cifar10:${f.cifarGood}`, "--steps", "1"],
    "3×32×32",
  );

  // MNIST IDX files.
  const idxSays: Record<string, (string | RegExp)[]> = {
    "mnist-bad-magic": ["train-images-idx3-ubyte", "magic"],
    "mnist-short-header": ["train-images-idx3-ubyte", "truncated header"],
    "mnist-truncated": ["train-images-idx3-ubyte", "truncated"],
    "mnist-trailing": ["t10k-images-idx3-ubyte", "trailing data"],
    "mnist-label-count": ["train-labels-idx1-ubyte", "expected 16 labels"],
    "mnist-label-range": ["t10k-labels-idx1-ubyte", "found 12"],
    "mnist-no-labels": ["mnist-no-labels", "train-labels-idx1-ubyte"],
    "mnist-empty-file": ["t10k-images-idx3-ubyte"],
    "mnist-bad-gzip": ["train-images-idx3-ubyte.gz"],
    "mnist-huge-dims": ["train-images-idx3-ubyte", "4000000000"],
    "mnist-wrong-size": ["1×20×20", "1×28×28"],
    "mnist-test-size": ["held-out images are 1×24×24", "training images are 1×28×28"],
  };
  for (const [name, says] of Object.entries(idxSays)) {
    add(name, [...FAST, "--data", `mnist-idx:${f[name]}`], ...says);
  }

  // CIFAR-10 binaries.
  const cifarSays: Record<string, (string | RegExp)[]> = {
    "cifar-short-record": ["data_batch_3.bin", "3073", "found 3072 bytes"],
    "cifar-partial-record": ["data_batch_1.bin", "partial"],
    "cifar-empty-file": ["test_batch.bin", "found 0 bytes"],
    "cifar-label-range": ["data_batch_2.bin", "found 10"],
    "cifar-gzip": ["data_batch_5.bin", "gzip"],
    "cifar-no-test": ["cifar-no-test", "test_batch.bin"],
    "cifar-no-train": ["cifar-no-train", "missing data_batch_4.bin"],
  };
  for (const [name, says] of Object.entries(cifarSays)) {
    add(
      name,
      ["--model", "cifar-quick", "--data", `cifar10:${f[name]}`, "--steps", "1", "--batch", "8"],
      ...says,
    );
  }

  // Checkpoints: the file must exist and be readable before anything starts, and what is in it is
  // checked against the model (loadCheckpoint's dry run) before any device starts.
  add(
    "--resume missing",
    [...TINY(f), "--steps", "2", "--resume", f.missing],
    "--resume",
    f.missing,
    "no such file",
  );
  // BatchNorm statistics are buffers each device keeps (CPU Workers, WebGPU devices, MPI ranks); a
  // hybrid schedule's head shards cannot carry them yet, refused by the trainer's own check
  // (`checkBuffersCarried`) before any device starts, naming the flags. Mutation tried: the train
  // command not calling it (the trainer's own refusal then names no flag) fails this case.
  add(
    "BatchNorm net with --schedule hybrid",
    ["--model", f.bnNet, "--data", "synthetic", "--batch", "8", "--steps", "1", "--schedule", "hybrid"],
    "bn_net.prototxt with --schedule hybrid: the net keeps BatchNorm statistics (3 buffers)",
    "hybrid schedule's head shards cannot carry yet",
    "use a data-parallel schedule",
  );

  // .caffemodel weights: read and checked against the net before any device starts.
  add("--weights missing", [...TINY(f), "--steps", "2", "--weights", f.missing], "--weights", "no such file");
  add(
    "--weights truncated",
    [...TINY(f), "--steps", "2", "--weights", f.weightsTruncated],
    "truncated.caffemodel: byte",
  );
  add(
    "--weights wrong shape",
    [...TINY(f), "--steps", "2", "--weights", f.weightsWrongShape],
    "wrong-shape.caffemodel: weights do not fit the net",
    'shape differs: "ip.weight" is [10, 72] in the net, [3] in the file',
  );
  add(
    "--weights with --resume",
    [...TINY(f), "--steps", "2", "--weights", f.weightsWrongShape, "--resume", f.tinyCheckpoint],
    "--weights and --resume cannot be combined",
  );
  add(
    "--weights with a built-in model",
    [...FAST, "--weights", f.weightsWrongShape],
    "--weights",
    "built-in",
  );
  add("--resume a directory", [...TINY(f), "--steps", "2", "--resume", f.emptyDir], "--resume", "not a file");
  // [words of the first line, words of the indented problem list]
  const checkpointSays: Record<string, [string | RegExp, string?]> = {
    "ckpt-empty": ["truncated"],
    "ckpt-short": ["truncated: 5 bytes"],
    "ckpt-truncated": ["truncated"],
    "ckpt-trailing": ["trailing bytes"],
    "ckpt-huge-length": ["exceeds the 100000000-byte limit"],
    "ckpt-length-past-end": ["reaches beyond the end of the file"],
    "ckpt-not-json": ["not valid JSON"],
    "ckpt-array-header": ['does not start with "{"'],
    "ckpt-deep-header": ["nests deeper than 3 levels"],
    "ckpt-not-utf8": ["not valid UTF-8"],
    "ckpt-text": [/header length \d+ exceeds|truncated/],
    "ckpt-wrong-model": ["checkpoint does not fit", "wrong model name"],
    "ckpt-wrong-format": ["checkpoint does not fit", 'metadata "format"'],
    "ckpt-bad-step": ["checkpoint does not fit", 'metadata "step"'],
    "ckpt-bad-optimizer-json": ["checkpoint does not fit", "not valid JSON"],
    "ckpt-deep-optimizer-json": ["checkpoint does not fit", "nests deeper than 32 levels"],
    "ckpt-missing-tensor": ["checkpoint does not fit", 'missing: parameter "conv.bias"'],
    "ckpt-extra-tensor": ["checkpoint does not fit", 'unexpected: "extra"'],
    "ckpt-wrong-dtype": ["checkpoint does not fit", "dtype differs"],
    "ckpt-wrong-shape": ["checkpoint does not fit", "shape differs"],
    "ckpt-nan-weight": ["checkpoint does not fit", "holds 1 NaN or infinite values"],
  };
  for (const [name, [says, detail]] of Object.entries(checkpointSays)) {
    cases.push({
      name,
      argv: [...TINY(f), "--steps", "2", "--resume", f[name]],
      says: [`${name}.safetensors`, says],
      detail,
    });
  }
  add("--resume lenet with the tiny net's checkpoint", [
    ...FAST,
    "--devices",
    "1",
    "--resume",
    f.tinyCheckpoint,
  ], "tiny.safetensors: checkpoint does not fit");
  Object.assign(cases.at(-1)!, { detail: "wrong model name" });

  // Caffe prototxt files.
  for (const [name, [, says]] of Object.entries(PROTOTXT)) {
    add(
      `prototxt ${name}`,
      ["--model", f[`prototxt-${name}`], "--data", "synthetic", "--steps", "1"],
      `${name}.prototxt`,
      ...says,
    );
  }

  // Schedule files.
  for (const [name, [, says]] of Object.entries(SCHEDULES)) {
    add(`schedule ${name}`, [...FAST, "--schedule", f[`sched-${name}`]], ...says);
  }
  add("--schedule missing file", [...FAST, "--schedule", `${f.dir}/none.sched`], "--schedule", "none.sched");
  add("--schedule a directory", [...FAST, "--schedule", f.emptyDir], "--schedule", f.emptyDir);
  add("--schedule typo", [...FAST, "--schedule", "overlpa"], "--schedule", "did you mean overlap?");

  // Output paths, checked before step 1 (cli/outputs.ts), and the snapshot flags.
  const run = [...FAST, "--steps", "3"];
  add('--checkpoint ""', [...run, "--checkpoint", ""], "--checkpoint needs a value");
  add(
    "--checkpoint missing dir",
    [...run, "--checkpoint", `${f.missing}/run.safetensors`],
    "--checkpoint",
    "does not exist",
  );
  add("--checkpoint a directory", [...run, "--checkpoint", f.emptyDir], "--checkpoint", "is a directory");
  add(
    "--checkpoint under a file",
    [...run, "--checkpoint", `${f.tinyModel}/run.safetensors`],
    "--checkpoint",
    "not a directory",
  );
  add("--trace missing dir", [...run, "--trace", `${f.missing}/t.json`], "--trace", "does not exist");
  add("--trace a directory", [...run, "--trace", f.emptyDir], "--trace", "is a directory");
  add("--report missing dir", [...run, "--report", `${f.missing}/r.html`], "--report", "does not exist");
  add("--report a directory", [...run, "--report", f.emptyDir], "--report", "is a directory");
  add("--report under /dev/null", [...run, "--report", "/dev/null/r.html"], "--report", "not a directory");
  add("--report unwritable place", [...run, "--report", "/proc/tandem-report.html"], "--report", "/proc");
  add(
    "--trace = --checkpoint",
    [...run, "--checkpoint", `${f.dir}/same.safetensors`, "--trace", `${f.dir}/same.safetensors`],
    "--trace",
    "--checkpoint",
  );
  add(
    "--checkpoint-every without --checkpoint",
    [...run, "--checkpoint-every", "2"],
    "--checkpoint-every 2 needs --checkpoint",
  );
  add(
    "--checkpoint-every 0",
    [...run, "--checkpoint", `${f.dir}/c.safetensors`, "--checkpoint-every", "0"],
    "--checkpoint-every must be at least 1",
  );
  add(
    "--checkpoint-every x",
    [...run, "--checkpoint", `${f.dir}/c.safetensors`, "--checkpoint-every", "x"],
    "--checkpoint-every expects an integer",
  );
  add("--checkpoint-every 1.5", [
    ...run,
    "--checkpoint",
    `${f.dir}/c.safetensors`,
    "--checkpoint-every",
    "1.5",
  ], "--checkpoint-every expects an integer");
  add(
    "--keep without --checkpoint-every",
    [...run, "--checkpoint", `${f.dir}/c.safetensors`, "--keep", "2"],
    "--keep 2",
    "needs --checkpoint-every",
  );
  add("--keep 0", [
    ...run,
    "--checkpoint",
    `${f.dir}/c.safetensors`,
    "--checkpoint-every",
    "1",
    "--keep",
    "0",
  ], "--keep must be at least 1");
  add("--keep -1", [
    ...run,
    "--checkpoint",
    `${f.dir}/c.safetensors`,
    "--checkpoint-every",
    "1",
    "--keep",
    "-1",
  ], "--keep must be at least 1");
  add("--keep empty", [
    ...run,
    "--checkpoint",
    `${f.dir}/c.safetensors`,
    "--checkpoint-every",
    "1",
    "--keep",
    "",
  ], "--keep needs a value");

  return cases;
}
