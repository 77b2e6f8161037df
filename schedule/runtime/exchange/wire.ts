/**
 * Compressed gradients on the wire (opt-in: `wire: "fp16" | "bf16"`, the train command's `--wire`):
 * every device's gradients of a group are rounded to 16 bits before they travel, so the exchanged
 * bytes halve, and the receiver decodes them back to float32 exactly before the device-order average.
 *
 * Lossy, and not bit-identical to float32 training — but still one result per format: every device's
 * contribution, the master's own included, is rounded the same way before
 * `(q(g0) + … + q(gN−1)) · fround(1/N)`, so under one format every schedule, both reduction modes
 * and every transport give the same bits. Parameters are never compressed: the master's broadcast (and
 * an allreduce replica's update) stays float32, since rounding parameters would let replicas drift
 * apart and would round away small updates.
 *
 * Formats (both round to nearest, ties to even):
 * - `fp16` — IEEE 754 binary16: 5 exponent bits, 10 mantissa bits, subnormals down to 2^−24. A
 *   finite value whose magnitude rounds beyond the largest half, 65504, saturates to ±65504 instead
 *   of becoming ±Inf (an Inf would turn the average, and the parameters, into Inf or NaN; a saturated
 *   gradient is a clipped one). ±Inf stays ±Inf and NaN stays NaN (quiet), so a diverging run is
 *   still reported as one.
 * - `bf16` — the upper 16 bits of a float32 (8 exponent bits, 7 mantissa bits): float32's range,
 *   rounded. Finite values beyond the largest bfloat16 (≈ 3.39e38) saturate likewise; ±Inf and NaN
 *   are kept.
 *
 * Error feedback (`errorFeedback: true`): each device keeps a residual `e` for the whole layout,
 * persisting across steps. It sends `q(g + e)` and keeps `e ← (g + e) − q(g + e)`, so what rounding
 * drops in one step is sent in a later one: the sum of what a device sent over T steps differs from
 * the sum of its true gradients by its last residual only (at most half a unit in the last place
 * of the last value sent), instead of by an error that can grow with T. A non-finite `g + e` leaves a
 * zero residual. Checkpoints carry every device's residual (`residuals.ts`), so a resumed run
 * continues with the bits of a straight one. Where a failed step is undone (devices in one process)
 * a step reads the residuals the last good step left and writes a second buffer, which only a
 * completed step makes current ({@link GradientWire.commit}): a failed step leaves them as before,
 * for twice the residuals' memory and no copy.
 *
 * @module
 */

import { ValueError } from "../../../engine/errors.ts";

/** How gradients travel between devices: `fp32` (exact, the default), `fp16` or `bf16` (16 bits). */
export type WireFormat = "fp32" | "fp16" | "bf16";

/** The compressed formats. */
export type CompressedWireFormat = Exclude<WireFormat, "fp32">;

/** Every {@link WireFormat}, the default first. */
export const WIRE_FORMATS: readonly WireFormat[] = ["fp32", "fp16", "bf16"];

/**
 * Reads a wire format; anything else is a one-line `ValueError` naming the flag, the value and the
 * accepted ones.
 *
 * @example
 * ```ts
 * import { parseWire } from "./wire.ts";
 * console.log(parseWire("fp16")); // "fp16"
 * // parseWire("fp8") throws: --wire: expected one of fp32, fp16, bf16, got "fp8"
 * ```
 */
export function parseWire(text: string): WireFormat {
  const format = text.trim().toLowerCase();
  if (!(WIRE_FORMATS as readonly string[]).includes(format)) {
    throw new ValueError("--wire", `expected one of ${WIRE_FORMATS.join(", ")}, got "${text}"`);
  }
  return format as WireFormat;
}

/**
 * Bytes one gradient element takes on the wire: 4 for `fp32`, 2 for `fp16` and `bf16`.
 *
 * @example
 * ```ts
 * import { wireBytesPerElement } from "./wire.ts";
 * console.log(wireBytesPerElement("bf16") * 1000); // 2000 bytes for 1000 gradients
 * ```
 */
