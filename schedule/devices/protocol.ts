/**
 * Messages between the runtime (main thread) and a CPU device's Worker (a `node:worker_threads`
 * Worker; messages are its `postMessage` payloads, typed arrays over shared memory packed as their
 * `SharedArrayBuffer`s by {@link packViews}). Parameters and gradients never travel in messages: they
 * live in `SharedArrayBuffer`s both sides map, laid out by `parameter_layout.ts`. Messages say what
 * to do and report results; the latency-critical "this group's gradients are final" travels
 * through a shared signal word per group (`group_signals.ts`), so no message queue sits in the
 * overlap path.
 *
 * @module
 */

import type { ComputeCommand } from "./device.ts";
import type { ParameterLayout } from "./parameter_layout.ts";
import type { HeadPhase, HeadSetup } from "./sharded_head.ts";
import type { ModelSpec } from "./model_spec.ts";
import type { MemoryLoan } from "../../backends/backend.ts";

/** What the worker is started with (`workerData`), before any message. */
export interface CpuWorkerData {
  /** Nice value its compute thread takes first thing (see `thread_priority.ts`). */
  nice: number;
  /**
   * Kernel memory the runtime lent the replica's backend, holding the device's parameters and
   * gradients (`addresses` 0 and 1): the replica computes on its parameters in place, copying
   * nothing before a step. Absent where the runtime lent none (see `CpuDevice`); the worker then
   * copies them in.
   */
  memory?: MemoryLoan;
}

/** Main → worker: build the replica over shared parameter and gradient buffers. */
export interface InitMessage {
  type: "init";
  device: number;
  model: ModelSpec;
  /**
   * float32 × layout.total on a `SharedArrayBuffer`: this device's parameters (written by the
   * runtime between steps). A view, possibly into the runtime's kernel memory.
   */
  parameters: Float32Array;
  /** float32 × layout.total, shared: this device's gradients (written by the worker, group by group). */
  gradients: Float32Array;
  /**
   * int32 × groups: slot i holds 1 + the last iteration whose gradients of group `groups[i]` are
   * final in `gradients`. The worker stores and notifies with `Atomics`; the runtime waits on it.
   */
  signals: SharedArrayBuffer;
  /** Group of each `signals` slot. */
  groups: string[];
  /** Name, group and offset of every parameter, so the worker can check it built the same model. */
  slots: { name: string; group: string; offset: number; size: number }[];
}

/** Main → worker: run one iteration's compute lane on a shard (see `ComputeCommand`). */
/**
 * Main → worker: one iteration. The shard's images are not in the message: they are in the shared
 * input buffer (see {@link InputMessage}), `imageCount` floats from its start.
 *
 * @example
 * ```ts
 * import type { StepMessage } from "./protocol.ts";
 * // worker.postMessage({ type: "step", ...command, images: undefined, imageCount: 784 * 32 });
 * ```
 */
export type StepMessage = { type: "step"; imageCount: number } & Omit<ComputeCommand, "images">;

/**
 * Main → worker: from now on the images of each step are at the start of `images` (a view over a
 * `SharedArrayBuffer`). Sent once, and again only when a larger shard needs a larger buffer: a
 * batch's images in ordinary memory would be copied element by element with every step message
 * (about 12 ms per MB), so they travel in this buffer instead.
 *
 * @example
 * ```ts
 * import type { InputMessage } from "./protocol.ts";
 * const message: InputMessage = { type: "input", images: new Float32Array(new SharedArrayBuffer(4096)) };
 * ```
 */
export interface InputMessage {
  type: "input";
  /** The shared input buffer. */
  images: Float32Array;
}

/**
 * Main → worker: run a model-parallel head shard (hybrid schedules) with these buffers, replacing
 * any earlier setup; answered with `done` for `iteration` −1.
 *
 * @example
 * ```ts
 * import type { HeadSetupMessage } from "./protocol.ts";
 * // worker.postMessage({ type: "head-setup", layout, setup } satisfies HeadSetupMessage);
 * ```
 */
export interface HeadSetupMessage {
  type: "head-setup";
  /** The full parameter layout (the slices are ranges of it). */
  layout: ParameterLayout;
  /** The split and the shared buffers. */
  setup: HeadSetup;
}

/**
 * Main → worker: one phase of a hybrid iteration (see `sharded_head.ts`), answered with `done`;
 * `backward-body` also signals each group as `step` does.
 *
 * @example
 * ```ts
 * import type { HeadPhaseMessage } from "./protocol.ts";
 * const message: HeadPhaseMessage = { type: "head", iteration: 3, phase: { kind: "forward-stage", stage: 0 } };
 * ```
 */
export interface HeadPhaseMessage {
  type: "head";
  /** The training iteration the phase belongs to. */
  iteration: number;
  /**
   * The phase; a `forward-body` phase's `images` travel in the shared input buffer instead (its own
   * field is empty), `imageCount` floats of it.
   */
  phase: HeadPhase;
  /** For `forward-body`: how many floats of the shared input buffer are the shard's images. */
  imageCount?: number;
}

/**
 * Main → worker: how many threads the replica's CPU kernels may use (its share of the cores).
 *
 * @example
 * ```ts
 * import type { ThreadsMessage } from "./protocol.ts";
 * const message: ThreadsMessage = { type: "threads", threads: 2 };
 * ```
 */
