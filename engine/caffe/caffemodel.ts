/**
 * Caffe's binary weights (`.caffemodel`): a strict reader of the protobuf wire format for the few
 * messages that carry them (`NetParameter` → `LayerParameter` or the legacy `V1LayerParameter` →
 * `BlobProto` → `BlobShape`), and {@link loadCaffeWeights}, which checks every blob against an
 * imported net's parameters and loads all of them or none.
 *
 * The reader is ours rather than a protobuf library's so that a malformed or hostile file fails with
 * one line naming the byte offset, within fixed limits of size and nesting.
 *
 * @module
 */

import { formatShape, TandemError } from "../errors.ts";
import type { BufferEntry, ParameterEntry } from "../nn/parameter.ts";
import { Tensor } from "../tensor.ts";
import { caffeModuleName } from "./reader.ts";

/**
 * A `.caffemodel` that cannot be read, or whose weights do not fit the net; the message is one line,
 * `file: byte N: what was expected` for format errors and `file: weights do not fit the net: …` for
 * mismatches.
 *
 * @example
 * ```ts
 * import { CaffeModelError, parseCaffeModel } from "./caffemodel.ts";
 * try {
 *   parseCaffeModel(new Uint8Array([0x0a]), "net.caffemodel");
 * } catch (e) {
 *   if (e instanceof CaffeModelError) console.log(e.offset); // 1
 * }
 * ```
 */
export class CaffeModelError extends TandemError {
  /** The message without the `file: byte N:` prefix. */
  readonly detail: string;
  /** An error at byte `offset` of `fileName` (no offset: the file as a whole). */
  constructor(
    /** File the bytes came from (`<caffemodel>` when not given). */
    readonly fileName: string,
    /** Byte offset of the problem, when it is at one place. */
    readonly offset: number | undefined,
    detail: string,
  ) {
    super(`${fileName}: ${offset === undefined ? "" : `byte ${offset}: `}${detail}`);
    this.detail = detail;
  }
}

/** One blob of a layer: its shape as the file gives it and its values. */
export interface CaffeBlob {
  /** `BlobShape` dims, or the legacy `[num, channels, height, width]`. */
  readonly shape: readonly number[];
  /** Whether the shape came from the legacy 4-D fields (Caffe pads a target's shape to compare). */
  readonly legacy: boolean;
  /** The values (`data`, packed or not). */
  readonly data: Float32Array;
  /** Byte offset of the `BlobProto`, for messages. */
  readonly offset: number;
}

/** A layer of a `.caffemodel` and its blobs (layers without blobs are kept too, with none). */
export interface CaffeLayerWeights {
  /** The layer's name. */
  readonly name: string;
  /** Its blobs in Caffe's order (weights, then bias). */
  readonly blobs: readonly CaffeBlob[];
  /** Byte offset of the layer message. */
  readonly offset: number;
}

/** Largest `.caffemodel` accepted: protobuf's own 2 GiB message limit. */
export const MAX_CAFFEMODEL_BYTES = 2 ** 31 - 1;
/** Deepest nesting the reader descends (net → layer → blob → shape); it never goes further. */
export const MAX_CAFFEMODEL_DEPTH = 4;
/** Largest blob rank accepted (Caffe's own `kMaxBlobAxes`). */
const MAX_AXES = 32;

const VARINT = 0, FIXED64 = 1, LENGTH = 2, FIXED32 = 5;

/** A cursor over `bytes[start, end)`: one message, read field by field. */
class Wire {
  pos: number;
  constructor(
    readonly bytes: Uint8Array,
    readonly view: DataView,
    readonly fileName: string,
    start: number,
    readonly end: number,
    readonly depth: number,
    readonly what: string,
  ) {
    this.pos = start;
    if (depth > MAX_CAFFEMODEL_DEPTH) {
      this.fail(start, `${what} nests deeper than ${MAX_CAFFEMODEL_DEPTH} levels`);
    }
  }

  fail(offset: number, detail: string): never {
    throw new CaffeModelError(this.fileName, offset, detail);
  }

