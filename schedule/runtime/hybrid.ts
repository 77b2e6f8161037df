/**
 * The runtime side of hybrid schedules (a plan with `sharded` groups): the conv body stays
 * data-parallel — its groups go through the exchange's reduce, update and broadcast like any plan's —
 * while each device holds a slice of the fully-connected head's units and their optimizer state
 * (see `devices/sharded_head.ts`). This drives the devices through an iteration's phases in lockstep
 * and moves activations between them: all-gathers forward, reduce-scatters backward.
 *
 * In one process the devices share every activation buffer, so a gather is just the end of a phase
 * on every device (an emulated link adds the time the bytes would take). The head's gradients never
 * travel; each device's slice is updated by that device's own optimizer, on the communication lane,
 * while the devices run the body's backward. Where the devices keep their replicas resident (WebGPU,
 * `ResidentExchange`), each slice, its gradients and its optimizer state live on the device's own
 * backend too (`devices/head_slices.ts`), so the slice updates run there as the backend's kernels;
 * only activations cross the host (one process has no device-to-device path).
 *
 * Checkpoints hold whole tensors in the data-parallel layout: {@link HybridHead.gather} copies every
 * device's slices of the head (parameters and optimizer state) into the master's, and
 * {@link HybridHead.scatter} hands a loaded master's back out, so a hybrid checkpoint resumes under
 * data-parallel schedules and the other way round. Both read the slices asynchronously (`data()`),
 * so they work wherever the slices live.
 *
 * Gradient accumulation (`accumulate: K`) runs those phases once per micro-batch, over the
 * micro-batches of every device, and resolves the groups only after the last one: see
 * `devices/head_micro_batches.ts`.
 *
 * Numerics: the head computes each layer for the whole global batch in one product, where
 * data-parallel devices compute it per shard and average; the sums are grouped differently, so the
 * two agree to rounding (about 1e-7 relative per step), not bit for bit. Between hybrid runs —
 * any schedule, either reduction — the bits are the same.
 *
 * @module
 */

import { type Optimizer, type ParameterEntry, TandemError, type Tensor } from "../../engine/mod.ts";
import { fromStorage } from "../../engine/creation.ts";
import type { ComputeResult, Device } from "../devices/device.ts";
import type { GroupRange, ParameterLayout, ParameterSlot } from "../devices/parameter_layout.ts";
import type { ComputeSpan } from "../devices/protocol.ts";
import type { HeadPhase, HeadPhaseResult, HeadSetup, SumSource } from "../devices/sharded_head.ts";
import { type HeadLayout, sliceLayout, sliceSlots, unitRange } from "../devices/head_layout.ts";
import type { Deferred } from "./deferred.ts";
import { hostParameterEntries } from "./exchange/host_parameters.ts";
import { divergentFrom } from "./exchange/exchange.ts";
import { type Link, timedMove } from "./exchange/link.ts";

/**
 * Records a communication span of `device` (milliseconds of `performance.now()`) and the bytes the
 * device received in it.
 */
export type RecordSpan = (device: number, name: string, start: number, end: number, bytes?: number) => void;

/**
 * How activations — and a checkpoint's slices — move between the devices of a hybrid run: shared
 * buffers in one process ({@link SharedActivations}), MPI collectives across ranks.
 *
 * @example
 * ```ts
 * import { SharedActivations } from "./hybrid.ts";
 * // const route = new SharedActivations(devices, head); // one process, no emulated link
 * ```
 */
