/**
 * The exchange of devices whose parameters and gradients are host memory this thread can address
 * (CPU Workers over `SharedArrayBuffer`s, or any device without a resident replica, which copies its
 * gradients to the host): the master's receive buffers take the peers' gradients, the average is
 * computed here in device order, the optimizer runs on the CPU backend over zero-copy tensors of the
 * updating devices' parameter buffers, and a broadcast is a copy. An emulated link (`link.ts`) makes
 * each copy last as long as the link would.
 *
 * With a 16-bit wire format (`wire.ts`) each device's group slice is rounded on reduce — the
 * master's own into a buffer of its own, each peer's on its way into the master's receive buffer —
 * and the average reads the rounded slices; the emulated link then carries, and the trace records,
 * half the bytes. The devices' gradient buffers are only read. Parameters still travel in float32.
 *
 * @module
 */

import { getBackend, type Optimizer, type ParameterEntry } from "../../../engine/mod.ts";
import type { Backend } from "../../../backends/backend.ts";
import type { Device } from "../../devices/device.ts";
import { groupRange, type ParameterLayout, sharedFloats } from "../../devices/parameter_layout.ts";
import type { ReductionMode } from "../../plan/plan.ts";
import {
  divergentFrom,
  type Exchange,
  type ExchangeContext,
  freeHostExchange,
  InProcessExchange,
} from "./exchange.ts";
import { averageInDeviceOrder, hostParameterEntries } from "./host_parameters.ts";
import { emulateRingAllreduce, type Link, timedMove, transfer } from "./link.ts";
import { GradientWire, type WireOptions } from "./wire.ts";

/** See the module notes. */
export class SharedMemoryExchange extends InProcessExchange implements Exchange {
  readonly name = "shared memory";
  /** Copies between host buffers and the average here cannot fail. */
  readonly transfersCanFail = false;
  readonly optimizers: readonly Optimizer[];
  /**
   * Where the host work runs (buffers, average, optimizer): the backend current at construction,
   * whatever the caller makes current later (it may evaluate on another backend between steps).
   */
  readonly #host: Backend = getBackend();
  /** The averaged gradients each optimizer reads (its parameters' `.grad`). */
  readonly #averaged: Float32Array[];
  /**
   * The master's receive buffers for each peer's gradients (index 0 unused); with a compressed wire,
   * every device's rounded gradients (index 0 the master's own; in allreduce mode, every device's).
   */
  readonly #received: Float32Array[];
  /** The gradients' wire format, where compressed (`undefined`: fp32, exact). */
  readonly wire: GradientWire | undefined;

