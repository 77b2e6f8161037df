/**
 * `--data synthetic:CxHxW` and a Caffe data layer's preprocessing in `deno task train` (issue 17
 * item 4): the synthetic grammar, a `train_test` prototxt whose Data layer reads a database (so it
 * declares no input shape) training on `synthetic:3x32x32`, and `transform_param`'s `crop_size`,
 * `mean_value` and `scale` reaching the batches exactly.
 */

import assert from "node:assert/strict";
import { fitToModel, MAX_SYNTHETIC_ELEMENTS, syntheticShape } from "../../cli/data.ts";
import { CliError } from "../../cli/errors.ts";
import { chooseModel, NEEDS_INPUT_SHAPE } from "../../cli/model.ts";
import { DataLoader, type ImageDataset } from "../../mod.ts";
import { importCaffeNet } from "../../engine/caffe/mod.ts";

const dir = await Deno.makeTempDir({ prefix: "tandem_cli_data_test_" });

/** The layers of Caffe's examples/cifar10/cifar10_quick_train_test.prototxt, written out here. */
const CIFAR10_QUICK_TRAIN_TEST = `name: "CIFAR10_quick"
layer {
  name: "cifar" type: "Data" top: "data" top: "label"
  include { phase: TRAIN }
  transform_param { mean_file: "examples/cifar10/mean.binaryproto" }
  data_param { source: "examples/cifar10/cifar10_train_lmdb" batch_size: 100 backend: LMDB }
}
layer {
  name: "cifar" type: "Data" top: "data" top: "label"
  include { phase: TEST }
  transform_param { mean_file: "examples/cifar10/mean.binaryproto" }
  data_param { source: "examples/cifar10/cifar10_test_lmdb" batch_size: 100 backend: LMDB }
}
layer {
  name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  param { lr_mult: 1 } param { lr_mult: 2 }
  convolution_param { num_output: 32 pad: 2 kernel_size: 5 stride: 1
    weight_filler { type: "gaussian" std: 0.0001 } bias_filler { type: "constant" } }
}
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "relu1" type: "ReLU" bottom: "pool1" top: "pool1" }
layer {
  name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
  param { lr_mult: 1 } param { lr_mult: 2 }
  convolution_param { num_output: 32 pad: 2 kernel_size: 5 stride: 1
    weight_filler { type: "gaussian" std: 0.01 } bias_filler { type: "constant" } }
}
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { pool: AVE kernel_size: 3 stride: 2 } }
layer {
  name: "conv3" type: "Convolution" bottom: "pool2" top: "conv3"
  param { lr_mult: 1 } param { lr_mult: 2 }
  convolution_param { num_output: 64 pad: 2 kernel_size: 5 stride: 1
    weight_filler { type: "gaussian" std: 0.01 } bias_filler { type: "constant" } }
}
layer { name: "relu3" type: "ReLU" bottom: "conv3" top: "conv3" }
layer { name: "pool3" type: "Pooling" bottom: "conv3" top: "pool3" pooling_param { pool: AVE kernel_size: 3 stride: 2 } }
layer {
  name: "ip1" type: "InnerProduct" bottom: "pool3" top: "ip1"
  param { lr_mult: 1 } param { lr_mult: 2 }
  inner_product_param { num_output: 64 weight_filler { type: "gaussian" std: 0.1 } bias_filler { type: "constant" } }
}
layer {
  name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
  param { lr_mult: 1 } param { lr_mult: 2 }
  inner_product_param { num_output: 10 weight_filler { type: "gaussian" std: 0.1 } bias_filler { type: "constant" } }
}
layer { name: "accuracy" type: "Accuracy" bottom: "ip2" bottom: "label" top: "accuracy" include { phase: TEST } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
`;

Deno.test("cli data: synthetic:CxHxW takes x or ×, refuses anything else naming --data and the grammar", () => {
  // Mutation tried: dropping `d > 0` from the check let "0x32x32" through and this failed.
  assert.deepEqual(syntheticShape("synthetic:3x32x32"), [3, 32, 32]);
  assert.deepEqual(syntheticShape("synthetic:1×28×28"), [1, 28, 28]);
  assert.equal(syntheticShape("synthetic"), undefined);
  assert.equal(syntheticShape("mnist"), undefined);
  for (const bad of ["", "3x32", "3x32x32x1", "0x32x32", "3x-1x2", "3.5x2x2", "3x 32x32", "axbxc", "3xx32"]) {
    assert.throws(
      () => syntheticShape(`synthetic:${bad}`),
      (e: unknown) =>
        e instanceof CliError && e.message.startsWith(`--data synthetic:${bad}:`) &&
        e.message.includes("synthetic:CxHxW") && e.message.includes(`"${bad}"`) && !e.message.includes("\n"),
      bad,
    );
  }
  assert.deepEqual(syntheticShape("synthetic:4x1024x1024"), [4, 1024, 1024]);
  assert.throws(
    () => syntheticShape("synthetic:5x1024x1024"),
    new RegExp(`at most ${MAX_SYNTHETIC_ELEMENTS}`),
  );
});

