/**
 * The exchange of devices whose parameters and gradients are host memory this thread can address
 * (CPU Workers over `SharedArrayBuffer`s, or any device without a resident replica, which copies its
 * gradients to the host): the master's receive buffers take the peers' gradients, the average is
 * computed here in device order, the optimizer runs on the CPU backend over zero-copy tensors of the
 * updating devices' parameter buffers, and a broadcast is a copy. An emulated link (`link.ts`) makes
 * each copy last as long as the link would.
 *
 * @module
 */

import type { Optimizer, ParameterEntry } from "../../engine/mod.ts";
import type { Device } from "../devices/device.ts";
import { groupRange, type ParameterLayout, sharedFloats } from "../devices/layout.ts";
import type { ReductionMode } from "../plan/plan.ts";
import { divergentFrom, type Exchange, type ExchangeContext, InProcessExchange } from "./exchange.ts";
import { averageInDeviceOrder, hostParameterEntries } from "./host_parameters.ts";
import { emulateRingAllreduce, type LinkSpec, transfer } from "./link.ts";

/** See the module notes. */
export class SharedMemoryExchange extends InProcessExchange implements Exchange {
  readonly name = "shared memory";
  /** Copies between host buffers and the average here cannot fail. */
  readonly transfersCanFail = false;
  readonly optimizers: readonly Optimizer[];
  /** The averaged gradients each optimizer reads (its parameters' `.grad`). */
  readonly #averaged: Float32Array[];
  /** The master's receive buffers for each peer's gradients (index 0 unused). */
  readonly #received: Float32Array[];

  /** Creates the optimizers over the updating devices' parameter buffers. */
  constructor(
    devices: readonly Device[],
    layout: ParameterLayout,
    mode: ReductionMode,
    link: LinkSpec | undefined,
    optimizer: (parameters: ParameterEntry[]) => Optimizer,
  ) {
    super(devices, layout, mode, link);
    // In kernel memory, as the devices' parameters are: the optimizer updates in place.
    this.#averaged = this.updating.map(() => sharedFloats(layout.total));
    this.optimizers = this.updating.map((device, i) =>
      optimizer(hostParameterEntries(layout, device.parameters, this.#averaged[i]))
    );
    this.#received = devices.map((d) => sharedFloats(d.index === 0 ? 0 : layout.total));
  }

  beforeStep(): Promise<void> {
    return Promise.resolve();
  }

  #slice(buffer: Float32Array, group: string): Float32Array {
    const range = groupRange(this.layout, group);
    return buffer.subarray(range.offset, range.offset + range.size);
  }

  async reduce(group: string, context: ExchangeContext): Promise<void> {
    const devices = this.local;
    const slice = (buffer: Float32Array) => this.#slice(buffer, group);
    if (this.mode === "master") {
      // Each peer has its own link to the master; the transfers run side by side.
      await Promise.all(
        devices.slice(1).map(async (device) => {
          const t = await transfer(slice(device.gradients), slice(this.#received[device.index]), this.link);
          context.record(device.index, `send ${group} gradients`, t.start, t.end);
        }),
      );
      averageInDeviceOrder(
        [slice(devices[0].gradients), ...devices.slice(1).map((d) => slice(this.#received[d.index]))],
        slice(this.#averaged[0]),
      );
      return;
    }
    // Averaged once here for every device; an emulated link makes it last as a ring all-reduce would.
    const start = performance.now();
    const average = slice(this.#averaged[0]);
    averageInDeviceOrder(devices.map((d) => slice(d.gradients)), average);
    for (const averaged of this.#averaged.slice(1)) slice(averaged).set(average);
    await emulateRingAllreduce(start, average.byteLength, devices.length, this.link);
  }

  async broadcast(group: string, context: ExchangeContext): Promise<boolean> {
    if (this.mode !== "master") return false;
    const master = this.#slice(this.local[0].parameters, group);
    await Promise.all(
      this.local.slice(1).map(async (device) => {
        const t = await transfer(master, this.#slice(device.parameters, group), this.link);
        context.record(device.index, `receive ${group} parameters`, t.start, t.end);
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
}
