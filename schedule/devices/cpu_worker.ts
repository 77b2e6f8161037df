/**
 * The Worker behind a CPU device: one full model replica on its own thread. It runs the compute
 * lane — forward, then backward group by group — and after each group copies that group's
 * gradients into the shared gradient buffer and tells the runtime, so communication can start while
 * the next group's backward runs.
 *
 * @module
 */

/// <reference lib="deno.worker" />

import {
  backwardPass,
  countCorrect,
  fromStorage,
  getBackend,
  type Network,
  ops,
  type ParameterEntry,
  type Tensor,
  tensor,
  tidy,
} from "../../mod.ts";
import type { ThreadsMessage } from "./cpu_device.ts";
import { buildModel } from "./model_spec.ts";
import type { ComputeSpan, InitMessage, StepMessage, WorkerReply } from "./protocol.ts";

let device = -1;
let model: Network;
let parameters: Float32Array;
let gradients: Float32Array;
let signals: Int32Array;
let groupSlots: Map<string, number>;
/** Each parameter with zero-copy views of its slices of the shared parameter and gradient buffers. */
let entries: { entry: ParameterEntry; offset: number; size: number; shared: Tensor; gradient: Tensor }[] = [];

const now = () => performance.timeOrigin + performance.now();

function reply(message: WorkerReply): void {
  self.postMessage(message);
}

async function init(message: InitMessage): Promise<void> {
  device = message.device;
  model = await buildModel(message.model);
  parameters = new Float32Array(message.parameters);
  gradients = new Float32Array(message.gradients);
  signals = new Int32Array(message.signals);
  groupSlots = new Map(message.groups.map((g, i) => [g, i]));
  const byName = new Map(model.namedParameters().map((p) => [p.name, p]));
  if (byName.size !== message.slots.length) {
    throw new Error(`replica has ${byName.size} parameters, the runtime's layout ${message.slots.length}`);
  }
  entries = message.slots.map((slot) => {
    const entry = byName.get(slot.name);
    if (!entry || entry.tensor.size !== slot.size || entry.group !== slot.group) {
      throw new Error(`replica parameter "${slot.name}" does not match the runtime's layout`);
    }
    const backend = getBackend();
    const view = (buffer: Float32Array) =>
      fromStorage(
        backend,
        backend.wrap!(buffer.subarray(slot.offset, slot.offset + slot.size)),
        entry.tensor.shape,
      );
    return {
      entry,
      offset: slot.offset,
      size: slot.size,
      shared: view(parameters),
      gradient: view(gradients),
    };
  });
  reply({ type: "ready", device });
}

/** Loads the shared parameters (device 0's, after broadcast) into the replica's tensors. */
function loadParameters(): void {
  for (const { entry, shared } of entries) entry.tensor.assign(shared);
}

function step(message: StepMessage): void {
  const spans: ComputeSpan[] = [];
  let start = now();
  loadParameters();
  const images = tensor(message.images, { shape: message.shape });
  const labels = tensor(message.labels, { dtype: "int32" });
  const { loss, logits } = tidy(() => {
    const logits = model.forward(images, {
      seed: message.seed,
      step: message.iteration,
      sampleOffset: message.sampleOffset,
    });
    return { loss: ops.softmaxCrossEntropy(logits, labels), logits };
  });
  spans.push({ name: "forward", start, end: now() });
  const pass = backwardPass(loss);
  for (const group of message.backwardGroups) {
    start = now();
    const members = entries.filter((e) => e.entry.group === group);
    tidy(() => pass.runUntil(members.map((m) => m.entry.tensor)));
    if (message.failInGroup === group) throw new Error(`injected failure in backward ${group}`);
    for (const { entry, offset, size, gradient } of members) {
      const grad = entry.tensor.grad;
      if (grad) {
        gradient.assign(grad);
        grad.dispose();
        entry.tensor.grad = null;
      } else {
        gradients.fill(0, offset, offset + size);
      }
    }
    spans.push({ name: `backward ${group}`, group, start, end: now() });
    const slot = groupSlots.get(group)!;
    Atomics.store(signals, slot, message.iteration + 1);
    Atomics.notify(signals, slot);
  }
  tidy(() => pass.runToEnd());
  const lossValue = loss.dataSync()[0];
  const correct = countCorrect(logits.dataSync() as Float32Array, message.labels, logits.shape[1]);
  for (const t of [loss, logits, images, labels]) t.dispose();
  for (const { entry } of entries) {
    entry.tensor.grad?.dispose();
    entry.tensor.grad = null;
  }
  reply({
    type: "done",
    device,
    iteration: message.iteration,
    loss: lossValue,
    correct,
    count: message.labels.length,
    spans,
  });
}

self.onmessage = async (event: MessageEvent<InitMessage | StepMessage | ThreadsMessage>) => {
  const message = event.data;
  try {
    if (message.type === "init") await init(message);
    else if (message.type === "threads") {
      // This device's share of the cores for the CPU backend's kernel threads.
      const backend = getBackend() as { threads?: number };
      if ("threads" in backend) backend.threads = message.threads;
    } else step(message);
  } catch (error) {
    const e = error as Error;
    reply({
      type: "error",
      device,
      iteration: message.type === "step" ? message.iteration : undefined,
      message: e?.message ?? String(error),
      stack: e?.stack,
    });
  }
};
