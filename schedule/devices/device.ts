/**
 * The device contract: what the runtime needs from a device handle, whatever runs behind it (a CPU
 * Worker, a WebGPU device, another process). A device owns one full replica, exposes its parameters
 * and gradients as host-visible flat buffers laid out by `layout.ts`, and runs the compute lane of an
 * iteration, announcing each group's gradients as soon as they are final.
 *
 * A device whose memory the host cannot address (a GPU) may also offer a {@link ResidentReplica}:
 * when every device of a run does, the runtime leaves parameters, gradients and optimizer state on
 * the devices — averaging, the optimizer and the broadcast run there, and only gradients and
 * parameters travel between devices, each group through one staged copy.
 *
 * @module
 */

import { type ParameterEntry, TandemError } from "../../engine/mod.ts";
import type { ParameterLayout } from "./parameter_layout.ts";
import type { ComputeSpan } from "./protocol.ts";
import type { HeadPhase, HeadPhaseResult, HeadSetup } from "./sharded_head.ts";
import type { HeadLayout } from "./head_layout.ts";

/**
 * A device failed: its worker threw, died or stopped answering. Names the device.
 *
 * @example
 * ```ts
 * import { DeviceError } from "./device.ts";
 * const e = new DeviceError(1, "worker terminated");
 * console.log(e.message); // "device 1: worker terminated"
 * ```
 */
export class DeviceError extends TandemError {
  /** Index of the failed device. */
  readonly device: number;
  /** A failure of `device`. */
  constructor(device: number, message: string) {
    super(`device ${device}: ${message}`);
    this.device = device;
  }
}

/** One iteration's compute-lane work for a device. */
export interface ComputeCommand {
  /** Training iteration (keys dropout). */
  iteration: number;
  /** Float32 NCHW shard. */
  images: Float32Array;
  /** Int32 labels. */
  labels: Int32Array;
  /** Shape of `images`. */
  shape: number[];
  /** Global position of the shard's first sample. */
  sampleOffset: number;
  /** Run seed. */
  seed: number;
  /** Groups to backward, in order. */
  backwardGroups: string[];
  /**
   * Gradient accumulation: the shard runs as this many micro-batches and the groups are reported
   * after the last one only (default 1).
   */
  microBatches?: number;
}

/** What a device's compute lane produced. */
export interface ComputeResult {
  /** Mean loss over the shard. */
  loss: number;
  /** Correct top-1 predictions in the shard. */
  correct: number;
  /** Samples in the shard. */
  count: number;
  /** Compute spans, in `performance.now()` milliseconds of the calling thread. */
  spans: ComputeSpan[];
}

/** How the runtime uses a device's {@link ResidentReplica}; see {@link ResidentReplica.activate}. */
export interface ResidentRole {
  /** Devices in the run. */
  readonly devices: number;
  /**
   * Peers receive this device's gradients: copy each group's gradients off the device as soon as its
   * backward is queued, so the copy is not queued behind the rest of the backward.
   */
  readonly sendsGradients: boolean;
  /**
   * This device averages gradients and runs an optimizer over its own parameters (device 0 in
   * `master` mode, every device in `allreduce` mode).
   */
  readonly updates: boolean;
}

/**
 * Optional capability of a {@link Device}: its replica stays resident in the device's own memory.
 * The runtime uses it when every device of a run provides it: optimizers are created over
 * {@link ResidentReplica.parameterEntries}, so updates run as the backend's kernels on the device, and
 * gradients and parameters move between devices group by group through `stage…` / `receive…` pairs
 * (for WebGPU: copy to a reused mappable staging buffer, map, `writeBuffer` on the destination).
 * Once activated, `Device.compute` neither reads `Device.parameters` nor fills `Device.gradients`;
 * those host arrays are only mirrors, the parameters one filled when the runtime syncs them.
 *
 * @example
 * ```ts
 * import type { Device } from "./device.ts";
 * // What the master does for "reduce fc" with two devices:
 * async function reduce(master: Device, peer: Device) {
 *   await peer.resident!.stageGradients("fc", (values) => master.resident!.receiveGradients(1, "fc", values));
 *   master.resident!.averageGradients("fc");
 * }
 * ```
 */
