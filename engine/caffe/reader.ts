/**
 * What the Caffe importer's parts share: {@link CaffeImportError}, a strict reader of prototxt
 * values that reports the file position of every problem, the blocks every layer builder reads
 * (`param` blocks and multipliers, fillers, `*_param` messages, spatial sizes), and how messages
 * show a blob's shape.
 *
 * @module
 */

import { formatShape } from "../errors.ts";
import type { Filler, VarianceNorm } from "../nn/init.ts";
import type { Multipliers } from "../nn/layers.ts";
import type { Module } from "../nn/module.ts";
import { PrototxtError, type PrototxtField, PrototxtMessage, type PrototxtScalar } from "./prototxt.ts";

/**
 * A well-formed net definition that Tandem cannot import as given (unknown layer type, bad value,
 * a graph that cannot run), with the file position of the offending layer or value.
 *
 * @example
 * ```ts
 * import { CaffeImportError, importCaffeNet } from "./mod.ts";
 * try {
 *   importCaffeNet('layer { name: "e" type: "Eltwise" bottom: "a" top: "b" }');
 * } catch (e) {
 *   if (e instanceof CaffeImportError) console.log(e.layer, e.line, e.column); // e 1 1
 * }
 * ```
 */
export class CaffeImportError extends PrototxtError {
  /** An error about `layer` (if any) at `line`:`column` of `fileName`. */
  constructor(
    fileName: string,
    line: number,
    column: number,
    detail: string,
    /** Name of the Caffe layer at fault, when the problem is in a layer. */
    readonly layer?: string,
  ) {
    super(fileName, line, column, detail);
  }
}

/** Where a layer sits in the file, for errors. */
export interface LayerRef {
  name: string;
  type: string;
  field: PrototxtField;
  message: PrototxtMessage;
}

export class Reader {
  constructor(readonly fileName: string) {}

  fail(at: { line: number; column: number }, detail: string, layer?: string): never {
    throw new CaffeImportError(this.fileName, at.line, at.column, detail, layer);
  }

  failValue(field: PrototxtField, detail: string, layer?: string): never {
    return this.fail({ line: field.valueLine, column: field.valueColumn }, detail, layer);
  }

  /** The only occurrence of a singular field, as protobuf rejects a second one. */
  single(message: PrototxtMessage, name: string, where: string): PrototxtField | undefined {
    const fields = message.all(name);
    if (fields.length > 1) {
      this.fail(fields[1], `${where}: field "${name}" is not repeated but is given twice`);
    }
    return fields[0];
  }

  /** Rejects fields outside `allowed`: in interpreted blocks a typo or an unsupported option would otherwise be silently dropped. */
  checkFields(message: PrototxtMessage, allowed: readonly string[], where: string, layer?: string): void {
    for (const field of message.fields) {
      if (!allowed.includes(field.name)) {
        this.fail(field, `${where}: unknown field "${field.name}" (known: ${allowed.join(", ")})`, layer);
      }
    }
  }

  scalar(field: PrototxtField, where: string, layer?: string): PrototxtScalar {
    if (field.value instanceof PrototxtMessage) {
      this.failValue(field, `${where}: "${field.name}" must be a value, not a message`, layer);
    }
    return field.value;
  }

  messageOf(field: PrototxtField, where: string, layer?: string): PrototxtMessage {
    if (!(field.value instanceof PrototxtMessage)) {
      this.failValue(field, `${where}: "${field.name}" must be a message { … }`, layer);
    }
    return field.value;
  }

  number(field: PrototxtField, where: string, layer?: string): number {
    const v = this.scalar(field, where, layer);
    if (v.kind !== "number") {
      this.failValue(field, `${where}: "${field.name}" must be a number, got ${show(v)}`, layer);
    }
    return v.value;
  }

  /** An integer ≥ `min` (Caffe's uint32/int32 fields). */
  integer(field: PrototxtField, where: string, min: number, layer?: string): number {
    const v = this.number(field, where, layer);
    if (!Number.isInteger(v) || v < min) {
      this.failValue(
        field,
        `${where}: "${field.name}" must be an integer ≥ ${min}, got ${fieldText(field)}`,
        layer,
      );
    }
    return v;
  }

  string(field: PrototxtField, where: string, layer?: string): string {
    const v = this.scalar(field, where, layer);
    if (v.kind !== "string") {
      this.failValue(field, `${where}: "${field.name}" must be a quoted string, got ${show(v)}`, layer);
    }
    return v.value;
  }

  bool(field: PrototxtField, where: string, layer?: string): boolean {
    const v = this.scalar(field, where, layer);
    if (v.kind === "bool") return v.value;
    if (v.kind === "identifier" && (v.value === "t" || v.value === "f")) return v.value === "t";
    if (v.kind === "number" && (v.value === 0 || v.value === 1)) return v.value === 1;
    return this.failValue(field, `${where}: "${field.name}" must be true or false, got ${show(v)}`, layer);
  }

