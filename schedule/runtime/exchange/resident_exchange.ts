/**
 * The exchange of devices that keep their replica in their own memory (every device offers a
 * {@link ResidentReplica}; WebGPU devices do). Parameters, gradients and optimizer state stay on the
 * devices for the whole run: the optimizers are created over the devices' own parameter tensors, so
 * SGD and Adam run as the backend's fused kernels where the parameters live; `reduce` moves each
 * peer's gradients of a group to the averaging device through the staging path and averages them
 * there in device order, with the host's float32 arithmetic; `broadcast` stages the master's new
 * parameters of the group to every peer. Parameters reach the host only when asked for
 * (`syncParameters`), and an undoable update copies on the device.
 *
 * Gradients travel in float32 only: a 16-bit wire format (`wire.ts`) must round every device's
 * contribution, but each device averages its own gradients on the device without them passing
 * through the host, so it is refused here, naming `--wire`.
 *
 * @module
 */

import {
  disposeOptimizerState,
  type Optimizer,
  packOptimizerState,
  type ParameterEntry,
  TandemError,
  unpackOptimizerState,
} from "../../../engine/mod.ts";
import type { Device, ResidentReplica } from "../../devices/device.ts";
import { groupRange, type ParameterLayout } from "../../devices/parameter_layout.ts";
import type { ReductionMode } from "../../plan/plan.ts";
import {
  divergentFrom,
  type Exchange,
  type ExchangeContext,
  InProcessExchange,
  settleAll,
} from "./exchange.ts";
import { emulateRingAllreduce, type Link, timedMove } from "./link.ts";
import { checkWireOptions, type WireOptions } from "./wire.ts";

/** See the module notes. */
export class ResidentExchange extends InProcessExchange implements Exchange {
  readonly name = "GPU-resident";
  /** Staging to and from peer devices fails when one is lost. */
  readonly transfersCanFail = true;
  /** Gradients travel in fp32 only (see the module notes). */
  readonly wire = undefined;
  readonly optimizers: readonly Optimizer[];
  readonly #replicas: ResidentReplica[];
  /** Whether the devices' host `parameters` mirrors hold the resident parameters. */
  #mirrorsCurrent = true;
  /** A broadcast started by `broadcastParameters`, which the next step waits for. */
  #pendingBroadcast: Promise<unknown> | undefined;

  /**
   * Activates every device's resident replica (the initial parameters are in their host
   * `parameters`) and creates the optimizers over the updating devices' own tensors. A compressed
   * `wire` is refused (see the module notes).
   */
  constructor(
    devices: readonly Device[],
    layout: ParameterLayout,
    mode: ReductionMode,
    link: Link | undefined,
    optimizer: (parameters: ParameterEntry[]) => Optimizer,
    wire: WireOptions = {},
  ) {
    checkWireOptions(wire);
    if ((wire.wire ?? "fp32") !== "fp32") {
      throw new TandemError(
        `--wire ${wire.wire}: GPU-resident (${devices[0]?.kind}) devices exchange fp32 gradients only, ` +
          `since each averages its own gradients on the GPU without rounding them as the peers' would be; ` +
          `use --wire fp32, or CPU devices`,
      );
    }
    super(devices, layout, mode, link);
    this.#replicas = devices.map((d) => d.resident!);
    const count = devices.length;
    for (const device of devices) {
      device.resident!.activate({
        devices: count,
        sendsGradients: count > 1 && (mode === "allreduce" || device.index > 0),
        updates: mode === "allreduce" || device.index === 0,
      });
    }
    this.optimizers = this.updating.map((device) => optimizer([...device.resident!.parameterEntries]));
  }

  async beforeStep(): Promise<void> {
    const pending = this.#pendingBroadcast;
    this.#pendingBroadcast = undefined;
    await pending;
    this.#mirrorsCurrent = false;
  }