export interface ActivationRoute {
  /** Devices in the run (ranks under MPI). */
  readonly size: number;
  /** Each local device's buffers for a global batch of `batch`, in local device order. */
  setup(batch: number): HeadSetup[];
  /** After `forward-body`: every device's `inputs[0]` holds the whole batch's rows. */
  gatherRows(record: RecordSpan): Promise<void>;
  /** After `forward-stage s`: every device's `inputs[s + 1]` holds every device's columns. */
  gatherColumns(stage: number, record: RecordSpan): Promise<void>;
  /** After `backward-stage s`: every device's sources for the stage below (or the body) are in place. */
  scatter(stage: number, record: RecordSpan): Promise<void>;
  /** Every device's `own` (one per local device), in device order, on the master; else `undefined`. */
  collect(own: readonly Float32Array[]): Promise<Float32Array[] | undefined>;
  /** The master's `values` on every device (`undefined` elsewhere). */
  share(values: Float32Array | undefined): Promise<Float32Array>;
  /**
   * Devices whose body — every group outside the sharded ones — differs in any bit from device
   * 0's (the same answer everywhere); the head's ranges differ by design, each device keeping only
   * its own slice current.
   */
  divergentBodies(local: readonly Device[], layout: ParameterLayout): Promise<number[]>;
}

/** What one hybrid iteration needs besides the devices. */
export interface HybridIteration {
  /** Training iteration. */
  iteration: number;
  /** Run seed (dropout). */
  seed: number;
  /** The global batch's pixels (every rank has it). */
  images: Float32Array;
  /** Int32 labels of the whole global batch. */
  labels: Int32Array;
  /** `[batch, …sample]`. */
  shape: readonly number[];
  /** Per local device, per group: resolved when that group's gradients are final. */
  ready: readonly Map<string, Deferred<void>>[];
  /** Records a communication span. */
  record: RecordSpan;
  /** The body's groups in the order the plan backwards them. */
  bodyGroups: readonly string[];
  /**
   * Gradient accumulation: each device's shard runs as this many micro-batches, each through every
   * phase; the groups are final only after the last (default 1; see `head_micro_batches.ts`).
   */
  microBatches?: number;
}

/** The head's slices, optimizers and activation traffic for the devices of this process. */
export class HybridHead {
  /** The split. */
  readonly head: HeadLayout;
  /** Each local device's optimizer over its slice of the head, in local device order. */
  readonly optimizers: readonly Optimizer[];
  readonly #devices: readonly Device[];
  readonly #layout: ParameterLayout;
  readonly #route: ActivationRoute;
  /** Whether the slices live on the devices (see the module notes). */
  readonly #resident: boolean;
  #batch = 0;

  /**
   * Slices the head of `layout` for the `devices` of this process (all of them in one process, this
   * rank's under MPI), moving activations along `route`, and gives each device an optimizer over its
   * slice from `optimizer`: over the device's host buffers, or with `resident` (the devices'
   * resident replicas are active) over the slice each device keeps on its backend.
   */
  constructor(
    head: HeadLayout,
    devices: readonly Device[],
    layout: ParameterLayout,
    optimizer: (parameters: ParameterEntry[]) => Optimizer,
    route: ActivationRoute,
    { resident = false }: { resident?: boolean } = {},
  ) {
    const unable = devices.find((d) => !d.sharded);
    if (unable) {
      throw new TandemError(
        `hybrid schedule: device ${unable.index} (${unable.kind}) cannot hold a model-parallel slice of the head`,
      );
    }
    if (head.devices !== route.size) {
      throw new TandemError(
        `hybrid schedule: the head is split ${head.devices} ways for ${route.size} devices`,
      );
    }
    const hostOnly = resident ? devices.find((d) => !d.sharded!.residentSlice) : undefined;
    if (hostOnly) {
      throw new TandemError(
        `hybrid schedule: device ${hostOnly.index} (${hostOnly.kind}) keeps its replica resident but cannot keep its slice of the head there`,
      );
    }
    const narrow = head.stages.find((s) => s.units < head.devices);
    if (narrow) {
      throw new TandemError(
        `hybrid schedule: layer ${narrow.linear} has ${narrow.units} output units, fewer than the ${head.devices} devices to split them over`,
      );
    }
    this.head = head;
    this.#devices = devices;
    this.#layout = layout;
    this.#route = route;
    this.#resident = resident;
    this.optimizers = devices.map((device) =>
      optimizer(
        resident ? [...device.sharded!.residentSlice!(layout, head)] : hostParameterEntries(
          sliceLayout(sliceSlots(layout, head, device.index)),
          device.parameters,
          device.gradients,
        ),
      )
    );
  }