  /**
   * Creates the optimizers over the updating devices' parameter buffers; `wire` (default fp32) says
   * how gradients travel.
   */
  constructor(
    devices: readonly Device[],
    layout: ParameterLayout,
    mode: ReductionMode,
    link: Link | undefined,
    optimizer: (parameters: ParameterEntry[]) => Optimizer,
    wire: WireOptions = {},
  ) {
    super(devices, layout, mode, link);
    // A failed step is undone here, residuals included.
    this.wire = GradientWire.create(wire, layout.total, devices.map((d) => d.index), true);
    // In kernel memory, as the devices' parameters are: the optimizer updates in place.
    this.#averaged = this.updating.map(() => sharedFloats(layout.total, this.#host));
    this.optimizers = this.updating.map((device, i) =>
      optimizer(hostParameterEntries(layout, device.parameters, this.#averaged[i], this.#host))
    );
    const compressed = this.wire !== undefined;
    // Receive buffers only where something travels into them: an emulated link or a compressed wire.
    this.#received = devices.map((d) =>
      sharedFloats((d.index === 0 || !link) && !compressed ? 0 : layout.total, this.#host)
    );
  }

  beforeStep(): Promise<void> {
    return Promise.resolve();
  }

  #slice(buffer: Float32Array, group: string): Float32Array {
    const range = groupRange(this.layout, group);
    return buffer.subarray(range.offset, range.offset + range.size);
  }

  async reduce(group: string, context: ExchangeContext): Promise<void> {
    if (this.wire) return await this.#reduceCompressed(this.wire, group, context);
    const devices = this.local;
    const slice = (buffer: Float32Array) => this.#slice(buffer, group);
    if (this.mode === "master") {
      // Without a link the master reads the peers' gradients where they lie: nothing travels, and
      // a device writes its group's gradients again only in the next step's backward. Over an
      // emulated link each peer has its own to the master; the transfers run side by side.
      const link = this.link;
      if (link) {
        await Promise.all(
          devices.slice(1).map(async (device) => {
            const t = await transfer(slice(device.gradients), slice(this.#received[device.index]), link);
            context.record(device.index, `send ${group} gradients`, t.start, t.end, t.bytes);
          }),
        );
      }
      const peer = (d: Device) => slice(link ? this.#received[d.index] : d.gradients);
      averageInDeviceOrder(
        [slice(devices[0].gradients), ...devices.slice(1).map(peer)],
        slice(this.#averaged[0]),
        this.#host,
      );
      return;
    }
    // Averaged once here for every device; an emulated link makes it last as a ring all-reduce would.
    const start = performance.now();
    const average = slice(this.#averaged[0]);
    averageInDeviceOrder(devices.map((d) => slice(d.gradients)), average, this.#host);
    for (const averaged of this.#averaged.slice(1)) slice(averaged).set(average);
    await emulateRingAllreduce(start, average.byteLength, devices.length, this.link);
    recordRing(context, devices, group, start, average.byteLength);
  }

  /**
   * {@link reduce} over a 16-bit wire: every device's slice rounded (a peer's inside its emulated
   * transfer, at the compressed size), then the same device-order average of the rounded slices.
   */
  async #reduceCompressed(wire: GradientWire, group: string, context: ExchangeContext): Promise<void> {
    const devices = this.local;
    const range = groupRange(this.layout, group);
    const slice = (buffer: Float32Array) => buffer.subarray(range.offset, range.offset + range.size);
    const rounded = (device: Device) => slice(this.#received[device.index]);
    const round = (device: Device) =>
      wire.quantize(device.index, range.offset, slice(device.gradients), rounded(device));
    const bytes = wire.bytes(range.size);
    const average = slice(this.#averaged[0]);
    if (this.mode === "master") {
      const sends = devices.slice(1).map(async (device) => {
        const t = await timedMove(bytes, this.link, () => round(device));
        context.record(device.index, `send ${group} gradients`, t.start, t.end, t.bytes);
      });
      round(devices[0]); // while the peers' gradients are on the (emulated) link
      await Promise.all(sends);
      averageInDeviceOrder(devices.map(rounded), average, this.#host);
      return;
    }
    const start = performance.now();
    for (const device of devices) round(device);
    averageInDeviceOrder(devices.map(rounded), average, this.#host);
    for (const averaged of this.#averaged.slice(1)) slice(averaged).set(average);
    await emulateRingAllreduce(start, bytes, devices.length, this.link);
    recordRing(context, devices, group, start, bytes);
  }

  async broadcast(group: string, context: ExchangeContext): Promise<boolean> {
    if (this.mode !== "master") return false;
    const master = this.#slice(this.local[0].parameters, group);
    await Promise.all(
      this.local.slice(1).map(async (device) => {
        const t = await transfer(master, this.#slice(device.parameters, group), this.link);
        context.record(device.index, `receive ${group} parameters`, t.start, t.end, t.bytes);
      }),
    );
    return true;
  }

  broadcastParameters(iteration: number): Promise<number> {
    const master = this.local[0].parameters;
    for (const device of this.local.slice(1)) device.parameters.set(master);
    // The optimizers' state tensors share the CPU backend, so they load each other's directly.
    if (this.optimizers.length > 1) {
      const state = this.optimizers[0].state();
      for (const optimizer of this.optimizers.slice(1)) optimizer.loadState(state);
    }
    return Promise.resolve(iteration);
  }

  syncParameters(): Promise<void> {
    return Promise.resolve();
  }

  masterParameters(): Float32Array {
    return this.local[0].parameters.slice();
  }

  divergentReplicas(): Promise<number[]> {
    return Promise.resolve(divergentFrom(this.local));
  }

  async close(): Promise<void> {
    await Promise.all(this.local.map((d) => d.close()));
  }

  free(): void {
    freeHostExchange(this.optimizers, this.local, [...this.#averaged, ...this.#received]);
  }
}

/**
 * Records an all-reduce of `bytes` per device on every device's lane as `send <group> gradients`,
 * with what each device sends in a ring all-reduce: 2(N−1)/N of them.
 */
function recordRing(
  context: ExchangeContext,
  devices: readonly Device[],
  group: string,
  start: number,
  bytes: number,
): void {
  const n = devices.length;
  if (n < 2) return;
  const end = performance.now(), sent = Math.round(2 * (n - 1) / n * bytes);
  for (const device of devices) context.record(device.index, `send ${group} gradients`, start, end, sent);
}
