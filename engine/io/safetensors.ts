/**
 * The safetensors format (https://github.com/huggingface/safetensors): encode, decode, save and
 * load (Tandem checkpoints on top of it are in `checkpoint.ts`).
 *
 * Layout: an 8-byte little-endian u64 `N`, then `N` bytes of UTF-8 JSON,
 * `{"__metadata__": {string: string}, "<name>": {"dtype": "F32", "shape": [2, 3],
 * "data_offsets": [begin, end]}, …}`, padded with spaces to a multiple of 8 bytes, then the raw
 * little-endian tensor data. Offsets are relative to the start of the data section; tensors are
 * written contiguously in header order, with `__metadata__` first, as the reference implementation
 * does.
 *
 * Loading validates what the reference implementation validates: header length within the 100 MB
 * limit and the file, UTF-8 JSON object starting with `{`, known dtypes, `data_offsets` matching the
 * shape's byte size, tensors covering the data section exactly with no overlap, gap or trailing
 * bytes, and string metadata values.
 *
 * @module
 */

import { formatShape, TandemError } from "../errors.ts";
import { tensor as makeTensor } from "../creation.ts";
import { Tensor } from "../tensor.ts";
import { writeFileAtomic } from "./atomic.ts";
import { SafetensorsError } from "./errors.ts";

/** Element types of the safetensors format. */
export type SafetensorsDType =
  | "BOOL"
  | "U8"
  | "I8"
  | "F8_E5M2"
  | "F8_E4M3"
  | "I16"
  | "U16"
  | "F16"
  | "BF16"
  | "I32"
  | "U32"
  | "F32"
  | "F64"
  | "I64"
  | "U64";

/** Bytes per element of each dtype. */
const DTYPE_BYTES: Readonly<Record<SafetensorsDType, number>> = {
  BOOL: 1,
  U8: 1,
  I8: 1,
  F8_E5M2: 1,
  F8_E4M3: 1,
  I16: 2,
  U16: 2,
  F16: 2,
  BF16: 2,
  I32: 4,
  U32: 4,
  F32: 4,
  F64: 8,
  I64: 8,
  U64: 8,
};

/**
 * Host arrays for the dtypes: float and integer types map to their typed array; `BOOL`, `U8` and the
 * 8-bit floats to `Uint8Array`; `F16` and `BF16` to `Uint16Array` holding the raw bits.
 */
export type SafetensorsArray =
  | Float32Array
  | Float64Array
  | Int8Array
  | Uint8Array
  | Int16Array
  | Uint16Array
  | Int32Array
  | Uint32Array
  | BigInt64Array
  | BigUint64Array;

const ARRAY_OF: Readonly<Record<SafetensorsDType, (buffer: ArrayBuffer) => SafetensorsArray>> = {
  BOOL: (b) => new Uint8Array(b),
  U8: (b) => new Uint8Array(b),
  I8: (b) => new Int8Array(b),
  F8_E5M2: (b) => new Uint8Array(b),
  F8_E4M3: (b) => new Uint8Array(b),
  I16: (b) => new Int16Array(b),
  U16: (b) => new Uint16Array(b),
  F16: (b) => new Uint16Array(b),
  BF16: (b) => new Uint16Array(b),
  I32: (b) => new Int32Array(b),
  U32: (b) => new Uint32Array(b),
  F32: (b) => new Float32Array(b),
  F64: (b) => new Float64Array(b),
  I64: (b) => new BigInt64Array(b),
  U64: (b) => new BigUint64Array(b),
};

/** The reference implementation's limit on the JSON header, against hostile or corrupt lengths. */
export const MAX_HEADER_BYTES = 100_000_000;

/**
 * How deep a safetensors header's JSON may nest: the format's own nesting is 3 (the header object, a
 * tensor's entry, its `shape` list). Checked before `JSON.parse`, so a hostile header fails in one
 * linear pass, and nothing downstream (messages quoting a value) meets a deeply nested one.
 */
export const MAX_HEADER_DEPTH = 3;

/**
 * Where `text` (JSON) first nests deeper than `limit` arrays and objects, as a phrase for an
 * error, or `undefined`. Strings are skipped, escapes included.
 */
