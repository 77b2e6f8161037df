/**
 * Builders of the Caffe layers that DAG nets add to the chain importer's: `Concat` and `Eltwise`
 * (several bottoms), `BatchNorm` (its three statistics become module buffers) and `Scale`. Each
 * reads its `*_param` block strictly, as the chain builders do, and checks its bottoms' shapes, so a
 * net that cannot work is refused with the layer, its bottoms and their shapes before any work.
 *
 * @module
 */

import { BatchNorm } from "../nn/batch_norm.ts";
import { Concat, Eltwise, type EltwiseOperation } from "../nn/join.ts";
import { Scale } from "../nn/scale.ts";
import {
  type Built,
  fillerOf,
  type LayerRef,
  multipliersOf,
  paramBlock,
  paramsOf,
  type Reader,
  refuseSharedParam,
  sampleShape,
} from "./reader.ts";

/** The layer types built here. */
export const DAG_TYPES = ["Concat", "Eltwise", "BatchNorm", "Scale"];

/** Layer types that read several bottoms. */
export const JOIN_TYPES = ["Concat", "Eltwise"];

/** A bottom as the importer resolved it: its Caffe name and its shape (batch axis of 1 included). */
export interface BottomShape {
  /** The blob's name in the file. */
  readonly name: string;
  /** Its shape with a batch axis of 1. */
  readonly shape: readonly number[];
}

const listed = (bottoms: readonly BottomShape[]) =>
  bottoms.map((b) => `"${b.name}" ${sampleShape(b.shape)}`).join(", ");

/**
 * Builds a {@link DAG_TYPES} layer for its resolved bottoms.
 *
 * @example
 * ```ts ignore
 * import { buildDagModule } from "./dag_layers.ts";
 * const { module } = buildDagModule(reader, ref, [{ name: "a", shape: [1, 64, 28, 28] }]);
 * ```
 */