  /**
   * After the devices closed: frees the slice optimizers' state (resident slices' went with their
   * devices' backends).
   */
  free(): void {
    if (!this.#resident) { for (const optimizer of this.optimizers) optimizer.dispose(); }
  }

  /**
   * Runs one iteration's phases on every local device; returns each one's result (its shard's loss
   * and hits, as a data-parallel device reports them, and its spans). Each sharded group's
   * readiness is resolved once the head's backward is done everywhere, each body group's as its
   * device reports it.
   */
  compute(step: HybridIteration): Promise<ComputeResult>[] {
    const run = this.#run(step);
    return this.#devices.map((_, i) =>
      run.then((results) => ({
        loss: results.loss[i],
        correct: results.correct[i],
        count: step.shape[0] / this.#route.size,
        spans: results.spans[i],
      }))
    );
  }

  async #run(step: HybridIteration): Promise<{ loss: number[]; correct: number[]; spans: ComputeSpan[][] }> {
    const devices = this.#devices, route = this.#route;
    const batch = step.shape[0];
    const count = step.microBatches ?? 1;
    // The buffers hold one micro-batch of every device: the whole batch without accumulation.
    const gathered = batch / count;
    if (gathered !== this.#batch) {
      const setups = route.setup(gathered);
      await Promise.all(devices.map((device, i) => device.sharded!.setupHead(this.#layout, setups[i])));
      this.#batch = gathered;
    }
    const spans: ComputeSpan[][] = devices.map(() => []);
    const loss = devices.map(() => 0), correct = devices.map(() => 0);
    for (let k = 0; k < count; k++) {
      const results = await this.#microBatch(step, { index: k, count }, spans);
      results.forEach((r, i) => {
        loss[i] += r.loss ?? NaN;
        correct[i] += r.correct ?? 0;
      });
    }
    // As `replicaStep` reports an accumulated shard: the micro-batches' mean loss, every hit.
    return { loss: loss.map((l) => l / count), correct, spans };
  }

  /** One micro-batch's phases on every local device; the last stage's results (loss and hits). */
  async #microBatch(
    step: HybridIteration,
    micro: { index: number; count: number },
    spans: ComputeSpan[][],
  ): Promise<HeadPhaseResult[]> {
    const devices = this.#devices, route = this.#route, stages = this.head.stages;
    const [batch, ...sample] = step.shape;
    const shard = batch / route.size, sampleSize = sample.reduce((a, b) => a * b, 1);
    const m = shard / micro.count, first = micro.index * m, last = micro.index === micro.count - 1;
    const all = async (phase: (d: number) => HeadPhase, onGradients?: (i: number, group: string) => void) => {
      const results = await Promise.all(
        devices.map((device, i) =>
          device.sharded!.runHead(
            step.iteration,
            phase(device.index),
            onGradients && ((group) => onGradients(i, group)),
          )
        ),
      );
      results.forEach((r, i) => spans[i].push(...r.spans));
      return results;
    };
    await all((d) => ({
      kind: "forward-body",
      iteration: step.iteration,
      seed: step.seed,
      images: step.images.subarray((d * shard + first) * sampleSize, (d * shard + first + m) * sampleSize),
      shape: [m, ...sample],
      sampleOffset: d * shard + first,
      ...(micro.count > 1 ? { microBatch: micro.index, microBatches: micro.count } : {}),
    }));
    // The gathered rows' labels: every device's micro-batch, in device order.
    const labels = micro.count === 1 ? step.labels : new Int32Array(route.size * m);
    if (micro.count > 1) {
      for (let e = 0; e < route.size; e++) {
        labels.set(step.labels.subarray(e * shard + first, e * shard + first + m), e * m);
      }
    }
    await route.gatherRows(step.record);
    for (let s = 0; s < stages.length; s++) {
      await all(() => ({ kind: "forward-stage", stage: s }));
      await route.gatherColumns(s, step.record);
    }
    let results: HeadPhaseResult[] = [];
    for (let s = stages.length - 1; s >= 0; s--) {
      const phase = await all(() => ({
        kind: "backward-stage",
        stage: s,
        ...(s === stages.length - 1 ? { labels } : {}),
      }));
      if (s === stages.length - 1) results = phase;
      await route.scatter(s, step.record);
    }
    // After the last micro-batch the head's gradients are final on every device: its updates may
    // start (no earlier: the next micro-batch's stages still read the slices' parameters).
    if (last) {
      for (const ready of step.ready) for (const group of this.head.sharded) ready.get(group)!.resolve();
    }
    await all(
      () => ({ kind: "backward-body", groups: last ? step.bodyGroups : [] }),
      (i, group) => step.ready[i].get(group)!.resolve(),
    );
    return results;
  }

  /** Updates `group`'s slice on every local device with that device's optimizer. */
  update(group: string, options: { undoable: boolean }): void {
    for (const optimizer of this.optimizers) optimizer.step(group, options);
  }

  /** Ends the iteration on every slice optimizer. */
  finishIteration(): void {
    for (const optimizer of this.optimizers) optimizer.finishIteration();
  }

  /** See {@link ActivationRoute.divergentBodies}. Collective under MPI. */
  divergentBodies(): Promise<number[]> {
    return this.#route.divergentBodies(this.#devices, this.#layout);
  }

  /** Undoes this iteration's slice updates (a failed step). */
  undoIteration(): void {
    for (const optimizer of this.optimizers) optimizer.undoIteration();
  }

  /**
   * Collective: copies every device's slices of the head into `master` (device 0's flat parameters)
   * and, when given, their optimizer state into `masterOptimizer` (over the whole layout), so both
   * hold whole tensors; resident, the master's own tensors of the head take them too (what a
   * checkpoint reads). Only the master's arguments matter.
   */
  async gather(master: Float32Array | undefined, masterOptimizer: Optimizer | undefined): Promise<void> {
    // Each device's slice laid end to end: parameters, then each state slot, slot by slot (the
    // optimizer's entries are in `sliceSlots` order).
    const own = await Promise.all(this.optimizers.map(async (optimizer) => {
      const state = optimizer.state();
      const parts: Float32Array[] = [];
      for (const entry of optimizer.parameters) {
        parts.push((await entry.tensor.data()) as Float32Array);
        for (const t of Object.values(state.perParameter.get(entry.name)!)) {
          parts.push((await t.data()) as Float32Array);
        }
      }
      return concatenate(parts);
    }));
    const all = await this.#route.collect(own);
    if (!all || !master) return;
    const wholeState = new Map<string, Record<string, Float32Array>>();
    const state = masterOptimizer?.state();
    const slotNames = this.#slotNames();
    for (const [d, packed] of all.entries()) {
      let at = 0;
      for (const slot of sliceSlots(this.#layout, this.head, d)) {
        const whole = this.#slotOf(slot.name);
        master.set(packed.subarray(at, at + slot.size), slot.offset);
        at += slot.size;
        for (const name of slotNames) {
          const target = wholeState.get(slot.name) ?? {};
          target[name] ??= new Float32Array(whole.size);
          target[name].set(packed.subarray(at, at + slot.size), slot.offset - whole.offset);
          wholeState.set(slot.name, target);
          at += slot.size;
        }
      }
    }
    if (this.#resident) {
      for (const group of this.head.sharded) {
        const range = this.#layout.groups.find((g) => g.name === group)!;
        this.#devices[0].resident!.receiveParameters(
          group,
          master.subarray(range.offset, range.offset + range.size),
        );
      }
    }
    if (!masterOptimizer || !state) return;
    const perParameter = new Map(state.perParameter);
    const made: Tensor[] = [];
    for (const [name, slots] of wholeState) {
      const like = masterOptimizer.parameters.find((p) => p.name === name)!.tensor;
      const tensors = Object.fromEntries(
        Object.entries(slots).map(([slot, values]) => [slot, upload(values, like)]),
      );
      made.push(...Object.values(tensors));
      perParameter.set(name, tensors);
    }
    const updates = { ...state.updates, ...this.optimizers[0]?.state().updates };
    try {
      masterOptimizer.loadState({ ...state, perParameter, updates });
    } finally {
      for (const t of made) t.dispose();
    }
  }

  /**
   * Collective: hands the master's head out to every device's slice optimizer — its slice's
   * parameters and optimizer state — after a checkpoint was loaded into `masterOptimizer` (which
   * only the master passes) and its parameters broadcast. The host path's slices already hold the
   * broadcast values; resident slices live apart from the whole layers and take them here.
   */
  async scatter(masterOptimizer: Optimizer | undefined): Promise<void> {
    const sharded = this.#layout.slots.filter((s) => this.head.sharded.includes(s.group));
    const slotNames = this.#slotNames();
    let packed: Float32Array | undefined;
    let counts: Float32Array | undefined;
    if (masterOptimizer) {
      // Per slot: the parameter, then each state slot.
      const state = masterOptimizer.state();
      const parts: Float32Array[] = [];
      for (const slot of sharded) {
        const parameter = masterOptimizer.parameters.find((p) => p.name === slot.name)!.tensor;
        parts.push((await parameter.data()) as Float32Array);
        for (const name of slotNames) {
          parts.push((await state.perParameter.get(slot.name)![name].data()) as Float32Array);
        }
      }
      packed = concatenate(parts);
      counts = Float32Array.from([state.iteration, ...sharded.map((slot) => state.updates[slot.name])]);
    }
    const whole = await this.#route.share(packed);
    const [iteration, ...updateCounts] = await this.#route.share(counts);
    for (const [i, optimizer] of this.optimizers.entries()) {
      const d = this.#devices[i].index;
      const own = optimizer.state();
      const perParameter = new Map<string, Record<string, Tensor>>();
      const updates: Record<string, number> = {};
      let at = 0;
      for (const [k, slot] of sharded.entries()) {
        const row = slot.size / slot.shape[0];
        const { start, end } = unitRange(slot.shape[0], this.head.devices, d);
        const rows = () => whole.slice(at + start * row, at + end * row);
        const parameter = optimizer.parameters.find((p) => p.name === slot.name)!.tensor;
        const values = upload(rows(), parameter);
        try {
          parameter.assign(values);
        } finally {
          values.dispose();
        }
        at += slot.size;
        const slots: Record<string, Tensor> = {};
        for (const name of slotNames) {
          slots[name] = upload(rows(), own.perParameter.get(slot.name)![name]);
          at += slot.size;
        }
        perParameter.set(slot.name, slots);
        updates[slot.name] = updateCounts[k];
      }
      try {
        optimizer.loadState({ ...own, iteration, perParameter, updates });
      } finally {
        for (const slots of perParameter.values()) for (const t of Object.values(slots)) t.dispose();
      }
    }
  }

  /** The optimizer's state slots per parameter (`history` for SGD, `m` and `v` for Adam). */
  #slotNames(): string[] {
    return Object.keys(this.optimizers[0].state().perParameter.values().next().value ?? {});
  }

