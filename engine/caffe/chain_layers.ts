/**
 * Builders of the Caffe layers a plain chain is made of: Convolution, InnerProduct, Pooling, LRN
 * (ACROSS_CHANNELS and WITHIN_CHANNEL), ReLU, Dropout and Flatten. Each reads its `*_param` block
 * strictly — an unknown field or an option Tandem cannot honour is refused with its file position,
 * since dropping it would import a different net without a word — and builds the Tandem layer for
 * the shape flowing in (Caffe infers input widths and channel counts from the bottom blob, so the
 * file never states them). The layers DAG nets add are built in `dag_layers.ts`; the importer picks
 * the builder by type.
 *
 * @module
 */

import { TandemError } from "../errors.ts";
import { AvgPool2d, Conv2d, Dropout, Flatten, Linear, LRN, MaxPool2d, ReLU } from "../nn/layers.ts";
import type { WeightedLayerOptions } from "../nn/layers.ts";
import { WithinChannelLRN } from "../nn/lrn_within_channel.ts";
import { sizeOf } from "../shape.ts";
import type { PrototxtMessage } from "./prototxt.ts";
import {
  type Built,
  fillerOf,
  KERNEL,
  type LayerRef,
  multipliersOf,
  PAD,
  pairOf,
  paramsOf,
  type Reader,
  spatial,
  STRIDE,
} from "./reader.ts";

/** The layer types built here, in the order messages list them. */
export const CHAIN_TYPES = ["Convolution", "Pooling", "LRN", "ReLU", "Dropout", "InnerProduct", "Flatten"];

/** A Convolution's or InnerProduct's required `num_output`. */
function numOutputOf(reader: Reader, ref: LayerRef, m: PrototxtMessage, where: string): number {
  const numOutput = reader.single(m, "num_output", where);
  if (!numOutput) reader.fail(ref.field, `${where}: num_output is required`, ref.name);
  return reader.integer(numOutput, where, 1, ref.name);
}

/** Refuses an `axis` other than 1: Tandem's layers take channels (or features) on axis 1 only. */
function refuseAxis(reader: Reader, m: PrototxtMessage, where: string, layer: string): void {
  const axis = reader.single(m, "axis", where);
  if (axis && reader.number(axis, where, layer) !== 1) {
    reader.failValue(axis, `${where}: only axis 1 is supported`, layer);
  }
}

/**
 * A Convolution's or Pooling's window: the kernel (required), stride (default 1) and padding
 * (default 0). `repeated`: ConvolutionParameter repeats these fields (one value per spatial axis),
 * PoolingParameter does not.
 */
function windowOf(
  reader: Reader,
  ref: LayerRef,
  m: PrototxtMessage,
  where: string,
  repeated: boolean,
): { kernel: [number, number]; stride: [number, number]; pad: [number, number] } {
  const kernel = spatial(reader, m, { ...KERNEL, repeated }, where, ref.name, undefined, 1);
  if (!kernel) {
    reader.fail(ref.field, `${where}: kernel_size (or kernel_h and kernel_w) is required`, ref.name);
  }
  const stride = spatial(reader, m, { ...STRIDE, repeated }, where, ref.name, 1, 1)!;
  const pad = spatial(reader, m, { ...PAD, repeated }, where, ref.name, 0, 0)!;
  return { kernel, stride, pad };
}

/**
 * The learned blobs of a Convolution or InnerProduct: their `param` multipliers and fillers, with
 * Caffe's default filler (constant 0) where the file gives none — noted for the weights, since a net
 * whose weights all start equal is rarely what the author meant, yet it is what Caffe would run.
 */
function weightsOf(
  reader: Reader,
  ref: LayerRef,
  m: PrototxtMessage,
  where: string,
  bias: boolean,
  notes: string[],
): WeightedLayerOptions {
  const [weightMultipliers, biasMultipliers] = multipliersOf(reader, ref, bias ? 2 : 1);
  const weightField = reader.single(m, "weight_filler", where);
  if (!weightField) {
    notes.push(`${ref.name} (${ref.type}): no weight_filler, so the weights start at 0 as in Caffe`);
  }
  return {
    bias,
    weightFiller: fillerOf(reader, weightField, `${where}.weight_filler`, ref.name),
    biasFiller: fillerOf(reader, reader.single(m, "bias_filler", where), `${where}.bias_filler`, ref.name),
    weightMultipliers,
    biasMultipliers: biasMultipliers ?? {},
  };
}

/**
 * Builds a {@link CHAIN_TYPES} layer for its bottom's shape (batch axis of 1 included).
 *
 * @example
 * ```ts ignore
 * import { buildChainModule } from "./chain_layers.ts";
 * const { module, notes } = buildChainModule(reader, ref, [1, 3, 227, 227]);
 * ```
 */
export function buildChainModule(reader: Reader, ref: LayerRef, shape: readonly number[]): Built {
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
      const outChannels = numOutputOf(reader, ref, m, where);
      const { kernel, stride, pad } = windowOf(reader, ref, m, where, true);
      for (const d of m.all("dilation")) {
        if (reader.integer(d, where, 1, layer) !== 1) {
          reader.failValue(d, `${where}: dilation other than 1 is not supported`, layer);
        }
      }
      refuseAxis(reader, m, where, layer);
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
      const weights = weightsOf(reader, ref, m, where, bias, notes);
      return {
        module: new Conv2d(inChannels, outChannels, pairOf(kernel[0], kernel[1]), {
          stride: pairOf(stride[0], stride[1]),
          padding: pairOf(pad[0], pad[1]),
          groups,
          ...weights,
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
      const outFeatures = numOutputOf(reader, ref, m, where);
      refuseAxis(reader, m, where, layer);
      const transpose = reader.single(m, "transpose", where);
      if (transpose && reader.bool(transpose, where, layer)) {
        reader.failValue(transpose, `${where}: transpose: true is not supported`, layer);
      }
      const bias = reader.optBool(m, "bias_term", where, true, layer);
      const weights = weightsOf(reader, ref, m, where, bias, notes);
      // Caffe flattens everything after the batch axis; the width follows from the shape flowing in.
      return { module: new Linear(sizeOf(shape.slice(1)), outFeatures, weights), notes };
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
      let kernel: [number, number], stride: [number, number], pad: [number, number];
      if (reader.optBool(m, "global_pooling", where, false, layer)) {
        // Caffe's global pooling: one window over the whole map, stride 1, no padding.
        kernel = [shape[2], shape[3]];
        stride = [1, 1];
        pad = [0, 0];
      } else {
        ({ kernel, stride, pad } = windowOf(reader, ref, m, where, false));
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
