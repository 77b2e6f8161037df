/**
 * `.caffemodel` import (issue 17 item 3): fixtures are encoded by protobufjs, an encoder independent
 * of our reader, from the subset of Caffe's caffe.proto below (Caffe's field numbers), never by code
 * of ours. Each test names the mutation of engine/caffe/caffemodel.ts that made it fail.
 */

import assert from "node:assert/strict";
import protobuf from "protobufjs";
import "../../mod.ts";
import { loadCaffeWeights } from "../../mod.ts";
import { CaffeModelError, importCaffeNet, parseCaffeModel } from "../../engine/caffe/mod.ts";

// Caffe's messages with Caffe's field numbers; the Unpacked* copies write `data` one fixed32 per
// value (proto2's default), as old Caffe files may.
const PROTO = `
syntax = "proto2";
package caffe;
message BlobShape { repeated int64 dim = 1 [packed = true]; }
message BlobProto {
  optional BlobShape shape = 7;
  repeated float data = 5 [packed = true];
  optional int32 num = 1; optional int32 channels = 2; optional int32 height = 3; optional int32 width = 4;
}
message UnpackedBlobProto { optional BlobShape shape = 7; repeated float data = 5 [packed = false]; }
message LayerParameter { optional string name = 1; optional string type = 2; repeated BlobProto blobs = 7; }
message UnpackedLayerParameter { optional string name = 1; optional string type = 2; repeated UnpackedBlobProto blobs = 7; }
message V1LayerParameter { optional string name = 4; repeated BlobProto blobs = 6; }
message NetParameter { optional string name = 1; repeated LayerParameter layer = 100; repeated V1LayerParameter layers = 2; }
message UnpackedNetParameter { optional string name = 1; repeated UnpackedLayerParameter layer = 100; }
`;
const root = protobuf.parse(PROTO).root;
const encode = (type: string, value: Record<string, unknown>): Uint8Array => {
  const T = root.lookupType(`caffe.${type}`);
  const problem = T.verify(value);
  if (problem) throw new Error(problem);
  return T.encode(T.fromObject(value)).finish();
};

// LeNet-like: conv1 2×1×3×3 on 1×8×8 → 2×6×6, pool 2 → 2×3×3, ip1 3×18.
const PROTOTXT = `name: "lenetish"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 1 dim: 8 dim: 8 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param { num_output: 2 kernel_size: 3 } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool1" top: "ip1" inner_product_param { num_output: 3 } }
`;

/** Distinct values per parameter, some not exactly representable (0.1 steps) to test float32 rounding. */
const values = (n: number, base: number) => Array.from({ length: n }, (_, i) => base + 0.1 * i);
const W = {
  "conv1.weight": { shape: [2, 1, 3, 3], data: values(18, 1) },
  "conv1.bias": { shape: [2], data: values(2, -5) },
  "ip1.weight": { shape: [3, 18], data: values(54, 10) },
  "ip1.bias": { shape: [3], data: values(3, -20) },
};

const blob = (key: keyof typeof W) => ({ shape: { dim: W[key].shape }, data: W[key].data });
const modernLayers = () => [
  { name: "data", type: "Input" },
  { name: "conv1", type: "Convolution", blobs: [blob("conv1.weight"), blob("conv1.bias")] },
  { name: "pool1", type: "Pooling" },
  { name: "ip1", type: "InnerProduct", blobs: [blob("ip1.weight"), blob("ip1.bias")] },
];

function freshNet() {
  return importCaffeNet(PROTOTXT, { seed: 3 }).network;
}

function assertLoaded(net: ReturnType<typeof freshNet>): void {
  for (const p of net.namedParameters()) {
    const want = W[p.name as keyof typeof W];
    assert.ok(want, p.name);
    assert.deepEqual([...p.tensor.dataSync()], [...new Float32Array(want.data)], p.name);
  }
}

function snapshot(net: ReturnType<typeof freshNet>): number[][] {
  return net.namedParameters().map((p) => [...p.tensor.dataSync()]);
}

// Mutation: reading the packed `data` run as one unpacked float (wire type 2 treated as fixed32)
// failed this test (and three others).
Deno.test("caffemodel: protobufjs-encoded layer/BlobShape weights load exactly into conv1/ip1", () => {
  const bytes = encode("NetParameter", { name: "lenetish", layer: modernLayers() });
  const net = freshNet();
  loadCaffeWeights(net.namedParameters(), parseCaffeModel(bytes, "lenet.caffemodel"));
  assertLoaded(net);
  net.dispose();
});