  #slotOf(name: string): ParameterSlot {
    return this.#layout.slots.find((s) => s.name === name)!;
  }
}

/** `values` as a new tensor shaped and placed (backend) like `like`. */
function upload(values: Float32Array, like: Tensor): Tensor {
  return fromStorage(like.backend, like.backend.upload(values), like.shape);
}

/** `parts` end to end in one array. */
function concatenate(parts: readonly Float32Array[]): Float32Array {
  const out = new Float32Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const part of parts) {
    out.set(part, at);
    at += part.length;
  }
  return out;
}

/**
 * The devices of one process share every activation buffer, so a gather is just the end of a phase
 * on every device, and a reduce-scatter reads every device's partial gradients where they lie. An
 * emulated link adds the time the bytes each device receives would take.
 *
 * @example
 * ```ts
 * import { SharedActivations } from "./hybrid.ts";
 * // new HybridHead(head, devices, layout, optimizer, new SharedActivations(devices.length, head, link));
 * ```
 */
export class SharedActivations implements ActivationRoute {
  readonly size: number;
  readonly #head: HeadLayout;
  readonly #link: Link | undefined;
  #batch = 0;

  /** The route for `size` devices in this process, with an optional emulated link. */
  constructor(size: number, head: HeadLayout, link?: Link) {
    this.size = size;
    this.#head = head;
    this.#link = link;
  }

