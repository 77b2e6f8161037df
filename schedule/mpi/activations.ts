/**
 * Hybrid schedules across MPI ranks: how activations move between the ranks' devices, one device
 * per rank (see `runtime/hybrid.ts` and `devices/sharded_head.ts`).
 *
 * - The body's output rows: `MPI_Iallgather` straight into every rank's `inputs[0]`.
 * - A head layer's output columns: each rank packs its columns (padded to the widest slice, since
 *   `MPI_Iallgather` moves equal blocks) and unpacks the others' into `inputs[s + 1]`.
 * - A head layer's partial input gradients: `MPI_Ialltoall` sends rank e just the part it sums —
 *   its columns of the layer below, or its shard's rows for the body — so each rank receives
 *   (N−1)/N of a partial, not N−1 whole ones. The rank then sums the N parts in rank order from the
 *   receive buffer, the same values in the same order as devices sharing memory: a hybrid run gives
 *   the same bits in one process and across ranks.
 *
 * @module
 */

import { TandemError } from "../../engine/mod.ts";
import type { Device } from "../devices/device.ts";
import type { ParameterLayout } from "../devices/parameter_layout.ts";
import { type HeadLayout, unitRange } from "../devices/head_layout.ts";
import type { HeadSetup, SumSource } from "../devices/sharded_head.ts";
import { type ActivationRoute, bodyRanges, type RecordSpan } from "../runtime/hybrid.ts";
import { divergentRanks } from "./exchange.ts";
import type { MpiRequest } from "./request.ts";
import type { MpiTransport } from "./transport.ts";

/** This rank's buffers for one global batch size. */
interface Buffers {
  batch: number;
  inputs: Float32Array[];
  partials: Float32Array[];
  /** This rank's rows of the body's output, the send side of the row all-gather. */
  rows: Float32Array;
  /** Per stage: this rank's output columns packed, and every rank's. */
  columns: { send: Float32Array; receive: Float32Array; width: number }[];
  /**
   * Per stage s: the all-to-all of its partial input gradient, blocks for each rank in rank order;
   * for s = 0 the partial itself is the send side (its rows are the ranks' shards, in order).
   */
  scatters: { send: Float32Array; receive: Float32Array; width: number }[];
}

/**
 * The {@link ActivationRoute} of one device per MPI rank.
 *
 * @example
 * ```ts
 * import { MpiActivations } from "./activations.ts";
 * // new HybridHead(head, exchange.local, layout, optimizer, new MpiActivations(transport, head, 120));
 * ```
 */
export class MpiActivations implements ActivationRoute {
  readonly size: number;
  readonly #transport: MpiTransport;
  readonly #head: HeadLayout;
  readonly #timeoutMs: number;
  #buffers: Buffers | undefined;

  /** The route of this rank's device; collectives fail after `timeoutSeconds`. */
  constructor(transport: MpiTransport, head: HeadLayout, timeoutSeconds: number) {
    this.size = transport.size;
    this.#transport = transport;
    this.#head = head;
    this.#timeoutMs = timeoutSeconds * 1000;
  }

  setup(batch: number): HeadSetup[] {
    const stages = this.#head.stages, n = this.size, rank = this.#transport.rank;
    const shared = (length: number) => new Float32Array(new SharedArrayBuffer(4 * length));
    const widest = (units: number) =>
      Math.max(...Array.from({ length: n }, (_, e) => unitRange(units, n, e)).map((r) => r.end - r.start));
    const shard = batch / n, features = stages[0].inFeatures;
    const columns = stages.map((s) => {
      const width = widest(s.units);
      return { send: shared(batch * width), receive: shared(n * batch * width), width };
    });
    const scatters = stages.map((_, i) => {
      if (i === 0) return { send: new Float32Array(0), receive: shared(batch * features), width: features };
      const width = widest(stages[i - 1].units);
      return { send: shared(n * batch * width), receive: shared(n * batch * width), width };
    });
    const buffers: Buffers = {
      batch,
      inputs: [...stages.map((s) => shared(batch * s.inFeatures)), shared(batch * stages.at(-1)!.units)],
      partials: stages.map((s) => shared(batch * s.inFeatures)),
      rows: shared(shard * features),
      columns,
      scatters,
    };
    this.#buffers = buffers;
    const seeds: SumSource[][] = stages.map((_, s) => {
      if (s === stages.length - 1) return [];
      const { receive, width } = scatters[s + 1];
      return Array.from(
        { length: n },
        (_, e) => ({ values: receive, stride: width, offset: e * batch * width }),
      );
    });
    seeds.push(
      Array.from({ length: n }, (_, e) => ({
        values: scatters[0].receive,
        stride: features,
        offset: e * shard * features,
      })),
    );
    return [{
      head: this.#head,
      device: rank,
      batch,
      inputs: buffers.inputs,
      partials: buffers.partials,
      seeds,
    }];
  }

