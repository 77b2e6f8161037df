/**
 * Compressed gradients on the wire (`schedule/runtime/exchange/wire.ts`, `wire: "fp16" | "bf16"`): the codec
 * against an exact float64 reference, error feedback, and 2-device runs that must stay bit-identical
 * across schedules and reduction modes under one format while differing from fp32, with half the
 * bytes on the emulated link. Each test names the mutation of the code that made it fail.
 */

import assert from "node:assert/strict";
import { helpText, parseTrainArgs } from "../../cli/args.ts";
import {
  DataParallelTrainer,
  overlapPlan,
  type Plan,
  sequentialPlan,
  SGD,
  TraceRecorder,
} from "../../mod.ts";
import {
  bf16Bits,
  compressGradients,
  decodeGradients,
  fp16Bits,
  quantizeGradients,
} from "../../schedule/runtime/exchange/wire.ts";
import type { Device, ParameterLayout } from "../../schedule/devices/mod.ts";
import { parseLink, parseWire, type WireFormat } from "../../schedule/runtime/mod.ts";
import type { ReductionMode } from "../../schedule/mod.ts";
import { sharedFloats } from "../../schedule/devices/parameter_layout.ts";
import type { ExchangeContext } from "../../schedule/runtime/exchange/exchange.ts";
import { ResidentExchange } from "../../schedule/runtime/exchange/resident_exchange.ts";
import { SharedMemoryExchange } from "../../schedule/runtime/exchange/shared_memory_exchange.ts";
import {
  bits,
  tinyBatch,
  tinyGroups as groups,
  tinyModel,
  tinyOptimizers,
} from "../fixtures/data_parallel.ts";
import { RUN_SEED, sha256, TRAIN_STEPS } from "../fixtures/mpi_rank.ts";
import { mpi, probeMpirun, rank0Report } from "../fixtures/mpirun.ts";

import { runSlowTests } from "../fixtures/slow.ts";

const mpirun = await probeMpirun("wire");

type Compressed = "fp16" | "bf16";

/** The value of 16-bit `h`, from the formats' definitions in float64 (sign, exponent, mantissa). */
function referenceValue(h: number, format: Compressed): number {
  const sign = h & 0x8000 ? -1 : 1;
  const [mantissaBits, exponentBits, bias] = format === "fp16" ? [10, 5, 15] : [7, 8, 127];
  const exponent = (h >>> mantissaBits) & ((1 << exponentBits) - 1);
  const mantissa = h & ((1 << mantissaBits) - 1);
  if (exponent === (1 << exponentBits) - 1) return mantissa ? NaN : sign * Infinity;
  if (exponent === 0) return sign * mantissa * 2 ** (1 - bias - mantissaBits);
  return sign * (1 + mantissa / 2 ** mantissaBits) * 2 ** (exponent - bias);
}

/** The largest finite magnitude's bits. */
const MAX_BITS: Record<Compressed, number> = { fp16: 0x7bff, bf16: 0x7f7f };

/**
 * The bits of the 16-bit value nearest to `x` (ties to the even pattern), finite overflow saturated
 * to the largest finite value, ±Inf kept; NaN gives -1 (any NaN pattern is right). By search over
 * the magnitudes, which increase with their bit patterns.
 */
function referenceEncode(x: number, format: Compressed): number {
  if (Number.isNaN(x)) return -1;
  const sign = x < 0 || Object.is(x, -0) ? 0x8000 : 0;
  const a = Math.abs(x), max = MAX_BITS[format];
  if (a === Infinity) return sign | (max + 1);
  let lo = 0, hi = max;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (referenceValue(mid, format) <= a) lo = mid;
    else hi = mid - 1;
  }
  if (lo === max) return sign | max;
  const below = a - referenceValue(lo, format), above = referenceValue(lo + 1, format) - a;
  if (below < above) return sign | lo;
  if (above < below) return sign | (lo + 1);
  return sign | (lo & 1 ? lo + 1 : lo);
}

/** float32 values from their bits. */
function fromBits(patterns: number[]): Float32Array {
  return new Float32Array(Uint32Array.from(patterns, (b) => b >>> 0).buffer);
}

/** The float32 bits of `x`. */
function bitsOf(x: number): number {
  return new Uint32Array(new Float32Array([x]).buffer)[0];
}

