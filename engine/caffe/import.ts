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
 * which accuracy and evaluation use, is the loss with the largest weight, the last on ties.
 *
 * This file walks the kept layers in order and wires them; the parts live beside it: which layers a
 * phase keeps in `net_filter.ts`, data layers and the input shape in `data_layers.ts`, the layer
 * builders in `chain_layers.ts` and `dag_layers.ts`, the shared reading helpers in `reader.ts`.
 *
 * @module
 */

import { TandemError } from "../errors.ts";
import { JoinModule } from "../nn/join.ts";
import type { Network } from "../nn/network.ts";
import { buildChainModule, CHAIN_TYPES } from "./chain_layers.ts";
import { buildDagModule, DAG_TYPES, JOIN_TYPES } from "./dag_layers.ts";
import { type CaffeTransform, DATA_TYPES, dataBlobsOf, netInputs, resolveInputShape } from "./data_layers.ts";
import { assembleNetwork, BlobTable, type CaffeNode, type NetworkParts } from "./graph.ts";
import { type CaffePhase, filterLayers } from "./net_filter.ts";
import { parsePrototxt, PrototxtError, type PrototxtMessage } from "./prototxt.ts";
import { type Built, caffeModuleName, type LayerRef, Reader, sampleShape } from "./reader.ts";

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

/**
 * Every supported type, for messages: the data layers, the modules, and the layers this file
 * handles itself (Split is wiring; the loss, Softmax and Accuracy stay outside the network).
 */
const SUPPORTED = [
  ...DATA_TYPES,
  ...CHAIN_TYPES,
  ...DAG_TYPES,
  "Split",
  "SoftmaxWithLoss",
  "Softmax",
  "Accuracy",
];

/**
 * Builds a {@link Network} from a Caffe net definition (text or a tree from
 * {@link parsePrototxt}). Keeps the layers of `phase` (`net_filter.ts`), follows Caffe's blobs from the data layer to
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

  // The blobs data layers provide, by name: legacy net inputs now, data layers as they come.
  const dataBlobs = netInputs(reader, root);
  const layers = filterLayers(reader, root, { phase, level, stages }, SUPPORTED, notes);

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
    inputShape = resolveInputShape(reader, options.inputShape, name, data, ref, notes);
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
    const refuseBottoms = (expected: string) =>
      reader.fail(ref.field, `${where} has ${bottoms.length} bottom blob(s); expected ${expected}`, ref.name);
    if (DATA_TYPES.includes(ref.type)) {
      for (const [blob, info] of dataBlobsOf(reader, ref, notes)) dataBlobs.set(blob, info);
      continue;
    }
    if (ref.type === "Accuracy") {
      notes.push(`${ref.name} (Accuracy): not part of the network; Tandem measures accuracy itself`);
      continue;
    }
    if (ref.type === "SoftmaxWithLoss") {
      if (bottoms.length !== 2) refuseBottoms("2 (scores and labels)");
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
      if (bottoms.length !== 1) refuseBottoms("1");
      softmaxOutput = readBottom(bottoms[0], ref, where).id;
      notes.push(
        `${ref.name} (Softmax): left out; the network outputs logits (apply softmax to get probabilities)`,
      );
      continue;
    }
    if (ref.type === "Split") {
      // Caffe's explicit Split: every top is the bottom (their gradients are summed by autograd).
      if (bottoms.length !== 1) refuseBottoms("1");
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
      refuseBottoms(JOIN_TYPES.includes(ref.type) ? "at least 1" : "1");
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
        : buildChainModule(reader, ref, shape);
      outputShape = built.module instanceof JoinModule
        ? built.module.describeAll(values.map((v) => v.shape)).outputShape
        : built.module.describe(shape).outputShape;
    } catch (error) {
      if (error instanceof PrototxtError || !(error instanceof Error)) throw error;
      return reader.fail(
        ref.field,
        `${where} does not fit its input ${
          values.map((v) => sampleShape(v.shape)).join(", ")
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