export function jsonDepthProblem(text: string, limit: number): string | undefined {
  let depth = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x22) {
      for (i++; i < text.length && text.charCodeAt(i) !== 0x22; i++) if (text.charCodeAt(i) === 0x5c) i++;
    } else if (c === 0x5b || c === 0x7b) {
      if (++depth > limit) return `nests deeper than ${limit} levels at character ${i + 1}`;
    } else if (c === 0x5d || c === 0x7d) {
      depth--;
    }
  }
  return undefined;
}

/** A value quoted in an error message: JSON, cut to a readable length. */
function brief(value: unknown): string {
  const text = JSON.stringify(value) ?? String(value);
  return text.length > 60 ? `${text.slice(0, 57)}...` : text;
}

/** Typed arrays are used as little-endian bytes directly; a big-endian host would need swapping. */
const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/**
 * A tensor held on the host, as read from a safetensors file (or to be written to one).
 *
 * @example
 * ```ts
 * import type { HostTensor } from "./safetensors.ts";
 * const t: HostTensor = { dtype: "F32", shape: [2], data: new Float32Array([1, 2]) };
 * ```
 */
export interface HostTensor {
  /** Element type. */
  dtype: SafetensorsDType;
  /** Dimensions, outermost first (`[]` for a scalar). */
  shape: number[];
  /** The values, row-major; the typed array matching `dtype` (see {@link SafetensorsArray}). */
  data: SafetensorsArray;
}

/**
 * The contents of a safetensors file.
 *
 * @example
 * ```ts
 * import type { SafetensorsFile } from "./safetensors.ts";
 * function names(file: SafetensorsFile) { return [...file.tensors.keys()]; }
 * ```
 */
export interface SafetensorsFile {
  /** Tensors by name, in the order of their data in the file (the writing order). */
  tensors: Map<string, HostTensor>;
  /** The `__metadata__` strings (empty when the file has none). */
  metadata: Record<string, string>;
}

/** What can be written: Tandem tensors (float32 → F32, int32 → I32) or host tensors. */
export type TensorSource = Tensor | HostTensor;

/**
 * Tensors to write, by name, in writing order. Prefer a `Map` when names may look like integers: a
 * plain object iterates such keys first, in numeric order.
 */
export type TensorCollection = Record<string, TensorSource> | Map<string, TensorSource>;

function entriesOf(tensors: TensorCollection): [string, TensorSource][] {
  return tensors instanceof Map ? [...tensors] : Object.entries(tensors);
}

