/**
 * Turning `--model` into a {@link ModelSpec} every device can build: a built-in name, or a Caffe
 * `.prototxt` whose text travels in the spec.
 *
 * @module
 */

import { basename } from "node:path";
import { type Network, TandemError } from "../mod.ts";
import { buildModel, type ModelSpec } from "../schedule/devices/mod.ts";
import { type BuiltinModelName, builtinModels } from "../engine/models/mod.ts";
import { type CaffeImport, type CaffeTransform, importCaffeNet } from "../engine/caffe/mod.ts";
import { type LoadedImages, loadImages, syntheticShape } from "./data.ts";
import { CliError, closest } from "./errors.ts";

/** Returned by {@link chooseModel} for a Caffe net whose input shape only its data can tell. */
export const NEEDS_INPUT_SHAPE: unique symbol = Symbol("needs input shape");

/** A chosen model before the data fixes its class count. */
export interface ModelChoice {
  /** Spec for `classes` output classes (built-ins adapt; a Caffe net has its own). */
  spec(classes?: number): ModelSpec;
  /** Per-sample input `[C, H, W]`. */
  inputShape: readonly number[];
  /** Classes the model predicts by default. */
  classes: number;
  /** Name for messages and checkpoints. */
  name: string;
  /** A Caffe net's data-layer preprocessing (`transform_param`), for the data pipeline. */
  transform?: CaffeTransform;
}

/**
 * Resolves `--model`: a built-in name, or a path to a Caffe net definition (any existing file or a
 * name ending in `.prototxt`). An unknown name lists the built-ins and suggests the closest.
 *
 * @example
 * ```ts ignore
 * import { chooseModel } from "./model.ts";
 * const model = await chooseModel("lenet", 1);
 * console.log(model.inputShape); // [1, 28, 28]
 * ```
 */
export async function chooseModel(
  text: string,
  seed: number,
  inputShape?: readonly number[],
): Promise<ModelChoice | typeof NEEDS_INPUT_SHAPE> {
  const builtin = builtinModels[text as BuiltinModelName];
  if (builtin) {
    return {
      spec: (classes?: number) => ({
        kind: "builtin",
        name: text as BuiltinModelName,
        options: { seed, classes },
      }),
      inputShape: builtin.inputShape,
      classes: builtin.classes,
      name: text,
    };
  }
  let prototxt: string | undefined;
  try {
    if ((await Deno.stat(text)).isFile) prototxt = await Deno.readTextFile(text);
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
  }
  if (prototxt === undefined) {
    const names = Object.keys(builtinModels);
    if (text.endsWith(".prototxt")) throw new CliError(`--model ${text}: no such file`);
    // The last component: a typo of a built-in name arrives resolved to a path (cli/paths.ts).
    const hint = closest(basename(text), names);
    throw new CliError(
      `--model: unknown model "${text}"${hint ? `; did you mean ${hint}?` : ""} ` +
        `(built-ins: ${names.join(", ")}; or give a path to a Caffe .prototxt)`,
    );
  }
  const spec: ModelSpec = { kind: "caffe", text: prototxt, options: { seed, fileName: text, inputShape } };
  // Imported once here to learn the input, class count and preprocessing the prototxt declares (as
  // buildModel imports it on every device: the TRAIN phase).
  let imported: CaffeImport;
  try {
    imported = importCaffeNet(prototxt, { ...spec.options, phase: "TRAIN" });
  } catch (error) {
    // A Data layer reading a database leaves the shape to the database: the images will tell.
    if (!inputShape && error instanceof TandemError && /cannot tell the input shape/.test(error.message)) {
      return NEEDS_INPUT_SHAPE;
    }
    throw error;
  }
  const { network, transform } = imported;
  const built = { inputShape: network.inputShape, classes: network.classes, name: network.name, transform };
  network.dispose();
  return { spec: () => spec, ...built };
}

/**
 * The model of `--model` for the data of `--data`: {@link chooseModel}, and for a Caffe net whose
 * data layer leaves the input shape to its database, the shape `--data synthetic:CxHxW` gives, or
 * else the loaded images' (returned too, so they are read once).
 *
 * @example
 * ```ts ignore
 * import { chooseModelForData } from "./model.ts";
 * const { choice } = await chooseModelForData({ model: "cifar10_quick_train_test.prototxt", data: "synthetic:3x32x32", seed: 1 });
 * ```
 */
export async function chooseModelForData(
  args: { model: string; data: string; seed: number },
): Promise<{ choice: ModelChoice; images?: LoadedImages }> {
  const chosen = await chooseModel(args.model, args.seed);
  if (chosen !== NEEDS_INPUT_SHAPE) return { choice: chosen };
  const given = syntheticShape(args.data);
  // Plain `synthetic` refuses here, asking for synthetic:CxHxW.
  const images = given ? undefined : await loadImages(args.data, undefined, args.seed);
  const shape = given ?? [images!.train.channels, images!.train.height, images!.train.width];
  const choice = await chooseModel(args.model, args.seed, shape);
  if (choice === NEEDS_INPUT_SHAPE) throw new Error("input shape still unknown");
  return { choice, images };
}

/** Builds the network of `spec` on this thread (for summaries, profiles and evaluation). */
export function buildLocal(spec: ModelSpec): Promise<Network> {
  return buildModel(spec);
}
