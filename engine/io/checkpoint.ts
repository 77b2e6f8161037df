/**
 * Tandem checkpoints: one safetensors file (`safetensors.ts`) holding a model's parameters and
 * buffers, its optimizer's state, and the training step, model name, random-generator state and
 * extra data as metadata. Saving is atomic; loading validates everything against the model before
 * it assigns anything, and says in one {@link CheckpointError} what does not match.
 *
 * @module
 */

import { formatShape } from "../errors.ts";
import type { BufferEntry, ParameterEntry } from "../nn/parameter.ts";
import type { Optimizer, OptimizerState, OptimizerStateInfo } from "../optim/optimizer.ts";
import { findNonFinite } from "../finite.ts";
import { Tensor } from "../tensor.ts";
import { CheckpointError } from "./errors.ts";
import {
  dtypeOfTensor,
  type HostTensor,
  jsonDepthProblem,
  loadSafetensors,
  type SafetensorsFile,
  saveSafetensors,
  type TensorSource,
} from "./safetensors.ts";

/** How deep the JSON in a checkpoint's metadata strings (optimizer state, extra data) may nest. */
export const MAX_METADATA_JSON_DEPTH = 32;

/** Marks files written by {@link saveCheckpoint}; bump on incompatible layout changes. */
export const CHECKPOINT_FORMAT = "tandem-checkpoint/1";

/** Prefix of optimizer state tensors: `optimizer.<parameter name>.<slot>`. */
const OPTIMIZER_PREFIX = "optimizer.";

function slotKey(parameter: string, slot: string): string {
  return `${OPTIMIZER_PREFIX}${parameter}.${slot}`;
}

/**
 * What {@link saveCheckpoint} stores.
 *
 * @example
 * ```ts
 * import type { CheckpointContents } from "./checkpoint.ts";
 * declare const contents: CheckpointContents;
 * console.log(contents.modelName, contents.step);
 * ```
 */
export interface CheckpointContents {
  /** The model's parameters, stored under their dotted names. */
  parameters: readonly ParameterEntry[];
  /**
   * The model's buffers (BatchNorm statistics, `Module.namedBuffers()`; a data-parallel trainer's
   * `bufferEntries`, device 0's), stored under their dotted names and listed in the metadata
   * `buffers`.
   */
  buffers?: readonly BufferEntry[];
  /** Optimizer whose state (tensors and iteration/hyper-parameters/update counts) is stored too. */
  optimizer?: Optimizer;
  /** Training step (non-negative integer), returned on load. */
  step: number;
  /** The model's name, checked on load. */
  modelName: string;
  /** Random-generator state (any JSON value), returned on load. */
  rng?: unknown;
  /** Anything else JSON-serialisable (epoch, data-loader position…), returned on load. */
  extra?: unknown;
  /**
   * Further float32 arrays of training state (e.g. the trainer's error-feedback residuals), stored
   * as 1-D tensors under their names and listed in the metadata `extra_tensors`, so that loading
   * tells them from unexpected tensors and returns them.
   */
  extraTensors?: Readonly<Record<string, Float32Array>>;
}

/**
 * Saves parameters, optimizer state and training metadata in one safetensors file, atomically.
 * Tensors: each parameter and buffer under its name; optimizer slots under
 * `optimizer.<name>.<slot>`. Metadata (strings): `format`, `model_name`, `step`, and JSON texts
 * `optimizer` (kind, hyper-parameters, iteration, update counts), `buffers` (the buffers' names),
 * `rng` and `extra` when given, and `extra_tensors` (the names of `extraTensors`).
 *
 * @example
 * ```ts
 * import { saveCheckpoint } from "./checkpoint.ts";
 * import type { ParameterEntry } from "../nn/parameter.ts";
 * import type { SGD } from "../optim/sgd.ts";
 * declare const parameters: ParameterEntry[], optimizer: SGD;
 * await saveCheckpoint("alexnet-1000.safetensors", {
 *   parameters, optimizer, step: 1000, modelName: "alexnet", rng: { seed: 1 },
 * });
 * ```
 */