  async gatherRows(record: RecordSpan): Promise<void> {
    const b = this.#ready(), stage = this.#head.stages[0], rank = this.#transport.rank;
    const start = performance.now();
    b.rows.set(b.inputs[0].subarray(rank * b.rows.length, (rank + 1) * b.rows.length));
    await this.#wait(this.#transport.allgather(b.rows, b.inputs[0], `gather ${stage.linear} input`));
    record(
      rank,
      `gather ${stage.linear} input`,
      start,
      performance.now(),
      (this.size - 1) * b.rows.byteLength,
    );
  }

  async gatherColumns(stage: number, record: RecordSpan): Promise<void> {
    const b = this.#ready(), { linear, units } = this.#head.stages[stage];
    const n = this.size, rank = this.#transport.rank, batch = b.batch;
    const { send, receive, width } = b.columns[stage];
    const target = b.inputs[stage + 1];
    const start = performance.now();
    const own = unitRange(units, n, rank);
    for (let r = 0; r < batch; r++) {
      send.set(target.subarray(r * units + own.start, r * units + own.end), r * width);
    }
    await this.#wait(this.#transport.allgather(send, receive, `gather ${linear} output`));
    for (let e = 0; e < n; e++) {
      if (e === rank) continue;
      const { start: from, end } = unitRange(units, n, e);
      for (let r = 0; r < batch; r++) {
        const at = (e * batch + r) * width;
        target.set(receive.subarray(at, at + end - from), r * units + from);
      }
    }
    record(rank, `gather ${linear} output`, start, performance.now(), (n - 1) * send.byteLength);
  }

  async scatter(stage: number, record: RecordSpan): Promise<void> {
    const b = this.#ready(), stages = this.#head.stages, { linear, inFeatures } = stages[stage];
    const n = this.size, rank = this.#transport.rank, batch = b.batch;
    const { send, receive, width } = b.scatters[stage];
    const partial = b.partials[stage];
    const name = `scatter ${linear} input gradients`;
    const start = performance.now();
    if (stage === 0) {
      await this.#wait(this.#transport.alltoall(partial, receive, name));
    } else {
      // Rank e gets the columns of its units of the layer below, every row.
      const units = stages[stage - 1].units;
      for (let e = 0; e < n; e++) {
        const { start: from, end } = unitRange(units, n, e);
        for (let r = 0; r < batch; r++) {
          send.set(partial.subarray(r * inFeatures + from, r * inFeatures + end), (e * batch + r) * width);
        }
      }
      await this.#wait(this.#transport.alltoall(send, receive, name));
    }
    record(rank, name, start, performance.now(), ((n - 1) * receive.byteLength) / n);
  }

  async collect(own: readonly Float32Array[]): Promise<Float32Array[] | undefined> {
    const bytes = own[0];
    const parts = await this.#transport.gatherBytes(
      new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength),
      0,
      { deadline: performance.now() + this.#timeoutMs },
      "gather the head's slices",
    );
    return parts?.map((p) => new Float32Array(p.buffer, p.byteOffset, p.byteLength / 4));
  }

  async share(values: Float32Array | undefined): Promise<Float32Array> {
    const bytes = values && new Uint8Array(values.buffer, values.byteOffset, values.byteLength);
    const out = await this.#transport.broadcastBytes(
      bytes,
      0,
      { deadline: performance.now() + this.#timeoutMs },
      "share the head's state",
    );
    return new Float32Array(out.buffer, out.byteOffset, out.byteLength / 4);
  }

  divergentBodies(local: readonly Device[], layout: ParameterLayout): Promise<number[]> {
    const parameters = local[0].parameters, body = bodyRanges(layout, this.#head);
    const values = new Float32Array(body.reduce((n, g) => n + g.size, 0));
    let at = 0;
    for (const g of body) {
      values.set(parameters.subarray(g.offset, g.offset + g.size), at);
      at += g.size;
    }
    return divergentRanks(this.#transport, values, this.#timeoutMs, "compare the bodies");
  }

  #ready(): Buffers {
    if (!this.#buffers) {
      throw new TandemError("hybrid schedule: activations moved before the route was set up");
    }
    return this.#buffers;
  }

  async #wait(request: MpiRequest): Promise<void> {
    // The devices wait on it with nothing else to do: poll without sleeping (see `WaitOptions.spin`).
    await request.wait({ deadline: performance.now() + this.#timeoutMs, spin: true });
  }
}
