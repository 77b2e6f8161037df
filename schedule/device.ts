/**
 * The device contract: what the runtime needs from a device handle, whatever runs behind it (a CPU
 * Worker here; a WebGPU device or another process later). A device owns one full replica, exposes
 * its parameters and gradients as host-visible flat buffers laid out by `layout.ts`, and runs the
 * compute lane of an iteration, announcing each group's gradients as soon as they are final.
 *
 * @module
 */

import { TandemError } from "../engine/mod.ts";
import type { ComputeSpan } from "./protocol.ts";

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
  /** Fault injection for tests: throw during this group's backward. */
  failInGroup?: string;
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
  /** Host-visible flat parameters; the runtime writes them between iterations. */
  readonly parameters: Float32Array;
  /** Host-visible flat gradients; valid for a group once `onGradients` reported it. */
  readonly gradients: Float32Array;
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
}
