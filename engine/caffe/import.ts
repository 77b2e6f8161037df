/**
 * Imports a Caffe net definition (`train_val.prototxt`, `deploy.prototxt`) as a Tandem `Network`:
 * Convolution, Pooling, LRN (ACROSS_CHANNELS and WITHIN_CHANNEL), ReLU, Dropout, InnerProduct and
 * Flatten, and for nets whose graph branches and joins Concat, Eltwise (SUM with coefficients, PROD,
 * MAX), BatchNorm (its statistics as buffers) and Scale, with Caffe's fillers and `param`
 * multipliers, parameters named after the Caffe layers (`<layer>.<blob>`) so the same seed gives the
 * same values as the matching model factory.
 *
 * Blobs follow Caffe's semantics (`graph.ts`): layers run in file order, an in-place layer (top ==
 * bottom) rewrites its blob for every later reader, a blob read twice is Caffe's `Split` (an explicit
 * `Split` layer too), and a bottom no earlier layer writes is refused. A net where every layer reads
 * the one before imports as a chain (a `Sequential` network, exactly as before graphs were
 * supported); any other as a network on a `Graph` (`engine/nn/graph.ts`). Every SoftmaxWithLoss
 * counts with its `loss_weight` (Caffe's weighted sum, GoogLeNet's 0.3, 0.3, 1); the main classifier,
 * which accuracy and evaluation use, is the loss with the largest weight, the last on ties. The new
 * layers' builders are in `dag_layers.ts`, the shared reading helpers in `reader.ts`.
 *
 * Input shape: the `inputShape` option wins; otherwise an `Input` layer's or the legacy
 * `input_shape`/`input_dim` shape, a `MemoryData` layer's size, or `transform_param.crop_size`
 * (square crops; channels from `force_gray`/`force_color`, `image_data_param.is_color`, and else 3,
 * since LMDB/LevelDB `Data` does not say — noted). A `Data` layer without a crop (cifar10_quick)
 * only learns its size from the database, so the import asks for `inputShape` instead of guessing.
 *
 * @module
 */

import { TandemError } from "../errors.ts";
import { AvgPool2d, Conv2d, Dropout, Flatten, Linear, LRN, MaxPool2d, ReLU } from "../nn/layers.ts";
import { JoinModule } from "../nn/join.ts";
import type { Network } from "../nn/network.ts";
import { WithinChannelLRN } from "../nn/lrn_within_channel.ts";
import { buildDagModule, DAG_TYPES, JOIN_TYPES } from "./dag_layers.ts";
import { assembleNetwork, BlobTable, type CaffeNode, type NetworkParts } from "./graph.ts";
import { parsePrototxt, PrototxtError, type PrototxtField, type PrototxtMessage } from "./prototxt.ts";
import {
  type Built,
  CaffeImportError,
  caffeModuleName,
  fillerOf,
  KERNEL,
  type LayerRef,
  multipliersOf,
  PAD,
  pairOf,
  paramsOf,
  Reader,
  spatial,
  STRIDE,
} from "./reader.ts";

export { CaffeImportError, caffeModuleName };

/** Caffe's phase a net is instantiated for. */
export type CaffePhase = "TRAIN" | "TEST";

/**
 * Options of {@link importCaffeNet}.
 *
 * @example
 * ```ts
 * import type { CaffeImportOptions } from "./import.ts";
 * const options: CaffeImportOptions = { phase: "TEST", seed: 1, inputShape: [3, 32, 32] };
 * ```
 */
export interface CaffeImportOptions {
  /** Which phase's layers to keep (`include`/`exclude` rules); default `TRAIN`. */
  phase?: CaffePhase;
  /** Initialisation seed (default 0). */
  seed?: number;
  /** File name for messages (default: the parsed tree's, or `<prototxt>`). */
  fileName?: string;
  /** Per-sample input `[channels, height, width]`; overrides what the data layers say. */
  inputShape?: readonly number[];
  /** Stages for `include { stage: … }` rules (default none), as Caffe's `NetState.stage`. */
  stages?: readonly string[];
  /** Level for `min_level`/`max_level` rules (default 0), as Caffe's `NetState.level`. */
  level?: number;
}

/**
 * The preprocessing a Caffe data layer's `transform_param` asks for, for a data pipeline to apply
 * (the network itself never sees it): Caffe computes `(pixel − mean) · scale` on a `crop_size`
 * square crop (random while training, centred when testing), mirrored at random with `mirror`.
 * Only the fields the layer gives are present.
 *
 * @example
 * ```ts
 * import { importCaffeNet } from "./import.ts";
 * const { transform } = importCaffeNet(`
 *   layer { name: "d" type: "Data" top: "data" top: "label"
 *           transform_param { crop_size: 4 mean_value: 104 mean_value: 117 mean_value: 123 } }
 *   layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 2 } }
 * `);
 * console.log(transform); // { cropSize: 4, meanValue: [104, 117, 123] }
 * ```
 */