export async function saveCheckpoint(path: string, contents: CheckpointContents): Promise<void> {
  const { parameters, optimizer, step, modelName } = contents;
  if (!Number.isSafeInteger(step) || step < 0) {
    throw new CheckpointError(path, [`step must be a non-negative integer, got ${step}`]);
  }
  if (typeof modelName !== "string") throw new CheckpointError(path, ["modelName must be a string"]);
  const tensors = new Map<string, TensorSource>();
  for (const p of parameters) {
    if (tensors.has(p.name)) throw new CheckpointError(path, [`parameter name "${p.name}" appears twice`]);
    tensors.set(p.name, p.tensor);
  }
  for (const b of contents.buffers ?? []) {
    if (tensors.has(b.name)) {
      throw new CheckpointError(path, [`buffer "${b.name}" collides with another tensor of that name`]);
    }
    tensors.set(b.name, b.tensor);
  }
  const metadata: Record<string, string> = {
    format: CHECKPOINT_FORMAT,
    model_name: modelName,
    step: String(step),
  };
  if (optimizer) {
    const state = optimizer.state();
    for (const [name, slots] of state.perParameter) {
      for (const [slot, t] of Object.entries(slots)) {
        const key = slotKey(name, slot);
        if (tensors.has(key)) {
          throw new CheckpointError(path, [
            `optimizer tensor "${key}" collides with a parameter of that name`,
          ]);
        }
        tensors.set(key, t);
      }
    }
    const { iteration, hyper, updates } = state;
    metadata.optimizer = JSON.stringify({ iteration, hyper, updates });
  }
  if (contents.buffers?.length) metadata.buffers = JSON.stringify(contents.buffers.map((b) => b.name));
  if (contents.rng !== undefined) metadata.rng = JSON.stringify(contents.rng);
  if (contents.extra !== undefined) metadata.extra = JSON.stringify(contents.extra);
  const extraTensors = Object.entries(contents.extraTensors ?? {});
  for (const [name, data] of extraTensors) {
    if (tensors.has(name)) {
      throw new CheckpointError(path, [`extra tensor "${name}" collides with another tensor`]);
    }
    tensors.set(name, { dtype: "F32", shape: [data.length], data });
  }
  if (extraTensors.length) metadata.extra_tensors = JSON.stringify(extraTensors.map(([name]) => name));
  // A diverged model is never written: it would replace a good file with one nobody can resume.
  const bad = await findNonFinite(
    [...tensors].flatMap(([name, t]) => t instanceof Tensor ? [{ name, tensor: t }] : []),
  );
  if (bad) {
    throw new CheckpointError(path, [
      `not written: "${bad.name}" holds ${bad.value} at element ${bad.index}; a checkpoint keeps finite values only`,
    ]);
  }
  await saveSafetensors(path, tensors, metadata);
}

/**
 * What {@link loadCheckpoint} checks against and loads into.
 *
 * @example
 * ```ts
 * import type { LoadCheckpointOptions } from "./checkpoint.ts";
 * const options: LoadCheckpointOptions = { parameters: [], modelName: "alexnet" };
 * ```
 */
export interface LoadCheckpointOptions {
  /** The model's parameters; each must be in the checkpoint with the same shape and dtype. */
  parameters: readonly ParameterEntry[];
  /**
   * The model's buffers (BatchNorm statistics); each must be in the checkpoint, listed as a buffer,
   * with the same shape. A checkpoint holding buffers cannot load without them.
   */
  buffers?: readonly BufferEntry[];
  /**
   * Optimizer to restore; the checkpoint must hold matching state. When omitted, stored optimizer
   * state is ignored (loading weights for evaluation or fine-tuning).
   */
  optimizer?: Optimizer;
  /** Expected model name; a different stored name is a mismatch. */
  modelName?: string;
  /**
   * Check everything and change nothing: how a program refuses a bad checkpoint before it starts
   * expensive work (devices), with the tensors it will load into later.
   */
  dryRun?: boolean;
  /** The file's contents already read by `loadSafetensors(path)`, so a big file is read once. */
  file?: SafetensorsFile;
}

/**
 * The training metadata of a loaded checkpoint.
 *
 * @example
 * ```ts
 * import type { LoadedCheckpoint } from "./checkpoint.ts";
 * declare const loaded: LoadedCheckpoint;
 * console.log(`resuming ${loaded.modelName} at step ${loaded.step}`);
 * ```
 */
export interface LoadedCheckpoint {
  /** The training step saved. */
  step: number;
  /** The model name saved. */
  modelName: string;
  /** The RNG state saved, parsed from JSON (`undefined` when none). */
  rng?: unknown;
  /** The extra data saved, parsed from JSON (`undefined` when none). */
  extra?: unknown;
  /** The extra tensors saved (`CheckpointContents.extraTensors`), by name; empty when none. */
  extraTensors: Record<string, Float32Array>;
  /** All raw metadata strings. */
  metadata: Record<string, string>;
}