  /** An enum value by name or by number (`pool: MAX` or `pool: 0`). */
  enumValue<T extends string>(field: PrototxtField, values: readonly T[], where: string, layer?: string): T {
    const v = this.scalar(field, where, layer);
    if (v.kind === "identifier" && (values as readonly string[]).includes(v.value)) return v.value as T;
    if (v.kind === "number" && Number.isInteger(v.value) && v.value >= 0 && v.value < values.length) {
      return values[v.value];
    }
    return this.failValue(
      field,
      `${where}: "${field.name}" must be one of ${values.join(", ")}, got ${show(v)}`,
      layer,
    );
  }

  optNumber(m: PrototxtMessage, name: string, where: string, fallback: number, layer?: string): number {
    const f = this.single(m, name, where);
    return f ? this.number(f, where, layer) : fallback;
  }

  optInteger(
    m: PrototxtMessage,
    name: string,
    where: string,
    fallback: number,
    min: number,
    layer?: string,
  ): number {
    const f = this.single(m, name, where);
    return f ? this.integer(f, where, min, layer) : fallback;
  }

  optBool(m: PrototxtMessage, name: string, where: string, fallback: boolean, layer?: string): boolean {
    const f = this.single(m, name, where);
    return f ? this.bool(f, where, layer) : fallback;
  }
}

export function show(v: PrototxtScalar): string {
  switch (v.kind) {
    case "string":
      return `string ${JSON.stringify(v.value)}`;
    case "number":
      return v.text;
    case "bool":
      return String(v.value);
    default:
      return v.value;
  }
}

export function fieldText(field: PrototxtField): string {
  return field.value instanceof PrototxtMessage ? "a message" : show(field.value);
}

/**
 * A shape without its batch axis of 1, as messages show blobs (`[C, H, W]`): the importer tracks
 * shapes with the batch axis, the file's author thinks per sample.
 */
export function sampleShape(shape: readonly number[]): string {
  return formatShape(shape.slice(1));
}

/** `[h, w]` collapsed to one number when square, so options read like the hand-written models. */
export function pairOf(h: number, w: number): number | [number, number] {
  return h === w ? h : [h, w];
}

export const FILLER_TYPES = ["constant", "gaussian", "uniform", "xavier", "msra"] as const;
const VARIANCE_NORMS = ["FAN_IN", "FAN_OUT", "AVERAGE"] as const;
const VARIANCE_NORM_OF: Record<(typeof VARIANCE_NORMS)[number], VarianceNorm> = {
  FAN_IN: "fanIn",
  FAN_OUT: "fanOut",
  AVERAGE: "average",
};

/** Caffe's `FillerParameter` with Caffe's defaults (type constant, value 0, std 1, max 1). */
export function fillerOf(
  reader: Reader,
  field: PrototxtField | undefined,
  where: string,
  layer: string,
): Filler {
  if (!field) return { type: "constant", value: 0 };
  const m = reader.messageOf(field, where, layer);
  reader.checkFields(
    m,
    ["type", "value", "min", "max", "mean", "std", "sparse", "variance_norm"],
    where,
    layer,
  );
  const typeField = reader.single(m, "type", where);
  const type = typeField ? reader.string(typeField, where, layer) : "constant";
  if (!(FILLER_TYPES as readonly string[]).includes(type)) {
    reader.failValue(
      typeField!,
      `${where}: filler type "${type}" is not supported (supported: ${FILLER_TYPES.join(", ")})`,
      layer,
    );
  }
  const sparse = reader.single(m, "sparse", where);
  if (sparse && reader.number(sparse, where, layer) !== -1) {
    reader.failValue(sparse, `${where}: sparse fillers are not supported`, layer);
  }
  const varianceNorm = () => {
    const f = reader.single(m, "variance_norm", where);
    return VARIANCE_NORM_OF[f ? reader.enumValue(f, VARIANCE_NORMS, where, layer) : "FAN_IN"];
  };
  switch (type as (typeof FILLER_TYPES)[number]) {
    case "constant":
      return { type: "constant", value: reader.optNumber(m, "value", where, 0, layer) };
    case "gaussian": {
      const std = reader.optNumber(m, "std", where, 1, layer);
      if (!(std >= 0)) {
        reader.failValue(reader.single(m, "std", where)!, `${where}: std must be ≥ 0, got ${std}`, layer);
      }
      return { type: "gaussian", std, mean: reader.optNumber(m, "mean", where, 0, layer) };
    }
    case "uniform": {
      const min = reader.optNumber(m, "min", where, 0, layer),
        max = reader.optNumber(m, "max", where, 1, layer);
      if (!(max > min)) {
        reader.fail(field, `${where}: uniform filler needs max (${max}) > min (${min})`, layer);
      }
      return { type: "uniform", min, max };
    }
    case "xavier":
      return { type: "xavier", varianceNorm: varianceNorm() };
    case "msra":
      return { type: "msra", varianceNorm: varianceNorm() };
  }
}