  async reduce(group: string, context: ExchangeContext): Promise<void> {
    const bytes = groupRange(this.layout, group).size * 4;
    const [master, ...peers] = this.#replicas;
    if (this.mode === "master") {
      // Each peer has its own link to the master; the transfers run side by side.
      await settleAll(peers.map(async (peer, i) => {
        const t = await timedMove(
          bytes,
          this.link,
          () => peer.stageGradients(group, (values) => master.receiveGradients(i + 1, group, values)),
        );
        context.record(i + 1, `send ${group} gradients`, t.start, t.end, t.bytes);
      }));
      master.averageGradients(group);
      return;
    }
    // Every device receives every other one's gradients and averages them itself, in device order,
    // so all replicas compute the same bits; timed as a ring all-reduce.
    const start = performance.now();
    if (this.#replicas.length > 1) {
      await settleAll(this.#replicas.map((sender, from) =>
        sender.stageGradients(group, (values) => {
          for (const [to, receiver] of this.#replicas.entries()) {
            if (to !== from) receiver.receiveGradients(from, group, values);
          }
        })
      ));
    }
    for (const replica of this.#replicas) replica.averageGradients(group);
    await emulateRingAllreduce(start, bytes, this.#replicas.length, this.link);
  }

  async broadcast(group: string, context: ExchangeContext): Promise<boolean> {
    if (this.mode !== "master") return false;
    const [master, ...peers] = this.#replicas;
    const bytes = groupRange(this.layout, group).size * 4;
    // One staged copy off the master serves every peer; each peer's own link is timed apart.
    const t = await timedMove(bytes, this.link, () =>
      master.stageParameters(group, (values) => {
        for (const peer of peers) peer.receiveParameters(group, values);
      }));
    peers.forEach((_, i) => context.record(i + 1, `receive ${group} parameters`, t.start, t.end, t.bytes));
    return true;
  }

  /**
   * Parameters group by group through the staging path, then (allreduce) the master's optimizer
   * state to every peer's optimizer, on its own device. The next step waits for it, so a caller
   * that does not await it still trains on the broadcast parameters.
   */
  broadcastParameters(iteration: number): Promise<number> {
    this.#mirrorsCurrent = false;
    const previous = this.#pendingBroadcast ?? Promise.resolve();
    const broadcast = previous.then(() => this.#broadcast()).then(() => iteration);
    // Handled here so a caller that does not await it cannot crash the process; the step rethrows.
    broadcast.catch(() => {});
    this.#pendingBroadcast = broadcast;
    return broadcast;
  }

  async #broadcast(): Promise<void> {
    const [master, ...peers] = this.#replicas;
    for (const range of this.layout.groups) {
      await master.stageParameters(range.name, (values) => {
        for (const peer of peers) peer.receiveParameters(range.name, values);
      });
    }
    if (this.optimizers.length === 1) return;
    const { header, values } = await packOptimizerState(this.optimizers[0].state());
    for (const optimizer of this.optimizers.slice(1)) {
      const state = unpackOptimizerState(header, values, optimizer.parameters);
      try {
        optimizer.loadState(state);
      } finally {
        disposeOptimizerState(state);
      }
    }
  }

  async syncParameters(): Promise<void> {
    if (this.#mirrorsCurrent) return;
    await this.beforeStep();
    await settleAll(this.local.map(async (device) => {
      for (const range of this.layout.groups) {
        await device.resident!.stageParameters(
          range.name,
          (values) => device.parameters.set(values, range.offset),
        );
      }
    }));
    this.#mirrorsCurrent = true;
  }

  #requireMirrors(what: string): void {
    if (this.#mirrorsCurrent) return;
    throw new TandemError(
      `DataParallelTrainer.${what}: the parameters live on the ${this.local[0].kind} devices and have ` +
        `changed since they were last copied to the host; await trainer.syncParameters() first`,
    );
  }

  masterParameters(): Float32Array {
    this.#requireMirrors("masterParameters");
    return this.local[0].parameters.slice();
  }

  divergentReplicas(): Promise<number[]> {
    this.#requireMirrors("divergentReplicas");
    return Promise.resolve(divergentFrom(this.local));
  }

  async close(): Promise<void> {
    // A broadcast still staging must not find its devices gone; its failure no longer matters.
    await this.#pendingBroadcast?.catch(() => {});
    await Promise.all(this.local.map((d) => d.close()));
  }

  free(): void {
    // Closing freed each device's backend, and with it every tensor the optimizers kept there.
  }
}
