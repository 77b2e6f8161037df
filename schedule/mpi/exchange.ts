/**
 * The exchange across processes and hosts: one device per MPI rank, rank 0 the master, the same
 * plans as in one process and the same parameters, bit for bit.
 *
 * Each rank hosts one device (a CPU Worker by default) that runs the compute lane, while the rank's
 * main thread runs the plan's communication lane with non-blocking collectives polled between yields
 * to the event loop — so under `overlap` the FC gradients cross the network while the conv gradients
 * are still being computed, in every process.
 *
 * Lossless as in one process: every rank receives the same global batch and takes its shard
 * (`sampleOffset = rank × shard`), so the dropout masks match; gradients are never summed by MPI
 * (whose order is the library's choice for more than 2 ranks) but gathered and averaged in rank order
 * with {@link averageInDeviceOrder}:
 * - `master`: `MPI_Igather` of each group's gradients to rank 0, which averages, updates and
 *   `MPI_Ibcast`s the group's new parameters; rank 0 gathers in place (it averages its own
 *   gradients where they are) and posts the receives of the plan's first reduce when the step
 *   starts, so gradients that arrive early land where they belong;
 * - `allreduce`: `MPI_Iallgather` of each group's gradients, then every rank averages in rank order
 *   and applies the identical update to its own replica.
 *
 * These gathers and broadcasts carry the most bytes by far; by default they run with the same
 * semantics over direct TCP connections between the ranks (`sockets.ts`, `dataPlane: "sockets"`),
 * which avoid the copies through Open MPI's buffers, and through MPI's own collectives with
 * `dataPlane: "mpi"`. Everything else goes through MPI.
 *
 * With a 16-bit wire format (`wire.ts`: `fp16`, `bf16`) each rank encodes its gradients (with its
 * own error-feedback residual, if asked) and the gathers carry the 16-bit values as bytes, half as
 * many; the averaging ranks decode them exactly before the same rank-order average, so the result
 * equals the in-process run under the same format bit for bit. Parameters travel in float32.
 *
 * A model's buffers (BatchNorm statistics, `buffer_layout.ts`) are never exchanged during a step:
 * each rank's device keeps its own, updated by its own forward, as devices in one process do. Rank
 * 0's are the master's (what the train command evaluates and checkpoints); they are broadcast to
 * every rank at the start and by {@link MpiExchange.broadcastParameters} (after rank 0 loaded a
 * checkpoint), as one process copies device 0's to the others.
 *
 * A failed rank fails the job, never hangs it (see `transport.ts`); a failed step is not undone,
 * since the other ranks are left inside collectives and only a new job can continue (nor are the
 * statistics its forward moved).
 *
 * It stays one file although long: one class implements the runtime's exchange contract for a rank,
 * and its reduce, pipeline and broadcast share the posted requests and gathered buffers of a step;
 * the collectives they post live apart (`sockets.ts`, `transport.ts`, `request.ts`).
 *
 * @module
 */

import type { Backend } from "../../backends/backend.ts";
import {
  disposeOptimizerState,
  getBackend,
  type Optimizer,
  packOptimizerState,
  type ParameterEntry,
  unpackOptimizerState,
} from "../../engine/mod.ts";
import { loadInitialBuffers } from "../devices/buffer_layout.ts";
import { CpuDevice } from "../devices/cpu_device.ts";
import { type ComputeResult, type Device, DeviceError } from "../devices/device.ts";
import { groupRange, type ParameterLayout, sharedFloats } from "../devices/parameter_layout.ts";
import { actionLabel } from "../plan/plan.ts";
import type { Plan, ReductionMode } from "../plan/plan.ts";
import {
  type CombinedResult,
  type Exchange,
  type ExchangeContext,
  freeHostExchange,
  type PipelineSpans,
  type ReplicaReference,
} from "../runtime/exchange/exchange.ts";
import { averageInDeviceOrder, hostParameterEntries } from "../runtime/exchange/host_parameters.ts";
import type { DataParallelOptions } from "../runtime/options.ts";
import type { TraceRecorder, TraceSpan } from "../runtime/trace.ts";
import { GradientWire } from "../runtime/exchange/wire.ts";
import { pipelineChunkBytes } from "../runtime/exchange/link.ts";
import { type BulkCollectives, type BulkRequest, bytesOf, SocketMesh } from "./sockets.ts";
import { detectMpiLaunch } from "./launch.ts";
import { TransportError, type WaitOptions } from "./request.ts";
import { eagerMessageBytes } from "./tcp.ts";
import { measureLink } from "./link_probe.ts";
import { MpiTransport } from "./transport.ts";