export interface CaffeTransform {
  /** `scale`: multiplier after mean subtraction. */
  scale?: number;
  /** `mean_value`s: one for every channel, or one per channel. */
  meanValue?: number[];
  /** `crop_size`: side of the square crop. */
  cropSize?: number;
  /** `mirror`: flip training samples horizontally at random. */
  mirror?: boolean;
  /** `mean_file`: a binaryproto mean image, named as the file gives it (not read here). */
  meanFile?: string;
}

/**
 * What {@link importCaffeNet} produces.
 *
 * @example
 * ```ts
 * import { importCaffeNet, type CaffeImport } from "./import.ts";
 * function show(r: CaffeImport) { console.log(r.network.name, r.loss, r.notes.join("\n")); }
 * ```
 */
export interface CaffeImport {
  /** The network (a chain, or a graph), initialised with the seed. */
  network: Network;
  /** What was left out or assumed (data layers, accuracy, phase-filtered layers, renamed layers…). */
  notes: string[];
  /** The loss layer's type (`SoftmaxWithLoss`), or undefined for a net without one (deploy). */
  loss: "SoftmaxWithLoss" | undefined;
  /** The `transform_param` of the data layer feeding the network, if it has one. */
  transform?: CaffeTransform;
}

/** Layer types that become modules of the network. */
const MODULE_TYPES = [
  "Convolution",
  "Pooling",
  "LRN",
  "ReLU",
  "Dropout",
  "InnerProduct",
  "Flatten",
  ...DAG_TYPES,
];
/** Layer types that only provide blobs. */
const DATA_TYPES = ["Data", "ImageData", "Input", "MemoryData"];
/** Every supported type, for messages. */
const SUPPORTED = [...DATA_TYPES, ...MODULE_TYPES, "Split", "SoftmaxWithLoss", "Softmax", "Accuracy"];

const LAYER_FIELDS = new Set([
  "name",
  "type",
  "bottom",
  "top",
  "phase",
  "loss_weight",
  "param",
  "blobs",
  "propagate_down",
  "include",
  "exclude",
]);

/** An input blob and what is known of its per-sample shape. */
interface DataBlob {
  shape: number[] | undefined;
  /** How the shape was found, or why it is unknown. */
  source: string;
  layer: LayerRef | undefined;
  isLabel: boolean;
  /** The layer's `transform_param`, for the data pipeline. */
  transform?: CaffeTransform;
}

function ruleMet(
  reader: Reader,
  rule: PrototxtMessage,
  phase: CaffePhase,
  level: number,
  stages: readonly string[],
) {
  const where = "include/exclude rule";
  reader.checkFields(rule, ["phase", "min_level", "max_level", "stage", "not_stage"], where);
  const p = reader.single(rule, "phase", where);
  if (p && reader.enumValue(p, ["TRAIN", "TEST"] as const, where) !== phase) return false;
  const min = reader.single(rule, "min_level", where);
  if (min && level < reader.number(min, where)) return false;
  const max = reader.single(rule, "max_level", where);
  if (max && level > reader.number(max, where)) return false;
  for (const s of rule.all("stage")) if (!stages.includes(reader.string(s, where))) return false;
  for (const s of rule.all("not_stage")) if (stages.includes(reader.string(s, where))) return false;
  return true;
}