  setup(batch: number): HeadSetup[] {
    const stages = this.#head.stages, n = this.size;
    const shared = (length: number) => new Float32Array(new SharedArrayBuffer(4 * length));
    const inputs = [...stages.map((s) => shared(batch * s.inFeatures)), shared(batch * stages.at(-1)!.units)];
    const partials = Array.from({ length: n }, () => stages.map((s) => shared(batch * s.inFeatures)));
    const shard = batch / n, features = stages[0].inFeatures;
    this.#batch = batch;
    return partials.map((own, d) => {
      const seeds: SumSource[][] = stages.map((_, s) =>
        s === stages.length - 1 ? [] : partials.map((p) => ({
          values: p[s + 1],
          stride: stages[s + 1].inFeatures,
          offset: unitRange(stages[s].units, n, d).start,
        }))
      );
      seeds.push(partials.map((p) => ({ values: p[0], stride: features, offset: d * shard * features })));
      return { head: this.#head, device: d, batch, inputs, partials: own, seeds };
    });
  }

  gatherRows(record: RecordSpan): Promise<void> {
    const stage = this.#head.stages[0];
    return this.#move(
      record,
      `gather ${stage.linear} input`,
      (this.size - 1) * this.#batch / this.size * stage.inFeatures,
    );
  }