export function wireBytesPerElement(format: WireFormat): 2 | 4 {
  return format === "fp32" ? 4 : 2;
}

/**
 * The binary16 bits nearest to the float32 with bits `bits` (round to nearest, ties to even), with
 * finite overflow saturated to ±65504 and NaN kept quiet (see the module notes).
 *
 * @example
 * ```ts
 * import { fp16Bits } from "./wire.ts";
 * const bits = new Uint32Array(new Float32Array([1.5]).buffer)[0];
 * console.log(fp16Bits(bits).toString(16)); // "3e00"
 * ```
 */
export function fp16Bits(bits: number): number {
  const sign = (bits >>> 16) & 0x8000;
  const a = bits & 0x7fffffff;
  if (a >= 0x38800000) {
    // 2^−14 and up. At 65520 (0x477ff000), halfway from 65504 to 65536, ties-to-even would round
    // to 65536, which binary16 cannot hold: from there on finite values saturate.
    if (a >= 0x477ff000) {
      if (a > 0x7f800000) return sign | 0x7e00 | ((a >>> 13) & 0x3ff);
      return a === 0x7f800000 ? sign | 0x7c00 : sign | 0x7bff;
    }
    // Rebias the exponent (127 → 15) and drop 13 mantissa bits, rounding half to even.
    return sign | ((a - 0x38000000 + 0xfff + ((a >>> 13) & 1)) >>> 13);
  }
  // Below 2^−14: a multiple of 2^−24 (a binary16 subnormal), or 0. Up to 2^−25 (a tie with 0,
  // which is even) everything rounds to 0.
  if (a <= 0x33000000) return sign;
  const shift = 126 - (a >>> 23); // 14 … 23: value = mantissa · 2^−24 / 2^shift
  const mantissa = (a & 0x7fffff) | 0x800000;
  const half = 1 << (shift - 1);
  const rest = mantissa & ((half << 1) - 1);
  let q = mantissa >>> shift;
  if (rest > half || (rest === half && (q & 1) === 1)) q++;
  return sign | q; // q may reach 0x400, the smallest normal: still the right bits
}

/**
 * The bfloat16 bits nearest to the float32 with bits `bits` (round to nearest, ties to even), with
 * finite overflow saturated to ±(largest bfloat16) and NaN kept quiet (see the module notes).
 *
 * @example
 * ```ts
 * import { bf16Bits } from "./wire.ts";
 * const bits = new Uint32Array(new Float32Array([1.5]).buffer)[0];
 * console.log(bf16Bits(bits).toString(16)); // "3fc0"
 * ```
 */
export function bf16Bits(bits: number): number {
  const sign = (bits >>> 16) & 0x8000;
  const a = bits & 0x7fffffff;
  if (a >= 0x7f7f8000) {
    if (a > 0x7f800000) return sign | (a >>> 16) | 0x40;
    return a === 0x7f800000 ? sign | 0x7f80 : sign | 0x7f7f;
  }
  return sign | ((a + 0x7fff + ((a >>> 16) & 1)) >>> 16);
}

/** float32 bits of every binary16 value, built on first use (256 KiB). */
let fp16Table: Uint32Array | undefined;