function buildModule(reader: Reader, ref: LayerRef, shape: readonly number[]): Built {
  const notes: string[] = [];
  const layer = ref.name;
  switch (ref.type) {
    case "Convolution": {
      const where = `layer "${layer}" convolution_param`;
      const m = paramsOf(reader, ref, "convolution_param");
      reader.checkFields(
        m,
        [
          "num_output",
          "bias_term",
          "pad",
          "kernel_size",
          "stride",
          "dilation",
          "pad_h",
          "pad_w",
          "kernel_h",
          "kernel_w",
          "stride_h",
          "stride_w",
          "group",
          "weight_filler",
          "bias_filler",
          "engine",
          "axis",
          "force_nd_im2col",
        ],
        where,
        layer,
      );
      const numOutput = reader.single(m, "num_output", where);
      if (!numOutput) reader.fail(ref.field, `${where}: num_output is required`, layer);
      const outChannels = reader.integer(numOutput, where, 1, layer);
      const kernel = spatial(reader, m, { ...KERNEL, repeated: true }, where, layer, undefined, 1);
      if (!kernel) {
        reader.fail(ref.field, `${where}: kernel_size (or kernel_h and kernel_w) is required`, layer);
      }
      const stride = spatial(reader, m, { ...STRIDE, repeated: true }, where, layer, 1, 1)!;
      const pad = spatial(reader, m, { ...PAD, repeated: true }, where, layer, 0, 0)!;
      for (const d of m.all("dilation")) {
        if (reader.integer(d, where, 1, layer) !== 1) {
          reader.failValue(d, `${where}: dilation other than 1 is not supported`, layer);
        }
      }
      const axis = reader.single(m, "axis", where);
      if (axis && reader.number(axis, where, layer) !== 1) {
        reader.failValue(axis, `${where}: only axis 1 is supported`, layer);
      }
      const groups = reader.optInteger(m, "group", where, 1, 1, layer);
      const bias = reader.optBool(m, "bias_term", where, true, layer);
      const inChannels = shape[1];
      if (inChannels % groups || outChannels % groups) {
        reader.fail(
          reader.single(m, "group", where) ?? ref.field,
          `${where}: group ${groups} must divide the input channels (${inChannels}) and num_output (${outChannels})`,
          layer,
        );
      }
      const [weightMultipliers, biasMultipliers] = multipliersOf(reader, ref, bias ? 2 : 1);
      const weightField = reader.single(m, "weight_filler", where);
      if (!weightField) {
        notes.push(`${layer} (Convolution): no weight_filler, so the weights start at 0 as in Caffe`);
      }
      return {
        module: new Conv2d(inChannels, outChannels, pairOf(kernel[0], kernel[1]), {
          stride: pairOf(stride[0], stride[1]),
          padding: pairOf(pad[0], pad[1]),
          groups,
          bias,
          weightFiller: fillerOf(reader, weightField, `${where}.weight_filler`, layer),
          biasFiller: fillerOf(reader, reader.single(m, "bias_filler", where), `${where}.bias_filler`, layer),
          weightMultipliers,
          biasMultipliers: biasMultipliers ?? {},
        }),
        notes,
      };
    }
    case "InnerProduct": {
      const where = `layer "${layer}" inner_product_param`;
      const m = paramsOf(reader, ref, "inner_product_param");
      reader.checkFields(
        m,
        ["num_output", "bias_term", "weight_filler", "bias_filler", "axis", "transpose"],
        where,
        layer,
      );
      const numOutput = reader.single(m, "num_output", where);
      if (!numOutput) reader.fail(ref.field, `${where}: num_output is required`, layer);
      const outFeatures = reader.integer(numOutput, where, 1, layer);
      const axis = reader.single(m, "axis", where);
      if (axis && reader.number(axis, where, layer) !== 1) {
        reader.failValue(axis, `${where}: only axis 1 is supported`, layer);
      }
      const transpose = reader.single(m, "transpose", where);
      if (transpose && reader.bool(transpose, where, layer)) {
        reader.failValue(transpose, `${where}: transpose: true is not supported`, layer);
      }
      const bias = reader.optBool(m, "bias_term", where, true, layer);
      const [weightMultipliers, biasMultipliers] = multipliersOf(reader, ref, bias ? 2 : 1);
      const weightField = reader.single(m, "weight_filler", where);
      if (!weightField) {
        notes.push(`${layer} (InnerProduct): no weight_filler, so the weights start at 0 as in Caffe`);
      }
      // Caffe flattens everything after the batch axis; the width follows from the shape flowing in.
      const inFeatures = shape.slice(1).reduce((a, b) => a * b, 1);
      return {
        module: new Linear(inFeatures, outFeatures, {
          bias,
          weightFiller: fillerOf(reader, weightField, `${where}.weight_filler`, layer),
          biasFiller: fillerOf(reader, reader.single(m, "bias_filler", where), `${where}.bias_filler`, layer),
          weightMultipliers,
          biasMultipliers: biasMultipliers ?? {},
        }),
        notes,
      };
    }
    case "Pooling": {
      const where = `layer "${layer}" pooling_param`;
      const m = paramsOf(reader, ref, "pooling_param");
      reader.checkFields(
        m,
        [
          "pool",
          "pad",
          "pad_h",
          "pad_w",
          "kernel_size",
          "kernel_h",
          "kernel_w",
          "stride",
          "stride_h",
          "stride_w",
          "engine",
          "global_pooling",
          "round_mode",
        ],
        where,
        layer,
      );
      multipliersOf(reader, ref, 0);
      const poolField = reader.single(m, "pool", where);
      const pool = poolField
        ? reader.enumValue(poolField, ["MAX", "AVE", "STOCHASTIC"] as const, where, layer)
        : "MAX";
      if (pool === "STOCHASTIC") {
        reader.failValue(
          poolField!,
          `${where}: STOCHASTIC pooling is not supported (MAX and AVE are)`,
          layer,
        );
      }
      const round = reader.single(m, "round_mode", where);
      if (round && reader.enumValue(round, ["CEIL", "FLOOR"] as const, where, layer) === "FLOOR") {
        reader.failValue(
          round,
          `${where}: round_mode FLOOR is not supported (Tandem pools with Caffe's CEIL)`,
          layer,
        );
      }
      let kernel: [number, number] | undefined, stride: [number, number], pad: [number, number];
      if (reader.optBool(m, "global_pooling", where, false, layer)) {
        // Caffe's global pooling: one window over the whole map, stride 1, no padding.
        kernel = [shape[2], shape[3]];
        stride = [1, 1];
        pad = [0, 0];
      } else {
        kernel = spatial(reader, m, { ...KERNEL, repeated: false }, where, layer, undefined, 1);
        if (!kernel) {
          reader.fail(ref.field, `${where}: kernel_size (or kernel_h and kernel_w) is required`, layer);
        }
        stride = spatial(reader, m, { ...STRIDE, repeated: false }, where, layer, 1, 1)!;
        pad = spatial(reader, m, { ...PAD, repeated: false }, where, layer, 0, 0)!;
      }
      const options = {
        kernel: pairOf(kernel[0], kernel[1]),
        stride: pairOf(stride[0], stride[1]),
        ...(pad[0] || pad[1] ? { padding: pairOf(pad[0], pad[1]) } : {}),
      };
      return { module: pool === "MAX" ? new MaxPool2d(options) : new AvgPool2d(options), notes };
    }
    case "LRN": {
      const where = `layer "${layer}" lrn_param`;
      const m = paramsOf(reader, ref, "lrn_param");
      reader.checkFields(m, ["local_size", "alpha", "beta", "norm_region", "k", "engine"], where, layer);
      multipliersOf(reader, ref, 0);
      const region = reader.single(m, "norm_region", where);
      const within = region !== undefined &&
        reader.enumValue(region, ["ACROSS_CHANNELS", "WITHIN_CHANNEL"] as const, where, layer) ===
          "WITHIN_CHANNEL";
      const size = reader.optInteger(m, "local_size", where, 5, 1, layer);
      if (size % 2 === 0) {
        reader.fail(
          reader.single(m, "local_size", where)!,
          `${where}: local_size must be odd, got ${size}`,
          layer,
        );
      }
      if (within) {
        if (shape.length !== 4) reader.fail(ref.field, `${where}: WITHIN_CHANNEL needs an NCHW input`, layer);
        const k = reader.single(m, "k", where);
        if (k && reader.number(k, where, layer) !== 1) {
          notes.push(`${layer} (LRN): k ignored, as Caffe ignores it for WITHIN_CHANNEL (the shift is 1)`);
        }
        return {
          module: new WithinChannelLRN({
            size,
            alpha: reader.optNumber(m, "alpha", where, 1, layer),
            beta: reader.optNumber(m, "beta", where, 0.75, layer),
          }),
          notes,
        };
      }
      return {
        module: new LRN({
          size,
          alpha: reader.optNumber(m, "alpha", where, 1, layer),
          beta: reader.optNumber(m, "beta", where, 0.75, layer),
          k: reader.optNumber(m, "k", where, 1, layer),
        }),
        notes,
      };
    }
    case "ReLU": {
      const where = `layer "${layer}" relu_param`;
      const m = paramsOf(reader, ref, "relu_param");
      reader.checkFields(m, ["negative_slope", "engine"], where, layer);
      multipliersOf(reader, ref, 0);
      const slope = reader.single(m, "negative_slope", where);
      if (slope && reader.number(slope, where, layer) !== 0) {
        reader.failValue(slope, `${where}: leaky ReLU (negative_slope ≠ 0) is not supported`, layer);
      }
      return { module: new ReLU(), notes };
    }
    case "Dropout": {
      const where = `layer "${layer}" dropout_param`;
      const m = paramsOf(reader, ref, "dropout_param");
      reader.checkFields(m, ["dropout_ratio", "scale_train"], where, layer);
      multipliersOf(reader, ref, 0);
      const ratio = reader.optNumber(m, "dropout_ratio", where, 0.5, layer);
      if (!(ratio >= 0 && ratio < 1)) {
        reader.fail(
          reader.single(m, "dropout_ratio", where)!,
          `${where}: dropout_ratio must be in [0, 1), got ${ratio}`,
          layer,
        );
      }
      const scale = reader.single(m, "scale_train", where);
      if (scale && !reader.bool(scale, where, layer)) {
        reader.failValue(
          scale,
          `${where}: scale_train: false is not supported (Tandem scales at training time)`,
          layer,
        );
      }
      return { module: new Dropout(ratio), notes };
    }
    case "Flatten": {
      const where = `layer "${layer}" flatten_param`;
      const m = paramsOf(reader, ref, "flatten_param");
      reader.checkFields(m, ["axis", "end_axis"], where, layer);
      multipliersOf(reader, ref, 0);
      const axis = reader.optNumber(m, "axis", where, 1, layer),
        end = reader.optNumber(m, "end_axis", where, -1, layer);
      if (axis !== 1 || (end !== -1 && end !== shape.length - 1)) {
        reader.fail(ref.field, `${where}: only axis 1 to the last axis is supported`, layer);
      }
      return { module: new Flatten(1), notes };
    }
  }
  throw new TandemError(`unreachable: layer type ${ref.type}`);
}

