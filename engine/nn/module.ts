/**
 * The `Module` base class: named parameters with groups and Caffe's learning-rate/decay multipliers,
 * child modules, train/eval mode, deterministic initialisation, and shape/FLOP description for
 * summaries.
 *
 * @module
 */

import { full, tensor, zeros } from "../creation.ts";
import { TandemError } from "../errors.ts";
import { untrackFromScopes } from "../context.ts";
import type { Tensor } from "../tensor.ts";
import { type Filler, fillerValues, skippingFillers, streamOf } from "./init.ts";
import type { BufferEntry, ParameterEntry } from "./parameter.ts";

/** What a forward pass needs beyond its input: where the batch sits in training, for dropout. */
export interface ForwardContext {
  /** Run seed for stochastic layers (default 0). */
  seed?: number;
  /** Training step (keys dropout masks; default 0). */
  step?: number;
  /** Global index of the batch's first sample, so a shard on device 1 draws the same masks as the whole batch on one device. */
  sampleOffset?: number;
}

/** A layer's output shape and forward cost for a given input shape (one sample's FLOPs). */
export interface LayerDescription {
  /** Output shape including the batch axis. */
  outputShape: number[];
  /** Floating-point operations of the forward pass per sample (multiply-add = 2). */
  flops: number;
}

/** How a parameter is trained and initialised. */
export interface ParameterOptions {
  /** Group for reduction and per-group updates; defaults to the layer's (`conv` or `fc`). */
  group?: string;
  /** Learning-rate multiplier (Caffe `lr_mult`). */
  lrMult?: number;
  /** Weight-decay multiplier (Caffe `decay_mult`). */
  decayMult?: number;
  /** Initialiser (Caffe filler). */
  filler?: Filler;
}

interface OwnBuffer {
  tensor: Tensor;
  value: number;
}

interface OwnParameter {
  tensor: Tensor;
  group: string | undefined;
  lrMult: number;
  decayMult: number;
  filler: Filler;
}

/**
 * Base class of layers and models.
 *
 * @example
 * ```ts
 * import { Module, type LayerDescription } from "./module.ts";
 * import { ops, type Tensor } from "../../mod.ts";
 * class Scale extends Module {
 *   readonly kind = "Scale";
 *   readonly weight = this.addParameter("weight", [1], { filler: { type: "constant", value: 2 } });
 *   forward(x: Tensor) { return ops.mul(x, this.weight); }
 *   describe(shape: readonly number[]): LayerDescription { return { outputShape: [...shape], flops: 1 }; }
 * }
 * ```
 */
export abstract class Module {
  /** Layer type, e.g. `Conv2d`. */
  abstract readonly kind: string;
  /** Group of this layer's parameters unless overridden (`conv` for convolutions, `fc` for linear). */
  readonly defaultGroup: string = "conv";
  #training = true;
  #groupOverride: string | undefined;
  readonly #parameters = new Map<string, OwnParameter>();
  readonly #buffers = new Map<string, OwnBuffer>();
  readonly #children = new Map<string, Module>();
  #parent: Module | undefined;
  #nameInParent = "";

  /** Computes the layer's output. */
  abstract forward(x: Tensor, context?: ForwardContext): Tensor;

  /** Output shape and per-sample FLOPs for an input of `inputShape` (batch axis included). */
  abstract describe(inputShape: readonly number[]): LayerDescription;

