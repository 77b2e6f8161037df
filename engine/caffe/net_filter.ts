/**
 * Which of a net's layers the import keeps, as Caffe's `Net::FilterNet` decides for a `NetState`
 * (phase, level, stages) from each layer's `include`/`exclude` rules — one train_val file holds
 * both phases' data and accuracy layers. Every layer is read first for what any layer has (its
 * fields, name, type and rules), so a typo in a layer the phase leaves out is still caught; only a
 * kept layer must have a supported type (a TEST-only layer Tandem cannot build does not stop a
 * TRAIN import) and a name no other kept layer uses (parameters and notes are named after it).
 *
 * @module
 */

import type { PrototxtMessage } from "./prototxt.ts";
import type { LayerRef, Reader } from "./reader.ts";

/** Caffe's phase a net is instantiated for. */
export type CaffePhase = "TRAIN" | "TEST";

/** Caffe's `NetState`: what the `include`/`exclude` rules are tested against. */
export interface NetState {
  /** The phase. */
  readonly phase: CaffePhase;
  /** `NetState.level`, for `min_level`/`max_level`. */
  readonly level: number;
  /** `NetState.stage`, for `stage`/`not_stage`. */
  readonly stages: readonly string[];
}

/** A layer's own fields (`LayerParameter`); each type's `*_param` block is read by its builder. */
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

/** Caffe's `StateMeetsRule`: whether one `include`/`exclude` rule holds in `state`. */
function ruleMet(reader: Reader, rule: PrototxtMessage, { phase, level, stages }: NetState): boolean {
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

/**
 * The layers of `root` kept in `state`, in file order, each with a type in `supported`; the ones
 * left out are noted.
 *
 * @example
 * ```ts ignore
 * const layers = filterLayers(reader, root, { phase: "TRAIN", level: 0, stages: [] }, SUPPORTED, notes);
 * ```
 */
export function filterLayers(
  reader: Reader,
  root: PrototxtMessage,
  state: NetState,
  supported: readonly string[],
  notes: string[],
): LayerRef[] {
  const { phase, stages } = state;
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
      ? includes.some((r) => ruleMet(reader, r, state))
      : !excludes.some((r) => ruleMet(reader, r, state));
    if (!included) {
      notes.push(
        `${name} (${type}): left out in phase ${phase}${
          stages.length ? ` with stages ${stages.join(", ")}` : ""
        } (include/exclude rules)`,
      );
      continue;
    }
    if (!supported.includes(type)) {
      reader.fail(
        field,
        `layer "${name}" has unsupported type "${type}" (supported: ${supported.join(", ")})`,
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
  return layers;
}