/** What a data layer says about its blobs' shapes. */
function dataBlobsOf(reader: Reader, ref: LayerRef, notes: string[]): Map<string, DataBlob> {
  const tops = ref.message.all("top").map((t) => reader.string(t, `layer "${ref.name}"`, ref.name));
  const blobs = new Map<string, DataBlob>();
  const where = `layer "${ref.name}"`;
  let shape: number[] | undefined;
  let source = "";
  let pipelineTransform: CaffeTransform | undefined;
  if (ref.type === "Input") {
    const shapes = paramsOf(reader, ref, "input_param").all("shape").map((f) =>
      blobShape(reader, f, `${where} input_param`, ref.name)
    );
    tops.forEach((top, i) => {
      const s = shapes.length === 1 ? shapes[0] : shapes[i];
      blobs.set(top, { shape: s, source: `input_param shape`, layer: ref, isLabel: false });
    });
    notes.push(`${ref.name} (Input): input layer, not part of the network`);
    return blobs;
  }
  if (ref.type === "MemoryData") {
    const m = paramsOf(reader, ref, "memory_data_param");
    const dims = ["channels", "height", "width"].map((n) =>
      reader.optInteger(m, n, `${where} memory_data_param`, 0, 0, ref.name)
    );
    if (dims.every((d) => d > 0)) {
      shape = dims;
      source = "memory_data_param";
    } else source = "memory_data_param without channels/height/width";
  } else {
    const transformField = reader.single(ref.message, "transform_param", where);
    // Read for the data pipeline; the network never applies it.
    const transform = transformField ? reader.messageOf(transformField, where, ref.name) : undefined;
    const crop = transform && reader.single(transform, "crop_size", `${where} transform_param`);
    let channels = 3, channelSource = "";
    if (transform && reader.optBool(transform, "force_gray", `${where} transform_param`, false, ref.name)) {
      channels = 1;
      channelSource = "force_gray";
    } else if (
      transform && reader.optBool(transform, "force_color", `${where} transform_param`, false, ref.name)
    ) {
      channelSource = "force_color";
    } else if (ref.type === "ImageData") {
      const m = paramsOf(reader, ref, "image_data_param");
      channels = reader.optBool(m, "is_color", `${where} image_data_param`, true, ref.name) ? 3 : 1;
      channelSource = "image_data_param.is_color";
    }
    const cropSize = crop ? reader.integer(crop, `${where} transform_param`, 0, ref.name) : 0;
    if (transform) pipelineTransform = transformOf(reader, transform, `${where} transform_param`, ref.name);
    if (cropSize > 0) {
      shape = [channels, cropSize, cropSize];
      source = `transform_param.crop_size ${cropSize}` +
        (channelSource
          ? ` and ${channelSource}`
          : `, assuming 3 colour channels (a ${ref.type} layer does not say)`);
    } else if (ref.type === "ImageData") {
      const m = paramsOf(reader, ref, "image_data_param");
      const h = reader.optInteger(m, "new_height", `${where} image_data_param`, 0, 0, ref.name);
      const w = reader.optInteger(m, "new_width", `${where} image_data_param`, 0, 0, ref.name);
      if (h > 0 && w > 0) {
        shape = [channels, h, w];
        source = `image_data_param.new_height/new_width and ${channelSource}`;
      } else source = "no crop_size or new_height/new_width: the image files decide";
    } else {
      source = "no transform_param.crop_size: the database decides";
    }
  }
  tops.forEach((top, i) => {
    blobs.set(
      top,
      i === 0
        ? { shape, source, layer: ref, isLabel: false, transform: pipelineTransform }
        : { shape: undefined, source: "labels", layer: ref, isLabel: true },
    );
  });
  const preprocessing = ref.message.has("transform_param")
    ? "; its preprocessing (transform_param) is returned as transform, for the data pipeline"
    : "";
  notes.push(`${ref.name} (${ref.type}): data layer, not part of the network${preprocessing}`);
  return blobs;
}

