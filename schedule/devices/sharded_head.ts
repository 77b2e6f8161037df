/**
 * A device's part of a hybrid iteration: the body of its data-parallel replica and its slice of the
 * model-parallel head's units (how the head is split across devices is in `head_layout.ts`),
 * computed for the whole global batch.
 *
 * One iteration runs as phases, and between phases the runtime moves activations between devices:
 *
 * 1. `forward-body`: the body on this device's shard; its output rows go to `inputs[0]`.
 *    (all-gather: every device then holds the whole batch's rows)
 * 2. `forward-stage s`, for each head layer: its slice of units for all B samples, through the
 *    parameter-free layers after it (ReLU, Dropout), into its columns of `inputs[s + 1]`.
 *    (all-gather by columns; the last stage's output is the logits)
 * 3. `backward-stage s`, from the last: the output gradient of its units — from the loss on the full
 *    logits for the last stage, else summed over every device's partial input gradient of stage
 *    s + 1, in device order — gives the slice's weight and bias gradients (kept on this device:
 *    they never travel) and this device's partial input gradient `partials[s]` (reduce-scatter).
 * 4. `backward-body`: the body's output gradient (this shard's rows of every device's
 *    `partials[0]`, summed in device order) runs the body's backward group by group.
 *
 * Dropout in a slice draws exactly the mask the whole layer draws (see `columns` in `ops.dropout`),
 * so the head computes what one device would compute on the whole batch, up to summation order.
 *
 * The same code runs in a CPU device's Worker and on a device driven from the main thread (WebGPU).
 *
 * @module
 */

import {
  averageGradients,
  backwardPass,
  countCorrect,
  type ForwardContext,
  type Module,
  type Network,
  ops,
  type ParameterEntry,
  TandemError,
  Tensor,
  tidy,
} from "../../engine/mod.ts";
import { fromStorage } from "../../engine/creation.ts";
import { streamOf } from "../../engine/nn/init.ts";
import type { Backend } from "../../backends/backend.ts";
import { type Dropout, forwardLayers, fusedRun } from "../../engine/nn/layers.ts";
import type { ParameterLayout, ParameterSlot } from "./parameter_layout.ts";
import type { ComputeSpan } from "./protocol.ts";
import { gatheredSamples, type MicroBatch, SliceGradientSum, WHOLE_SHARD } from "./head_micro_batches.ts";
import type { SliceStore } from "./head_slices.ts";
import { type HeadLayout, sliceSlots, unitRange } from "./head_layout.ts";

/** One device's part of a reduce-scatter: element (r, c) of source e is `values[r·stride + offset + c]`. */
export interface SumSource {
  /** The values. */
  readonly values: Float32Array;
  /** Elements per row. */
  readonly stride: number;
  /** First element of this device's part in each row. */
  readonly offset: number;
}

/** What a device's head shard works in, set once per batch size. */
export interface HeadSetup {
  /** The split. */
  readonly head: HeadLayout;
  /** This device. */
  readonly device: number;
  /** Samples in the global batch (B). */
  readonly batch: number;
  /**
   * `inputs[s]`: `[B, inFeatures of stage s]`, the gathered input of stage s (for s = 0 the body's
   * output rows); `inputs[stages]`: `[B, units of the last stage]`, the gathered logits. This device
   * writes its rows of `inputs[0]` and its columns of the others; the runtime fills in the rest.
   */
  readonly inputs: readonly Float32Array[];
  /** `partials[s]`: this device's partial gradient of stage s's input, `[B, inFeatures]`. */
  readonly partials: readonly Float32Array[];
  /**
   * `seeds[s]` (for s below the last stage): the sources whose sum, in device order, is the gradient
   * of this device's units of stage s's output — every device's `partials[s + 1]` at this device's
   * columns. `seeds[stages]`: those of the body's output gradient — this shard's rows of every
   * device's `partials[0]` (`offset` at the shard's first row).
   */
  readonly seeds: readonly (readonly SumSource[])[];
}