  /** A varint of up to 10 bytes as a number; `safe` refuses values beyond 2^53 (lengths, dims). */
  varint(what: string, safe = true): number {
    const start = this.pos;
    let value = 0, scale = 1;
    for (let i = 0; i < 10; i++) {
      if (this.pos >= this.end) this.fail(start, `truncated varint (${what}): the ${this.what} ends first`);
      const byte = this.bytes[this.pos++];
      if (i === 9 && byte > 1) this.fail(start, `varint (${what}) longer than 64 bits`);
      value += (byte & 0x7f) * scale;
      scale *= 128;
      if (byte < 0x80) {
        if (safe && value > Number.MAX_SAFE_INTEGER) {
          this.fail(start, `${what} ${value} is too large (a negative or corrupt value)`);
        }
        return value;
      }
    }
    return this.fail(start, `varint (${what}) longer than 10 bytes`);
  }

  /** The next field's number and wire type, or undefined at the message's end. */
  tag(): { field: number; wire: number; at: number } | undefined {
    if (this.pos >= this.end) return undefined;
    const at = this.pos;
    const key = this.varint("field key");
    const field = Math.floor(key / 8), wire = key % 8;
    if (field === 0 || field > 2 ** 29 - 1) this.fail(at, `field number ${field} is out of range`);
    return { field, wire, at };
  }

  /** The extent of a length-delimited field, checked against the enclosing message. */
  length(what: string): { start: number; end: number } {
    const at = this.pos;
    const n = this.varint(`length of ${what}`);
    if (n > this.end - this.pos) {
      this.fail(
        at,
        `${what} of ${n} bytes reaches past the end of the ${this.what} (${this.end - this.pos} left)`,
      );
    }
    const start = this.pos;
    this.pos += n;
    return { start, end: this.pos };
  }

  /** A sub-message of this one, one level deeper. */
  message(what: string): Wire {
    const { start, end } = this.length(what);
    return new Wire(this.bytes, this.view, this.fileName, start, end, this.depth + 1, what);
  }

  expect(tag: { field: number; wire: number; at: number }, wire: number, what: string): void {
    if (tag.wire !== wire) {
      const names = ["varint", "fixed64", "length-delimited", "group start", "group end", "fixed32"];
      this.fail(
        tag.at,
        `${this.what} field ${tag.field} (${what}) has wire type ${tag.wire} (${
          names[tag.wire] ?? "invalid"
        }); expected ${names[wire]}`,
      );
    }
  }

  /** Skips a field this reader does not need, without looking inside it. */
  skip(tag: { field: number; wire: number; at: number }): void {
    const need = (n: number) => {
      if (this.end - this.pos < n) {
        this.fail(tag.at, `truncated field ${tag.field}: the ${this.what} ends first`);
      }
      this.pos += n;
    };
    if (tag.wire === VARINT) this.varint(`field ${tag.field}`, false);
    else if (tag.wire === FIXED64) need(8);
    else if (tag.wire === FIXED32) need(4);
    else if (tag.wire === LENGTH) this.length(`field ${tag.field}`);
    else {
      this.fail(
        tag.at,
        `field ${tag.field} of the ${this.what} has wire type ${tag.wire}, which Caffe never writes`,
      );
    }
  }

  string(what: string): string {
    const { start, end } = this.length(what);
    try {
      return new TextDecoder("utf-8", { fatal: true }).decode(this.bytes.subarray(start, end));
    } catch {
      return this.fail(start, `${what} is not valid UTF-8`);
    }
  }
}

/** Appends repeated floats, packed (one length-delimited run) or unpacked (one fixed32 each). */
function readFloats(w: Wire, tag: { field: number; wire: number; at: number }, out: number[][]): void {
  if (tag.wire === FIXED32) {
    if (w.end - w.pos < 4) w.fail(tag.at, `truncated float: the ${w.what} ends first`);
    out.push([w.view.getFloat32(w.pos, true)]);
    w.pos += 4;
    return;
  }
  w.expect(tag, LENGTH, "data, packed floats");
  const { start, end } = w.length("packed data");
  if ((end - start) % 4) w.fail(start, `packed data of ${end - start} bytes is not a whole number of floats`);
  const run = new Array<number>((end - start) / 4);
  for (let i = 0; i < run.length; i++) run[i] = w.view.getFloat32(start + 4 * i, true);
  out.push(run);
}