/** How many of a float tensor's values are NaN or ±∞, and the first; `undefined` when none. */
function nonFiniteIn(host: HostTensor): { count: number; index: number; first: number } | undefined {
  if (!(host.data instanceof Float32Array)) return undefined;
  let count = 0, index = -1;
  for (let i = 0; i < host.data.length; i++) {
    const v = host.data[i];
    if (v - v !== 0) {
      if (count++ === 0) index = i;
    }
  }
  return count ? { count, index, first: host.data[index] } : undefined;
}

function describe(host: HostTensor): string {
  return `${formatShape(host.shape)} ${host.dtype}`;
}

function parseJson(text: string | undefined, what: string, problems: string[]): unknown {
  if (text === undefined) return undefined;
  const tooDeep = jsonDepthProblem(text, MAX_METADATA_JSON_DEPTH);
  if (tooDeep) {
    problems.push(`metadata "${what}" ${tooDeep}`);
    return undefined;
  }
  try {
    return JSON.parse(text);
  } catch (error) {
    problems.push(`metadata "${what}" is not valid JSON: ${(error as Error).message}`);
    return undefined;
  }
}

/** Copies a host tensor into `target` in place, through a temporary tensor on `target`'s backend. */
function assignHost(target: Tensor, host: HostTensor): void {
  const temporary = new Tensor(
    target.backend,
    target.backend.upload(host.data as Float32Array | Int32Array),
    host.shape,
  );
  try {
    target.assign(temporary);
  } finally {
    temporary.dispose();
  }
}

/**
 * Loads a checkpoint written by {@link saveCheckpoint} into `parameters` (and `optimizer`) in place.
 * Everything is verified first (format, model name, every parameter present with the same shape and
 * dtype, no unexpected tensors, optimizer kind, hyper-parameters, state slots and counts); any
 * mismatch throws one `CheckpointError` listing all of them, with nothing modified. Format errors of
 * the file itself throw `SafetensorsError`.
 *
 * @example
 * ```ts
 * import { loadCheckpoint } from "./checkpoint.ts";
 * import type { ParameterEntry } from "../nn/parameter.ts";
 * import type { SGD } from "../optim/sgd.ts";
 * declare const parameters: ParameterEntry[], optimizer: SGD;
 * const { step, rng } = await loadCheckpoint("alexnet-1000.safetensors", {
 *   parameters, optimizer, modelName: "alexnet",
 * });
 * ```
 */