function elementCount(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

/** The safetensors dtype of a Tandem tensor dtype. */
export function dtypeOfTensor(t: Tensor): SafetensorsDType {
  return t.dtype === "int32" ? "I32" : "F32";
}

interface Planned {
  name: string;
  source: TensorSource;
  dtype: SafetensorsDType;
  shape: readonly number[];
  bytes: number;
}

/** Validates the input, lays the tensors out and renders the padded header (with its length prefix). */
function plan(
  where: string,
  tensors: TensorCollection,
  metadata: Record<string, string> | undefined,
): { header: Uint8Array; planned: Planned[]; dataBytes: number } {
  if (!LITTLE_ENDIAN) throw new SafetensorsError(where, "big-endian hosts are not supported");
  const planned: Planned[] = [];
  const seen = new Set<string>();
  for (const [name, source] of entriesOf(tensors)) {
    if (name === "__metadata__") throw new SafetensorsError(where, `"__metadata__" cannot name a tensor`);
    if (seen.has(name)) throw new SafetensorsError(where, `tensor "${name}" appears twice`);
    seen.add(name);
    if (source instanceof Tensor) {
      const dtype = dtypeOfTensor(source);
      planned.push({ name, source, dtype, shape: source.shape, bytes: source.size * DTYPE_BYTES[dtype] });
      continue;
    }
    const { dtype, shape, data } = source ?? {};
    if (!(dtype in DTYPE_BYTES)) {
      throw new SafetensorsError(where, `tensor "${name}": unknown dtype ${JSON.stringify(dtype)}`);
    }
    if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
      throw new SafetensorsError(where, `tensor "${name}": shape must be non-negative integers`);
    }
    const bytes = elementCount(shape) * DTYPE_BYTES[dtype];
    if (
      !ArrayBuffer.isView(data) || data.byteLength !== bytes || data.BYTES_PER_ELEMENT !== DTYPE_BYTES[dtype]
    ) {
      throw new SafetensorsError(
        where,
        `tensor "${name}": ${dtype} ${formatShape(shape)} needs ${bytes} bytes in ${
          DTYPE_BYTES[dtype]
        }-byte ` +
          `elements, data has ${data?.byteLength} in ${data?.BYTES_PER_ELEMENT}-byte elements`,
      );
    }
    planned.push({ name, source, dtype, shape, bytes });
  }
  const fields: string[] = [];
  if (metadata !== undefined) {
    const pairs = Object.entries(metadata).map(([key, value]) => {
      if (typeof value !== "string") {
        throw new SafetensorsError(where, `metadata "${key}" is a ${typeof value}; values must be strings`);
      }
      return `${JSON.stringify(key)}:${JSON.stringify(value)}`;
    });
    fields.push(`"__metadata__":{${pairs.join(",")}}`);
  }
  let offset = 0;
  for (const p of planned) {
    // Built by hand: JSON.stringify of an object would move integer-like names to the front.
    const info = { dtype: p.dtype, shape: p.shape, data_offsets: [offset, offset + p.bytes] };
    fields.push(`${JSON.stringify(p.name)}:${JSON.stringify(info)}`);
    offset += p.bytes;
  }
  const json = new TextEncoder().encode(`{${fields.join(",")}}`);
  const padded = Math.ceil(json.length / 8) * 8;
  if (padded > MAX_HEADER_BYTES) {
    throw new SafetensorsError(where, `header of ${padded} bytes exceeds the ${MAX_HEADER_BYTES}-byte limit`);
  }
  const header = new Uint8Array(8 + padded).fill(0x20, 8 + json.length);
  new DataView(header.buffer).setBigUint64(0, BigInt(padded), true);
  header.set(json, 8);
  return { header, planned, dataBytes: offset };
}

/** The bytes of one planned tensor, read from its backend when it is a Tandem tensor. */
async function bytesOf(where: string, p: Planned): Promise<Uint8Array> {
  const data = p.source instanceof Tensor ? await p.source.data() : p.source.data;
  if (data.byteLength !== p.bytes) {
    throw new SafetensorsError(
      where,
      `tensor "${p.name}" produced ${data.byteLength} bytes, expected ${p.bytes}`,
    );
  }
  return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
}

async function* chunksOf(where: string, header: Uint8Array, planned: Planned[]): AsyncGenerator<Uint8Array> {
  yield header;
  for (const p of planned) yield await bytesOf(where, p);
}

/**
 * The safetensors bytes of `tensors` (in the given order) and optional string `metadata`.
 * Async because device tensors are read with `await data()`.
 *
 * @example
 * ```ts
 * import { encodeSafetensors } from "./safetensors.ts";
 * import { tensor } from "../creation.ts";
 * const bytes = await encodeSafetensors({ w: tensor([1, 2, 3]) }, { note: "demo" });
 * ```
 */
export async function encodeSafetensors(
  tensors: TensorCollection,
  metadata?: Record<string, string>,
): Promise<Uint8Array> {
  const { header, planned, dataBytes } = plan("encodeSafetensors", tensors, metadata);
  const out = new Uint8Array(header.length + dataBytes);
  let at = 0;
  for await (const chunk of chunksOf("encodeSafetensors", header, planned)) {
    out.set(chunk, at);
    at += chunk.length;
  }
  return out;
}

/**
 * Parses and validates safetensors bytes; errors are `SafetensorsError`s prefixed with `source`.
 * Tensor data is copied out, so the result does not keep `bytes` alive.
 *
 * @example
 * ```ts
 * import { decodeSafetensors, encodeSafetensors } from "./safetensors.ts";
 * import { tensor } from "../creation.ts";
 * const { tensors } = decodeSafetensors(await encodeSafetensors({ w: tensor([1, 2]) }));
 * console.log(tensors.get("w")!.data); // Float32Array [1, 2]
 * ```
 */