/** Repeated int64 dims, packed or not; negative ones (10-byte varints) are refused by `varint`. */
function readDims(w: Wire, tag: { field: number; wire: number; at: number }, dims: number[]): void {
  if (tag.wire === VARINT) {
    dims.push(w.varint("BlobShape dim"));
    return;
  }
  w.expect(tag, LENGTH, "dim");
  // A packed run is a field, not a message: read at the same depth.
  const { start, end } = w.length("packed dims");
  const packed = new Wire(w.bytes, w.view, w.fileName, start, end, w.depth, "packed dims");
  while (packed.pos < packed.end) dims.push(packed.varint("BlobShape dim"));
}

function readBlob(w: Wire): CaffeBlob {
  const offset = w.pos;
  const blob = w.message("BlobProto");
  let dims: number[] | undefined;
  const legacy = [0, 0, 0, 0]; // num, channels, height, width: Caffe's defaults
  let legacyGiven = false;
  const runs: number[][] = [];
  for (let tag = blob.tag(); tag; tag = blob.tag()) {
    if (tag.field === 7) {
      blob.expect(tag, LENGTH, "shape");
      const shape = blob.message("BlobShape");
      dims ??= [];
      for (let t = shape.tag(); t; t = shape.tag()) {
        if (t.field === 1) readDims(shape, t, dims);
        else shape.skip(t);
      }
    } else if (tag.field >= 1 && tag.field <= 4) {
      blob.expect(tag, VARINT, ["num", "channels", "height", "width"][tag.field - 1]);
      legacy[tag.field - 1] = blob.varint(["num", "channels", "height", "width"][tag.field - 1]);
      legacyGiven = true;
    } else if (tag.field === 5) readFloats(blob, tag, runs);
    else if (tag.field === 8 || tag.field === 9) {
      blob.fail(tag.at, `BlobProto holds double_data/double_diff; only float data is supported`);
    } else blob.skip(tag); // diff (6) and anything newer
  }
  if (dims && legacyGiven) w.fail(offset, `BlobProto gives both shape and legacy num/channels/height/width`);
  const shape = dims ?? legacy;
  if (shape.length > MAX_AXES) w.fail(offset, `BlobProto has ${shape.length} axes (at most ${MAX_AXES})`);
  const count = shape.reduce((a, b) => a * b, 1);
  const values = runs.reduce((n, r) => n + r.length, 0);
  if (values !== count) {
    w.fail(offset, `BlobProto of shape ${formatShape(shape)} holds ${values} values; expected ${count}`);
  }
  const data = new Float32Array(values);
  let k = 0;
  for (const run of runs) for (const v of run) data[k++] = v;
  return { shape, legacy: dims === undefined, data, offset };
}

/**
 * Reads the layers and blobs of a `.caffemodel` (a binary `NetParameter`): `layer` (field 100) and
 * the legacy `layers` (field 2), each with its name and `BlobProto`s (shape or legacy 4-D dims,
 * packed or unpacked float data). Other fields are skipped unread. Anything malformed throws one
 * {@link CaffeModelError} naming the byte offset and what was expected.
 *
 * @example
 * ```ts
 * import { parseCaffeModel } from "./caffemodel.ts";
 * // layer { name: "ip" }: field 100, length 4, name (field 1) "ip"
 * const layers = parseCaffeModel(new Uint8Array([0xa2, 0x06, 4, 0x0a, 2, 0x69, 0x70]));
 * console.log(layers[0].name, layers[0].blobs.length); // ip 0
 * ```
 */