/** A phase of a hybrid iteration on one device (see the module notes). */
export type HeadPhase =
  | {
    readonly kind: "forward-body";
    readonly iteration: number;
    readonly seed: number;
    /** Float32 NCHW shard. */
    readonly images: Float32Array;
    readonly shape: number[];
    /** Global position of the shard's (micro-batch's) first sample. */
    readonly sampleOffset: number;
    /**
     * Gradient accumulation (see `head_micro_batches.ts`): this phase starts micro-batch
     * `microBatch` (default 0) of `microBatches` (default 1); `images` are that micro-batch's.
     */
    readonly microBatch?: number;
    readonly microBatches?: number;
  }
  | { readonly kind: "forward-stage"; readonly stage: number }
  | {
    readonly kind: "backward-stage";
    readonly stage: number;
    /** The global batch's labels, for the loss (the last stage only). */
    readonly labels?: Int32Array;
  }
  | { readonly kind: "backward-body"; readonly groups: readonly string[] };

/** What a phase reports. */
export interface HeadPhaseResult {
  /** Compute spans, in `performance.now()` milliseconds of the thread that ran them. */
  spans: ComputeSpan[];
  /** The full batch's mean loss (from the last stage's backward). */
  loss?: number;
  /** Correct top-1 predictions in this device's shard (from the last stage's backward). */
  correct?: number;
}

/** A device's head shard and the body of its replica, run phase by phase. */
export class HeadShard {
  readonly #network: Network;
  readonly #setup: HeadSetup;
  readonly #layers: Map<string, Module>;
  /** This device's slice of each stage: its units and parameter slots. */
  readonly #slices: { start: number; end: number; slots: ParameterSlot[] }[];
  readonly #bodyEntries: readonly ParameterEntry[];
  readonly #backend: Backend;
  /** The iteration's context and tensors, between phases. */
  #context: ForwardContext = {};
  #bodyOutput: Tensor | undefined;
  #stages: { input: Tensor; output: Tensor; parameters: Tensor[] }[] = [];
  #shard = { start: 0, size: 0 };
  /** The micro-batch running, and the global sample of each gathered row where not row r = sample r. */
  #micro: MicroBatch = WHOLE_SHARD;
  #rows: number[] | undefined;
  /** The slice gradients of the step's earlier micro-batches. */
  readonly #sums = new SliceGradientSum();

