import assert from "node:assert/strict";
import { DisposedError, type Tensor, tensor } from "../../mod.ts";
import type { ParameterEntry } from "../../engine/nn/parameter.ts";
import { Adam, type Optimizer, SGD } from "../../engine/optim/mod.ts";
import { writeFileAtomic } from "../../engine/io/atomic.ts";
import { CheckpointError, OutputPathError, SafetensorsError } from "../../engine/io/errors.ts";
import {
  decodeSafetensors,
  encodeSafetensors,
  type HostTensor,
  hostTensorToTensor,
  loadSafetensors,
  saveSafetensors,
} from "../../engine/io/safetensors.ts";
import { loadCheckpoint, saveCheckpoint } from "../../engine/io/checkpoint.ts";

const encoder = new TextEncoder();

/** A safetensors file from a raw header string and data bytes, for corrupt-file tests. */
function craft(header: string, data: Uint8Array = new Uint8Array(), declaredLength?: bigint): Uint8Array {
  const json = encoder.encode(header);
  const out = new Uint8Array(8 + json.length + data.length);
  new DataView(out.buffer).setBigUint64(0, declaredLength ?? BigInt(json.length), true);
  out.set(json, 8);
  out.set(data, 8 + json.length);
  return out;
}

function bytesOf(values: Float32Array | Int32Array): Uint8Array {
  return new Uint8Array(values.buffer, values.byteOffset, values.byteLength);
}

async function inTempDir<T>(fn: (dir: string) => Promise<T>): Promise<T> {
  const dir = await Deno.makeTempDir({ prefix: "tandem-safetensors-" });
  try {
    return await fn(dir);
  } finally {
    await Deno.chmod(dir, 0o755).catch(() => {});
    await Deno.remove(dir, { recursive: true });
  }
}

async function listDir(dir: string): Promise<string[]> {
  const names: string[] = [];
  for await (const entry of Deno.readDir(dir)) names.push(entry.name);
  return names.sort();
}

Deno.test("safetensors round trip: F32, I32, scalar, empty and other host dtypes, with metadata", async () => {
  const w = tensor([[1.5, -2, 3], [4, 5e-8, -6e30]]);
  const labels = tensor([3, -1, 2147483647, -2147483648], { dtype: "int32" });
  const s = tensor(0.25, { shape: [] });
  const empty = tensor([], { shape: [0] });
  const empty2 = tensor([], { shape: [2, 0] });
  const f64: HostTensor = { dtype: "F64", shape: [2], data: new Float64Array([Math.PI, -0]) };
  const i64: HostTensor = { dtype: "I64", shape: [1], data: new BigInt64Array([-(2n ** 62n)]) };
  const bool: HostTensor = { dtype: "BOOL", shape: [3], data: new Uint8Array([1, 0, 1]) };
  const bf16: HostTensor = { dtype: "BF16", shape: [1], data: new Uint16Array([0x3f80]) };
  const metadata = { framework: "tandem", "ünïcode": "✓", empty: "" };
  const bytes = await encodeSafetensors({ w, labels, s, empty, empty2, f64, i64, bool, bf16 }, metadata);
  const file = decodeSafetensors(bytes);
  assert.deepEqual(file.metadata, metadata);
  assert.deepEqual([...file.tensors.keys()], [
    "w",
    "labels",
    "s",
    "empty",
    "empty2",
    "f64",
    "i64",
    "bool",
    "bf16",
  ]);
  assert.deepEqual(file.tensors.get("w"), { dtype: "F32", shape: [2, 3], data: w.dataSync() });
  assert.deepEqual(file.tensors.get("labels"), { dtype: "I32", shape: [4], data: labels.dataSync() });
  assert.deepEqual(file.tensors.get("s"), { dtype: "F32", shape: [], data: new Float32Array([0.25]) });
  assert.deepEqual(file.tensors.get("empty"), { dtype: "F32", shape: [0], data: new Float32Array() });
  assert.deepEqual(file.tensors.get("empty2"), { dtype: "F32", shape: [2, 0], data: new Float32Array() });
  for (const [name, host] of Object.entries({ f64, i64, bool, bf16 })) {
    assert.deepEqual(file.tensors.get(name), host);
  }
  assert.ok(Object.is((file.tensors.get("f64")!.data as Float64Array)[1], -0));

  const back = hostTensorToTensor(file.tensors.get("labels")!);
  assert.equal(back.dtype, "int32");
  assert.deepEqual(back.dataSync(), labels.dataSync());
  assert.throws(() => hostTensorToTensor(f64), /F64 has no Tandem tensor type/);

  await inTempDir(async (dir) => {
    const path = `${dir}/model.safetensors`;
    await saveSafetensors(path, new Map([["w", w], ["s", s]]), { epoch: "3" });
    const loaded = await loadSafetensors(path);
    assert.deepEqual(loaded.metadata, { epoch: "3" });
    assert.deepEqual(loaded.tensors.get("w")!.data, w.dataSync());
    assert.deepEqual(await listDir(dir), ["model.safetensors"]);
  });
  for (const t of [w, labels, s, empty, empty2, back]) t.dispose();
});