export function decodeSafetensors(bytes: Uint8Array, source = "<bytes>"): SafetensorsFile {
  const fail = (what: string): never => {
    throw new SafetensorsError(source, what);
  };
  if (!LITTLE_ENDIAN) fail("big-endian hosts are not supported");
  if (bytes.length < 8) {
    fail(`truncated: ${bytes.length} bytes, but a safetensors file starts with an 8-byte header length`);
  }
  const headerLength = new DataView(bytes.buffer, bytes.byteOffset, 8).getBigUint64(0, true);
  if (headerLength > BigInt(MAX_HEADER_BYTES)) {
    fail(
      `header length ${headerLength} exceeds the ${MAX_HEADER_BYTES}-byte limit (corrupt or not safetensors)`,
    );
  }
  const n = Number(headerLength);
  if (8 + n > bytes.length) {
    fail(`truncated: header length ${n} reaches beyond the end of the file (${bytes.length} bytes)`);
  }
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(bytes.subarray(8, 8 + n));
  } catch {
    return fail("header is not valid UTF-8");
  }
  if (!text.startsWith("{")) {
    fail(`header does not start with "{" (got ${JSON.stringify(text.slice(0, 16))})`);
  }
  const tooDeep = jsonDepthProblem(text, MAX_HEADER_DEPTH);
  if (tooDeep) fail(`header ${tooDeep} (a safetensors header nests ${MAX_HEADER_DEPTH})`);
  let header: unknown;
  try {
    header = JSON.parse(text);
  } catch (error) {
    return fail(`header is not valid JSON: ${(error as Error).message}`);
  }
  if (header === null || typeof header !== "object" || Array.isArray(header)) {
    fail("header is not a JSON object");
  }

  const metadata: Record<string, string> = {};
  const infos: { name: string; dtype: SafetensorsDType; shape: number[]; begin: number; end: number }[] = [];
  for (const [name, value] of Object.entries(header as Record<string, unknown>)) {
    if (name === "__metadata__") {
      if (value === null || typeof value !== "object" || Array.isArray(value)) {
        fail("__metadata__ is not an object");
      }
      for (const [key, item] of Object.entries(value as Record<string, unknown>)) {
        if (typeof item !== "string") {
          fail(`__metadata__ ${brief(key)} is ${brief(item)}; metadata values must be strings`);
        }
        metadata[key] = item as string;
      }
      continue;
    }
    const where = `tensor ${brief(name)}`;
    if (value === null || typeof value !== "object" || Array.isArray(value)) {
      fail(`${where}: entry is not an object`);
    }
    const { dtype, shape, data_offsets: offsets } = value as Record<string, unknown>;
    if (typeof dtype !== "string" || !(dtype in DTYPE_BYTES)) {
      fail(
        `${where}: dtype ${brief(dtype)} is not supported (known: ${Object.keys(DTYPE_BYTES).join(", ")})`,
      );
    }
    if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
      fail(`${where}: shape ${brief(shape)} is not a list of non-negative integers`);
    }
    const validOffsets = Array.isArray(offsets) && offsets.length === 2 &&
      offsets.every((o) => Number.isSafeInteger(o) && o >= 0) && offsets[0] <= offsets[1];
    if (!validOffsets) {
      fail(`${where}: data_offsets ${brief(offsets)} is not [begin, end] with begin ≤ end`);
    }
    const [begin, end] = offsets as [number, number];
    const count = elementCount(shape as number[]);
    const needed = count * DTYPE_BYTES[dtype as SafetensorsDType];
    if (!Number.isSafeInteger(needed) || needed !== end - begin) {
      fail(
        `${where}: ${dtype} ${formatShape(shape as number[])} needs ${needed} bytes, but data_offsets ` +
          `[${begin}, ${end}] span ${end - begin}`,
      );
    }
    infos.push({ name, dtype: dtype as SafetensorsDType, shape: shape as number[], begin, end });
  }

  const dataStart = 8 + n;
  const dataLength = bytes.length - dataStart;
  const byOffset = [...infos].sort((a, b) => a.begin - b.begin || a.end - b.end);
  let covered = 0;
  let previous: (typeof infos)[number] | undefined;
  for (const info of byOffset) {
    const range = `"${info.name}" [${info.begin}, ${info.end}]`;
    if (info.begin < covered) {
      fail(
        `data_offsets overlap: ${range} starts inside "${previous!.name}" [${previous!.begin}, ${
          previous!.end
        }]`,
      );
    }
    if (info.begin > covered) {
      fail(`data_offsets leave a gap: bytes [${covered}, ${info.begin}) belong to no tensor`);
    }
    if (info.end > dataLength) {
      fail(`truncated: ${range} reaches beyond the data section (${dataLength} bytes after the header)`);
    }
    covered = info.end;
    previous = info;
  }
  if (covered !== dataLength) fail(`${dataLength - covered} trailing bytes after the last tensor's data`);

  // JSON.parse loses the header's key order (integer-like keys move first); data order is the
  // writer's order for files written contiguously in header order, as this module and the reference do.
  const tensors = new Map<string, HostTensor>();
  for (const info of byOffset) {
    const copy = bytes.slice(dataStart + info.begin, dataStart + info.end);
    tensors.set(info.name, { dtype: info.dtype, shape: info.shape, data: ARRAY_OF[info.dtype](copy.buffer) });
  }
  return { tensors, metadata };
}