export function buildDagModule(reader: Reader, ref: LayerRef, bottoms: readonly BottomShape[]): Built {
  const layer = ref.name;
  const notes: string[] = [];
  const shape = bottoms[0].shape;
  switch (ref.type) {
    case "Concat": {
      const where = `layer "${layer}" concat_param`;
      const m = paramsOf(reader, ref, "concat_param");
      reader.checkFields(m, ["axis", "concat_dim"], where, layer);
      multipliersOf(reader, ref, 0);
      const axisField = reader.single(m, "axis", where), dimField = reader.single(m, "concat_dim", where);
      if (axisField && dimField) reader.fail(dimField, `${where}: give axis or concat_dim, not both`, layer);
      let axis = axisField
        ? reader.integer(axisField, where, -shape.length, layer)
        : dimField
        ? reader.integer(dimField, where, 0, layer)
        : 1;
      if (axis < 0) axis += shape.length;
      if (axis >= shape.length) {
        reader.fail(
          axisField ?? dimField!,
          `${where}: axis ${axis} is out of range for ${sampleShape(shape)}`,
          layer,
        );
      }
      if (axis === 0) {
        reader.fail(
          axisField ?? dimField!,
          `${where}: concatenating along the batch axis is not supported`,
          layer,
        );
      }
      for (const b of bottoms) {
        if (b.shape.length !== shape.length || b.shape.some((d, i) => i !== axis && d !== shape[i])) {
          reader.fail(
            ref.field,
            `layer "${layer}" (Concat): bottoms ${
              listed(bottoms)
            } differ outside axis ${axis}, so they cannot be concatenated`,
            layer,
          );
        }
      }
      return { module: new Concat(axis), notes };
    }
    case "Eltwise": {
      const where = `layer "${layer}" eltwise_param`;
      const m = paramsOf(reader, ref, "eltwise_param");
      reader.checkFields(m, ["operation", "coeff", "stable_prod_grad"], where, layer);
      multipliersOf(reader, ref, 0);
      const opField = reader.single(m, "operation", where);
      const operation: EltwiseOperation = opField
        ? reader.enumValue(opField, ["PROD", "SUM", "MAX"] as const, where, layer)
        : "SUM";
      const coeffFields = m.all("coeff");
      const coeffs = coeffFields.map((f) => reader.number(f, where, layer));
      if (coeffs.length && operation !== "SUM") {
        reader.fail(
          coeffFields[0],
          `${where}: coeff applies to SUM only, not ${operation} (as in Caffe)`,
          layer,
        );
      }
      if (coeffs.length && coeffs.length !== bottoms.length) {
        reader.fail(
          coeffFields[0],
          `${where}: ${coeffs.length} coeff value(s) for ${bottoms.length} bottoms; give one per bottom`,
          layer,
        );
      }
      if (bottoms.length < 2) {
        reader.fail(
          ref.field,
          `layer "${layer}" (Eltwise) has ${bottoms.length} bottom; it needs at least 2`,
          layer,
        );
      }
      for (const b of bottoms) {
        if (b.shape.length !== shape.length || b.shape.some((d, i) => d !== shape[i])) {
          reader.fail(
            ref.field,
            `layer "${layer}" (Eltwise ${operation}): bottoms ${
              listed(bottoms)
            } differ in shape; Eltwise needs equal shapes`,
            layer,
          );
        }
      }
      const stable = reader.single(m, "stable_prod_grad", where);
      if (stable && !reader.bool(stable, where, layer)) {
        notes.push(
          `${layer} (Eltwise): stable_prod_grad: false ignored (the gradient is always the stable product)`,
        );
      }
      const unit = coeffs.every((c) => c === 1);
      return { module: new Eltwise(operation, coeffs.length && !unit ? coeffs : undefined), notes };
    }
    case "BatchNorm": {
      const where = `layer "${layer}" batch_norm_param`;
      const m = paramsOf(reader, ref, "batch_norm_param");
      reader.checkFields(m, ["use_global_stats", "moving_average_fraction", "eps"], where, layer);
      // Caffe masks its three statistics from the solver and refuses any other lr_mult.
      const params = ref.message.all("param");
      if (params.length > 3) {
        reader.fail(
          params[3],
          `layer "${layer}" (BatchNorm) has ${params.length} param blocks but 3 statistics`,
          layer,
        );
      }
      for (const p of params) {
        const pm = paramBlock(reader, ref, p);
        const lr = reader.single(pm, "lr_mult", `layer "${layer}" param`);
        if (!lr || reader.number(lr, where, layer) !== 0) {
          reader.fail(
            lr ?? p,
            `layer "${layer}" (BatchNorm): its statistics are not learned; a param block must say lr_mult: 0 (Caffe refuses others too)`,
            layer,
          );
        }
        refuseSharedParam(reader, ref, pm);
      }
      if (shape.length < 2) {
        reader.fail(ref.field, `layer "${layer}" (BatchNorm) needs a channel axis`, layer);
      }
      const global = reader.single(m, "use_global_stats", where);
      const eps = reader.optNumber(m, "eps", where, 1e-5, layer);
      if (!(eps > 0)) {
        reader.failValue(reader.single(m, "eps", where)!, `${where}: eps must be > 0, got ${eps}`, layer);
      }
      notes.push(
        `${layer} (BatchNorm): statistics kept as buffers, not learned; ` +
          (global
            ? `use_global_stats: ${reader.bool(global, where, layer)}`
            : "batch statistics in training, running ones in evaluation (Caffe's TRAIN and TEST)"),
      );
      return {
        module: new BatchNorm(shape[1], {
          ...(global ? { useGlobalStats: reader.bool(global, where, layer) } : {}),
          movingAverageFraction: reader.optNumber(m, "moving_average_fraction", where, 0.999, layer),
          eps,
        }),
        notes,
      };
    }
    case "Scale": {
      const where = `layer "${layer}" scale_param`;
      const m = paramsOf(reader, ref, "scale_param");
      reader.checkFields(m, ["axis", "num_axes", "filler", "bias_term", "bias_filler"], where, layer);
      if (bottoms.length !== 1) {
        reader.fail(
          ref.field,
          `layer "${layer}" (Scale) has ${bottoms.length} bottoms; only a learned scale (one bottom) is supported`,
          layer,
        );
      }
      const axis = reader.single(m, "axis", where);
      if (axis && reader.number(axis, where, layer) !== 1) {
        reader.failValue(axis, `${where}: only axis 1 (channels) is supported`, layer);
      }
      const numAxes = reader.single(m, "num_axes", where);
      if (numAxes && reader.number(numAxes, where, layer) !== 1) {
        reader.failValue(numAxes, `${where}: only num_axes 1 (a scale per channel) is supported`, layer);
      }
      if (shape.length < 2) reader.fail(ref.field, `layer "${layer}" (Scale) needs a channel axis`, layer);
      const bias = reader.optBool(m, "bias_term", where, false, layer);
      const [multipliers, biasMultipliers] = multipliersOf(reader, ref, bias ? 2 : 1);
      const filler = reader.single(m, "filler", where);
      const biasFiller = reader.single(m, "bias_filler", where);
      return {
        module: new Scale(shape[1], {
          bias,
          filler: filler
            ? fillerOf(reader, filler, `${where}.filler`, layer)
            : { type: "constant", value: 1 },
          biasFiller: fillerOf(reader, biasFiller, `${where}.bias_filler`, layer),
          multipliers,
          biasMultipliers,
        }),
        notes,
      };
    }
  }
  throw new Error(`unreachable: layer type ${ref.type}`);
}