/** The fields of a `transform_param` a data pipeline can apply (see {@link CaffeTransform}). */
function transformOf(reader: Reader, m: PrototxtMessage, where: string, layer: string): CaffeTransform {
  const out: CaffeTransform = {};
  const scale = reader.single(m, "scale", where);
  if (scale) out.scale = reader.number(scale, where, layer);
  const means = m.all("mean_value").map((f) => reader.number(f, where, layer));
  if (means.length > 0) out.meanValue = means;
  const crop = reader.single(m, "crop_size", where);
  if (crop && reader.integer(crop, where, 0, layer) > 0) out.cropSize = reader.integer(crop, where, 0, layer);
  const mirror = reader.single(m, "mirror", where);
  if (mirror) out.mirror = reader.bool(mirror, where, layer);
  const meanFile = reader.single(m, "mean_file", where);
  if (meanFile) out.meanFile = reader.string(meanFile, where, layer);
  return out;
}

/** A `BlobShape { dim: N dim: C dim: H dim: W }` → `[C, H, W]`. */
function blobShape(reader: Reader, field: PrototxtField, where: string, layer?: string): number[] {
  const m = reader.messageOf(field, where, layer);
  reader.checkFields(m, ["dim"], where, layer);
  const dims = m.all("dim").map((d) => reader.integer(d, where, 1, layer));
  if (dims.length !== 4) {
    reader.fail(field, `${where}: expected 4 dims (N, C, H, W), got ${dims.length}`, layer);
  }
  return dims.slice(1);
}