// Mutation: ignoring NetParameter field 2 (legacy `layers`) left every parameter "not in the
// file"; not padding the target shape for legacy blobs (exact compare) refused [1, 1, 3, 18].
Deno.test("caffemodel: legacy V1 layers with num/channels/height/width blobs are reshaped", () => {
  const legacy = (key: keyof typeof W) => {
    const s = W[key].shape, padded = [...Array(4 - s.length).fill(1), ...s];
    return { num: padded[0], channels: padded[1], height: padded[2], width: padded[3], data: W[key].data };
  };
  const bytes = encode("NetParameter", {
    layers: [
      { name: "conv1", blobs: [legacy("conv1.weight"), legacy("conv1.bias")] },
      { name: "pool1" },
      { name: "ip1", blobs: [legacy("ip1.weight"), legacy("ip1.bias")] },
    ],
  });
  const layers = parseCaffeModel(bytes);
  assert.deepEqual(layers.find((l) => l.name === "ip1")!.blobs[0].shape, [1, 1, 3, 18]);
  const net = freshNet();
  loadCaffeWeights(net.namedParameters(), layers);
  assertLoaded(net);
  net.dispose();
});

// Mutation: accepting only packed data (no fixed32 branch for field 5) refused the fixed32 values.
Deno.test("caffemodel: unpacked floats (one fixed32 per value) load as packed ones", () => {
  const bytes = encode("UnpackedNetParameter", { layer: modernLayers() });
  const packed = encode("NetParameter", { layer: modernLayers() });
  assert.ok(bytes.length > packed.length, "the fixture really is unpacked");
  const net = freshNet();
  loadCaffeWeights(net.namedParameters(), parseCaffeModel(bytes));
  assertLoaded(net);
  net.dispose();
});

// Mutation: dropping the length check in Wire.length (reading past the message end) turned the
// error into a RangeError from DataView or a silently short blob.
Deno.test("caffemodel: a truncated file fails with one line naming the byte offset", () => {
  const bytes = encode("NetParameter", { layer: modernLayers() });
  for (const cut of [1, 7, bytes.length >> 1, bytes.length - 3]) {
    assert.throws(
      () => parseCaffeModel(bytes.subarray(0, cut), "cut.caffemodel"),
      (e: unknown) => {
        assert.ok(e instanceof CaffeModelError, String(e));
        assert.match(e.message, /^cut\.caffemodel: byte \d+: /);
        assert.ok(!e.message.includes("\n"));
        return true;
      },
      `cut at ${cut}`,
    );
  }
});

// Mutation: skipping the shape check (fits() returning true) loaded the transposed ip1 weights.
Deno.test("caffemodel: a wrong shape is refused and nothing is loaded", () => {
  const layers = modernLayers();
  layers[3].blobs![0] = { shape: { dim: [18, 3] }, data: W["ip1.weight"].data };
  const net = freshNet();
  const before = snapshot(net);
  assert.throws(
    () =>
      loadCaffeWeights(net.namedParameters(), parseCaffeModel(encode("NetParameter", { layer: layers })), {
        fileName: "t.caffemodel",
      }),
    /^CaffeModelError: t\.caffemodel: weights do not fit the net: shape differs: "ip1\.weight" is \[3, 18\] in the net, \[18, 3\] in the file/,
  );
  assert.deepEqual(snapshot(net), before);
  net.dispose();
});

// Mutation: not listing net parameters without a blob (only checking file → net) loaded a file
// without ip1 silently.
Deno.test("caffemodel: layers missing on either side are listed in one error", () => {
  const layers = modernLayers().filter((l) => l.name !== "ip1");
  layers.push({ name: "fc9", type: "InnerProduct", blobs: [blob("ip1.bias")] });
  const net = freshNet();
  assert.throws(
    () => loadCaffeWeights(net.namedParameters(), parseCaffeModel(encode("NetParameter", { layer: layers }))),
    (e: unknown) => {
      assert.ok(e instanceof CaffeModelError);
      assert.match(e.message, /in the file, not in the net: layer "fc9" blob 0 \(\[3\]\)/);
      assert.match(
        e.message,
        /in the net, not in the file: "ip1\.weight" \[3, 18\] \(no layer "ip1" with blobs\)/,
      );
      assert.ok(!e.message.includes("\n"));
      return true;
    },
  );
  net.dispose();
});

