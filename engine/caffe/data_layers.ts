/**
 * Caffe's data layers (`Data`, `ImageData`, `Input`, `MemoryData`) and legacy net inputs, read for
 * what the network needs from them: the blobs they provide, the per-sample input shape, and the
 * `transform_param` preprocessing a data pipeline applies (the network itself never sees it).
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
import type { PrototxtField, PrototxtMessage } from "./prototxt.ts";
import { type LayerRef, paramsOf, type Reader } from "./reader.ts";

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

/** Layer types that only provide blobs. */
export const DATA_TYPES = ["Data", "ImageData", "Input", "MemoryData"];

/** An input blob and what is known of its per-sample shape. */
export interface DataBlob {
  shape: number[] | undefined;
  /** How the shape was found, or why it is unknown. */
  source: string;
  layer: LayerRef | undefined;
  isLabel: boolean;
  /** The layer's `transform_param`, for the data pipeline. */
  transform?: CaffeTransform;
}

/**
 * The legacy deploy inputs at the top of a net: `input: "data"`, each with an
 * `input_shape { dim … }` or four `input_dim`s (N, C, H, W) per input, in order.
 */
export function netInputs(reader: Reader, root: PrototxtMessage): Map<string, DataBlob> {
  const dataBlobs = new Map<string, DataBlob>();
  const inputs = root.all("input").map((f) => reader.string(f, "net input"));
  const inputShapes = root.all("input_shape").map((f) => blobShape(reader, f, "net input_shape"));
  const inputDims = root.all("input_dim").map((f) => reader.integer(f, "net input_dim", 1));
  inputs.forEach((name, i) => {
    const shape = inputShapes[i] ??
      (inputDims.length >= 4 * (i + 1) ? inputDims.slice(4 * i + 1, 4 * i + 4) : undefined);
    dataBlobs.set(name, { shape, source: "net input", layer: undefined, isLabel: false });
  });
  return dataBlobs;
}

/**
 * What a data layer (one of {@link DATA_TYPES}) says about its blobs: the first top's per-sample
 * shape where the layer tells it, and how it was found (for the notes, or for the message asking
 * for `inputShape`); every further top is labels.
 */
export function dataBlobsOf(reader: Reader, ref: LayerRef, notes: string[]): Map<string, DataBlob> {
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
    if (transform) {
      pipelineTransform = transformOf(reader, transform, `${where} transform_param`, ref.name, cropSize);
    }
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

/**
 * The fields of a `transform_param` a data pipeline can apply (see {@link CaffeTransform}).
 * `cropSize` is the one {@link dataBlobsOf} already read (and checked) for the input shape.
 */
function transformOf(
  reader: Reader,
  m: PrototxtMessage,
  where: string,
  layer: string,
  cropSize: number,
): CaffeTransform {
  const out: CaffeTransform = {};
  const scale = reader.single(m, "scale", where);
  if (scale) out.scale = reader.number(scale, where, layer);
  const means = m.all("mean_value").map((f) => reader.number(f, where, layer));
  if (means.length > 0) out.meanValue = means;
  if (cropSize > 0) out.cropSize = cropSize;
  const mirror = reader.single(m, "mirror", where);
  if (mirror) out.mirror = reader.bool(mirror, where, layer);
  const meanFile = reader.single(m, "mean_file", where);
  if (meanFile) out.meanFile = reader.string(meanFile, where, layer);
  return out;
}

/** A `BlobShape { dim: N dim: C dim: H dim: W }` → `[C, H, W]` (the batch size is the trainer's). */
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
 * The per-sample input shape of `blob`, the network's input, when `first` reads it: the
 * `inputShape` option (`given`) wins, noted when it overrides what the file says; otherwise the data
 * layer's shape, or a refusal (at the data layer, else at `first`) asking for the option — guessing
 * would build layers of the wrong width, found only when data arrives.
 */
export function resolveInputShape(
  reader: Reader,
  given: readonly number[] | undefined,
  blob: string,
  data: DataBlob,
  first: LayerRef,
  notes: string[],
): number[] {
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