function fp16ToFloatBits(): Uint32Array {
  if (fp16Table) return fp16Table;
  const table = new Uint32Array(65536);
  const floats = new Float32Array(table.buffer);
  for (let h = 0; h < 65536; h++) {
    const sign = (h & 0x8000) << 16, exponent = (h >>> 10) & 0x1f, mantissa = h & 0x3ff;
    if (exponent === 0) {
      floats[h] = mantissa * 2 ** -24; // exact: a subnormal half is a small float32 normal
      table[h] |= sign; // ±0 too
    } else if (exponent === 31) table[h] = sign | 0x7f800000 | (mantissa << 13);
    else table[h] = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  return fp16Table = table;
}

/** One float32 and its bits, for the residual arithmetic. */
const scratch = new Float32Array(1);
const scratchBits = new Uint32Array(scratch.buffer);

/**
 * Per float32 exponent field, `1.5 · 2^(e + 42)` with `e` the binary16 exponent of that binade (at
 * least −14, the subnormals' spacing): `(|x| + c) − c` in float64 is `|x|` rounded to the binary16
 * grid, ties to even, in the addition's single rounding (the sum stays in c's binade, whose float64
 * spacing is binary16's there, and c is an even multiple of it); saturated where above 65504 (Inf
 * and NaN pass), and the sign put back by multiplying with ±1. Branch-free, unlike {@link fp16Bits}
 * (the codec test holds both to the same reference), and written out in each loop below: V8 runs
 * these loops about 3× slower when the rounding is a function, even a small one.
 */
const FP16_ROUNDERS = Float64Array.from(
  { length: 256 },
  (_, field) => 1.5 * 2 ** (Math.max(field - 127, -14) + 42),
);

/**
 * What stands in for a rounded magnitude `q` beyond 65504 when it is scaled to binary16 bits (see
 * `compressGradients`): 65504 for a saturated value, 2^16 for Inf (whose bits come out as 0x7c00),
 * 1.5 · 2^16 for NaN (0x7e00, a quiet NaN).
 */
function fp16Marker(q: number): number {
  return q === Infinity ? 65536 : q > 65504 ? 65504 : 98304;
}

/** The block `compressGradients` scales binary16 values into, and its bits. */
const FP16_BLOCK = new Float32Array(4096);
const FP16_BLOCK_BITS = new Uint32Array(FP16_BLOCK.buffer);

function bitsOf(values: Float32Array): Uint32Array {
  return new Uint32Array(values.buffer, values.byteOffset, values.length);
}

function checkLengths(what: string, from: { length: number }, to: { length: number }): void {
  if (from.length !== to.length) {
    throw new ValueError(what, `needs equal lengths, got ${from.length} values and ${to.length} outputs`);
  }
}

/**
 * Decodes 16-bit `encoded` values of `format` into `out`, exactly (every binary16 and bfloat16 value
 * is a float32).
 *
 * @example
 * ```ts
 * import { decodeGradients } from "./wire.ts";
 * const out = new Float32Array(2);
 * decodeGradients(new Uint16Array([0x3e00, 0xc000]), "fp16", out);
 * console.log(out); // Float32Array [1.5, -2]
 * ```
 */
export function decodeGradients(encoded: Uint16Array, format: CompressedWireFormat, out: Float32Array): void {
  checkLengths("decodeGradients", encoded, out);
  const target = bitsOf(out);
  if (format === "bf16") {
    for (let i = 0; i < encoded.length; i++) target[i] = encoded[i] << 16;
    return;
  }
  const table = fp16ToFloatBits();
  for (let i = 0; i < encoded.length; i++) target[i] = table[encoded[i]];
}

/**
 * Encodes `values` as 16-bit `format` into `out`, what travels. With a `residual` (error feedback,
 * the same length as `values`, zeros at first): encodes `v = fround(values + residual)` instead and
 * leaves `v − decode(encode(v))` (0 where `v` is not finite) in `residualOut` (default: `residual`
 * itself). NaN is encoded as a quiet NaN, its payload not kept.
 *
 * @example
 * ```ts
 * import { compressGradients, decodeGradients } from "./wire.ts";
 * const residual = new Float32Array(1);
 * const wire = new Uint16Array(1), back = new Float32Array(1);
 * compressGradients(new Float32Array([1 + 2 ** -12]), "fp16", wire, residual);
 * decodeGradients(wire, "fp16", back);
 * console.log(back[0], residual[0]); // 1 0.000244140625 (sent next step)
 * ```
 */
export function compressGradients(
  values: Float32Array,
  format: CompressedWireFormat,
  out: Uint16Array,
  residual?: Float32Array,
  residualOut: Float32Array | undefined = residual,
): void {
  checkLengths("compressGradients", values, out);
  if (residual) checkLengths("compressGradients", values, residual);
  if (residual) checkLengths("compressGradients", values, residualOut!);
  const source = bitsOf(values);
  if (format === "bf16") {
    if (!residual) {
      for (let i = 0; i < source.length; i++) {
        const bits = source[i];
        // Round half to even in place; beyond the largest bfloat16 (and NaN) bf16Bits decides.
        out[i] = (bits & 0x7fffffff) < 0x7f7f8000
          ? (bits + 0x7fff + ((bits >>> 16) & 1)) >>> 16
          : bf16Bits(bits);
      }
      return;
    }
    for (let i = 0; i < values.length; i++) {
      const v = Math.fround(values[i] + residual[i]);
      scratch[0] = v;
      const bits = scratchBits[0];
      const h = (bits & 0x7fffffff) < 0x7f7f8000
        ? (bits + 0x7fff + ((bits >>> 16) & 1)) >>> 16
        : bf16Bits(bits);
      out[i] = h;
      scratchBits[0] = h << 16;
      const e = v - scratch[0];
      residualOut![i] = e - e === 0 ? e : 0;
    }
    return;
  }
  // Block by block: first each value rounded and scaled by 2^−112 into float32, whose bits are
  // then binary16's shifted left by 13 (subnormals included; the sign stays in place), then the
  // bits. Two plain passes over a block in cache run faster than one that turns doubles into
  // integers.
  const rounders = FP16_ROUNDERS, scaled = FP16_BLOCK, scaledBits = FP16_BLOCK_BITS, n = values.length;
  for (let start = 0; start < n; start += scaled.length) {
    const end = Math.min(n, start + scaled.length);
    if (!residual) {
      for (let i = start; i < end; i++) {
        const bits = source[i], c = rounders[(bits >>> 23) & 0xff], sign = 1 - ((bits >>> 31) << 1);
        const q = Math.abs(values[i]) + c - c;
        if (q <= 65504) scaled[i - start] = q * sign * 2 ** -112;
        else scaled[i - start] = fp16Marker(q) * sign * 2 ** -112;
      }
    } else {
      for (let i = start; i < end; i++) {
        const v = Math.fround(values[i] + residual[i]);
        scratch[0] = v;
        const bits = scratchBits[0], c = rounders[(bits >>> 23) & 0xff], sign = 1 - ((bits >>> 31) << 1);
        let q = Math.abs(v) + c - c;
        if (q <= 65504) scaled[i - start] = q * sign * 2 ** -112;
        else {
          scaled[i - start] = fp16Marker(q) * sign * 2 ** -112;
          q = q === Infinity ? q : 65504;
        }
        const e = v - q * sign;
        residualOut![i] = e - e === 0 ? e : 0;
      }
    }
    for (let i = start; i < end; i++) {
      const t = scaledBits[i - start];
      out[i] = ((t >>> 16) & 0x8000) | ((t & 0x7fffffff) >>> 13);
    }
  }
}

/**
 * What the receiver of {@link compressGradients} decodes, in one pass without the 16-bit buffer:
 * `out = decode(encode(values))` (NaN as some NaN), with the same error feedback. `out` may be
 * `values`. For moves that need no buffer in between (devices sharing this process's memory).
 *
 * @example
 * ```ts
 * import { quantizeGradients } from "./wire.ts";
 * const out = new Float32Array(2);
 * quantizeGradients(new Float32Array([0.1, 70000]), "fp16", out);
 * console.log(out); // Float32Array [0.0999755859375, 65504]
 * ```
 */
export function quantizeGradients(
  values: Float32Array,
  format: CompressedWireFormat,
  out: Float32Array,
  residual?: Float32Array,
  residualOut: Float32Array | undefined = residual,
): void {
  checkLengths("quantizeGradients", values, out);
  if (residual) checkLengths("quantizeGradients", values, residual);
  if (residual) checkLengths("quantizeGradients", values, residualOut!);
  const source = bitsOf(values);
  if (format === "bf16") {
    const target = bitsOf(out);
    if (!residual) {
      for (let i = 0; i < source.length; i++) {
        const bits = source[i];
        target[i] = (bits & 0x7fffffff) < 0x7f7f8000
          ? (bits + 0x7fff + ((bits >>> 16) & 1)) & 0xffff0000
          : bf16Bits(bits) << 16;
      }
      return;
    }
    for (let i = 0; i < values.length; i++) {
      const v = Math.fround(values[i] + residual[i]);
      scratch[0] = v;
      const u = scratchBits[0];
      const bits = (u & 0x7fffffff) < 0x7f7f8000
        ? (u + 0x7fff + ((u >>> 16) & 1)) & 0xffff0000
        : bf16Bits(u) << 16;
      target[i] = bits;
      scratchBits[0] = bits;
      const e = v - scratch[0];
      residualOut![i] = e - e === 0 ? e : 0;
    }
    return;
  }
  const rounders = FP16_ROUNDERS, n = values.length;
  if (!residual) {
    for (let i = 0; i < n; i++) {
      const bits = source[i], c = rounders[(bits >>> 23) & 0xff];
      let q = Math.abs(values[i]) + c - c;
      if (q > 65504) q = q === Infinity ? q : 65504;
      out[i] = q * (1 - ((bits >>> 31) << 1));
    }
    return;
  }
  for (let i = 0; i < n; i++) {
    const v = Math.fround(values[i] + residual[i]);
    scratch[0] = v;
    const bits = scratchBits[0], c = rounders[(bits >>> 23) & 0xff];
    let q = Math.abs(v) + c - c;
    if (q > 65504) q = q === Infinity ? q : 65504;
    const q2 = q * (1 - ((bits >>> 31) << 1));
    out[i] = q2;
    const e = v - q2;
    residualOut![i] = e - e === 0 ? e : 0;
  }
}

/** How gradients travel, as {@link DataParallelOptions} gives it. */
export interface WireOptions {
  /** The format (default `fp32`). */
  wire?: WireFormat;
  /** Keep a residual per device and send it with the next step's gradients (compressed formats only). */
  errorFeedback?: boolean;
}

/**
 * Checks wire options before anything starts: a known format, and error feedback only with a
 * compressed one.
 *
 * @example
 * ```ts
 * import { checkWireOptions } from "./wire.ts";
 * checkWireOptions({ wire: "bf16", errorFeedback: true }); // fine
 * // checkWireOptions({ errorFeedback: true }) throws: errorFeedback needs wire "fp16" or "bf16"
 * ```
 */
export function checkWireOptions(options: WireOptions): void {
  const wire = options.wire ?? "fp32";
  if (!WIRE_FORMATS.includes(wire)) {
    throw new ValueError(
      "DataParallelTrainer",
      `wire must be one of ${WIRE_FORMATS.join(", ")}, got "${wire}"`,
    );
  }
  if (options.errorFeedback && wire === "fp32") {
    throw new ValueError(
      "DataParallelTrainer",
      `errorFeedback needs wire "fp16" or "bf16": fp32 gradients lose nothing to feed back`,
    );
  }
}

/**
 * One run's gradient compression: the format and, with error feedback, a residual per device for
 * the whole layout (elements indexed as in the layout), kept across steps. Exchanges compress each
 * device's group slice through it; {@link GradientWire.create} returns `undefined` for `fp32`, where
 * the exchanges keep their exact paths untouched.
 *
 * @example
 * ```ts
 * import { GradientWire } from "./wire.ts";
 * const wire = GradientWire.create({ wire: "fp16", errorFeedback: true }, 4, [0, 1])!;
 * const out = new Float32Array(2);
 * wire.quantize(1, 2, new Float32Array([0.1, 0.2]), out); // device 1, layout elements 2 and 3
 * wire.commit(); // the step completed: its residuals are what the next step adds
 * console.log(wire.bytes(1000)); // 2000
 * ```
 */
export class GradientWire {
  /** The compressed format. */
  readonly format: CompressedWireFormat;
  /** Per device index, the residual the current step adds (error feedback only). */
  #residuals: Map<number, Float32Array> | undefined;
  /**
   * Per device index, where the current step leaves its residual: a second buffer where a failed
   * step must leave the residuals as they were, else {@link #residuals} itself.
   */
  #written: Map<number, Float32Array> | undefined;

  private constructor(
    format: CompressedWireFormat,
    residuals: Map<number, Float32Array> | undefined,
    written: Map<number, Float32Array> | undefined,
  ) {
    this.format = format;
    this.#residuals = residuals;
    this.#written = written;
  }

  /**
   * The compression of `options` for a layout of `total` elements whose gradients come from the
   * devices with indices `devices` (those this process compresses for); `undefined` for `fp32`.
   * `undoable`: a failed step (one {@link GradientWire.commit} does not follow) leaves the residuals
   * as they were, at twice their memory.
   */
  static create(
    options: WireOptions,
    total: number,
    devices: Iterable<number>,
    undoable = false,
  ): GradientWire | undefined {
    checkWireOptions(options);
    const format = options.wire ?? "fp32";
    if (format === "fp32") return undefined;
    const indices = [...devices];
    const buffers = () => new Map(indices.map((d) => [d, new Float32Array(total)]));
    const residuals = options.errorFeedback ? buffers() : undefined;
    return new GradientWire(format, residuals, residuals && undoable ? buffers() : residuals);
  }

  /** Whether each device carries its rounding error into its next step. */
  get errorFeedback(): boolean {
    return this.#residuals !== undefined;
  }

  /** The devices whose residuals this process keeps, in index order (none without error feedback). */
  get devices(): number[] {
    return [...this.#residuals?.keys() ?? []].sort((a, b) => a - b);
  }

  /** Bytes `elements` gradients take on the wire. */
  bytes(elements: number): number {
    return elements * wireBytesPerElement(this.format);
  }

  /**
   * Device `device`'s residual over the whole layout as the last completed step left it (a view:
   * copy it to keep it), for checkpoints.
   */
  residual(device: number): Float32Array {
    const residual = this.#residuals?.get(device);
    if (!residual) throw new ValueError("GradientWire", `no residual for device ${device}`);
    return residual;
  }

  /** Replaces device `device`'s residual (resuming from a checkpoint); zeros where `values` is absent. */
  loadResidual(device: number, values: Float32Array | undefined): void {
    const residual = this.residual(device);
    if (values && values.length !== residual.length) {
      throw new ValueError(
        "GradientWire",
        `device ${device}'s residual has ${values.length} elements, the layout ${residual.length}`,
      );
    }
    if (values) residual.set(values);
    else residual.fill(0);
  }

  /**
   * The step completed: the residuals it left become those the next step adds. Every step writes
   * the residual of every element it reads (each exchanged group, whole), so the buffer the next step
   * writes holds nothing it will read first.
   */
  commit(): void {
    if (this.#written === this.#residuals) return;
    [this.#residuals, this.#written] = [this.#written, this.#residuals];
  }

  /** Device `device`'s residual of `length` elements from layout element `offset`: read, written. */
  #residual(device: number, offset: number, length: number): [Float32Array, Float32Array] | undefined {
    if (!this.#residuals) return undefined;
    const residual = this.#residuals.get(device), written = this.#written!.get(device);
    if (!residual || !written) throw new ValueError("GradientWire", `no residual for device ${device}`);
    return [residual.subarray(offset, offset + length), written.subarray(offset, offset + length)];
  }

  /** Encodes device `device`'s gradients `values` (from layout element `offset`) into `out`. */
  encode(device: number, offset: number, values: Float32Array, out: Uint16Array): void {
    const [residual, written] = this.#residual(device, offset, values.length) ?? [];
    compressGradients(values, this.format, out, residual, written);
  }

  /** Decodes what {@link GradientWire.encode} sent. */
  decode(encoded: Uint16Array, out: Float32Array): void {
    decodeGradients(encoded, this.format, out);
  }

  /** `out = decode(encode(values))` for device `device`, in one pass (see {@link quantizeGradients}). */
  quantize(device: number, offset: number, values: Float32Array, out: Float32Array): void {
    const [residual, written] = this.#residual(device, offset, values.length) ?? [];
    quantizeGradients(values, this.format, out, residual, written);
  }
}