Deno.test("safetensors byte layout of a tiny file, checked by hand", async () => {
  const a = tensor([1, 2]);
  const b = tensor(7, { shape: [], dtype: "int32" });
  const bytes = await encodeSafetensors({ a, b }, { k: "v" });
  const json = '{"__metadata__":{"k":"v"},' +
    '"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},' +
    '"b":{"dtype":"I32","shape":[],"data_offsets":[8,12]}}';
  const padded = Math.ceil(json.length / 8) * 8;
  assert.equal(padded % 8, 0);
  assert.equal(bytes.length, 8 + padded + 12);
  assert.equal(new DataView(bytes.buffer).getBigUint64(0, true), BigInt(padded));
  assert.deepEqual([...bytes.subarray(0, 8)], [padded & 0xff, padded >> 8, 0, 0, 0, 0, 0, 0]);
  const header = new TextDecoder().decode(bytes.subarray(8, 8 + padded));
  assert.equal(header, json + " ".repeat(padded - json.length));
  // 1.0f = 0x3f800000, 2.0f = 0x40000000, little-endian; then int32 7.
  assert.deepEqual([...bytes.subarray(8 + padded)], [0, 0, 0x80, 0x3f, 0, 0, 0, 0x40, 7, 0, 0, 0]);

  // Names that look like integers keep their given order (JSON.stringify of an object would not).
  const ordered = await encodeSafetensors(new Map([["b", b], ["10", a]]));
  assert.deepEqual([...decodeSafetensors(ordered).tensors.keys()], ["b", "10"]);
  const text = new TextDecoder().decode(ordered.subarray(8));
  assert.ok(text.startsWith('{"b":{"dtype":"I32","shape":[],"data_offsets":[0,4]},"10":'), text);
  assert.ok(!text.includes("__metadata__"));
  a.dispose();
  b.dispose();
});