/** A seeded stream of uint32 (xorshift32). */
function xorshift(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5;
    return (s >>>= 0);
  };
}

/**
 * The inputs the codec must round exactly: the edge cases (±0, float32 subnormals, the smallest
 * binary16 subnormal and the tie below it, the largest finite values and just past them, ±Inf,
 * NaNs), every representable 16-bit magnitude of the format, the midpoint between every two adjacent
 * ones (a tie) and the float32 just below and above each midpoint, both signs, and random patterns.
 */
function codecInputs(format: Compressed): Float32Array {
  const patterns = [
    0x00000000, // +0
    0x00000001, // smallest float32 subnormal
    0x007fffff, // largest float32 subnormal
    0x00800000, // smallest float32 normal
    0x33000000, // 2^-25: a tie between 0 and the smallest binary16 subnormal (rounds to 0)
    0x33000001, // just above it (rounds to 2^-24)
    0x33800000, // 2^-24
    0x38800000, // 2^-14: smallest binary16 normal
    0x387fc000, // 2^-14 − 2^-24 … the largest binary16 subnormal
    0x387fe000, // halfway between it and 2^-14
    0x477fe000, // 65504
    0x477fefff, // just below 65520 (rounds to 65504)
    0x477ff000, // 65520: ties to 65536, saturates
    0x47800000, // 65536
    0x4f000000, // 2^31
    0x7f7f0000, // largest bfloat16
    0x7f7f7fff, // just below its tie with 2^128
    0x7f7f8000, // the tie: saturates
    0x7f7fffff, // largest float32
    0x7f800000, // +Inf
    0x7f800001, // a signalling NaN with a low payload
    0x7fc00000, // quiet NaN
    0x7fffffff, // NaN, full payload
    0x3f800000, // 1
    0x3dcccccd, // 0.1
  ];
  const max = MAX_BITS[format];
  for (let b = 0; b <= max; b++) {
    const exact = bitsOf(referenceValue(b, format));
    patterns.push(exact);
    if (b < max) {
      const tie = bitsOf((referenceValue(b, format) + referenceValue(b + 1, format)) / 2);
      patterns.push(tie, tie - 1, tie + 1);
    }
  }
  const random = xorshift(format === "fp16" ? 16 : 32);
  for (let i = 0; i < 100_000; i++) patterns.push(random());
  return fromBits([...patterns, ...patterns.map((p) => p ^ 0x80000000)]);
}

/** `a` and `b` are the same float32, ±0 told apart, any NaN equal to any NaN. */
function sameFloat(a: number, b: number): boolean {
  return Object.is(a, b) || (Number.isNaN(a) && Number.isNaN(b));
}

for (const format of ["fp16", "bf16"] as const) {
  // Mutations that made it fail, each alone: in the scalar encoders, ties away from zero instead of
  // to even (fp16Bits: `+ 0x1000` for `+ 0xfff + ((a >>> 13) & 1)`; bf16Bits: `+ 0x8000` for
  // `+ 0x7fff + …`), fp16 overflow left to round to Inf (`a >= 0x477ff000` made `a >= 0x47800000`),
  // the subnormal tie `a <= 0x33000000` made `<`; in the branch-free fp16 path, the rounders one
  // binade coarse (`+ 43` for `+ 42`), the subnormal spacing wrong (`-15` for `-14`), no saturation
  // (`q > 65504` made `q > Infinity`), the sign dropped (`return q;`); the decode table's exponent
  // rebias `+ 112` made `+ 111`.
  Deno.test(`${format}: encode and decode equal an exact float64 reference, bit for bit`, () => {
    const one = new Float32Array(1);
    for (let h = 0; h < 65536; h++) {
      decodeGradients(new Uint16Array([h]), format, one);
      const expected = referenceValue(h, format);
      assert.ok(sameFloat(one[0], expected), `decode 0x${h.toString(16)}: ${one[0]}, expected ${expected}`);
    }
    const inputs = codecInputs(format);
    const encoded = new Uint16Array(inputs.length);
    compressGradients(inputs, format, encoded);
    const scalar = format === "fp16" ? fp16Bits : bf16Bits;
    const nan = (h: number) => referenceValue(h, format);
    for (let i = 0; i < inputs.length; i++) {
      const expected = referenceEncode(inputs[i], format);
      const input = `${format}(${inputs[i]}) (float32 0x${bitsOf(inputs[i]).toString(16)})`;
      const scalarBits = scalar(bitsOf(inputs[i]));
      if (expected === -1) {
        assert.ok(Number.isNaN(nan(encoded[i])), `${input}: 0x${encoded[i].toString(16)} is not a NaN`);
        assert.ok(
          Number.isNaN(nan(scalarBits)),
          `${input}: scalar 0x${scalarBits.toString(16)} is not a NaN`,
        );
        continue;
      }
      assert.equal(
        encoded[i],
        expected,
        `${input}: 0x${encoded[i].toString(16)}, expected 0x${expected.toString(16)}`,
      );
      assert.equal(
        scalarBits,
        expected,
        `${input}: scalar 0x${scalarBits.toString(16)}, expected 0x${expected.toString(16)}`,
      );
    }
    // The one-pass form gives what the receiver decodes (any NaN for a NaN).
    const decoded = new Float32Array(inputs.length), quantized = new Float32Array(inputs.length);
    decodeGradients(encoded, format, decoded);
    quantizeGradients(inputs, format, quantized);
    for (let i = 0; i < inputs.length; i++) {
      if (!sameFloat(quantized[i], decoded[i])) {
        assert.fail(`${format}(${inputs[i]}): one pass gives ${quantized[i]}, decode(encode) ${decoded[i]}`);
      }
    }
  });
}