/** Kernel threads for one of `ranksOnHost` ranks sharing this host's cores (at least 1). */
function cpuThreadsPerRank(ranksOnHost: number): number {
  const cores = Math.max(1, navigator.hardwareConcurrency || 1);
  return Math.max(1, Math.floor(cores / ranksOnHost));
}

/** Part of a group's flat range. */
interface Piece {
  /** First element in the layout. */
  offset: number;
  /** Elements. */
  size: number;
}

/** Default chunk (averaged, updated and sent back as one): 1 MiB keeps per-update costs small. */
export const DEFAULT_CHUNK_BYTES = 1024 * 1024;

/**
 * Bytes each rank sends when the ranks measure their link for master mode's chunks: 4 MiB, about
 * 34 ms each way over 1 Gbit/s, long enough that the ends of a transfer weigh little.
 */
const LINK_RATE_PROBE_BYTES = 4 << 20;

/** See the module notes. */
export class MpiExchange implements Exchange {
  readonly name = "MPI";
  readonly rollsBack = false;
  readonly transfersCanFail = true;
  /** The communicator. */
  readonly transport: MpiTransport;
  /** Direct connections between the ranks, where gradients and parameters travel over them. */
  readonly sockets: SocketMesh | undefined;
  /** What moves gradients and parameters: {@link sockets}, or MPI's collectives. */
  readonly #bulk: BulkCollectives;
  readonly local: readonly Device[];
  readonly optimizers: readonly Optimizer[];
  readonly parameterEntries: readonly ParameterEntry[];
  readonly #device: Device;
  readonly #layout: ParameterLayout;
  readonly #mode: ReductionMode;
  /** Where the host work runs: the backend current at construction (see `SharedMemoryExchange`). */
  readonly #host: Backend = getBackend();
  /** The averaged gradients the optimizer reads, on ranks that update. */
  readonly #averaged: Float32Array | undefined;
  /** Every rank's gradients of one group, in rank order, on ranks that average. */
  readonly #gathered: Float32Array | undefined;
  readonly #timeoutMs: number;
  readonly #chunkBytes: number;
  /** The link's rate both ways (master mode), which sets the chunks' least size; rank 0's on every rank. */
  readonly #linkBytesPerSecond: number | undefined;
  /** `performance.now()` just after a barrier all ranks left together: the ranks' common zero. */
  readonly #clockZero: number;
  /** The gradients' wire format, where compressed (`undefined`: fp32, exact); this rank's residual. */
  readonly wire: GradientWire | undefined;
  /** This rank's encoded gradients of one group (compressed wire only). */
  readonly #sendWire: Uint16Array | undefined;
  /** Every rank's encoded gradients of one group, laid out as {@link #gathered} (compressed, averaging ranks). */
  readonly #gatheredWire: Uint16Array | undefined;
  /**
   * Master mode, rank 0: its gathers are `MPI_IN_PLACE`, so it sends itself nothing and averages its
   * own gradients where they are; and it posts the receives of {@link #earlyGroup} when a step starts.
   */
  readonly #root: boolean;
  /**
   * The group of the plan's first communication action where that is a reduce and no collective
   * can come before it in a step (no sharded groups, whose activations travel during compute).
   */
  readonly #earlyGroup: string | undefined;
  /** Gathers {@link beforeStep} posted for {@link #earlyGroup}, until its reduce takes them. */
  #posted: BulkRequest[] | undefined;