Deno.test("corrupt safetensors give clear errors", async () => {
  const one = bytesOf(new Float32Array([1]));
  const two = bytesOf(new Float32Array([1, 2]));
  const info = (dtype: string, shape: number[], offsets: number[]) =>
    JSON.stringify({ dtype, shape, data_offsets: offsets });
  const cases: [string, Uint8Array, RegExp][] = [
    ["too short", new Uint8Array(5), /truncated: 5 bytes, but a safetensors file starts with an 8-byte/],
    [
      "header too large",
      craft("{}", undefined, 2n ** 40n),
      /header length 1099511627776 exceeds the 100000000-byte limit/,
    ],
    [
      "header beyond file",
      craft("{}", undefined, 1000n),
      /truncated: header length 1000 reaches beyond the end/,
    ],
    ["bad JSON", craft('{"a": '), /header is not valid JSON/],
    ["not an object", craft("[1, 2]"), /header does not start with "\{"/],
    ["not UTF-8", craft('{"\xff"}').map((x, i) => (i === 10 ? 0xff : x)), /not valid UTF-8/],
    [
      "unknown dtype",
      craft(`{"a":${info("F4", [1], [0, 4])}}`, one),
      /tensor "a": dtype "F4" is not supported/,
    ],
    [
      "size mismatch",
      craft(`{"a":${info("F32", [2], [0, 4])}}`, one),
      /F32 \[2\] needs 8 bytes, but data_offsets \[0, 4\] span 4/,
    ],
    [
      "reversed offsets",
      craft(`{"a":${info("F32", [0], [4, 0])}}`, one),
      /data_offsets \[4,0\] is not \[begin, end\]/,
    ],
    [
      "overlap",
      craft(`{"a":${info("F32", [2], [0, 8])},"b":${info("F32", [1], [4, 8])}}`, two),
      /data_offsets overlap: "b" \[4, 8\] starts inside "a" \[0, 8\]/,
    ],
    ["gap", craft(`{"a":${info("F32", [1], [4, 8])}}`, two), /gap: bytes \[0, 4\) belong to no tensor/],
    [
      "truncated data",
      craft(`{"a":${info("F32", [2], [0, 8])}}`, one),
      /truncated: "a" \[0, 8\] reaches beyond the data section \(4 bytes/,
    ],
    ["trailing bytes", craft(`{"a":${info("F32", [1], [0, 4])}}`, two), /4 trailing bytes/],
    [
      "bad shape",
      craft(`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}}`),
      /shape \[-1\] is not a list/,
    ],
    [
      "metadata not strings",
      craft('{"__metadata__":{"step":5}}'),
      /__metadata__ "step" is 5; metadata values must be strings/,
    ],
  ];
  for (const [what, bytes, message] of cases) {
    assert.throws(
      () => decodeSafetensors(bytes, "x.safetensors"),
      (e: Error) =>
        e instanceof SafetensorsError && e.message.startsWith("x.safetensors: ") && message.test(e.message),
      what,
    );
  }
  // A valid hand-made file (no padding, as other writers may produce) decodes.
  assert.deepEqual(
    decodeSafetensors(craft(`{"a":${info("F32", [1], [0, 4])}}`, one)).tensors.get("a")!.data,
    new Float32Array([1]),
  );

  await inTempDir(async (dir) => {
    const path = `${dir}/broken.safetensors`;
    const good = await encodeSafetensors({ a: { dtype: "F32", shape: [4], data: new Float32Array(4) } });
    await Deno.writeFile(path, good.subarray(0, good.length - 3));
    await assert.rejects(
      loadSafetensors(path),
      (e: Error) => e instanceof SafetensorsError && e.message.startsWith(`${path}: truncated`),
    );
    await assert.rejects(loadSafetensors(`${dir}/missing.safetensors`), /missing.safetensors: cannot read/);
  });

  const t = tensor([1]);
  await assert.rejects(encodeSafetensors({ __metadata__: t }), /"__metadata__" cannot name a tensor/);
  await assert.rejects(encodeSafetensors({ t }, { n: 1 as unknown as string }), /values must be strings/);
  await assert.rejects(
    encodeSafetensors({ h: { dtype: "F32", shape: [3], data: new Float32Array(2) } }),
    /F32 \[3\] needs 12 bytes/,
  );
  t.dispose();
});

Deno.test("atomic writes: a failure midway leaves the target untouched and no temporary files", async () => {
  await inTempDir(async (dir) => {
    const path = `${dir}/weights.safetensors`;
    const a = tensor([1, 2, 3]);
    await saveSafetensors(path, { a });
    const original = await Deno.readFile(path);

    // The chunk source throws after the header and part of the data were written.
    async function* failing() {
      yield new Uint8Array(100);
      yield new Uint8Array(100);
      throw new Error("disk on fire");
    }
    await assert.rejects(writeFileAtomic(path, failing()), /disk on fire/);
    assert.deepEqual(await Deno.readFile(path), original);
    assert.deepEqual(await listDir(dir), ["weights.safetensors"]);

    // Encoding fails midway: the second tensor was disposed, found only when its bytes are read.
    const b = tensor([4, 5]);
    b.dispose();
    await assert.rejects(saveSafetensors(path, { a, b }), DisposedError);
    assert.deepEqual(await Deno.readFile(path), original);
    assert.deepEqual(await listDir(dir), ["weights.safetensors"]);

    // The target is a directory: refused before any temporary file is made, naming the path.
    await Deno.mkdir(`${dir}/taken`);
    await assert.rejects(
      saveSafetensors(`${dir}/taken`, { a }),
      (e: Error) => e instanceof OutputPathError && e.message.startsWith(`${dir}/taken: is a directory`),
    );
    assert.deepEqual(await listDir(dir), ["taken", "weights.safetensors"]);

    // A read-only directory (meaningless for root, which may write anyway).
    await Deno.chmod(dir, 0o555);
    let writable = true;
    try {
      await Deno.writeFile(`${dir}/probe`, new Uint8Array());
      await Deno.remove(`${dir}/probe`);
    } catch {
      writable = false;
    }
    if (!writable) {
      await assert.rejects(saveSafetensors(path, { a }), /cannot write/);
      assert.deepEqual(await Deno.readFile(path), original);
    }
    await Deno.chmod(dir, 0o755);

    // A successful save replaces the file.
    const seven = tensor([7]);
    await saveSafetensors(path, { a: seven });
    assert.deepEqual(
      decodeSafetensors(await Deno.readFile(path)).tensors.get("a")!.data,
      new Float32Array([7]),
    );
    assert.deepEqual(await listDir(dir), ["taken", "weights.safetensors"]);
    a.dispose();
    seven.dispose();
  });
});

interface Model {
  parameters: ParameterEntry[];
}

function makeModel(seed: number, shapes: Record<string, number[]> = {}): Model {
  const spec: [string, number[], string][] = [
    ["conv1.weight", shapes["conv1.weight"] ?? [2, 1, 3, 3], "conv"],
    ["conv1.bias", [2], "conv"],
    ["fc.weight", shapes["fc.weight"] ?? [3, 4], "fc"],
    ["fc.bias", [3], "fc"],
  ];
  return {
    parameters: spec.map(([name, shape, group], k) => ({
      name,
      group,
      lrMult: name.endsWith("bias") ? 2 : 1,
      decayMult: name.endsWith("bias") ? 0 : 1,
      tensor: tensor(
        Float32Array.from({ length: shape.reduce((a, b) => a * b, 1) }, (_, i) => Math.sin(seed + 3 * k + i)),
        { shape, requiresGrad: true },
      ),
    })),
  };
}

function train(model: Model, optimizer: Optimizer, from: number, to: number): void {
  for (let step = from; step < to; step++) {
    model.parameters.forEach((p, k) => {
      p.tensor.grad?.dispose();
      p.tensor.grad = tensor(
        Float32Array.from({ length: p.tensor.size }, (_, i) => Math.cos(step + k + 0.1 * i)),
        {
          shape: p.tensor.shape,
        },
      );
    });
    optimizer.step("fc");
    optimizer.step();
  }
  optimizer.zeroGrad();
}

function bits(t: { dataSync(): Float32Array | Int32Array }): number[] {
  return [...new Uint32Array(Float32Array.from(t.dataSync() as Float32Array).buffer)];
}

function disposeModel(model: Model, optimizer?: Optimizer): void {
  optimizer?.dispose();
  for (const p of model.parameters) p.tensor.dispose();
}

Deno.test("checkpoint: resume restores parameters and optimizer state bit-exactly (SGD and Adam)", async () => {
  for (
    const make of [
      (m: Model) =>
        new SGD(m.parameters, { lr: { policy: "inv", baseLr: 0.1, gamma: 0.5, power: 0.75 }, momentum: 0.9 }),
      (m: Model) => new Adam(m.parameters, { lr: 0.01, weightDecay: 1e-3 }),
    ]
  ) {
    await inTempDir(async (dir) => {
      const path = `${dir}/ckpt.safetensors`;
      const a = makeModel(1);
      const optA = make(a);
      train(a, optA, 0, 3);
      const rng = { seed: 42, stream: 7, offsets: [1, 2, 3] };
      await saveCheckpoint(path, {
        parameters: a.parameters,
        optimizer: optA,
        step: 3,
        modelName: "tiny",
        rng,
        extra: { epoch: 1 },
      });
      const savedBits = a.parameters.map((p) => bits(p.tensor));

      const file = await loadSafetensors(path);
      assert.equal(file.metadata.format, "tandem-checkpoint/1");
      assert.equal(file.metadata.model_name, "tiny");
      assert.equal(file.metadata.step, "3");
      const meta = JSON.parse(file.metadata.optimizer);
      assert.equal(meta.iteration, 3);
      assert.equal(meta.hyper.kind, optA.kind);
      for (const slot of optA.slotNames) assert.ok(file.tensors.has(`optimizer.fc.weight.${slot}`));

      const b = makeModel(2);
      const optB = make(b);
      const loaded = await loadCheckpoint(path, {
        parameters: b.parameters,
        optimizer: optB,
        modelName: "tiny",
      });
      assert.equal(loaded.step, 3);
      assert.equal(loaded.modelName, "tiny");
      assert.deepEqual(loaded.rng, rng);
      assert.deepEqual(loaded.extra, { epoch: 1 });
      assert.equal(optB.iteration, 3);
      const [sa, sb] = [optA.state(), optB.state()];
      assert.deepEqual(sb.updates, sa.updates);
      for (const [name, slots] of sa.perParameter) {
        for (const [slot, t] of Object.entries(slots)) {
          assert.deepEqual(bits(sb.perParameter.get(name)![slot]), bits(t));
        }
      }
      train(a, optA, 3, 6);
      train(b, optB, 3, 6);
      assert.deepEqual(b.parameters.map((p) => bits(p.tensor)), a.parameters.map((p) => bits(p.tensor)));

      // Weights only: stored optimizer state is ignored when no optimizer is given.
      const c = makeModel(3);
      await loadCheckpoint(path, { parameters: c.parameters });
      assert.deepEqual(c.parameters.map((p) => bits(p.tensor)), savedBits);
      disposeModel(a, optA);
      disposeModel(b, optB);
      disposeModel(c);
    });
  }
});

Deno.test("checkpoint: every mismatch is reported in one CheckpointError and nothing is modified", async () => {
  await inTempDir(async (dir) => {
    const path = `${dir}/ckpt.safetensors`;
    const saved = makeModel(1);
    const optimizer = new SGD(saved.parameters, { lr: 0.1, momentum: 0.9 });
    train(saved, optimizer, 0, 2);
    await saveCheckpoint(path, { parameters: saved.parameters, optimizer, step: 2, modelName: "tiny" });

    // Missing fc.bias, unexpected extra, a shape difference and a dtype difference, wrong name.
    const other = makeModel(5, { "fc.weight": [4, 3] });
    const labels = tensor([1, 2], { dtype: "int32" });
    const parameters: ParameterEntry[] = [
      ...other.parameters.filter((p) => p.name !== "fc.bias"),
      { name: "extra.weight", tensor: tensor([1, 2, 3]), group: "fc", lrMult: 1, decayMult: 1 },
    ];
    parameters[1] = { ...parameters[1], tensor: labels }; // conv1.bias as int32 [2]
    const before = parameters.map((p) => bits(p.tensor));
    const adam = new Adam(other.parameters, { lr: 0.1 });
    const error = await loadCheckpoint(path, { parameters, optimizer: adam, modelName: "big" }).then(
      () => assert.fail("expected a CheckpointError"),
      (e) => e,
    );
    assert.ok(error instanceof CheckpointError, String(error));
    assert.equal(error.path, path);
    assert.deepEqual(error.problems, [
      'wrong model name: checkpoint is for "tiny", expected "big"',
      'dtype differs: parameter "conv1.bias" is I32 in the model, F32 in the checkpoint',
      'shape differs: parameter "fc.weight" is [4, 3] in the model, [3, 4] in the checkpoint',
      'missing: parameter "extra.weight" [3] F32 is not in the checkpoint',
      'optimizer: optimizer kind: state is for "sgd", this optimizer is "adam"',
      'unexpected: "fc.bias" [3] F32 is in the checkpoint but not in the model',
    ]);
    assert.match(error.message, /checkpoint does not fit \(6 problems\)/);
    assert.deepEqual(parameters.map((p) => bits(p.tensor)), before);
    assert.equal(adam.iteration, 0);

    // Optimizer of the right kind but a checkpoint without optimizer state; slot shape mismatch.
    const weightsOnly = `${dir}/weights.safetensors`;
    await saveCheckpoint(weightsOnly, { parameters: saved.parameters, step: 2, modelName: "tiny" });
    const fresh = makeModel(6);
    const sgd = new SGD(fresh.parameters, { lr: 0.1 });
    await assert.rejects(
      loadCheckpoint(weightsOnly, { parameters: fresh.parameters, optimizer: sgd }),
      (e: Error) => e instanceof CheckpointError && /holds no optimizer state/.test(e.message),
    );
    const reshaped = makeModel(7, { "conv1.weight": [2, 9] });
    const sgd2 = new SGD(reshaped.parameters, { lr: 0.1 });
    await assert.rejects(
      loadCheckpoint(path, { parameters: reshaped.parameters, optimizer: sgd2 }),
      (e: Error) =>
        e instanceof CheckpointError && e.problems.length === 2 &&
        e.problems[1] ===
          'shape differs: optimizer state "optimizer.conv1.weight.history" is [2, 9] in the model, [2, 1, 3, 3] in the checkpoint',
    );

    // A plain safetensors file is not a checkpoint.
    const plain = `${dir}/plain.safetensors`;
    await saveSafetensors(plain, Object.fromEntries(saved.parameters.map((p) => [p.name, p.tensor])));
    await assert.rejects(
      loadCheckpoint(plain, { parameters: fresh.parameters }),
      (e: Error) =>
        e instanceof CheckpointError && /format/.test(e.problems[0]) && /step/.test(e.problems[1]),
    );
    await assert.rejects(
      saveCheckpoint(path, { parameters: saved.parameters, step: -1, modelName: "tiny" }),
      /step must be a non-negative integer/,
    );
    disposeModel(saved, optimizer);
    disposeModel(other, adam);
    disposeModel(fresh, sgd);
    disposeModel(reshaped, sgd2);
    parameters[parameters.length - 1].tensor.dispose();
    labels.dispose();
  });
});

const python = (() => {
  try {
    return new Deno.Command("python3", { args: ["--version"], stdout: "null", stderr: "null" }).outputSync()
      .success;
  } catch {
    return false;
  }
})();

// This checks the byte format against the specification with an independent stdlib-only parser; the
// reference `safetensors` package cannot be installed here (no PyPI access), so it is not the library.
const PY_PARSER = `
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
assert n % 8 == 0, "header not padded to 8 bytes"
header = json.loads(raw[8:8 + n].decode("utf-8"))
data = raw[8 + n:]
meta = header.pop("__metadata__", {})
fmt = {"F32": "f", "I32": "i", "F64": "d"}
size = {"F32": 4, "I32": 4, "F64": 8}
out, end = {}, 0
for name, info in header.items():
    b, e = info["data_offsets"]
    assert b == end, "tensors not contiguous in header order"
    count = 1
    for d in info["shape"]:
        count *= d
    assert e - b == count * size[info["dtype"]]
    values = struct.unpack("<%d%s" % (count, fmt[info["dtype"]]), data[b:e])
    total = 0.0
    for v in values:
        total += v
    out[name] = [info["dtype"], info["shape"], total]
    end = e
assert end == len(data)
print(json.dumps({"tensors": out, "metadata": meta, "order": list(header.keys())}))
`;

Deno.test({
  name: "python stdlib parser reads our files per the spec (format check, not the reference library)",
  ignore: !python,
  fn: async () => {
    await inTempDir(async (dir) => {
      const path = `${dir}/py.safetensors`;
      const w = tensor([[0.1, -2.5, 3], [1e-3, 7, -8]]);
      const labels = tensor([5, -6, 7], { dtype: "int32" });
      const s = tensor(1.25, { shape: [] });
      const empty = tensor([], { shape: [0, 4] });
      const f64: HostTensor = { dtype: "F64", shape: [3], data: new Float64Array([Math.E, 1e300, -1]) };
      // A Map keeps "2" in place; an object literal would move integer-like keys first.
      const tensors = new Map<string, Tensor | HostTensor>([["w", w], ["labels", labels], ["2", s], [
        "empty",
        empty,
      ], [
        "f64",
        f64,
      ]]);
      await saveSafetensors(path, tensors, { note: "hé", step: "12" });
      const { stdout, success, stderr } = await new Deno.Command("python3", { args: ["-c", PY_PARSER, path] })
        .output();
      assert.ok(success, new TextDecoder().decode(stderr));
      const parsed = JSON.parse(new TextDecoder().decode(stdout));
      assert.deepEqual(parsed.metadata, { note: "hé", step: "12" });
      assert.deepEqual(parsed.order, ["w", "labels", "2", "empty", "f64"]);
      const sum = (a: ArrayLike<number>) => Array.from(a).reduce((x, y) => x + y, 0);
      assert.deepEqual(parsed.tensors, {
        w: ["F32", [2, 3], sum(w.dataSync())],
        labels: ["I32", [3], sum(labels.dataSync())],
        "2": ["F32", [], 1.25],
        empty: ["F32", [0, 4], 0],
        f64: ["F64", [3], sum(f64.data as Float64Array)],
      });
      for (const t of [w, labels, s, empty]) t.dispose();
    });
  },
});

// Mutations: `extra_tensors` not written to the metadata (loading then calls them unexpected), and
// the loader not accounting for them (the same error).
Deno.test("checkpoint: extra tensors are stored, listed and returned; a collision or a missing one is refused", async () => {
  await inTempDir(async (dir) => {
    const path = `${dir}/extra.safetensors`;
    const model = makeModel(1);
    try {
      const residual = new Float32Array([0.5, -0.25, 0]);
      await saveCheckpoint(path, {
        parameters: model.parameters,
        step: 1,
        modelName: "tiny",
        extraTensors: { "wire.residual.0": residual },
      });
      const loaded = await loadCheckpoint(path, { parameters: model.parameters, modelName: "tiny" });
      assert.deepEqual(Object.keys(loaded.extraTensors), ["wire.residual.0"]);
      assert.deepEqual([...loaded.extraTensors["wire.residual.0"]], [...residual]);
      const plain = `${dir}/plain.safetensors`;
      await saveCheckpoint(plain, { parameters: model.parameters, step: 1, modelName: "tiny" });
      assert.deepEqual((await loadCheckpoint(plain, { parameters: model.parameters })).extraTensors, {});

      const name = model.parameters[0].name;
      await assert.rejects(
        saveCheckpoint(`${dir}/collide.safetensors`, {
          parameters: model.parameters,
          step: 1,
          modelName: "tiny",
          extraTensors: { [name]: residual },
        }),
        (e) => e instanceof CheckpointError && e.message.includes(`extra tensor "${name}" collides`),
      );
      // Listed in the metadata, absent from the file.
      const { tensors, metadata } = await loadSafetensors(path);
      tensors.delete("wire.residual.0");
      const broken = `${dir}/broken.safetensors`;
      await saveSafetensors(broken, tensors, metadata);
      await assert.rejects(
        loadCheckpoint(broken, { parameters: model.parameters }),
        (e) =>
          e instanceof CheckpointError &&
          e.message.includes(`extra tensor "wire.residual.0" is listed but not in the checkpoint`),
      );
    } finally {
      disposeModel(model);
    }
  });
});