// Mutation that made it fail: a `fp16` saturation value of 0x7c00 (Inf) instead of 0x7bff.
Deno.test("fp16: finite overflow saturates to ±65504; Inf and NaN are kept", () => {
  const out = new Float32Array(6);
  quantizeGradients(new Float32Array([70000, -1e30, 65519, Infinity, -Infinity, NaN]), "fp16", out);
  assert.deepEqual([...out], [65504, -65504, 65504, Infinity, -Infinity, NaN]);
});

// Mutation that made it fail: `parseWire` accepting any text (the check removed).
Deno.test("parseWire reads the formats and refuses anything else in one line naming --wire", () => {
  assert.equal(parseWire("fp16"), "fp16");
  assert.equal(parseWire(" BF16 "), "bf16");
  assert.throws(() => parseWire("fp8"), (error: Error) => {
    assert.equal(error.message, `--wire: expected one of fp32, fp16, bf16, got "fp8"`);
    return true;
  });
});

for (const format of ["fp16", "bf16"] as const) {
  // Mutations that made it fail (in `compressGradients`, and each the same in
  // `quantizeGradients`): the residual not updated (its store removed), not added
  // (`v = fround(values[i])`), or stored with the wrong sign (`decode(q) − v`).
  Deno.test(`${format}: error feedback keeps v − decode(encode(v)) and the sent sum tracks the true sum`, () => {
    const n = 64, steps = 400;
    const random = xorshift(7);
    const uniform = () => random() / 2 ** 32;
    // Gradients with a steady part the format cannot hold (1 + 2^-12: both round it to 1 every
    // time; 1 + 2^-9: bfloat16 does; 1/3: both round it) and a little noise.
    const bases = [1 + 2 ** -12, 1 + 2 ** -9, 1 / 3];
    const base = Float32Array.from({ length: n }, (_, i) => bases[i % 3]);
    const residual = new Float32Array(n), withFeedback = new Uint16Array(n), plain = new Uint16Array(n);
    const oneResidual = new Float32Array(n), onePass = new Float32Array(n);
    const trueSum = new Float64Array(n), sentSum = new Float64Array(n), plainSum = new Float64Array(n);
    const decoded = new Float32Array(n);
    let worst = 0, worstPlain = 0;
    for (let step = 0; step < steps; step++) {
      const g = Float32Array.from(base, (b) => b + (uniform() - 0.5) * 2 ** -14);
      const before = residual.slice();
      compressGradients(g, format, withFeedback, residual);
      decodeGradients(withFeedback, format, decoded);
      // The one-pass form keeps the same residual and gives what the receiver decodes.
      quantizeGradients(g, format, onePass, oneResidual);
      assert.deepEqual(bits(onePass), bits(decoded));
      assert.deepEqual(bits(oneResidual), bits(residual));
      for (let i = 0; i < n; i++) {
        const v = Math.fround(g[i] + before[i]);
        assert.equal(residual[i], Math.fround(v - decoded[i]), `step ${step} element ${i}`);
        trueSum[i] += g[i];
        sentSum[i] += decoded[i];
      }
      compressGradients(g, format, plain);
      decodeGradients(plain, format, decoded);
      for (let i = 0; i < n; i++) plainSum[i] += decoded[i];
      if (step === 49 || step === steps - 1) {
        for (let i = 0; i < n; i++) {
          worst = Math.max(worst, Math.abs(sentSum[i] - trueSum[i]));
          worstPlain = Math.max(worstPlain, Math.abs(plainSum[i] - trueSum[i]));
        }
      }
    }
    // Without feedback the error of the sum grows with the steps; with it, it stays within about
    // one rounding step of the format (2^-8 at 1 for bfloat16, 2^-11 for fp16), float32 sums aside.
    const ulp = format === "bf16" ? 2 ** -7 : 2 ** -10;
    assert.ok(worst <= ulp, `with error feedback the sum is off by ${worst}`);
    assert.ok(worstPlain > 20 * ulp, `without error feedback the sum is off by only ${worstPlain}`);
  });
}