/**
 * Writes `tensors` and optional string `metadata` to `path` in the safetensors format, atomically:
 * a crash or error mid-write leaves whatever was at `path` before (see `writeFileAtomic`).
 *
 * @example
 * ```ts
 * import { saveSafetensors } from "./safetensors.ts";
 * import { randn } from "../creation.ts";
 * const path = await Deno.makeTempFile({ suffix: ".safetensors" });
 * await saveSafetensors(path, { "fc.weight": randn([10, 4], { seed: 1 }) }, { epoch: "3" });
 * ```
 */
export async function saveSafetensors(
  path: string,
  tensors: TensorCollection,
  metadata?: Record<string, string>,
): Promise<void> {
  const { header, planned } = plan(path, tensors, metadata);
  try {
    await writeFileAtomic(path, chunksOf(path, header, planned));
  } catch (error) {
    if (error instanceof TandemError) throw error;
    throw new SafetensorsError(path, `cannot write: ${(error as Error).message}`, { cause: error });
  }
}

/**
 * Reads and validates the safetensors file at `path`; the values stay on the host (see
 * {@link hostTensorToTensor}). Errors name the file and what is wrong.
 *
 * @example
 * ```ts
 * import { loadSafetensors } from "./safetensors.ts";
 * declare const path: string;
 * const { tensors, metadata } = await loadSafetensors(path);
 * ```
 */
export async function loadSafetensors(path: string): Promise<SafetensorsFile> {
  let bytes: Uint8Array;
  try {
    bytes = await Deno.readFile(path);
  } catch (error) {
    throw new SafetensorsError(path, `cannot read: ${(error as Error).message}`, { cause: error });
  }
  return decodeSafetensors(bytes, path);
}

/**
 * A Tandem tensor on the current backend holding a host tensor's values: F32 → float32,
 * I32 → int32; other dtypes throw a `SafetensorsError`.
 *
 * @example
 * ```ts
 * import { hostTensorToTensor } from "./safetensors.ts";
 * const t = hostTensorToTensor({ dtype: "F32", shape: [2], data: new Float32Array([1, 2]) });
 * ```
 */
export function hostTensorToTensor(host: HostTensor, options: { requiresGrad?: boolean } = {}): Tensor {
  if (host.dtype === "F32") {
    return makeTensor(host.data as Float32Array, { shape: host.shape, requiresGrad: options.requiresGrad });
  }
  if (host.dtype === "I32") return makeTensor(host.data as Int32Array, { shape: host.shape, dtype: "int32" });
  throw new SafetensorsError(
    "hostTensorToTensor",
    `dtype ${host.dtype} has no Tandem tensor type (F32, I32)`,
  );
}