Deno.test("cli data: a train_test prototxt whose Data layer reads LMDB trains on --data synthetic:3x32x32", async () => {
  const path = `${dir}/cifar10_quick_train_test.prototxt`;
  await Deno.writeTextFile(path, CIFAR10_QUICK_TRAIN_TEST);
  // The database would say the shape; without it the import cannot.
  assert.equal(await chooseModel(path, 1), NEEDS_INPUT_SHAPE);
  // Mutation tried: chooseModelForData ignoring the flag's shape (`given` always undefined) made
  // this run refuse ("--data synthetic is shaped for the model's input") and the test fail.
  const run = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      "cli/train.ts",
      ...["--model", path, "--data", "synthetic:3x32x32", "--steps", "3", "--batch", "8", "--json"],
    ],
    stdout: "piped",
    stderr: "piped",
    stdin: "null",
  }).output();
  const stderr = new TextDecoder().decode(run.stderr);
  assert.equal(run.code, 0, stderr);
  const result = JSON.parse(new TextDecoder().decode(run.stdout));
  assert.equal(result.step, 3);
  assert.equal(result.model, "CIFAR10_quick");
  assert.ok(Number.isFinite(result.loss));
  assert.match(stderr, /on synthetic 3×32×32, 10 classes/);
});

Deno.test("cli data: a Data layer's crop_size, mean_value and scale shape the batches exactly", async () => {
  const path = `${dir}/crop_mean.prototxt`;
  await Deno.writeTextFile(
    path,
    `layer { name: "d" type: "Data" top: "data" top: "label"
        transform_param { crop_size: 4 mean_value: 10 mean_value: 20 mean_value: 30 scale: 0.5 mirror: true }
        data_param { source: "train_lmdb" backend: LMDB batch_size: 4 } }
     layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 3 } }
     layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }`,
  );
  assert.deepEqual(importCaffeNet(await Deno.readTextFile(path)).transform, {
    scale: 0.5,
    meanValue: [10, 20, 30],
    cropSize: 4,
    mirror: true,
  });
  const choice = await chooseModel(path, 1);
  assert.notEqual(choice, NEEDS_INPUT_SHAPE);
  if (choice === NEEDS_INPUT_SHAPE) return;
  assert.deepEqual(choice.inputShape, [3, 4, 4]);
  // Two 3×6×6 images whose pixel (c, y, x) of image n is 100n + 36c + 6y + x: every value distinct.
  const [C, H, W, N] = [3, 6, 6, 2];
  const pixels = new Float32Array(N * C * H * W).map((_, i) => 100 * Math.floor(i / 108) + (i % 108));
  const images: ImageDataset = {
    name: "known",
    images: pixels,
    labels: new Int32Array([0, 1]),
    count: N,
    channels: C,
    height: H,
    width: W,
    classes: 3,
  };
  // Mutations tried, each failing this test: fitToModel ignoring transform.meanValue (the images'
  // channel means instead), ignoring transform.scale (1/64 instead of 0.5), and dropping the crop
  // (cropSize undefined: whole 6×6 batches).
  const data = fitToModel({ train: images, test: images, description: "known" }, "known", choice);
  assert.deepEqual([data.cropSize, data.meanValue, data.scale, data.mirror], [4, [10, 20, 30], 0.5, true]);
  const loader = new DataLoader(data.test, { ...data, batchSize: 2, mode: "eval" });
  const batch = loader.batch(0, 0);
  assert.deepEqual(batch.images.shape, [2, 3, 4, 4]);
  const got = Array.from(await batch.images.data() as Float32Array);
  batch.dispose();
  // The centre crop of 6×6 to 4×4 starts at row 1, column 1; then (pixel − mean[c]) · scale.
  const expected: number[] = [];
  for (let n = 0; n < N; n++) {
    for (let c = 0; c < C; c++) {
      for (let y = 0; y < 4; y++) {
        for (let x = 0; x < 4; x++) {
          expected.push((100 * n + 36 * c + 6 * (y + 1) + (x + 1) - [10, 20, 30][c]) * 0.5);
        }
      }
    }
  }
  assert.deepEqual(got, expected);
});

Deno.test("cli data: cleanup", async () => {
  await Deno.remove(dir, { recursive: true });
});