/** A device holding only host buffers: enough for the exchange's reduce. */
function hostDevice(index: number, total: number): Device {
  return {
    index,
    kind: "host",
    parameters: sharedFloats(total),
    gradients: sharedFloats(total),
    compute: () => Promise.reject(new Error("not computing here")),
    close: () => Promise.resolve(),
  };
}

/** One group `fc` of `size` elements. */
function oneGroupLayout(size: number): ParameterLayout {
  return {
    slots: [{ name: "w", shape: [size], group: "fc", offset: 0, size, lrMult: 1, decayMult: 1 }],
    groups: [{ name: "fc", offset: 0, size }],
    total: size,
  };
}

// Mutations that made it fail: the master's own slice averaged unrounded (`round(devices[0])`
// removed and device 0's gradients copied unrounded), and the compressed transfer emulated at the
// fp32 size (`timedMove(2 * bytes, …)` in `#reduceCompressed`, whose recorded bytes are the moved
// ones) or at a quarter of it.
Deno.test("shared memory: every device's slice is rounded before the average; the link carries half the bytes", async () => {
  // 400 KB of fp32 gradients, 200 KB in fp16, over an emulated 1 MB/s link.
  const size = 100_000, link = parseLink("1MB/s");
  const reduce = async (mode: ReductionMode, wire: WireFormat) => {
    const layout = oneGroupLayout(size);
    const devices = [0, 1].map((d) => hostDevice(d, size));
    const random = xorshift(3);
    for (const device of devices) {
      device.gradients.set(Float32Array.from({ length: size }, () => random() / 2 ** 32 - 0.5));
    }
    const exchange = new SharedMemoryExchange(
      devices,
      layout,
      mode,
      link,
      (p) => new SGD(p, { lr: 0.1 }),
      { wire },
    );
    const records: { device: number; name: string; start: number; end: number; bytes?: number }[] = [];
    const context: ExchangeContext = {
      iteration: 0,
      deadline: Infinity,
      computing: () => false,
      record: (device, name, start, end, bytes) => records.push({ device, name, start, end, bytes }),
    };
    await exchange.reduce("fc", context);
    const average = exchange.optimizers[0].parameters[0].tensor.grad!.dataSync() as Float32Array;
    return { devices, records, average: average.slice() };
  };
  for (const mode of ["master", "allreduce"] as const) {
    const exact = await reduce(mode, "fp32");
    const half = await reduce(mode, "fp16");
    const sends = (r: typeof exact) => r.records.filter((s) => s.name === "send fc gradients");
    // The recorded bytes are those the emulated link was asked to carry (`TransferTiming.bytes`), so
    // these say the link carries half as much, without timing it.
    assert.ok(sends(exact).length > 0 && sends(exact).every((s) => s.bytes === 4 * size), mode);
    assert.ok(sends(half).length > 0 && sends(half).every((s) => s.bytes === 2 * size), mode);
    // (q(g0) + q(g1)) · fround(1/2), each device's gradients rounded, the master's too.
    const rounded = half.devices.map((d) => {
      const q = new Float32Array(size);
      quantizeGradients(d.gradients, "fp16", q);
      return q;
    });
    const expected = Float32Array.from(
      rounded[0],
      (q0, i) => Math.fround(q0 + rounded[1][i]) * Math.fround(1 / 2),
    );
    assert.deepEqual(bits(half.average), bits(expected), `${mode}: the average of the rounded gradients`);
    assert.notDeepEqual(bits(half.average), bits(exact.average), `${mode}: fp16 changed nothing`);
  }
});