// Checks the varint limits, a negative int64 dim and a group wire type (no mutation tried here).
Deno.test("caffemodel: malformed wire data fails at its byte", () => {
  const bad = (bytes: number[], pattern: RegExp) =>
    assert.throws(() => parseCaffeModel(new Uint8Array(bytes), "x"), pattern);
  bad([0x08, ...Array(10).fill(0xff), 0x01], /^CaffeModelError: x: byte 1: varint \(field 1\) longer than/);
  // layer { blobs { shape { dim: -1 } } }
  const negative = encode("NetParameter", { layer: [{ name: "a", blobs: [{ shape: { dim: [-1] } }] }] });
  assert.throws(() => parseCaffeModel(negative), /BlobShape dim .* too large/);
  bad([0x0b], /byte 0: field 1 of the NetParameter has wire type 3, which Caffe never writes/);
  bad([], /empty file/);
});

// The train command's --weights: the file's values must be what training starts from. With an lr
// of 1e-38 one step moves no weight of magnitude ≥ 1 by even half an ulp, so the checkpoint after it
// holds exactly the file's float32 values, whatever the seed. Mutation: not loading the weights into
// the trainer (the seeded init survives: the two seeds' parameters and the values differ).
Deno.test("caffemodel: --weights fine-tunes from the file's values (train command)", async () => {
  const dir = await Deno.makeTempDir();
  try {
    await Deno.writeTextFile(`${dir}/net.prototxt`, PROTOTXT);
    await Deno.writeFile(
      `${dir}/w.caffemodel`,
      encode("NetParameter", { name: "lenetish", layer: modernLayers() }),
    );
    const run = async (seed: string) => {
      const output = await new Deno.Command(Deno.execPath(), {
        args: [
          "run",
          "-A",
          new URL("../../cli/train.ts", import.meta.url).pathname,
          ...["--model", "net.prototxt", "--weights", "w.caffemodel", "--data", "synthetic", "--seed", seed],
          ...[
            "--steps",
            "1",
            "--batch",
            "8",
            "--lr",
            "1e-38",
            "--checkpoint",
            `c${seed}.safetensors`,
            "--json",
          ],
        ],
        cwd: dir,
        stdout: "piped",
        stderr: "piped",
        stdin: "null",
      }).output();
      assert.equal(output.code, 0, new TextDecoder().decode(output.stderr));
      return JSON.parse(new TextDecoder().decode(output.stdout)).paramsSha256 as string;
    };
    const [a, b] = [await run("1"), await run("2")];
    assert.equal(a, b, "the initial parameters came from the seed, not the file");
    const { loadSafetensors } = await import("../../engine/io/mod.ts");
    const { tensors } = await loadSafetensors(`${dir}/c1.safetensors`);
    for (const [name, want] of Object.entries(W)) {
      assert.deepEqual([...tensors.get(name)!.data as Float32Array], [...new Float32Array(want.data)], name);
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

// Mutation: loadCaffeWeights looking a BatchNorm layer's blobs up as `weight`/`bias` parameters
// (ignoring `buffers`) left them "in the file, not in the net" and fails here.
Deno.test("caffemodel: a BatchNorm layer's three blobs load into its statistics buffers; Scale's into weight and bias", () => {
  const text = `name: "bn"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 dim: 3 dim: 3 } } }
layer { name: "bn" type: "BatchNorm" bottom: "data" top: "data" }
layer { name: "scale" type: "Scale" bottom: "data" top: "data" scale_param { bias_term: true } }
`;
  const layers = [
    { name: "data", type: "Input" },
    {
      name: "bn",
      type: "BatchNorm",
      blobs: [
        { shape: { dim: [2] }, data: [4, 6] },
        { shape: { dim: [2] }, data: [8, 10] },
        { shape: { dim: [1] }, data: [2] },
      ],
    },
    {
      name: "scale",
      type: "Scale",
      blobs: [{ shape: { dim: [2] }, data: [3, 5] }, { shape: { dim: [2] }, data: [-1, 1] }],
    },
  ];
  const bytes = encode("NetParameter", { name: "bn", layer: layers });
  const { network } = importCaffeNet(text, { seed: 1 });
  const parsed = parseCaffeModel(bytes, "bn.caffemodel");
  assert.throws(
    () => loadCaffeWeights(network.namedParameters(), parsed),
    /in the file, not in the net: layer "bn" blob 0/,
  );
  loadCaffeWeights(network.namedParameters(), parsed, { buffers: network.namedBuffers() });
  assert.deepEqual(network.namedBuffers().map((b) => [b.name, [...b.tensor.dataSync()]]), [
    ["bn.mean", [4, 6]],
    ["bn.variance", [8, 10]],
    ["bn.scale_factor", [2]],
  ]);
  assert.deepEqual(network.namedParameters().map((p) => [p.name, [...p.tensor.dataSync()]]), [
    ["scale.weight", [3, 5]],
    ["scale.bias", [-1, 1]],
  ]);
  network.dispose();
});