  private constructor(
    transport: MpiTransport,
    device: Device,
    layout: ParameterLayout,
    mode: ReductionMode,
    optimizer: ((parameters: ParameterEntry[]) => Optimizer) | undefined,
    timeoutMs: number,
    clockZero: number,
    chunkBytes: number,
    linkBytesPerSecond: number | undefined,
    wire: GradientWire | undefined,
    plan: Plan,
    sockets: SocketMesh | undefined,
  ) {
    this.transport = transport;
    this.sockets = sockets;
    this.#bulk = sockets ?? transport;
    this.#root = mode === "master" && transport.rank === 0;
    const first = plan.actions.find((a) => a.lane === "comm");
    this.#earlyGroup = this.#root && first?.kind === "reduce" && !plan.sharded?.length
      ? first.group
      : undefined;
    this.#chunkBytes = chunkBytes;
    this.#linkBytesPerSecond = linkBytesPerSecond;
    this.#device = device;
    this.local = [device];
    this.#layout = layout;
    this.#mode = mode;
    this.#timeoutMs = timeoutMs;
    this.#clockZero = clockZero;
    this.#averaged = optimizer ? sharedFloats(layout.total, this.#host) : undefined;
    const largestGroup = Math.max(...layout.groups.map((g) => g.size));
    this.#gathered = optimizer ? sharedFloats(transport.size * largestGroup, this.#host) : undefined;
    this.wire = wire;
    // In shared memory, which never moves while MPI reads and writes it.
    const halves = (n: number) => new Uint16Array(new SharedArrayBuffer(2 * n));
    this.#sendWire = wire ? halves(largestGroup) : undefined;
    this.#gatheredWire = wire && optimizer ? halves(transport.size * largestGroup) : undefined;
    const entries = hostParameterEntries(layout, device.parameters, this.#averaged, this.#host);
    this.parameterEntries = entries;
    this.optimizers = optimizer ? [optimizer(entries)] : [];
  }

  /**
   * Collective. Starts MPI if asked to, checks that every rank runs the same plan, mode and model,
   * starts this rank's device and gives it rank 0's initial parameters.
   */
  static async create(options: DataParallelOptions, reference: ReplicaReference): Promise<MpiExchange> {
    const mode = options.mode ?? "master";
    const transport = options.transport === true || options.transport === undefined
      ? MpiTransport.init(options.transportOptions)
      : options.transport;
    const { rank } = transport;
    const { layout, initial } = reference;
    const timeoutSeconds = options.timeoutSeconds ?? 120;
    const within = (): WaitOptions => ({ deadline: performance.now() + timeoutSeconds * 1000 });

    // Collectives pair buffers by call order: ranks running different plans or models would
    // exchange the wrong bytes silently, so they are compared before anything moves.
    const configuration = JSON.stringify({
      mode,
      wire: options.wire ?? "fp32",
      errorFeedback: options.errorFeedback ?? false,
      // Chunks must match between ranks: their maximum, and the link's rate where given.
      chunkBytes: options.chunkBytes ?? DEFAULT_CHUNK_BYTES,
      linkBytesPerSecond: options.linkBytesPerSecond ?? null,
      model: reference.modelName,
      plan: options.plan.actions.map(actionLabel),
      slots: layout.slots.map((s) => `${s.name}:${s.group}:${s.size}`),
      buffers: reference.buffers?.slots.map((s) => `${s.name}:${s.size}`) ?? [],
    });
    const configurations = await transport.allgatherJson(configuration, within(), "compare configurations");
    const differing = configurations.flatMap((c, r) => c === configurations[0] ? [] : [r]);
    if (differing.length) {
      throw new TransportError(
        rank,
        "compare configurations",
        `found that rank${differing.length > 1 ? "s" : ""} ${differing.join(", ")} run${
          differing.length > 1 ? "" : "s"
        } another plan, reduction mode, wire format, chunk size, link rate or model than rank 0`,
      );
    }

    let device: Device | undefined, startFailure: string | null = null;
    try {
      device = options.startDevice
        ? await options.startDevice(rank, options.model, layout, timeoutSeconds)
        : await CpuDevice.start(rank, options.model, layout, {
          timeoutSeconds,
          // The ranks on this host share its cores, as Worker devices in one process do.
          threads: options.deviceThreads ?? cpuThreadsPerRank(detectMpiLaunch()?.localSize ?? 1),
          nice: options.computeNice,
        });
      // The rank's device keeps its own statistics, starting from the reference's (then rank 0's).
      loadInitialBuffers([device], reference.buffers, reference.initialBuffers);
    } catch (error) {
      startFailure = (error as Error)?.message ?? String(error);
    }
    // Every rank learns whether every device started, so all fail together instead of waiting.
    const starts = await transport.allgatherJson(startFailure, within(), "start devices");
    const firstFailed = starts.findIndex((s) => s !== null);
    if (firstFailed >= 0) {
      await device?.close();
      const what = starts.flatMap((s, r) => s === null ? [] : [`rank ${r}: ${s}`]).join("; ");
      throw new DeviceError(firstFailed, `could not start on every rank (${what})`);
    }
    try {
      device!.parameters.set(initial);
      await transport.broadcast(device!.parameters, 0, "broadcast initial parameters").wait(within());
      if (device!.buffers) {
        await transport.broadcast(device!.buffers, 0, "broadcast initial statistics").wait(within());
      }
      // Rank 0 averages and updates in master mode; every rank does in allreduce mode.
      const updates = mode === "allreduce" || rank === 0;
      const sockets = (options.dataPlane ?? "sockets") === "sockets"
        ? await SocketMesh.open(transport, within())
        : undefined;
      // Master-mode chunks are sent back, and their size follows the link's rate: measured where
      // not given, and rank 0's for every rank (their chunks must match).
      const linkBytesPerSecond = mode === "master" && transport.size > 1
        ? options.linkBytesPerSecond ??
          (await measureLink(transport, {
            bytes: LINK_RATE_PROBE_BYTES,
            dataPlane: options.dataPlane,
            mesh: sockets,
            deadline: within().deadline,
          })).link.bandwidthBytesPerSecond
        : undefined;
      // The ranks' common zero for traces: the moment they leave a barrier together. Polled at full
      // speed, and twice over (the first gathers the ranks, the second starts them level), so that
      // no rank leaves it late by a sleep between polls: with 1 ms sleeps, rank 1's clock sat 2–5 ms
      // off rank 0's on 2 hosts, and its FC exchange spans looked shorter than the link allows.
      for (let round = 0; round < 2; round++) {
        await transport.barrier("synchronise clocks").wait({ ...within(), spin: true });
      }
      const clockZero = performance.now();
      return new MpiExchange(
        transport,
        device!,
        layout,
        mode,
        updates ? options.optimizer : undefined,
        timeoutSeconds * 1000,
        clockZero,
        options.chunkBytes ?? DEFAULT_CHUNK_BYTES,
        linkBytesPerSecond,
        GradientWire.create(options, layout.total, [rank]),
        options.plan,
        sockets,
      );
    } catch (error) {
      await device!.close();
      throw error;
    }
  }

  get rank(): number {
    return this.transport.rank;
  }

  get size(): number {
    return this.transport.size;
  }

  #wait(context: ExchangeContext, what: string): WaitOptions {
    // Named if mpirun stops this rank mid-step (see MpiTransportOptions.reportTermination).
    this.transport.activity = `${what} (step ${context.iteration})`;
    // While the device computes, waits leave the CPU to it; afterwards they may poll at full speed.
    return {
      deadline: context.deadline,
      since: context.started,
      step: context.iteration,
      shareCpu: () => context.computing(),
    };
  }