export function parseCaffeModel(bytes: Uint8Array, fileName = "<caffemodel>"): CaffeLayerWeights[] {
  if (bytes.length > MAX_CAFFEMODEL_BYTES) {
    throw new CaffeModelError(fileName, undefined, `${bytes.length} bytes exceeds protobuf's 2 GiB limit`);
  }
  if (bytes.length === 0) throw new CaffeModelError(fileName, 0, "empty file; expected a Caffe NetParameter");
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const net = new Wire(bytes, view, fileName, 0, bytes.length, 1, "NetParameter");
  const layers: CaffeLayerWeights[] = [];
  for (let tag = net.tag(); tag; tag = net.tag()) {
    // LayerParameter: name 1, blobs 7; V1LayerParameter: name 4, blobs 6.
    const fields = tag.field === 100
      ? { name: 1, blobs: 7 }
      : tag.field === 2
      ? { name: 4, blobs: 6 }
      : undefined;
    if (!fields) {
      net.skip(tag);
      continue;
    }
    const kind = tag.field === 100 ? "LayerParameter" : "V1LayerParameter";
    net.expect(tag, LENGTH, tag.field === 100 ? "layer" : "layers");
    const offset = net.pos;
    const layer = net.message(kind);
    let name: string | undefined;
    const blobs: CaffeBlob[] = [];
    for (let t = layer.tag(); t; t = layer.tag()) {
      if (t.field === fields.name) {
        layer.expect(t, LENGTH, "name");
        name = layer.string("layer name");
      } else if (t.field === fields.blobs) {
        layer.expect(t, LENGTH, "blobs");
        blobs.push(readBlob(layer));
      } else layer.skip(t);
    }
    if (name === undefined) {
      throw new CaffeModelError(
        fileName,
        offset,
        `${kind} has no name; weights are matched to the net by name`,
      );
    }
    layers.push({ name, blobs, offset });
  }
  return layers;
}

/** Caffe's order of a layer's blobs, as the importer names its parameters. */
const BLOB_NAMES = ["weight", "bias"];

/** Caffe's `Blob::ShapeEquals`: exact, or for legacy 4-D blobs the target padded with leading 1s. */
function fits(blob: CaffeBlob, target: readonly number[]): boolean {
  const want = blob.legacy && target.length <= 4 ? [...Array(4 - target.length).fill(1), ...target] : target;
  return want.length === blob.shape.length && want.every((d, i) => d === blob.shape[i]);
}

/** Options of {@link loadCaffeWeights}. */
export interface LoadCaffeWeightsOptions {
  /** File named in messages (default `<caffemodel>`). */
  fileName?: string;
  /** Only check that everything fits; load nothing. */
  dryRun?: boolean;
  /**
   * The net's buffers (`namedBuffers()`): a BatchNorm layer's three blobs (mean, variance, moving
   * average factor) load into its `mean`, `variance` and `scale_factor` buffers, in that order.
   * Without them a file with BatchNorm blobs does not fit.
   */
  buffers?: readonly BufferEntry[];
}

/**
 * Loads the blobs of `layers` (from {@link parseCaffeModel}) into `parameters` of a net imported
 * with `importCaffeNet`: blob 0 of layer `L` into `L.weight`, blob 1 into `L.bias` (the layer name
 * as the importer makes module names). Every shape is checked first — InnerProduct `[out, in]`,
 * Convolution `[out, in/groups, kh, kw]`, legacy 4-D blobs (`[1, 1, out, in]`) reshaped as Caffe
 * does — and every parameter must have a blob and every blob a parameter; otherwise one
 * {@link CaffeModelError} lists the first few problems and nothing is loaded. With `buffers`, a
 * BatchNorm layer's three blobs load into its statistics buffers.
 *
 * @example
 * ```ts ignore
 * import { loadCaffeWeights, parseCaffeModel } from "./caffemodel.ts";
 * const layers = parseCaffeModel(await Deno.readFile("lenet.caffemodel"), "lenet.caffemodel");
 * loadCaffeWeights(network.namedParameters(), layers, { fileName: "lenet.caffemodel" });
 * ```
 */
