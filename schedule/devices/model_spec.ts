/**
 * How a device builds its replica. Devices run in other threads (or processes), so they receive a
 * description of the model, not the model: every replica is built the same way from it and then
 * overwritten with device 0's parameters, so all replicas start bit-identical.
 *
 * @module
 */

import {
  type BuiltinModelName,
  builtinModels,
  type CaffeImportOptions,
  importCaffeNet,
  type Module,
  type Network,
  TandemError,
  withoutFillers,
} from "../../engine/mod.ts";
import type { LayerBytes } from "../plan/buckets.ts";

/**
 * A model description that can cross a thread boundary:
 * - `builtin`: a model of the zoo by name (`alexnet-like`, `cifar-quick`, …) with its options;
 * - `caffe`: a Caffe net definition (prototxt text) and import options;
 * - `module`: a factory exported by an ES module (`url`, `exportName`), called with `args` —
 *   the way to bring your own network.
 */
export type ModelSpec =
  & (
    | { kind: "builtin"; name: BuiltinModelName; options?: { seed?: number; classes?: number } }
    | { kind: "caffe"; text: string; options?: Omit<CaffeImportOptions, "phase"> }
    | { kind: "module"; url: string; exportName: string; args?: unknown[] }
  )
  & {
    /**
     * Parameter group of each named layer, overriding the model's own (`conv`/`fc`): how an
     * automatic schedule's split (`AutoPlan.assignment`) reaches every replica.
     */
    groups?: Readonly<Record<string, string>>;
  };

/**
 * Builds the network a spec describes. With `fillParameters: false` its parameters stay zero (see
 * `withoutFillers`): for a replica that is given device 0's parameters before it computes.
 *
 * @example
 * ```ts
 * import { buildModel } from "./model_spec.ts";
 * const net = await buildModel({ kind: "builtin", name: "cifar-quick", options: { seed: 1 } });
 * ```
 */
export async function buildModel(
  spec: ModelSpec,
  options: { fillParameters?: boolean } = {},
): Promise<Network> {
  const network = await buildUngrouped(spec, options.fillParameters ?? true);
  if (spec.groups) {
    const layers = new Map(leafLayers(network).map((layer) => [layer.path, layer]));
    for (const [name, group] of Object.entries(spec.groups)) {
      const layer = layers.get(name);
      if (!layer) {
        throw new TandemError(
          `model spec: group assignment names layer "${name}", which ${network.name} does not have`,
        );
      }
      layer.setGroup(group);
    }
  }
  return network;
}

/**
 * Every leaf layer of `network` with its parameter bytes, forward order, named as a spec's `groups`
 * assignment names them (for `ddpBuckets` in `schedule/plan/buckets.ts`).
 *
 * @example
 * ```ts
 * import "../../mod.ts"; // registers the CPU backend
 * import { buildModel, layerParameterBytes } from "./model_spec.ts";
 * const net = await buildModel({ kind: "builtin", name: "cifar-quick" });
 * console.log(layerParameterBytes(net).at(-1)); // { name: "ip2", parameterBytes: 2600 }
 * ```
 */
export function layerParameterBytes(network: Module): LayerBytes[] {
  return leafLayers(network).map((layer) => ({
    name: layer.path,
    parameterBytes: 4 * layer.namedParameters().reduce((n, p) => n + p.tensor.size, 0),
  }));
}

function leafLayers(module: Module): Module[] {
  const children = module.children();
  return children.length === 0 ? [module] : children.flatMap(([, child]) => leafLayers(child));
}

async function buildUngrouped(spec: ModelSpec, fill: boolean): Promise<Network> {
  const build = <T>(create: () => T): T => fill ? create() : withoutFillers(create);
  switch (spec.kind) {
    case "builtin": {
      const entry = builtinModels[spec.name];
      if (!entry) {
        throw new TandemError(
          `model spec: unknown built-in model "${spec.name}"; known: ${
            Object.keys(builtinModels).join(", ")
          }`,
        );
      }
      return build(() => entry.create(spec.options));
    }
    case "caffe":
      return build(() => importCaffeNet(spec.text, { ...spec.options, phase: "TRAIN" }).network);
    case "module": {
      const module = await import(spec.url);
      const factory = module[spec.exportName];
      if (typeof factory !== "function") {
        throw new TandemError(`model spec: ${spec.url} has no exported function "${spec.exportName}"`);
      }
      return await build(() => factory(...(spec.args ?? [])));
    }
    default:
      throw new TandemError(`model spec: unknown kind "${(spec as { kind: string }).kind}"`);
  }
}