  /**
   * Rank 0 (master mode) posts the receives of the plan's first reduce before any gradient exists.
   * Peers often finish their backward first; without a posted receive their messages wait in MPI's
   * buffers for unexpected messages, which rank 0 then copies out while it posts, on the thread that
   * averages and updates (on 2 namespaces over 10 Gbit/s: 15–43 ms of a 66.5 MB exchange's 150 ms).
   */
  beforeStep(): Promise<void> {
    if (this.#earlyGroup !== undefined && !this.#posted) this.#posted = this.#gathers(this.#earlyGroup);
    return Promise.resolve();
  }

  /**
   * Posts `group`'s gathers, one per message. Rank 0 in master mode gathers in place (it reads no
   * gradients, so it may post before they are final); every other rank sends its gradients now,
   * encoded first under a compressed wire.
   */
  #gathers(group: string): BulkRequest[] {
    const bulk = this.#bulk, wire = this.wire;
    const base = groupRange(this.#layout, group).offset;
    const operation = `reduce ${group}`;
    return this.#messages(group).map((m) => {
      const gradients = this.#device.gradients.subarray(m.offset, m.offset + m.size);
      // A compressed wire sends each message's gradients encoded (as bytes) and gathers them encoded.
      const encoded = wire ? this.#sendWire!.subarray(m.offset - base, m.offset - base + m.size) : undefined;
      if (wire && !this.#root) wire.encode(this.rank, m.offset, gradients, encoded!);
      const send = encoded ? bytesOf(encoded) : gradients;
      const gatheredWire = this.#block(this.#gatheredWire, m, base);
      const receive = wire ? gatheredWire && bytesOf(gatheredWire) : this.#block(this.#gathered, m, base);
      return this.#mode === "master"
        ? bulk.gather(send, receive, 0, operation, { inPlace: true })
        : bulk.allgather(send, receive!, operation);
    });
  }