  /** Dotted path of this module inside its root model (`""` for the root). */
  get path(): string {
    if (!this.#parent) return "";
    const parentPath = this.#parent.path;
    return parentPath ? `${parentPath}.${this.#nameInParent}` : this.#nameInParent;
  }

  /** True in training mode (dropout active), false in evaluation mode. */
  get training(): boolean {
    return this.#training;
  }

  /** Sets training mode on this module and every descendant. */
  train(mode = true): this {
    this.#training = mode;
    for (const child of this.#children.values()) child.train(mode);
    return this;
  }

  /** Sets evaluation mode (same as `train(false)`). */
  eval(): this {
    return this.train(false);
  }

  /** Puts this module's and its descendants' parameters into `group` (unless a parameter names its own). */
  setGroup(group: string): this {
    this.#groupOverride = group;
    for (const child of this.#children.values()) child.setGroup(group);
    return this;
  }

  /** Declares a parameter (zero-filled until {@link Module.initialize}); returns its tensor. */
  protected addParameter(name: string, shape: readonly number[], options: ParameterOptions = {}): Tensor {
    if (this.#parameters.has(name) || this.#children.has(name) || this.#buffers.has(name)) {
      throw new TandemError(`${this.kind}: "${name}" is already a parameter or child of this module`);
    }
    const values = zeros(shape, { requiresGrad: true });
    untrackFromScopes(values); // parameters live as long as the model, not the enclosing tidy
    this.#parameters.set(name, {
      tensor: values,
      group: options.group,
      lrMult: options.lrMult ?? 1,
      decayMult: options.decayMult ?? 1,
      filler: options.filler ?? { type: "constant", value: 0 },
    });
    return values;
  }

  /**
   * Declares a buffer: state the module updates itself (BatchNorm's running statistics), with no
   * gradient and no optimizer, never exchanged as a gradient; `initialize` fills it with `value`
   * (default 0). Checkpoints save and load buffers beside the parameters.
   */
  protected addBuffer(name: string, shape: readonly number[], value = 0): Tensor {
    if (this.#parameters.has(name) || this.#children.has(name) || this.#buffers.has(name)) {
      throw new TandemError(`${this.kind}: "${name}" is already a parameter, buffer or child of this module`);
    }
    const values = full(shape, value);
    untrackFromScopes(values); // buffers live as long as the model, not the enclosing tidy
    this.#buffers.set(name, { tensor: values, value });
    return values;
  }

  /** Adds a child module under `name` (its parameters become `name.…`). */
  protected addModule<M extends Module>(name: string, module: M): M {
    if (this.#parameters.has(name) || this.#children.has(name) || this.#buffers.has(name)) {
      throw new TandemError(`${this.kind}: "${name}" is already a parameter or child of this module`);
    }
    if (!/^[A-Za-z0-9_\-]+$/.test(name)) {
      throw new TandemError(`${this.kind}: child name "${name}" must be letters, digits, "_" or "-"`);
    }
    if (module.#parent) throw new TandemError(`${module.kind} "${name}" already belongs to another module`);
    module.#parent = this;
    module.#nameInParent = name;
    this.#children.set(name, module);
    return module;
  }

  /** Direct children in registration order. */
  children(): [string, Module][] {
    return [...this.#children];
  }

  /** Every parameter of this module and its descendants, in registration order, with dotted names. */
  namedParameters(): ParameterEntry[] {
    const entries: ParameterEntry[] = [];
    this.#collect(this.path ? `${this.path}.` : "", entries, undefined);
    return entries;
  }

  #collect(prefix: string, into: ParameterEntry[], inheritedGroup: string | undefined): void {
    const group = this.#groupOverride ?? inheritedGroup;
    for (const [name, p] of this.#parameters) {
      into.push({
        name: prefix + name,
        tensor: p.tensor,
        group: p.group ?? group ?? this.defaultGroup,
        lrMult: p.lrMult,
        decayMult: p.decayMult,
      });
    }
    for (const [name, child] of this.#children) child.#collect(`${prefix}${name}.`, into, group);
  }

  /**
   * Every buffer of this module and its descendants (see {@link Module.addBuffer}), in registration
   * order, with dotted names like parameters'.
   */
  namedBuffers(): BufferEntry[] {
    const entries: BufferEntry[] = [];
    this.#collectBuffers(this.path ? `${this.path}.` : "", entries);
    return entries;
  }

  #collectBuffers(prefix: string, into: BufferEntry[]): void {
    for (const [name, b] of this.#buffers) into.push({ name: prefix + name, tensor: b.tensor });
    for (const [name, child] of this.#children) child.#collectBuffers(`${prefix}${name}.`, into);
  }

  /** Parameter tensors, optionally only those of one group. */
  parameters(group?: string): Tensor[] {
    return this.namedParameters().filter((p) => group === undefined || p.group === group).map((p) =>
      p.tensor
    );
  }

  /** Group names in the order their parameters appear. */
  parameterGroups(): string[] {
    return [...new Set(this.namedParameters().map((p) => p.group))];
  }

  /** Number of scalar parameters. */
  parameterCount(group?: string): number {
    return this.parameters(group).reduce((n, t) => n + t.size, 0);
  }

  /**
   * Fills every parameter with its filler, keyed by `seed` and the parameter's dotted name, so
   * the same seed gives the same model on every device and backend (inside `withoutFillers`,
   * parameters keep their zeros and only buffers are set).
   */
  initialize(seed: number): this {
    const prefix = this.path ? `${this.path}.` : "";
    this.#initialize(prefix, seed);
    return this;
  }

  #initialize(prefix: string, seed: number): void {
    // Inside `withoutFillers` they keep their zeros: whoever built them overwrites them next.
    const filled = skippingFillers() ? [] : this.#parameters;
    for (const [name, p] of filled) {
      const values = fillerValues(p.filler, p.tensor.shape, { seed, stream: streamOf(prefix + name) });
      const source = tensor(values, { shape: p.tensor.shape });
      p.tensor.assign(source);
      source.dispose();
    }
    for (const b of this.#buffers.values()) {
      const source = tensor(new Float32Array(b.tensor.size).fill(b.value), { shape: b.tensor.shape });
      b.tensor.assign(source);
      source.dispose();
    }
    for (const [name, child] of this.#children) child.#initialize(`${prefix}${name}.`, seed);
  }

  /** Frees every parameter (and its gradient) and buffer. */
  dispose(): void {
    for (const p of this.#parameters.values()) p.tensor.dispose();
    for (const b of this.#buffers.values()) b.tensor.dispose();
    for (const child of this.#children.values()) child.dispose();
  }
}