export interface ResidentReplica {
  /**
   * Switches the device to resident operation, called once before the first step: the host
   * `Device.parameters` (the initial values the runtime wrote) become the replica's parameters, and
   * the buffers `role` needs are allocated.
   */
  activate(role: ResidentRole): void;
  /**
   * The replica's parameters in layout order, as tensors on the device's own backend sharing storage
   * with the replica (an update is what the next forward reads). Each `.grad` is the averaged
   * gradient {@link ResidentReplica.averageGradients} writes (`null` unless the role `updates`).
   */
  readonly parameterEntries: readonly ParameterEntry[];
  /**
   * Lends `use` a host view of this device's own gradients of `group` from the last compute (layout
   * order within the group's range), staged off the device; the view is invalid once `use` settles.
   */
  stageGradients(group: string, use: (values: Float32Array) => void | Promise<void>): Promise<void>;
  /** Stores device `from`'s gradients of `group` (as lent by its `stageGradients`) on this device. */
  receiveGradients(from: number, group: string, values: Float32Array): void;
  /**
   * Averages `group`'s gradients of every device into the `.grad` of its parameter entries, on the
   * device: exactly `(g0 + g1 + … + g(N−1)) · fround(1/N)` in float32, added in device-index order,
   * with this device's own gradients in its place and every other one received.
   */
  averageGradients(group: string): void;
  /** As {@link ResidentReplica.stageGradients}, for the current parameters of `group`. */
  stageParameters(group: string, use: (values: Float32Array) => void | Promise<void>): Promise<void>;
  /** Overwrites `group`'s parameters with `values` (as lent by a peer's `stageParameters`). */
  receiveParameters(group: string, values: Float32Array): void;
}

/**
 * Optional capability of a {@link Device}: it can hold a model-parallel slice of the network's
 * fully-connected head and run a hybrid iteration phase by phase, the runtime moving activations
 * between phases (see `sharded_head.ts`). Hybrid schedules need it on every device.
 *
 * @example
 * ```ts
 * import type { Device } from "./device.ts";
 * async function forwardFirstStage(device: Device, iteration: number) {
 *   return await device.sharded!.runHead(iteration, { kind: "forward-stage", stage: 0 });
 * }
 * ```
 */
export interface ShardedReplica {
  /** Prepares the head shard: the split, this device's buffers and the batch size. */
  setupHead(layout: ParameterLayout, setup: HeadSetup): Promise<void>;
  /**
   * Optional, once the device's {@link ResidentReplica} is active: keeps this device's slice of
   * `head` on the device (tensors on its backend, copied there from the replica's whole head
   * layers) and returns them, in `sliceSlots` order, for the runtime's slice optimizer, so the
   * slice's updates run where it lives. Each `.grad` is the slice's gradient of the last step. From
   * then on the head's phases read and write these, never `parameters` or `gradients`.
   */
  residentSlice?(layout: ParameterLayout, head: HeadLayout): readonly ParameterEntry[];
  /**
   * Runs one phase of `iteration`. For `backward-body`, `onGradients(group)` is called as each body
   * group's gradients land in `gradients`, as `compute` does.
   */
  runHead(
    iteration: number,
    phase: HeadPhase,
    onGradients?: (group: string) => void,
  ): Promise<HeadPhaseResult>;
}

/**
 * A device handle.
 *
 * @example
 * ```ts
 * import type { Device } from "./device.ts";
 * async function runOne(device: Device, command: import("./device.ts").ComputeCommand) {
 *   return await device.compute(command, (group) => console.log(`${group} gradients ready`));
 * }
 * ```
 */
export interface Device {
  /** Position among the devices; 0 is the master. */
  readonly index: number;
  /** What kind of device, e.g. `cpu-worker`. */
  readonly kind: string;
  /**
   * Host-visible flat parameters; the runtime writes them between iterations (with a
   * {@link ResidentReplica} in use: a mirror the runtime fills on request).
   */
  readonly parameters: Float32Array;
  /**
   * Host-visible flat gradients; valid for a group once `onGradients` reported it (with a
   * {@link ResidentReplica} in use: not filled, the gradients stay on the device).
   */
  readonly gradients: Float32Array;
  /**
   * The replica's buffers (BatchNorm statistics) as a host array in `bufferLayoutOf(model
   * .namedBuffers())` order, for a model that has any: the device loads them into its replica before
   * each compute and writes them back after it, so the runtime may read (device 0's: the evaluated
   * and checkpointed statistics) or replace them (undoing a step, loading a checkpoint) between
   * steps. A device without it cannot train a model with buffers; the runtime refuses such a run.
   */
  readonly buffers?: Float32Array;
  /** Present when the replica can stay in the device's own memory; see {@link ResidentReplica}. */
  readonly resident?: ResidentReplica;
  /** Present when the device can run hybrid schedules; see {@link ShardedReplica}. */
  readonly sharded?: ShardedReplica;
  /**
   * Runs forward and the backward groups; calls `onGradients(group)` as each group's gradients land
   * in `gradients`. Rejects with a `DeviceError` on failure.
   */
  compute(
    command: ComputeCommand,
    onGradients: (group: string) => void,
  ): Promise<ComputeResult>;
  /** Stops the device. */
  close(): Promise<void>;
  /**
   * Optional: frees the host memory the device shares with the runtime (`parameters`, `gradients`),
   * once closed and nothing reads it any more; neither may be used afterwards.
   */
  free?(): void;
}