  gatherColumns(stage: number, record: RecordSpan): Promise<void> {
    const { linear, units } = this.#head.stages[stage];
    return this.#move(
      record,
      `gather ${linear} output`,
      this.#batch * (units - unitRange(units, this.size, 0).end),
    );
  }

  scatter(stage: number, record: RecordSpan): Promise<void> {
    const { linear, inFeatures } = this.#head.stages[stage];
    return this.#move(
      record,
      `scatter ${linear} input gradients`,
      (this.size - 1) * this.#batch * inFeatures / this.size,
    );
  }

  collect(own: readonly Float32Array[]): Promise<Float32Array[]> {
    return Promise.resolve([...own]);
  }

  share(values: Float32Array | undefined): Promise<Float32Array> {
    if (!values) throw new TandemError("hybrid schedule: nothing to share: the master passes the values");
    return Promise.resolve(values);
  }

  divergentBodies(local: readonly Device[], layout: ParameterLayout): Promise<number[]> {
    return Promise.resolve(divergentFrom(local, bodyRanges(layout, this.#head)));
  }

  /** An emulated link's time for the bytes each device receives, recorded on every device. */
  async #move(record: RecordSpan, name: string, elements: number): Promise<void> {
    if (!this.#link) return;
    const t = await timedMove(4 * elements, this.#link, () => {});
    for (let d = 0; d < this.size; d++) record(d, name, t.start, t.end, t.bytes);
  }
}

/**
 * The ranges of `layout` outside `head.sharded`: the body, which every device holds whole and which
 * must stay bit-identical across devices.
 *
 * @example
 * ```ts
 * import { bodyRanges } from "./hybrid.ts";
 * // bodyRanges(layout, head); // [{ name: "conv", offset: 4235, size: 1600 }]
 * ```
 */
export function bodyRanges(layout: ParameterLayout, head: HeadLayout): GroupRange[] {
  return layout.groups.filter((g) => !head.sharded.includes(g.name));
}