/**
 * Builds a {@link Network} from a Caffe net definition (text or a tree from
 * {@link parsePrototxt}). Keeps the layers of `phase`, follows Caffe's blobs from the data layer to
 * the losses (see the module notes), and maps each layer to a Tandem layer named as in Caffe, with
 * the file's fillers and `param` multipliers (Caffe's default `lr_mult: 1 decay_mult: 1` where a
 * block is missing). SoftmaxWithLoss layers are the losses; Accuracy, Softmax and data layers are
 * left out with a note. Unknown layer types, bad values and graphs that cannot run (a bottom nothing
 * writes before it, a cycle, shapes a Concat or Eltwise cannot join) throw {@link CaffeImportError}
 * with the layer and its file position; malformed text throws {@link PrototxtError}.
 *
 * @example
 * ```ts
 * import { importCaffeNet } from "./import.ts";
 * const { network, loss, notes } = importCaffeNet(`
 *   name: "tiny"
 *   input: "data"
 *   input_shape { dim: 1 dim: 1 dim: 8 dim: 8 }
 *   layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
 *           inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
 * `);
 * console.log(network.inputShape, network.classes, loss); // [1, 8, 8] 10 undefined
 * ```
 */
export function importCaffeNet(
  source: string | PrototxtMessage,
  options: CaffeImportOptions = {},
): CaffeImport {
  const root = typeof source === "string" ? parsePrototxt(source, options.fileName) : source;
  const reader: Reader = new Reader(options.fileName ?? root.fileName);
  const phase = options.phase ?? "TRAIN";
  if (phase !== "TRAIN" && phase !== "TEST") {
    throw new TandemError(`importCaffeNet: phase must be "TRAIN" or "TEST", got ${JSON.stringify(phase)}`);
  }
  const stages = options.stages ?? [], level = options.level ?? 0;
  const notes: string[] = [];
  reader.checkFields(
    root,
    ["name", "input", "input_shape", "input_dim", "force_backward", "state", "debug_info", "layer", "layers"],
    "net",
  );
  const v1 = root.first("layers");
  if (v1) {
    reader.fail(
      v1,
      `V1 "layers" definitions are not supported; convert the file with Caffe's upgrade_net_proto_text`,
    );
  }

  const dataBlobs = new Map<string, DataBlob>();
  // Legacy deploy inputs: `input: "data"` with `input_shape { dim … }` or four `input_dim`s per input.
  const inputs = root.all("input").map((f) => reader.string(f, "net input"));
  const inputShapes = root.all("input_shape").map((f) => blobShape(reader, f, "net input_shape"));
  const inputDims = root.all("input_dim").map((f) => reader.integer(f, "net input_dim", 1));
  inputs.forEach((name, i) => {
    const shape = inputShapes[i] ??
      (inputDims.length >= 4 * (i + 1) ? inputDims.slice(4 * i + 1, 4 * i + 4) : undefined);
    dataBlobs.set(name, { shape, source: "net input", layer: undefined, isLabel: false });
  });

  const layers: LayerRef[] = [];
  const seen = new Map<string, LayerRef>();
  for (const field of root.all("layer")) {
    const message = reader.messageOf(field, "net");
    for (const f of message.fields) {
      if (!LAYER_FIELDS.has(f.name) && !f.name.endsWith("_param")) {
        reader.fail(f, `layer: unknown field "${f.name}"`);
      }
    }
    const nameField = reader.single(message, "name", "layer");
    const typeField = reader.single(message, "type", "layer");
    const name = nameField ? reader.string(nameField, "layer") : `layer${layers.length + 1}`;
    if (!typeField) reader.fail(field, `layer "${name}" has no type`, name);
    const type = reader.string(typeField, `layer "${name}"`, name);
    const ref: LayerRef = { name, type, field, message };
    // Caffe: included if any include rule holds (or there are none) and no exclude rule holds.
    const includes = message.all("include").map((r) => reader.messageOf(r, `layer "${name}"`, name));
    const excludes = message.all("exclude").map((r) => reader.messageOf(r, `layer "${name}"`, name));
    if (includes.length && excludes.length) {
      reader.fail(field, `layer "${name}": give include or exclude rules, not both`, name);
    }
    const included = includes.length
      ? includes.some((r) => ruleMet(reader, r, phase, level, stages))
      : !excludes.some((r) => ruleMet(reader, r, phase, level, stages));
    if (!included) {
      notes.push(
        `${name} (${type}): left out in phase ${phase}${
          stages.length ? ` with stages ${stages.join(", ")}` : ""
        } (include/exclude rules)`,
      );
      continue;
    }
    if (!SUPPORTED.includes(type)) {
      reader.fail(
        field,
        `layer "${name}" has unsupported type "${type}" (supported: ${SUPPORTED.join(", ")})`,
        name,
      );
    }
    const previous = seen.get(name);
    if (previous) {
      reader.fail(
        field,
        `layer name "${name}" is used twice (also at line ${previous.field.line}, column ${previous.field.column})`,
        name,
      );
    }
    seen.set(name, ref);
    layers.push(ref);
  }

  const blobs = new BlobTable(reader, layers);
  const nodes: CaffeNode[] = [];
  const losses: NetworkParts["losses"][number][] = [];
  const usedNames = new Set<string>();
  let input: { blob: string; id: string; ref: LayerRef } | undefined;
  let inputShape: number[] | undefined;
  let transform: CaffeTransform | undefined; // the feeding data layer's preprocessing
  let softmaxOutput: string | undefined;
  let loss: CaffeImport["loss"];
  const shapes = new Map<string, number[]>();

  /** The value a module layer reads: a written blob, or (once) the data layer's images. */
  const readBottom = (name: string, ref: LayerRef, where: string) => {
    if (blobs.has(name)) return blobs.read(name, ref);
    const data = dataBlobs.get(name);
    if (!data) return blobs.read(name, ref); // refused there, naming a later writer if there is one
    if (data.isLabel) reader.fail(ref.field, `${where} reads the label blob "${name}"`, ref.name);
    if (input) {
      reader.fail(
        ref.field,
        `${where} reads a second input blob "${name}" (the first is "${input.blob}", read by layer "${input.ref.name}"); Tandem networks take one input`,
        ref.name,
      );
    }
    inputShape = resolveInputShape(reader, options, name, data, ref, notes);
    transform = data.transform;
    const id = blobs.write(name, [1, ...inputShape]);
    shapes.set(id, [1, ...inputShape]);
    input = { blob: name, id, ref };
    return blobs.read(name, ref);
  };

  for (const ref of layers) {
    const where = `layer "${ref.name}" (${ref.type})`;
    const bottoms = ref.message.all("bottom").map((f) => reader.string(f, where, ref.name));
    const tops = ref.message.all("top").map((f) => reader.string(f, where, ref.name));
    if (DATA_TYPES.includes(ref.type)) {
      for (const [blob, info] of dataBlobsOf(reader, ref, notes)) dataBlobs.set(blob, info);
      continue;
    }
    if (ref.type === "Accuracy") {
      notes.push(`${ref.name} (Accuracy): not part of the network; Tandem measures accuracy itself`);
      continue;
    }
    if (ref.type === "SoftmaxWithLoss") {
      if (bottoms.length !== 2) {
        reader.fail(
          ref.field,
          `${where} has ${bottoms.length} bottom blob(s); expected 2 (scores and labels)`,
          ref.name,
        );
      }
      const scores = readBottom(bottoms[0], ref, where);
      const label = dataBlobs.get(bottoms[1]);
      if (!label) {
        reader.fail(
          ref.field,
          `${where}: second bottom "${bottoms[1]}" must be the labels from a data layer`,
          ref.name,
        );
      }
      const weights = ref.message.all("loss_weight");
      const weight = weights.length ? reader.number(weights[0], where, ref.name) : 1;
      if (ref.message.has("loss_param")) notes.push(`${ref.name} (SoftmaxWithLoss): loss_param ignored`);
      losses.push({ name: ref.name, bottom: scores.id, weight, ref });
      loss = "SoftmaxWithLoss";
      continue;
    }
    if (ref.type === "Softmax") {
      if (bottoms.length !== 1) {
        reader.fail(ref.field, `${where} has ${bottoms.length} bottom blob(s); expected 1`, ref.name);
      }
      softmaxOutput = readBottom(bottoms[0], ref, where).id;
      notes.push(
        `${ref.name} (Softmax): left out; the network outputs logits (apply softmax to get probabilities)`,
      );
      continue;
    }
    if (ref.type === "Split") {
      // Caffe's explicit Split: every top is the bottom (their gradients are summed by autograd).
      if (bottoms.length !== 1) {
        reader.fail(ref.field, `${where} has ${bottoms.length} bottom blob(s); expected 1`, ref.name);
      }
      const value = readBottom(bottoms[0], ref, where);
      for (const top of tops) blobs.alias(top, value);
      continue;
    }
    const weight = ref.message.first("loss_weight");
    if (weight && reader.number(weight, where, ref.name) !== 0) {
      reader.failValue(weight, `${where}: loss_weight is only supported on the loss layer`, ref.name);
    }
    if (ref.message.has("blobs")) {
      reader.fail(
        ref.message.first("blobs")!,
        `${where}: embedded blobs (weights) are not supported`,
        ref.name,
      );
    }
    if (ref.message.has("propagate_down")) notes.push(`${ref.name} (${ref.type}): propagate_down ignored`);
    // Scale's second bottom (the scale as a blob) is refused by its builder, with the reason.
    const joins = JOIN_TYPES.includes(ref.type) || ref.type === "Scale";
    if (bottoms.length === 0 || (!joins && bottoms.length !== 1)) {
      reader.fail(
        ref.field,
        `${where} has ${bottoms.length} bottom blob(s); expected ${
          JOIN_TYPES.includes(ref.type) ? "at least 1" : "1"
        }`,
        ref.name,
      );
    }
    if (tops.length !== 1) {
      reader.fail(ref.field, `${where} has ${tops.length} top blobs; expected 1`, ref.name);
    }
    const values = bottoms.map((b) => readBottom(b, ref, where));
    const shape = values[0].shape;
    let built: Built;
    let outputShape: number[];
    try {
      built = DAG_TYPES.includes(ref.type)
        ? buildDagModule(reader, ref, values.map((v, i) => ({ name: bottoms[i], shape: v.shape })))
        : buildModule(reader, ref, shape);
      outputShape = built.module instanceof JoinModule
        ? built.module.describeAll(values.map((v) => v.shape)).outputShape
        : built.module.describe(shape).outputShape;
    } catch (error) {
      if (error instanceof PrototxtError || !(error instanceof Error)) throw error;
      return reader.fail(
        ref.field,
        `${where} does not fit its input ${
          values.map((v) => `[${v.shape.slice(1).join(", ")}]`).join(", ")
        }: ${error.message}`,
        ref.name,
      );
    }
    notes.push(...built.notes);
    const name = caffeModuleName(ref.name);
    if (name !== ref.name) notes.push(`${ref.name} (${ref.type}): named "${name}" in the network`);
    if (usedNames.has(name)) {
      reader.fail(ref.field, `${where}: module name "${name}" is already taken`, ref.name);
    }
    usedNames.add(name);
    const top = blobs.write(tops[0], outputShape);
    shapes.set(top, outputShape);
    nodes.push({ name, module: built.module, bottoms: values.map((v) => v.id), top, ref });
  }

  if (!input || nodes.length === 0) {
    reader.fail(layers[0]?.field ?? root, `the net has no layers to import (after keeping phase ${phase})`);
  }
  if (losses.length === 1 && losses[0].weight !== 1) {
    notes.push(`${losses[0].ref.name} (SoftmaxWithLoss): loss_weight ${losses[0].weight} ignored`);
  }
  const nameField = reader.single(root, "name", "net");
  const netName = nameField ? reader.string(nameField, "net") : "caffe-net";
  const network = assembleNetwork(reader, {
    name: netName,
    input: input.id,
    inputShape: inputShape!,
    nodes,
    losses: losses.length === 1 ? [{ ...losses[0], weight: 1 }] : losses,
    softmaxOutput,
    shapes,
  }, notes).initialize(options.seed ?? 0);
  return transform ? { network, notes, loss, transform } : { network, notes, loss };
}