/**
 * A spatial size given as `name` (repeated in ConvolutionParameter: 1 or 2 values; singular in
 * PoolingParameter) or as the `_h`/`_w` pair.
 */
export function spatial(
  reader: Reader,
  m: PrototxtMessage,
  names: { both: string; h: string; w: string; repeated: boolean },
  where: string,
  layer: string,
  fallback: number | undefined,
  min: number,
): [number, number] | undefined {
  const fields = names.repeated
    ? m.all(names.both)
    : [reader.single(m, names.both, where)].filter((f) => f !== undefined);
  const values = fields.map((f) => reader.integer(f, where, min, layer));
  const h = reader.single(m, names.h, where), w = reader.single(m, names.w, where);
  if (h || w) {
    if (values.length) {
      reader.fail(h ?? w!, `${where}: give either ${names.both} or ${names.h}/${names.w}, not both`, layer);
    }
    if (!h || !w) reader.fail(h ?? w!, `${where}: ${names.h} and ${names.w} must be given together`, layer);
    return [reader.integer(h, where, min, layer), reader.integer(w, where, min, layer)];
  }
  if (values.length > 2) {
    reader.fail(fields[2], `${where}: ${names.both} takes at most 2 values (2-D only)`, layer);
  }
  if (values.length === 2) return [values[0], values[1]];
  if (values.length === 1) return [values[0], values[0]];
  return fallback === undefined ? undefined : [fallback, fallback];
}

export const KERNEL = { both: "kernel_size", h: "kernel_h", w: "kernel_w" };
export const STRIDE = { both: "stride", h: "stride_h", w: "stride_w" };
export const PAD = { both: "pad", h: "pad_h", w: "pad_w" };

/**
 * One `param { … }` block of a layer (Caffe's `ParamSpec`), its fields checked. Learned blobs
 * ({@link multipliersOf}) and BatchNorm's statistics read these blocks alike; each then refuses a
 * shared parameter with {@link refuseSharedParam}, in its own order.
 */
export function paramBlock(reader: Reader, ref: LayerRef, field: PrototxtField): PrototxtMessage {
  const where = `layer "${ref.name}" param`;
  const m = reader.messageOf(field, where, ref.name);
  reader.checkFields(m, ["name", "lr_mult", "decay_mult", "share_mode"], where, ref.name);
  return m;
}

/** Refuses a `param` block's `name`: Caffe shares a parameter between layers by it; Tandem does not. */
export function refuseSharedParam(reader: Reader, ref: LayerRef, block: PrototxtMessage): void {
  const where = `layer "${ref.name}" param`;
  const shared = reader.single(block, "name", where);
  if (shared) reader.fail(shared, `${where}: shared parameters (param name) are not supported`, ref.name);
}

/** Weight and bias multipliers from `param { lr_mult decay_mult }` blocks (Caffe default 1 and 1). */
export function multipliersOf(reader: Reader, ref: LayerRef, blobs: number): Multipliers[] {
  const params = ref.message.all("param");
  if (params.length > blobs) {
    reader.fail(
      params[blobs],
      `layer "${ref.name}" (${ref.type}) has ${params.length} param blocks but only ${blobs} parameter blob(s)`,
      ref.name,
    );
  }
  return Array.from({ length: blobs }, (_, i) => {
    if (!params[i]) return { lrMult: 1, decayMult: 1 };
    const where = `layer "${ref.name}" param`;
    const m = paramBlock(reader, ref, params[i]);
    refuseSharedParam(reader, ref, m);
    return {
      lrMult: reader.optNumber(m, "lr_mult", where, 1, ref.name),
      decayMult: reader.optNumber(m, "decay_mult", where, 1, ref.name),
    };
  });
}

/** The `*_param` block of a layer, or an empty one. */
export function paramsOf(reader: Reader, ref: LayerRef, name: string): PrototxtMessage {
  const field = reader.single(ref.message, name, `layer "${ref.name}"`);
  return field
    ? reader.messageOf(field, `layer "${ref.name}"`, ref.name)
    : new PrototxtMessage(reader.fileName, ref.field.line, ref.field.column);
}

export interface Built {
  module: Module;
  notes: string[];
}

/**
 * A Caffe layer name as the network's module name (Tandem allows letters, digits, `_` and `-`), so
 * `conv/1` names parameters `conv_1.weight` and `conv_1.bias`; `.caffemodel` loading matches by it.
 *
 * @example
 * ```ts
 * import { caffeModuleName } from "./reader.ts";
 * caffeModuleName("conv/1"); // "conv_1"
 * ```
 */
export function caffeModuleName(name: string): string {
  let out = name.replace(/[^A-Za-z0-9_\-]/g, "_");
  // An integer-like key would jump to the front of the layer record (JS property order).
  if (/^(?:0|[1-9][0-9]*)$/.test(out)) out = `layer_${out}`;
  return out;
}