// Mutation that made it fail: the refusal removed from the `ResidentExchange` constructor (it then
// goes on to activate the devices, which these stand-ins cannot).
Deno.test("GPU-resident devices refuse a compressed wire in one line naming --wire", () => {
  let activated = 0;
  const devices = [0, 1].map((d) => ({
    ...hostDevice(d, 8),
    kind: "webgpu",
    resident: {
      activate: () => activated++,
    } as unknown as Device["resident"],
  }));
  assert.throws(
    () =>
      new ResidentExchange(devices, oneGroupLayout(8), "master", undefined, tinyOptimizers.sgd, {
        wire: "bf16",
      }),
    (error: Error) => {
      assert.match(
        error.message,
        /^--wire bf16: GPU-resident \(webgpu\) devices exchange fp32 gradients only/,
      );
      assert.ok(!error.message.includes("\n"));
      return true;
    },
  );
  assert.equal(activated, 0);
});

// Mutation that made it fail: the Chrome trace's `args` without `bytes`.
Deno.test("a span's bytes reach the Chrome trace's args", () => {
  const trace = new TraceRecorder();
  trace.record({
    device: 1,
    lane: "comm",
    name: "send fc gradients",
    step: 0,
    start: 0,
    end: 1,
    bytes: 2048,
  });
  trace.record({ device: 0, lane: "comm", name: "reduce fc", step: 0, start: 0, end: 2 });
  const spans = trace.toChromeTrace().traceEvents.filter((e) => e.ph === "X");
  assert.deepEqual(spans.map((e) => e.args), [{ step: 0, bytes: 2048 }, { step: 0 }]);
  assert.throws(
    () => trace.record({ device: 0, lane: "comm", name: "x", step: 0, start: 0, end: 1, bytes: -1 }),
    /bytes must be a finite number >= 0, got -1/,
  );
});

/** Trains the tiny net on 2 Worker devices and returns the master's parameters. */
async function train(
  plan: Plan,
  mode: ReductionMode,
  wire?: WireFormat,
  errorFeedback?: boolean,
  steps = 3,
): Promise<Float32Array> {
  const trainer = await DataParallelTrainer.create({
    model: tinyModel,
    devices: 2,
    mode,
    plan,
    optimizer: tinyOptimizers.sgd,
    seed: RUN_SEED,
    verifyReplicas: true,
    wire,
    errorFeedback,
  });
  try {
    for (let step = 0; step < steps; step++) await trainer.step(tinyBatch(step));
    return trainer.masterParameters();
  } finally {
    await trainer.close();
  }
}

// Mutations that made it fail: the master's own gradients not rounded in master mode (master then
// differs from allreduce); one residual shared by every device instead of one each (master mode,
// which rounds the peers first, then differs from allreduce, which rounds device 0 first); and the
// exchange ignoring its wire options (`GradientWire.create({}, …)` in `SharedMemoryExchange`: fp16
// then equals fp32).
Deno.test("fp16 on 2 devices: sequential = overlap and master = allreduce bit for bit, and not fp32", async () => {
  const exact = await train(sequentialPlan(groups), "master");
  const runs: Record<string, Float32Array> = {};
  for (const mode of ["master", "allreduce"] as const) {
    for (const plan of [sequentialPlan(groups), overlapPlan(groups)]) {
      runs[`${mode} ${plan.name}`] = await train(plan, mode, "fp16");
    }
  }
  const reference = runs["master sequential"];
  for (const [name, parameters] of Object.entries(runs)) {
    assert.deepEqual(bits(parameters), bits(reference), name);
  }
  assert.notDeepEqual(bits(reference), bits(exact), "fp16 gave the fp32 bits: nothing was rounded");
  // Close to fp32 all the same: rounding to fp16 moves a few steps' parameters very little.
  let diff = 0, norm = 0;
  for (let i = 0; i < exact.length; i++) {
    diff += (reference[i] - exact[i]) ** 2;
    norm += exact[i] ** 2;
  }
  assert.ok(
    Math.sqrt(diff / norm) < 1e-3,
    `fp16 moved the parameters by ${Math.sqrt(diff / norm)} (relative)`,
  );

  const feedback = await train(overlapPlan(groups), "master", "bf16", true);
  assert.deepEqual(bits(await train(sequentialPlan(groups), "allreduce", "bf16", true)), bits(feedback));
  assert.notDeepEqual(bits(await train(overlapPlan(groups), "master", "bf16")), bits(feedback));
});

