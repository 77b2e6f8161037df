/**
 * The thread behind a CPU device (a `node:worker_threads` Worker, so the device sees it exit or
 * crash): one full model replica. It runs the compute lane — forward, then backward group by group
 * ({@link replicaStep}) — and after each group copies that group's gradients into the shared
 * gradient buffer and tells the runtime, so communication can start while the next group's backward
 * runs.
 *
 * It loads the engine and the CPU backend only: a replica needs nothing else, and every device
 * thread pays for what it imports.
 *
 * @module
 */

import { parentPort, workerData } from "node:worker_threads";
import { CpuBackend } from "../../backends/cpu/backend.ts";
import {
  getBackend,
  type Network,
  type ParameterEntry,
  registerBackend,
  replicaStep,
  type Tensor,
  tensor,
} from "../../engine/mod.ts";
import { fromStorage } from "../../engine/creation.ts";
import { buildModel } from "./model_spec.ts";
import { type BufferLayout, bufferLayoutOf, copyBuffers } from "./buffer_layout.ts";
import type {
  ComputeSpan,
  CpuWorkerData,
  HeadPhaseMessage,
  HeadSetupMessage,
  InitMessage,
  StepMessage,
  WorkerMessage,
  WorkerReply,
} from "./protocol.ts";
import { packViews, unpackViews } from "./protocol.ts";
import { HeadShard } from "./sharded_head.ts";
import { signalGroup } from "./group_signals.ts";
import { hostSlices, type SliceStore } from "./head_slices.ts";
import { lowerThreadPriority, threadNice } from "./thread_priority.ts";

// First, so the kernel threads the backend starts later inherit it.
const { nice, memory } = workerData as CpuWorkerData;
if (nice > 0) lowerThreadPriority(nice);
const cpu = new CpuBackend({ memory });
registerBackend(cpu);

if (!parentPort) throw new Error("cpu_worker.ts runs as a node:worker_threads Worker of a CpuDevice");
const port = parentPort;

/** Where a parameter lives in the shared buffers, and a zero-copy view of its gradient slice. */
interface SharedSlot {
  offset: number;
  size: number;
  /** View of the parameter's slice of the shared parameters. */
  shared: Tensor;
  /** View of the parameter's slice of the shared gradients. */
  gradient: Tensor;
}

let device = -1;
let model: Network;
let gradients: Float32Array;
let signals: Int32Array;
let groupSlots: Map<string, number>;
/** The replica's parameters in layout order. */
let entries: ParameterEntry[] = [];
let slots = new Map<ParameterEntry, SharedSlot>();
let sharedParameters: Float32Array;
/** Whether the replica's parameter tensors lie over the shared parameters (see `init`). */
let rebound = false;
/** Bytes `loadParameters` copied in the current iteration (reported with it). */
let copiedBytes = 0;
/** The model-parallel head shard of a hybrid schedule, once set up. */
let head: HeadShard | undefined;
/** The head slice's home: the shared flat buffers the runtime's slice optimizer updates. */
let slices: SliceStore;
/** The replica's buffers (BatchNorm statistics) and their shared home (see `WorkerReply` ready). */
let bufferLayout: BufferLayout = { slots: [], total: 0 };
let sharedBuffers: Float32Array | undefined;
/** Where each step's images are (see `InputMessage`). */
let input: Float32Array = new Float32Array(0);

const now = () => performance.timeOrigin + performance.now();

function reply(message: WorkerReply): void {
  port.postMessage(packViews(message));
}

async function init(message: InitMessage): Promise<void> {
  device = message.device;
  // Its parameters are the shared buffer's, which the runtime fills with device 0's (or are copied
  // from it before every step): drawing the replica's own would only be thrown away.
  model = await buildModel(message.model, { fillParameters: false });
  // In the runtime's kernel memory where it lent us some: the same arrays, as operands here.
  const lentParameters = memory && cpu.viewLent(memory, 0, message.parameters.length);
  const lentGradients = memory && cpu.viewLent(memory, 1, message.gradients.length);
  const lent = lentParameters !== undefined && lentGradients !== undefined;
  const parameters = lent ? lentParameters : message.parameters;
  sharedParameters = parameters;
  gradients = lent ? lentGradients : message.gradients;
  signals = new Int32Array(message.signals);
  groupSlots = new Map(message.groups.map((g, i) => [g, i]));
  const byName = new Map(model.namedParameters().map((p) => [p.name, p]));
  if (byName.size !== message.slots.length) {
    throw new Error(`replica has ${byName.size} parameters, the runtime's layout ${message.slots.length}`);
  }
  const backend = getBackend();
  entries = [];
  slots = new Map();
  for (const slot of message.slots) {
    const entry = byName.get(slot.name);
    if (!entry || entry.tensor.size !== slot.size || entry.group !== slot.group) {
      throw new Error(`replica parameter "${slot.name}" does not match the runtime's layout`);
    }
    const view = (buffer: Float32Array) =>
      fromStorage(
        backend,
        backend.wrap!(buffer.subarray(slot.offset, slot.offset + slot.size)),
        entry.tensor.shape,
      );
    entries.push(entry);
    slots.set(entry, {
      offset: slot.offset,
      size: slot.size,
      shared: view(parameters),
      gradient: view(gradients),
    });
  }
  // The replica's parameters become the shared ones: nothing to copy before each step.
  rebound = lent;
  if (rebound) {
    for (const [entry, slot] of slots) entry.tensor.rebind(slot.shared.storage);
  }
  bufferLayout = bufferLayoutOf(model.namedBuffers());
  if (bufferLayout.total > 0) {
    sharedBuffers = new Float32Array(new SharedArrayBuffer(4 * bufferLayout.total));
    copyBuffers(bufferLayout, model.namedBuffers(), sharedBuffers, "flat");
    reply({ type: "ready", device, buffers: sharedBuffers, nice: threadNice() });
  } else reply({ type: "ready", device, nice: threadNice() });
}