  /**
   * Message `m`'s part of a gathered buffer (`#gathered`, `#gatheredWire`): every rank's values of
   * it, in rank order, at n · (m.offset − base); `undefined` where the buffer is.
   */
  #block<T extends Float32Array | Uint16Array>(buffer: T | undefined, m: Piece, base: number): T | undefined {
    const at = this.size * (m.offset - base);
    return buffer?.subarray(at, at + this.size * m.size) as T | undefined;
  }

  async reduce(group: string, context: ExchangeContext): Promise<void> {
    await this.pipeline(group, { broadcast: false }, context);
  }

  async broadcast(group: string, context: ExchangeContext): Promise<boolean> {
    if (this.#mode !== "master") return false;
    const wait = this.#wait(context, `broadcast ${group}`);
    const requests = this.#messages(group).map((m) =>
      this.#bulk.broadcast(
        this.#device.parameters.subarray(m.offset, m.offset + m.size),
        0,
        `broadcast ${group}`,
      )
    );
    for (const request of requests) await request.wait(wait);
    return true;
  }

  /**
   * `group`'s gradients as messages small enough to travel eagerly, every one posted at once so the
   * link never idles between them. As each chunk ({@link #chunkOf}) has arrived it is averaged in rank
   * order, then (where `update` is given) that part of the group updated, and (master mode,
   * `broadcast`) its new parameters sent back while later chunks are still coming in — both
   * directions of the link busy at once.
   */
  async pipeline(
    group: string,
    options: { update?: (range: { start: number; end: number }) => void; broadcast: boolean },
    context: ExchangeContext,
  ): Promise<PipelineSpans> {
    const n = this.size, bulk = this.#bulk;
    const wait = this.#wait(context, `reduce ${group}`);
    const messages = this.#messages(group);
    const base = groupRange(this.#layout, group).offset;
    const gathered = this.#gathered;
    const target = (m: Piece) => this.#block(gathered, m, base);
    const gradients = (m: Piece) => this.#device.gradients.subarray(m.offset, m.offset + m.size);
    const parameters = (m: Piece) => this.#device.parameters.subarray(m.offset, m.offset + m.size);
    const spans: PipelineSpans = { reduce: [performance.now(), 0] };
    const wire = this.wire;
    const encodedTarget = (m: Piece) => this.#block(this.#gatheredWire, m, base);
    const early = group === this.#earlyGroup ? this.#posted : undefined;
    if (early) this.#posted = undefined;
    const gathers = early ?? this.#gathers(group);
    let sent = spans.reduce[0];
    const broadcasting = options.broadcast && this.#mode === "master";
    // Peers post every receive now; the master sends each chunk once it is updated. Collectives pair
    // up by posting order, which is the same on every rank: all the gathers, then the broadcasts.
    const broadcasts = broadcasting && this.rank !== 0
      ? messages.map((m) => bulk.broadcast(parameters(m), 0, `broadcast ${group}`))
      : [];
    const perChunk = Math.max(1, Math.round(this.#chunkOf(group) / this.#messageBytes(group)));
    for (let first = 0; first < messages.length; first += perChunk) {
      const chunk = messages.slice(first, first + perChunk);
      for (let k = first; k < first + chunk.length; k++) await gathers[k].wait(wait);
      sent = performance.now();
      if (!gathered) continue;
      for (const m of chunk) {
        const all = target(m)!;
        // In place, rank 0's own block is still empty: encoded there now, or (fp32) read where it is.
        if (wire && this.#root) {
          wire.encode(this.rank, m.offset, gradients(m), encodedTarget(m)!.subarray(0, m.size));
        }
        if (wire) wire.decode(encodedTarget(m)!, all);
        const inputs = Array.from({ length: n }, (_, r) => all.subarray(r * m.size, (r + 1) * m.size));
        if (this.#root && !wire) inputs[0] = gradients(m);
        averageInDeviceOrder(inputs, this.#averaged!.subarray(m.offset, m.offset + m.size), this.#host);
      }
      spans.reduce[1] = performance.now();
      const last = chunk[chunk.length - 1];
      if (options.update) {
        const start = performance.now();
        options.update({ start: chunk[0].offset - base, end: last.offset + last.size - base });
        spans.update ??= [start, 0];
        spans.update[1] = performance.now();
      }
      if (broadcasting) {
        spans.broadcast ??= [performance.now(), 0];
        for (const m of chunk) broadcasts.push(bulk.broadcast(parameters(m), 0, `broadcast ${group}`));
      }
    }
    if (!spans.reduce[1]) spans.reduce[1] = performance.now();
    // What this rank put on the network for the group: half the bytes under a 16-bit wire.
    const size = groupRange(this.#layout, group).size;
    context.record(
      this.rank,
      `send ${group} gradients`,
      spans.reduce[0],
      sent,
      wire ? wire.bytes(size) : 4 * size,
    );
    if (broadcasting) {
      spans.broadcast ??= [performance.now(), 0];
      const received = this.#wait(context, `broadcast ${group}`);
      for (const request of broadcasts) await request.wait(received);
      spans.broadcast[1] = performance.now();
    }
    return spans;
  }

  /**
   * Bytes of one of `group`'s messages: a whole chunk over sockets; through MPI, as large as still
   * goes out without a handshake ({@link eagerMessageBytes}; larger ones stall a broadcast behind the gathers —
   * measured on a 1 Gbit/s link, 256 KiB messages over the default 64 KiB limit ran master mode at
   * 47% of the link), or a whole chunk where chunks are smaller.
   */
  #messageBytes(group: string): number {
    const chunk = this.#chunkOf(group);
    return this.sockets ? chunk : Math.min(eagerMessageBytes(), chunk);
  }

  /**
   * Bytes of `group`'s chunks (as float32): in master mode a 32nd of it within bounds, at least 1 ms
   * on the link; in allreduce mode, where nothing is sent back, the maximum ({@link pipelineChunkBytes}).
   */
  #chunkOf(group: string): number {
    return pipelineChunkBytes(
      4 * groupRange(this.#layout, group).size,
      this.#chunkBytes,
      this.#mode,
      this.#linkBytesPerSecond,
    );
  }

  /** `group`'s flat range in messages. */
  #messages(group: string): Piece[] {
    const { offset, size } = groupRange(this.#layout, group);
    const step = Math.max(1, Math.floor(this.#messageBytes(group) / 4));
    const pieces: Piece[] = [];
    for (let at = 0; at < size; at += step) {
      pieces.push({ offset: offset + at, size: Math.min(step, size - at) });
    }
    return pieces;
  }

  /** Every rank's loss and counts, combined in rank order as one process combines its devices'. */
  async combine(results: readonly ComputeResult[], context: ExchangeContext): Promise<CombinedResult> {
    const [result] = results;
    const n = this.size;
    const mine = new Float64Array(new SharedArrayBuffer(24));
    mine.set([result.loss, result.correct, result.count]);
    const all = new Float64Array(new SharedArrayBuffer(24 * n));
    await this.transport.allgather(mine, all, "share step results").wait(
      this.#wait(context, "share step results"),
    );
    this.transport.activity = undefined;
    let loss = 0, correct = 0, count = 0;
    for (let r = 0; r < n; r++) {
      loss += all[3 * r];
      correct += all[3 * r + 1];
      count += all[3 * r + 2];
    }
    return { loss: loss / n, correct, count };
  }

  /**
   * Collective. Sends rank 0's parameters, buffers (BatchNorm statistics, where the model has any)
   * and iteration, and in `allreduce` mode (where every rank updates) its optimizer state, to every
   * rank: after loading a checkpoint on rank 0.
   */
  async broadcastParameters(iteration: number): Promise<number> {
    const wait = { deadline: performance.now() + this.#timeoutMs };
    const transport = this.transport;
    await transport.broadcast(this.#device.parameters, 0, "broadcast parameters").wait(wait);
    const buffers = this.#device.buffers;
    if (buffers) await transport.broadcast(buffers, 0, "broadcast statistics").wait(wait);
    if (this.#mode === "master") {
      return await transport.broadcastJson(iteration, 0, wait, "broadcast iteration");
    }
    // allreduce: every optimizer must continue from rank 0's state (momentum, counts, iteration).
    const [optimizer] = this.optimizers;
    const packed = this.rank === 0
      ? await packOptimizerState(optimizer.state(), (n) => sharedFloats(n, this.#host))
      : undefined;
    const header = await transport.broadcastJson(
      packed?.header ?? null,
      0,
      wait,
      "broadcast optimizer state",
    );
    const values = packed?.values ?? sharedFloats(header!.total, this.#host);
    await transport.broadcast(values, 0, "broadcast optimizer state").wait(wait);
    if (this.rank !== 0) {
      const state = unpackOptimizerState(header!, values, optimizer.parameters);
      try {
        optimizer.loadState(state);
      } finally {
        disposeOptimizerState(state);
      }
    }
    return header!.iteration;
  }

  syncParameters(): Promise<void> {
    return Promise.resolve();
  }

  /**
   * Collective. With error feedback, rank 0 receives every rank's residual (`MPI_Igather`), as
   * checkpoints need; `undefined` elsewhere and without error feedback (the same on every rank: the
   * ranks were checked to run the same wire options).
   */
  async gatherResiduals(): Promise<Float32Array[] | undefined> {
    const wire = this.wire;
    if (!wire?.errorFeedback) return undefined;
    const total = this.#layout.total, size = this.transport.size;
    const own = sharedFloats(total, this.#host);
    own.set(wire.residual(this.rank));
    const all = this.rank === 0 ? sharedFloats(size * total, this.#host) : undefined;
    await this.transport.gather(own, all, 0, "gather residuals").wait({
      deadline: performance.now() + this.#timeoutMs,
    });
    return all && Array.from({ length: size }, (_, r) => all.slice(r * total, (r + 1) * total));
  }

  /**
   * Collective. With error feedback, rank r's residual becomes rank 0's `residuals[r]` (one
   * broadcast of them all, after loading a checkpoint), or zeros where rank 0 passes none.
   */
  async scatterResiduals(residuals: readonly Float32Array[] | undefined): Promise<void> {
    const wire = this.wire;
    if (!wire?.errorFeedback) return;
    const wait = { deadline: performance.now() + this.#timeoutMs };
    const total = this.#layout.total, size = this.transport.size;
    const given = await this.transport.broadcastJson(
      this.rank === 0 && residuals !== undefined,
      0,
      wait,
      "broadcast residuals",
    );
    if (!given) return wire.loadResidual(this.rank, undefined);
    const all = sharedFloats(size * total, this.#host);
    if (this.rank === 0) residuals!.forEach((r, d) => all.set(r, d * total));
    await this.transport.broadcast(all, 0, "broadcast residuals").wait(wait);
    wire.loadResidual(this.rank, all.subarray(this.rank * total, (this.rank + 1) * total));
  }

  masterParameters(): Float32Array {
    return this.#device.parameters.slice();
  }

  /** Collective: ranks whose parameters' SHA-256 differs from rank 0's, the same answer everywhere. */
  divergentReplicas(): Promise<number[]> {
    return divergentRanks(this.transport, this.#device.parameters, this.#timeoutMs, "compare replicas");
  }

  /**
   * Collective. Sends every rank's recorded spans to rank 0, whose `trace` then holds every rank's
   * lanes (device = rank), on rank 0's clock. The other ranks' recorders keep their own spans.
   */
  async gatherTrace(trace: TraceRecorder | undefined): Promise<void> {
    const own: TraceSpan[] = (trace?.spans ?? []).filter((s) => s.device === this.rank)
      .map((s) => ({ ...s, start: s.start - this.#clockZero, end: s.end - this.#clockZero }));
    const parts = await this.transport.gatherBytes(
      new TextEncoder().encode(JSON.stringify(own)),
      0,
      { deadline: performance.now() + this.#timeoutMs },
      "gather traces",
    );
    if (!parts || !trace) return;
    for (const [r, part] of parts.entries()) {
      if (r === this.rank) continue;
      for (const s of JSON.parse(new TextDecoder().decode(part)) as TraceSpan[]) {
        trace.record({ ...s, start: s.start + this.#clockZero, end: s.end + this.#clockZero });
      }
    }
  }

  /** Stops this rank's device. MPI stays up: call `transport.finalize()` when the process is done. */
  async close(): Promise<void> {
    this.sockets?.close();
    await this.#device.close();
  }

  free(): void {
    freeHostExchange(this.optimizers, [this.#device], [this.#averaged, this.#gathered]);
  }
}

/**
 * Collective: the ranks whose `values` differ in any bit from rank 0's, the same answer on every rank
 * (each rank sends a SHA-256 of its values, not the values).
 *
 * @example
 * ```ts
 * import { divergentRanks } from "./exchange.ts";
 * // await divergentRanks(transport, device.parameters, 60_000, "compare replicas"); // [] when they agree
 * ```
 */
export async function divergentRanks(
  transport: MpiTransport,
  values: Float32Array,
  timeoutMs: number,
  operation: string,
): Promise<number[]> {
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", values.slice()));
  const hex = Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
  const all = await transport.allgatherJson(hex, { deadline: performance.now() + timeoutMs }, operation);
  return all.flatMap((h, r) => h === all[0] ? [] : [r]);
}