export function loadCaffeWeights(
  parameters: readonly ParameterEntry[],
  layers: readonly CaffeLayerWeights[],
  options: LoadCaffeWeightsOptions = {},
): void {
  const fileName = options.fileName ?? "<caffemodel>";
  const byName = new Map(parameters.map((p) => [p.name, p]));
  const moduleOf = (name: string) => name.slice(0, name.lastIndexOf("."));
  const buffersOf = new Map<string, BufferEntry[]>();
  for (const b of options.buffers ?? []) {
    buffersOf.set(moduleOf(b.name), [...buffersOf.get(moduleOf(b.name)) ?? [], b]);
  }
  const problems: string[] = [];
  const planned: [{ name: string; tensor: Tensor }, CaffeBlob][] = [];
  const matched = new Set<string>(); // parameters with a blob, fitting or not
  const seen = new Map<string, CaffeLayerWeights>();
  for (const layer of layers) {
    const module = caffeModuleName(layer.name);
    const previous = seen.get(module);
    if (previous && layer.blobs.length) {
      problems.push(
        `layer "${layer.name}" (byte ${layer.offset}) appears twice (also at byte ${previous.offset})`,
      );
      continue;
    }
    if (layer.blobs.length) seen.set(module, layer);
    layer.blobs.forEach((blob, i) => {
      // A module with buffers (BatchNorm) takes its blobs into them, in order.
      const statistics = buffersOf.get(module);
      const key = statistics
        ? statistics[i]?.name ?? `${module}.blob${i}`
        : `${module}.${BLOB_NAMES[i] ?? `blob${i}`}`;
      const target = statistics ? statistics[i] : byName.get(key);
      if (target) matched.add(key);
      if (!target) {
        problems.push(
          `in the file, not in the net: layer "${layer.name}" blob ${i} (${formatShape(blob.shape)})`,
        );
      } else if (!fits(blob, target.tensor.shape)) {
        problems.push(
          `shape differs: "${key}" is ${formatShape(target.tensor.shape)} in the net, ${
            formatShape(blob.shape)
          }${blob.legacy ? " (legacy num/channels/height/width)" : ""} in the file (byte ${blob.offset})`,
        );
      } else planned.push([target, blob]);
    });
  }
  for (const p of [...parameters, ...options.buffers ?? []]) {
    if (matched.has(p.name)) continue;
    const module = p.name.slice(0, p.name.lastIndexOf("."));
    problems.push(
      `in the net, not in the file: "${p.name}" ${formatShape(p.tensor.shape)}${
        seen.has(module) ? "" : ` (no layer "${module}" with blobs)`
      }`,
    );
  }
  if (problems.length) {
    const more = problems.length > 3 ? `; … ${problems.length} problems in all` : "";
    throw new CaffeModelError(
      fileName,
      undefined,
      `weights do not fit the net: ${problems.slice(0, 3).join("; ")}${more}`,
    );
  }
  if (options.dryRun) return;
  for (const [p, blob] of planned) {
    const temporary = new Tensor(p.tensor.backend, p.tensor.backend.upload(blob.data), p.tensor.shape);
    try {
      p.tensor.assign(temporary);
    } finally {
      temporary.dispose();
    }
  }
}

/**
 * Reads a `.caffemodel` file and loads it into `parameters` with {@link loadCaffeWeights}.
 *
 * @example
 * ```ts ignore
 * import { loadCaffeModel } from "./caffemodel.ts";
 * await loadCaffeModel("lenet_iter_10000.caffemodel", network.namedParameters());
 * ```
 */
export async function loadCaffeModel(
  path: string,
  parameters: readonly ParameterEntry[],
  options: { dryRun?: boolean } = {},
): Promise<CaffeLayerWeights[]> {
  const layers = parseCaffeModel(await Deno.readFile(path), path);
  loadCaffeWeights(parameters, layers, { fileName: path, dryRun: options.dryRun });
  return layers;
}