// Mutation that made it fail: `checkWireOptions(options)` removed from `DataParallelTrainer.create`
// (the exchange still refuses them, but only once the devices have started).
Deno.test("bad wire options are refused before any device starts", async () => {
  let started = 0;
  const base = {
    model: tinyModel,
    plan: sequentialPlan(groups),
    optimizer: tinyOptimizers.sgd,
    startDevice: () => {
      started++;
      return Promise.reject(new Error("no device should start"));
    },
  };
  await assert.rejects(
    DataParallelTrainer.create({ ...base, wire: "fp8" as WireFormat }),
    /wire must be one of fp32, fp16, bf16, got "fp8"/,
  );
  await assert.rejects(
    DataParallelTrainer.create({ ...base, errorFeedback: true }),
    /errorFeedback needs wire "fp16" or "bf16"/,
  );
  assert.equal(started, 0);
});

// Mutations that made it fail: the `--error-feedback` and `--backend webgpu` checks removed from
// `parseTrainArgs` (each then parses instead of failing).
Deno.test("train command: --wire and --error-feedback parse, and are refused in one line where they cannot work", () => {
  const defaults = parseTrainArgs([], undefined);
  assert.deepEqual([defaults.wire, defaults.errorFeedback], ["fp32", false]);
  const args = parseTrainArgs(["--wire", "bf16", "--error-feedback"], undefined);
  assert.deepEqual([args.wire, args.errorFeedback], ["bf16", true]);
  const refused = (argv: string[], message: RegExp) =>
    assert.throws(() => parseTrainArgs(argv, undefined), (error: Error) => {
      assert.match(error.message, message);
      assert.ok(!error.message.includes("\n"), `not one line: ${error.message}`);
      return true;
    });
  refused(["--wire", "fp8"], /^--wire must be one of fp32, fp16, bf16, got "fp8"/);
  refused(["--error-feedback"], /^--error-feedback needs --wire fp16 or bf16/);
  refused(["--wire", "fp16", "--backend", "webgpu"], /^--wire fp16 is not available with --backend webgpu/);
  assert.match(helpText(), /--wire FORMAT .*fp32 \| fp16 \| bf16/);
  assert.match(helpText(), /--error-feedback /);
});

// Mutations that made it fail: the gathers sending the fp32 gradients while the averaging rank
// decodes 16-bit ones (`send` returning `gradients(m)` under a compressed wire: garbage, NaN loss),
// only rank 0's part of each gathered message decoded (fp16 then differs from the in-process run),
// and `MpiExchange.create` dropping `errorFeedback` (bf16 with error feedback then differs).
Deno.test({
  name:
    "mpi: fp16, and bf16 with error feedback, across 2 processes in 1000-byte chunks equal the in-process run",
  // Slow (two MPI jobs): runs with the slow tests. The default set runs both wires and error feedback
  // in process (above) and the fp32 wire across 2 processes (mpi_test.ts).
  ignore: !runSlowTests || !mpirun,
  fn: async () => {
    for (const [wire, errorFeedback] of [["fp16", false], ["bf16", true]] as const) {
      const run = await mpi([
        "tests/fixtures/mpi_rank.ts",
        "--scenario",
        "lossless",
        "--wire",
        wire,
        ...(errorFeedback ? ["--error-feedback"] : []),
      ]);
      const hashes = rank0Report<Record<string, string>>(run);
      // In process, every schedule and mode gives these bits (the test above).
      const local = await sha256(
        await train(overlapPlan(groups), "master", wire, errorFeedback, TRAIN_STEPS),
      );
      assert.deepEqual(hashes, {
        "master sequential": local,
        "master overlap": local,
        "allreduce sequential": local,
        "allreduce overlap": local,
      }, wire);
    }
  },
});