function resolveInputShape(
  reader: Reader,
  options: CaffeImportOptions,
  blob: string,
  data: DataBlob,
  first: LayerRef,
  notes: string[],
): number[] {
  const given = options.inputShape;
  if (given) {
    if (given.length !== 3 || !given.every((d) => Number.isInteger(d) && d > 0)) {
      throw new TandemError(
        `importCaffeNet: inputShape must be [channels, height, width] of positive integers, got [${
          given.join(", ")
        }]`,
      );
    }
    if (data.shape && data.shape.join() !== given.join()) {
      notes.push(
        `input "${blob}": inputShape [${given.join(", ")}] overrides [${
          data.shape.join(", ")
        }] (${data.source})`,
      );
    } else notes.push(`input "${blob}": [${given.join(", ")}] from the inputShape option`);
    return [...given];
  }
  if (!data.shape) {
    const at = data.layer?.field ?? first.field;
    reader.fail(
      at,
      `cannot tell the input shape of blob "${blob}" (${data.source}); pass the inputShape option, e.g. { inputShape: [3, 32, 32] }`,
      data.layer?.name,
    );
  }
  notes.push(`input "${blob}": [${data.shape.join(", ")}] from ${data.source}`);
  return [...data.shape];
}

/**
 * Reads a `.prototxt` file and imports it with {@link importCaffeNet}; messages name the file.
 *
 * @example
 * ```ts
 * import { loadCaffeNet } from "./import.ts";
 * // const { network } = await loadCaffeNet("models/bvlc_alexnet/train_val.prototxt", { seed: 1 });
 * ```
 */
export async function loadCaffeNet(
  path: string | URL,
  options: CaffeImportOptions = {},
): Promise<CaffeImport> {
  const text = await Deno.readTextFile(path);
  const fileName = options.fileName ??
    (path instanceof URL
      ? (path.protocol === "file:" ? decodeURIComponent(path.pathname) : path.href)
      : path);
  return importCaffeNet(parsePrototxt(text, fileName), { ...options, fileName });
}