/**
 * Loads the shared parameters (device 0's, after broadcast) into the replica's tensors: all of them,
 * or those of `only` (a hybrid body; the head reads its slices itself). Nothing where the tensors
 * lie over the shared parameters already (`rebound`).
 */
function loadParameters(only: readonly ParameterEntry[] = entries): void {
  if (rebound) return;
  for (const entry of only) {
    entry.tensor.assign(slots.get(entry)!.shared);
    copiedBytes += 4 * entry.tensor.size;
  }
}

/** Copies `members`' gradients into the shared buffer and frees them (zeros where none arrived). */
function publish(members: readonly ParameterEntry[]): void {
  for (const entry of members) {
    const { offset, size, gradient } = slots.get(entry)!;
    const grad = entry.tensor.grad;
    if (grad) {
      gradient.assign(grad);
      grad.dispose();
      entry.tensor.grad = null;
    } else {
      gradients.fill(0, offset, offset + size);
    }
  }
}

/** Tells the runtime that `group`'s gradients of `iteration` are final in the shared buffer. */
function signal(group: string, iteration: number): void {
  signalGroup(signals, groupSlots.get(group)!, iteration);
}

function setupHead(message: HeadSetupMessage): void {
  head?.reset();
  slices = hostSlices(sharedParameters, gradients);
  const sharded = new Set(message.setup.head.sharded);
  head = new HeadShard(model, message.layout, message.setup, entries.filter((e) => !sharded.has(e.group)));
  reply({ type: "done", device, iteration: -1, loss: 0, correct: 0, count: 0, spans: [], copiedBytes: 0 });
}

async function runHead(message: HeadPhaseMessage): Promise<void> {
  if (!head) throw new Error("a hybrid phase arrived before the head was set up");
  const phase = message.phase.kind === "forward-body"
    ? { ...message.phase, images: input.subarray(0, message.imageCount) }
    : message.phase;
  // Later micro-batches of a step run on the same parameters (and must keep the gradients).
  copiedBytes = 0;
  if (phase.kind === "forward-body" && !phase.microBatch) loadParameters(head.bodyEntries);
  // Spans travel on the shared clock (timeOrigin + now), as `step`'s do.
  const result = await head.run(phase, slices, (group, members) => {
    publish(members);
    signal(group, message.iteration);
  }).catch((error) => {
    head!.reset();
    throw error;
  });
  const shift = performance.timeOrigin;
  reply({
    type: "done",
    device,
    iteration: message.iteration,
    loss: result.loss ?? 0,
    correct: result.correct ?? 0,
    count: 0,
    spans: result.spans.map((s) => ({ ...s, start: s.start + shift, end: s.end + shift })),
    copiedBytes,
  });
}

async function step(message: StepMessage): Promise<void> {
  const spans: ComputeSpan[] = [];
  // Each span runs from the end of the previous one: the forward from the start of the step, a
  // group's backward from the end of the forward or of the group before.
  let start = now();
  copiedBytes = 0;
  loadParameters();
  // The statistics as the runtime left them (its own after the last step, or restored, or loaded).
  if (sharedBuffers) copyBuffers(bufferLayout, model.namedBuffers(), sharedBuffers, "tensors");
  const images = tensor(input.subarray(0, message.imageCount), { shape: message.shape });
  const labels = tensor(message.labels, { dtype: "int32" });
  try {
    const metrics = await replicaStep(model, entries, images, labels, message.labels, {
      context: { seed: message.seed, step: message.iteration, sampleOffset: message.sampleOffset },
      groups: message.backwardGroups,
      microBatches: message.microBatches,
      onForward: () => {
        const end = now();
        spans.push({ name: "forward", start, end });
        start = end;
      },
      onGroup: (group, members) => {
        publish(members);
        const end = now();
        spans.push({ name: `backward ${group}`, group, start, end });
        start = end;
        signal(group, message.iteration);
      },
    });
    if (sharedBuffers) copyBuffers(bufferLayout, model.namedBuffers(), sharedBuffers, "flat");
    reply({ type: "done", device, iteration: message.iteration, ...metrics, spans, copiedBytes });
  } finally {
    images.dispose();
    labels.dispose();
  }
}

port.on(
  "message",
  async (packed: unknown) => {
    const message = unpackViews<WorkerMessage>(packed);
    try {
      if (message.type === "init") await init(message);
      else if (message.type === "input") input = message.images;
      else if (message.type === "head-setup") setupHead(message);
      else if (message.type === "head") await runHead(message);
      else if (message.type === "threads") {
        // This device's share of the cores for the CPU backend's kernel threads.
        const backend = getBackend() as { threads?: number };
        if ("threads" in backend) backend.threads = message.threads;
      } else await step(message);
    } catch (error) {
      const e = error as Error;
      reply({
        type: "error",
        device,
        iteration: message.type === "step" || message.type === "head" ? message.iteration : undefined,
        message: e?.message ?? String(error),
        stack: e?.stack,
      });
    }
  },
);