export async function loadCheckpoint(
  path: string,
  options: LoadCheckpointOptions,
): Promise<LoadedCheckpoint> {
  const { tensors, metadata } = options.file ?? await loadSafetensors(path);
  const { parameters, optimizer, modelName } = options;
  const problems: string[] = [];

  if (metadata.format !== CHECKPOINT_FORMAT) {
    problems.push(
      `format: metadata "format" is ${JSON.stringify(metadata.format)}, expected "${CHECKPOINT_FORMAT}"`,
    );
  }
  const step = Number(metadata.step);
  if (!Number.isSafeInteger(step) || step < 0) {
    problems.push(`metadata "step" is ${JSON.stringify(metadata.step)}, expected a non-negative integer`);
  }
  if (modelName !== undefined && metadata.model_name !== modelName) {
    problems.push(
      `wrong model name: checkpoint is for ${JSON.stringify(metadata.model_name)}, expected "${modelName}"`,
    );
  }
  const rng = parseJson(metadata.rng, "rng", problems);
  const extra = parseJson(metadata.extra, "extra", problems);
  const extraTensors: Record<string, Float32Array> = {};
  const extraNames = parseJson(metadata.extra_tensors, "extra_tensors", problems) ?? [];
  if (!Array.isArray(extraNames) || extraNames.some((n) => typeof n !== "string")) {
    problems.push(`metadata "extra_tensors" is not a list of tensor names`);
  } else {
    for (const name of extraNames as string[]) {
      const host = tensors.get(name);
      if (!host || host.dtype !== "F32" || host.shape.length !== 1) {
        problems.push(`extra tensor "${name}" is listed but not in the checkpoint as a 1-D F32 tensor`);
      } else extraTensors[name] = host.data as Float32Array;
    }
  }

  const accounted = new Set<string>(Object.keys(extraTensors));
  const checkTensor = (key: string, target: Tensor, what: string) => {
    const host = tensors.get(key);
    const expected = `${formatShape(target.shape)} ${dtypeOfTensor(target)}`;
    if (!host) {
      problems.push(`missing: ${what} ${expected} is not in the checkpoint`);
      return;
    }
    accounted.add(key);
    const shapeDiffers = host.shape.length !== target.shape.length ||
      host.shape.some((d, i) => d !== target.shape[i]);
    if (shapeDiffers) {
      problems.push(
        `shape differs: ${what} is ${formatShape(target.shape)} in the model, ${
          formatShape(host.shape)
        } in the checkpoint`,
      );
    }
    if (host.dtype !== dtypeOfTensor(target)) {
      problems.push(
        `dtype differs: ${what} is ${dtypeOfTensor(target)} in the model, ${host.dtype} in the checkpoint`,
      );
    }
    // One NaN weight would spread through the whole net at the first step: refuse it here.
    const bad = nonFiniteIn(host);
    if (bad) {
      problems.push(
        `not finite: ${what} holds ${bad.count.toLocaleString("en-US")} NaN or infinite values of ${
          host.data.length.toLocaleString("en-US")
        } (the first, ${bad.first}, at element ${bad.index}); the run that saved it had diverged`,
      );
    }
  };
  for (const p of parameters) checkTensor(p.name, p.tensor, `parameter "${p.name}"`);
  const savedBuffers = parseJson(metadata.buffers, "buffers", problems) ?? [];
  if (!Array.isArray(savedBuffers) || savedBuffers.some((n) => typeof n !== "string")) {
    problems.push(`metadata "buffers" is not a list of tensor names`);
  }
  for (const b of options.buffers ?? []) {
    if (Array.isArray(savedBuffers) && !savedBuffers.includes(b.name) && tensors.has(b.name)) {
      problems.push(`buffer "${b.name}" is in the checkpoint but not listed as a buffer`);
    }
    checkTensor(b.name, b.tensor, `buffer "${b.name}"`);
  }

  let optimizerInfo: OptimizerStateInfo | undefined;
  if (optimizer) {
    const parsed = parseJson(metadata.optimizer, "optimizer", problems) as OptimizerStateInfo | undefined;
    if (metadata.optimizer === undefined) problems.push("optimizer: the checkpoint holds no optimizer state");
    else if (parsed !== undefined) {
      const kindProblem = parsed?.hyper?.kind !== optimizer.kind;
      problems.push(...optimizer.checkState(parsed).map((problem) => `optimizer: ${problem}`));
      if (!kindProblem) {
        optimizerInfo = parsed;
        for (const p of optimizer.parameters) {
          for (const slot of optimizer.slotNames) {
            checkTensor(slotKey(p.name, slot), p.tensor, `optimizer state "${slotKey(p.name, slot)}"`);
          }
        }
      } else {
        // Another optimizer's slots: the kind mismatch above already says why they do not fit.
        for (const key of tensors.keys()) if (key.startsWith(OPTIMIZER_PREFIX)) accounted.add(key);
      }
    }
  }
  for (const [key, host] of tensors) {
    if (accounted.has(key)) continue;
    if (!optimizer && key.startsWith(OPTIMIZER_PREFIX) && metadata.optimizer !== undefined) continue;
    problems.push(`unexpected: "${key}" ${describe(host)} is in the checkpoint but not in the model`);
  }
  if (problems.length > 0) throw new CheckpointError(path, problems);
  if (options.dryRun) return { step, modelName: metadata.model_name, rng, extra, metadata, extraTensors };

  for (const p of parameters) assignHost(p.tensor, tensors.get(p.name)!);
  for (const b of options.buffers ?? []) assignHost(b.tensor, tensors.get(b.name)!);
  if (optimizer && optimizerInfo) {
    const perParameter = new Map<string, Record<string, Tensor>>();
    const temporaries: Tensor[] = [];
    try {
      for (const p of optimizer.parameters) {
        const slots: Record<string, Tensor> = {};
        for (const slot of optimizer.slotNames) {
          const host = tensors.get(slotKey(p.name, slot))!;
          const t = new Tensor(
            p.tensor.backend,
            p.tensor.backend.upload(host.data as Float32Array),
            host.shape,
          );
          temporaries.push(t);
          slots[slot] = t;
        }
        perParameter.set(p.name, slots);
      }
      const state: OptimizerState = { ...optimizerInfo, perParameter };
      optimizer.loadState(state);
    } finally {
      for (const t of temporaries) t.dispose();
    }
  }
  return { step, modelName: metadata.model_name, rng, extra, extraTensors, metadata };
}