  /**
   * A shard over `network` (the device's replica); `bodyEntries` are its parameters outside the
   * sharded groups, loaded from the device's flat parameters by the caller.
   */
  constructor(
    network: Network,
    layout: ParameterLayout,
    setup: HeadSetup,
    bodyEntries: readonly ParameterEntry[],
  ) {
    this.#network = network;
    this.#setup = setup;
    this.#layers = new Map(network.layers());
    const slots = sliceSlots(layout, setup.head, setup.device);
    this.#slices = setup.head.stages.map((stage) => ({
      ...unitRange(stage.units, setup.head.devices, setup.device),
      slots: slots.filter((s) => s.name.startsWith(`${stage.linear}.`)),
    }));
    this.#bodyEntries = bodyEntries;
    this.#backend = network.namedParameters()[0].tensor.backend;
  }

  /** The setup it runs with. */
  get setup(): HeadSetup {
    return this.#setup;
  }

  /** The replica's parameters outside the sharded groups (the body's). */
  get bodyEntries(): readonly ParameterEntry[] {
    return this.#bodyEntries;
  }

  /**
   * Runs a phase. Stage forwards read the slice's parameters from `slices`, stage backwards hand it
   * the slice's gradients (`head_slices.ts`: the device's host buffers, or tensors on its backend).
   * `onGroup` sees each body group's parameters as their gradients become final (`backward-body`).
   */
  async run(
    phase: HeadPhase,
    slices: SliceStore,
    onGroup?: (group: string, members: readonly ParameterEntry[]) => void | Promise<void>,
  ): Promise<HeadPhaseResult> {
    const start = performance.now();
    const span = (name: string, group?: string): ComputeSpan[] => [
      { name, ...(group ? { group } : {}), start, end: performance.now() },
    ];
    switch (phase.kind) {
      case "forward-body":
        await this.#forwardBody(phase);
        return { spans: span("forward") };
      case "forward-stage":
        await this.#forwardStage(phase.stage, slices);
        return { spans: span(`forward ${this.#setup.head.stages[phase.stage].linear}`) };
      case "backward-stage": {
        const metrics = await this.#backwardStage(phase.stage, phase.labels, slices);
        const stage = this.#setup.head.stages[phase.stage];
        return {
          spans: span(`backward ${stage.linear}`, phase.stage === 0 ? stage.group : undefined),
          ...metrics,
        };
      }
      case "backward-body":
        return { spans: await this.#backwardBody(phase.groups, onGroup) };
    }
  }

  /** Frees what an unfinished iteration holds (after a failure), accumulated gradients too. */
  reset(): void {
    this.#release();
    this.#sums.clear();
    for (const p of this.#bodyEntries) {
      p.tensor.grad?.dispose();
      p.tensor.grad = null;
    }
  }

  /** Frees one micro-batch's tensors, keeping the gradients accumulated so far. */
  #release(): void {
    this.#bodyOutput?.dispose();
    this.#bodyOutput = undefined;
    for (const stage of this.#stages) this.#disposeStage(stage);
    this.#stages = [];
  }

  async #forwardBody(phase: Extract<HeadPhase, { kind: "forward-body" }>): Promise<void> {
    const micro = { index: phase.microBatch ?? 0, count: phase.microBatches ?? 1 };
    // Later micro-batches add onto the gradients of the earlier ones.
    if (micro.index === 0) this.reset();
    else this.#release();
    this.#micro = micro;
    this.#rows = gatheredSamples(this.#setup.batch, this.#setup.head.devices, micro);
    const backend = this.#backend;
    this.#context = { seed: phase.seed, step: phase.iteration, sampleOffset: phase.sampleOffset };
    // `start`: this device's first row among the gathered ones (its shard's first sample when whole).
    this.#shard = { start: this.#setup.device * phase.shape[0], size: phase.shape[0] };
    this.#network.train();
    const images = fromStorage(backend, backend.upload(phase.images), phase.shape);
    try {
      const graph = this.#network.graph, bodyOutput = this.#setup.head.bodyOutput;
      this.#bodyOutput = tidy(() => {
        // A graph's body runs as a graph, up to the blob the head reads.
        if (graph && bodyOutput) return graph.run(images, [bodyOutput], this.#context)[0];
        // As Sequential runs them: Conv2d → ReLU → MaxPool2d as one op, and so on (`fusedRun`).
        const body = this.#network.layers().slice(0, this.#setup.head.bodyLayers).map(([, layer]) => layer);
        return forwardLayers(body, images, this.#context);
      });
    } finally {
      images.dispose();
    }
    const features = this.#setup.head.stages[0].inFeatures, size = this.#bodyOutput.size;
    if (size !== this.#shard.size * features) {
      throw new TandemError(
        `hybrid schedule: the body's output has ${size / this.#shard.size} features per sample, ` +
          `${this.#setup.head.stages[0].linear} expects ${features}`,
      );
    }
    const start = this.#shard.start * features;
    await this.#bodyOutput.readInto(this.#setup.inputs[0].subarray(start, start + size));
  }

  async #forwardStage(index: number, slices: SliceStore): Promise<void> {
    const stage = this.#setup.head.stages[index];
    const slice = this.#slices[index];
    const batch = this.#setup.batch;
    const backend = this.#backend;
    const input = fromStorage(backend, backend.upload(this.#setup.inputs[index]), [batch, stage.inFeatures]);
    input.requiresGrad = true;
    const tensors = slice.slots.map((slot) => slices.parameter(slot, backend));
    const output = tidy(() => {
      // A ReLU right after the layer runs in its product's epilogue, as Sequential runs it.
      const fused =
        fusedRun([this.#layers.get(stage.linear), this.#layers.get(stage.after[0])]) !== undefined;
      let h = ops.linear(input, tensors[0], tensors[1], fused ? { activation: "relu" } : {});
      for (const name of fused ? stage.after.slice(1) : stage.after) {
        const layer = this.#layers.get(name)!;
        let next: Tensor;
        if (layer.kind === "Dropout") {
          const dropout = layer as Dropout;
          next = ops.dropout(h, {
            p: dropout.p,
            training: true,
            seed: this.#context.seed ?? 0,
            stream: streamOf(dropout.path),
            step: this.#context.step ?? 0,
            // Rows are global samples 0 … B−1 (accumulating: `#rows`); this slice holds columns
            // start … end−1.
            offset: 0,
            columns: { start: slice.start, total: stage.units, ...(this.#rows ? { rows: this.#rows } : {}) },
          });
        } else next = layer.forward(h, this.#context);
        h.dispose();
        h = next;
      }
      return h;
    });
    this.#stages[index] = { input, output, parameters: tensors };
    await output.readInto(this.#setup.inputs[index + 1], { start: slice.start, total: stage.units });
  }

  async #backwardStage(
    index: number,
    labels: Int32Array | undefined,
    slices: SliceStore,
  ): Promise<{ loss?: number; correct?: number }> {
    const stages = this.#setup.head.stages;
    const stage = stages[index], slice = this.#slices[index], batch = this.#setup.batch;
    const held = this.#stages[index];
    const backend = held.output.backend;
    const width = slice.end - slice.start;
    let seed: Float32Array, metrics: { loss?: number; correct?: number } = {};
    if (index === stages.length - 1) {
      if (!labels) throw new TandemError("hybrid schedule: the last stage's backward needs the labels");
      ({ seed, metrics } = await this.#lossSeed(labels, stage.units, slice));
    } else {
      seed = sumSources(this.#setup.seeds[index], batch, width);
    }
    const gradOutput = fromStorage(backend, backend.upload(seed), [batch, width]);
    try {
      tidy(() => backwardPass(held.output, { gradOutput }).runToEnd());
    } finally {
      gradOutput.dispose();
    }
    // Rows carry their shard's 1/(B/N), so the sum over the whole batch is N shards' gradients:
    // averaged as the data-parallel devices' are, `· fround(1/N)`.
    const scale = Math.fround(1 / this.#setup.head.devices);
    for (const [i, slot] of slice.slots.entries()) {
      const grad = held.parameters[i].grad;
      held.parameters[i].grad = null;
      // On the device's backend, as a kernel: the same float32 product as the exchange's average.
      const scaled = grad && scale !== 1 ? tidy(() => ops.mul(grad, scale)) : grad;
      if (scaled !== grad) grad?.dispose();
      // Accumulating: summed over the micro-batches, whole only after the last one.
      const total = this.#sums.add(`${index}.${i}`, scaled, this.#micro);
      if (total === undefined) continue;
      try {
        await slices.gradient(slot, total);
      } finally {
        total?.dispose();
      }
    }
    const inputGrad = held.input.grad;
    if (inputGrad) await inputGrad.readInto(this.#setup.partials[index]);
    else this.#setup.partials[index].fill(0);
    this.#disposeStage(held);
    return metrics;
  }

  /**
   * The loss gradient of this device's columns of the gathered logits, computed shard by shard as
   * the data-parallel devices compute it — each shard's mean loss, so rows carry 1/(B/N) — and this
   * device's shard's loss and hits, as a data-parallel device reports them.
   */
  async #lossSeed(
    labels: Int32Array,
    classes: number,
    slice: { start: number; end: number },
  ): Promise<{ seed: Float32Array; metrics: { loss: number; correct: number } }> {
    const batch = this.#setup.batch, devices = this.#setup.head.devices, shard = batch / devices;
    const backend = this.#backend;
    const all = this.#setup.inputs[this.#setup.head.stages.length];
    const width = slice.end - slice.start;
    const seed = new Float32Array(batch * width);
    let loss = NaN;
    for (let e = 0; e < devices; e++) {
      const rows = all.subarray(e * shard * classes, (e + 1) * shard * classes);
      const shardLabels = labels.subarray(e * shard, (e + 1) * shard);
      const logits = fromStorage(backend, backend.upload(rows), [shard, classes]);
      logits.requiresGrad = true;
      const labelTensor = new Tensor(backend, backend.upload(shardLabels), [shard], {
        hostInts: shardLabels,
      });
      try {
        const value = tidy(() => ops.softmaxCrossEntropy(logits, labelTensor));
        if (e === this.#setup.device) loss = await value.item();
        tidy(() => backwardPass(value).runToEnd());
        value.dispose();
        const grad = (await logits.grad!.data()) as Float32Array;
        for (let r = 0; r < shard; r++) {
          seed.set(
            grad.subarray(r * classes + slice.start, r * classes + slice.end),
            (e * shard + r) * width,
          );
        }
      } finally {
        logits.grad?.dispose();
        logits.dispose();
        labelTensor.dispose();
      }
    }
    const { start, size } = this.#shard;
    const correct = countCorrect(
      all.subarray(start * classes, (start + size) * classes),
      labels.subarray(start, start + size),
      classes,
    );
    return { seed, metrics: { loss, correct } };
  }

  async #backwardBody(
    groups: readonly string[],
    onGroup?: (group: string, members: readonly ParameterEntry[]) => void | Promise<void>,
  ): Promise<ComputeSpan[]> {
    const output = this.#bodyOutput;
    if (!output) throw new TandemError("hybrid schedule: backward-body before forward-body");
    const features = this.#setup.head.stages[0].inFeatures;
    const seed = sumSources(this.#setup.seeds[this.#setup.head.stages.length], this.#shard.size, features);
    const gradOutput = fromStorage(output.backend, output.backend.upload(seed), output.shape);
    const spans: ComputeSpan[] = [];
    let start = performance.now();
    const { index, count } = this.#micro, last = index === count - 1;
    try {
      const pass = backwardPass(output, { gradOutput });
      // Earlier micro-batches leave their gradients on `.grad` (no groups: nothing is reported).
      for (const group of last ? groups : []) {
        const members = this.#bodyEntries.filter((p) => p.group === group);
        tidy(() => pass.runUntil(members.map((m) => m.tensor)));
        if (count > 1) averageGradients(members, Math.fround(1 / count));
        await onGroup?.(group, members);
        const end = performance.now();
        spans.push({ name: `backward ${group}`, group, start, end });
        start = end;
      }
      tidy(() => pass.runToEnd());
    } finally {
      gradOutput.dispose();
      if (last) this.reset();
      else this.#release();
    }
    return spans;
  }

  #disposeStage(stage: { input: Tensor; output: Tensor; parameters: Tensor[] } | undefined): void {
    if (!stage) return;
    stage.input.grad?.dispose();
    stage.input.dispose();
    stage.output.dispose();
    for (const p of stage.parameters) {
      p.grad?.dispose();
      p.dispose();
    }
  }
}

/**
 * `Σ_e sources[e]` in device order, every partial sum rounded to float32, for `rows` rows of
 * `width` columns: a device's share of a reduce-scatter, the same bits whatever order the parts came
 * in (the order `averageInDeviceOrder` uses, without the scaling).
 *
 * @example
 * ```ts
 * import { sumSources } from "./sharded_head.ts";
 * const a = { values: new Float32Array([1, 2, 3, 4]), stride: 2, offset: 1 };
 * console.log(sumSources([a, a], 2, 1)); // Float32Array [4, 8]
 * ```
 */
export function sumSources(sources: readonly SumSource[], rows: number, width: number): Float32Array {
  const out = new Float32Array(rows * width);
  const first = sources[0];
  for (let r = 0; r < rows; r++) {
    out.set(
      first.values.subarray(r * first.stride + first.offset, r * first.stride + first.offset + width),
      r * width,
    );
  }
  for (const source of sources.slice(1)) {
    for (let r = 0; r < rows; r++) {
      const base = r * source.stride + source.offset, o = r * width;
      for (let c = 0; c < width; c++) out[o + c] += source.values[base + c];
    }
  }
  return out;
}