export interface ThreadsMessage {
  type: "threads";
  /** Kernel threads, the worker's own included. */
  threads: number;
}

/** A span of work on the worker's compute lane, in epoch milliseconds. */
export interface ComputeSpan {
  /** What ran, e.g. `backward fc`. */
  name: string;
  /** Its group, for backward spans. */
  group?: string;
  /** Start time. */
  start: number;
  /** End time. */
  end: number;
}

/** Main → worker: every message the runtime sends. */
export type WorkerMessage =
  | InitMessage
  | InputMessage
  | StepMessage
  | ThreadsMessage
  | HeadSetupMessage
  | HeadPhaseMessage;

/** Worker → main. */
export type WorkerReply =
  | {
    type: "ready";
    device: number;
    /**
     * The replica's buffers (BatchNorm statistics), flat in `bufferLayoutOf(model.namedBuffers())`
     * order over a `SharedArrayBuffer` the worker made; absent for a model without buffers. The
     * worker loads them into its replica before each step and writes them back after it, so between
     * steps they are the replica's and the runtime may read or replace them.
     */
    buffers?: Float32Array;
    /** The compute thread's nice value as it reads it (`threadNice`), where it can. */
    nice?: number;
  }
  | {
    type: "done";
    device: number;
    iteration: number;
    loss: number;
    correct: number;
    count: number;
    spans: ComputeSpan[];
    /** Bytes of parameters the replica copied from the shared buffer in this phase (see `memory`). */
    copiedBytes: number;
  }
  | { type: "error"; device: number; iteration?: number; message: string; stack?: string };

/** The typed arrays a message may carry over shared memory, by constructor name. */
const SHARED_VIEW_KINDS = {
  Float32Array,
  Float64Array,
  Int32Array,
  Uint32Array,
  Int16Array,
  Uint16Array,
  Int8Array,
  Uint8Array,
} as const;

/** The key that marks a packed view; no message field is named so. */
const SHARED_VIEW = "__tandemSharedView";

/** A typed array over a `SharedArrayBuffer` as it travels: the buffer, where the view starts, its length. */
interface PackedView {
  [SHARED_VIEW]: keyof typeof SHARED_VIEW_KINDS;
  buffer: SharedArrayBuffer;
  byteOffset: number;
  length: number;
}

function isPlainObject(value: object): boolean {
  const prototype = Object.getPrototypeOf(value);
  return prototype === Object.prototype || prototype === null;
}

/**
 * `message` with every typed array over a `SharedArrayBuffer` replaced by its buffer, offset and
 * length ({@link unpackViews} on the other side makes the view again, over the same memory).
 *
 * Why: Deno's `node:worker_threads` `postMessage` walks a typed array element by element even when
 * it is shared — a 64 MB view took 2.5–2.9 s to reach the worker — while a `SharedArrayBuffer`
 * itself arrives in a millisecond whatever its size. Sent as views, bvlc_alexnet's parameters and
 * gradients (2 × 244 MB) held each device's start for 20–47 s. Typed arrays in ordinary memory are
 * left as they are (they are copied, as they must be); only plain objects and arrays are walked.
 *
 * @example
 * ```ts
 * import { packViews, unpackViews } from "./protocol.ts";
 * const parameters = new Float32Array(new SharedArrayBuffer(4096), 1024, 16);
 * const copy = unpackViews<{ parameters: Float32Array }>(packViews({ parameters }));
 * copy.parameters[0] = 1; // parameters[0] is 1 too: the same memory
 * ```
 */
export function packViews(message: unknown): unknown {
  if (typeof message !== "object" || message === null) return message;
  if (ArrayBuffer.isView(message)) {
    const kind = message.constructor.name as keyof typeof SHARED_VIEW_KINDS;
    if (!(message.buffer instanceof SharedArrayBuffer) || SHARED_VIEW_KINDS[kind] !== message.constructor) {
      return message;
    }
    const view = message as unknown as Float32Array;
    const packed: PackedView = {
      [SHARED_VIEW]: kind,
      buffer: view.buffer as SharedArrayBuffer,
      byteOffset: view.byteOffset,
      length: view.length,
    };
    return packed;
  }
  if (Array.isArray(message)) return message.map(packViews);
  if (!isPlainObject(message)) return message;
  return Object.fromEntries(Object.entries(message).map(([key, value]) => [key, packViews(value)]));
}

/** The message {@link packViews} packed, its shared typed arrays made again over the same memory. */
export function unpackViews<T>(message: unknown): T {
  if (typeof message !== "object" || message === null || ArrayBuffer.isView(message)) return message as T;
  if (Array.isArray(message)) return message.map((item) => unpackViews(item)) as T;
  if (!isPlainObject(message)) return message as T;
  const packed = message as PackedView;
  const kind = packed[SHARED_VIEW];
  if (kind !== undefined) {
    const View = SHARED_VIEW_KINDS[kind] as unknown as new (
      buffer: SharedArrayBuffer,
      byteOffset: number,
      length: number,
    ) => ArrayBufferView;
    return new View(packed.buffer, packed.byteOffset, packed.length) as T;
  }
  return Object.fromEntries(Object.entries(message).map(([key, value]) => [key, unpackViews(value)])) as T;
}
