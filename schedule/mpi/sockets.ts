/**
 * The exchange's bulk data between ranks over direct TCP connections, one per pair of ranks, opened
 * through MPI when training starts: gradients and parameters go straight from one rank's memory into
 * the kernel's socket and out into the peer's, as gloo and NCCL move theirs, while MPI keeps the
 * launch, the small collectives (configurations, losses, traces) and failure handling.
 *
 * Why: Open MPI's TCP transport moves an eager message through its own fragment buffers, a copy
 * more on each side, and on a host whose cores also run the network stack that copy is the
 * bottleneck. Measured on one 2-core machine, 2 network namespaces over a 10 Gbit/s link: a 66.5 MB
 * pipelined master exchange ran at 3.2–3.7 Gbit/s through MPI, while two plain sockets carried the
 * same bytes there and back at 5.2–5.5 Gbit/s per direction, both cores 86–95% busy (one direction
 * alone: 9.3–9.5 Gbit/s).
 *
 * {@link SocketMesh} offers the three collectives the exchange needs — gather, all-gather and
 * broadcast — with MPI's semantics and {@link TransportError}s on failure. Messages between two ranks
 * pair up in posting order, one queue per direction, as MPI's collectives pair up in call order; a
 * peer that dies closes its sockets, so a wait fails at once instead of at its deadline.
 *
 * @module
 */

import { TransportError, type WaitOptions } from "./request.ts";
import type { MpiBuffer, MpiTransport } from "./transport.ts";

/** A posted transfer: await {@link BulkRequest.wait} before touching its buffers. */
export interface BulkRequest {
  /** What was posted, for messages. */
  readonly operation: string;
  /** Resolves once this rank's part is done; throws a {@link TransportError} on failure or deadline. */
  wait(options?: WaitOptions): Promise<void>;
}

/** The collectives the exchange moves gradients and parameters with (MPI's, or {@link SocketMesh}'s). */
export interface BulkCollectives {
  /** `root` receives every rank's `send` in rank order in `receive` (in place: its own block untouched). */
  gather(
    send: MpiBuffer,
    receive: MpiBuffer | undefined,
    root: number,
    operation: string,
    options?: { inPlace?: boolean },
  ): BulkRequest;
  /** Every rank receives every rank's `send`, in rank order, in `receive`. */
  allgather(send: MpiBuffer, receive: MpiBuffer, operation: string): BulkRequest;
  /** `root`'s `buffer` is copied into every other rank's `buffer`. */
  broadcast(buffer: MpiBuffer, root: number, operation: string): BulkRequest;
}

/** How the exchange moves gradients and parameters between ranks. */
export type DataPlane = "sockets" | "mpi";

/** The bytes of a typed array, as a view of the same memory (to send any values as `MPI_BYTE`s). */
export function bytesOf(values: ArrayBufferView): Uint8Array {
  return new Uint8Array(values.buffer, values.byteOffset, values.byteLength);
}

/** Why a connection's transfer failed, for the error of every request that needed it. */
class LinkFailure extends Error {}

async function readFully(connection: Deno.Conn, into: Uint8Array, peer: number): Promise<void> {
  for (let got = 0; got < into.length;) {
    let n: number | null;
    try {
      n = await connection.read(into.subarray(got));
    } catch (error) {
      throw new LinkFailure(`lost its connection to rank ${peer} (${(error as Error).message})`);
    }
    if (n === null) {
      throw new LinkFailure(
        `lost its connection to rank ${peer} (closed after ${got} of ${into.length} bytes)`,
      );
    }
    got += n;
  }
}

async function writeFully(connection: Deno.Conn, data: Uint8Array, peer: number): Promise<void> {
  try {
    for (let written = 0; written < data.length;) written += await connection.write(data.subarray(written));
  } catch (error) {
    throw new LinkFailure(`lost its connection to rank ${peer} (${(error as Error).message})`);
  }
}

/** One rank's part of a collective: every transfer it posted, done when all are. */
class SocketRequest implements BulkRequest {
  readonly operation: string;
  readonly #mesh: SocketMesh;
  readonly #done: Promise<void>;
  #failure: LinkFailure | undefined;
  #settled = false;

  constructor(mesh: SocketMesh, operation: string, parts: Promise<void>[]) {
    this.#mesh = mesh;
    this.operation = `${operation} (sockets)`;
    this.#done = Promise.all(parts).then(
      () => {
        this.#settled = true;
      },
      (error) => {
        this.#settled = true;
        this.#failure = error instanceof LinkFailure ? error : new LinkFailure(String(error));
      },
    );
  }

  async wait(options: WaitOptions = {}): Promise<void> {
    const started = performance.now();
    if (!this.#settled) {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const late = options.deadline === undefined ? undefined : new Promise<"late">((resolve) => {
        timer = setTimeout(() => resolve("late"), Math.max(0, options.deadline! - performance.now()));
      });
      try {
        if ((await (late ? Promise.race([this.#done, late]) : this.#done)) === "late" && !this.#settled) {
          throw this.#mesh.fail(
            this.operation,
            `did not complete within ${
              ((performance.now() - (options.since ?? started)) / 1000).toFixed(1)
            } s: another rank stopped taking part (it died, hangs, or runs a different schedule)`,
            options.step,
          );
        }
      } finally {
        clearTimeout(timer);
      }
    }
    if (this.#failure) throw this.#mesh.fail(this.operation, this.#failure.message, options.step);
  }
}

/** One direction of one connection: transfers run one after another, in posting order. */
class Queue {
  #tail: Promise<void> = Promise.resolve();

  push(transfer: () => Promise<void>): Promise<void> {
    const next = this.#tail.then(transfer);
    // A failed transfer fails those queued behind it too (the stream's position is lost).
    this.#tail = next;
    next.catch(() => {});
    return next;
  }
}

/** A connection to one peer and its two queues. */
interface Link {
  readonly connection: Deno.TcpConn;
  readonly sends: Queue;
  readonly receives: Queue;
}

/** Bytes of the greeting a connecting rank sends: the job's token (8) and its rank (4). */
const HELLO_BYTES = 12;

/**
 * The IPv4 addresses this rank may be reached at, best first: those inside a subnet Open MPI was
 * told to use (`btl_tcp_if_include` as `a.b.c.d/n`), then the other non-loopback ones, then
 * loopback (which only a rank on the same host can use).
 */
export function reachableAddresses(
  interfaces: readonly Deno.NetworkInterfaceInfo[] = Deno.networkInterfaces(),
  include: string | undefined = Deno.env.get("OMPI_MCA_btl_tcp_if_include"),
): string[] {
  const v4 = [...new Set(interfaces.filter((i) => i.family === "IPv4").map((i) => i.address))];
  const toNumber = (a: string) => a.split(".").reduce((n, part) => n * 256 + Number(part), 0);
  const subnets = (include ?? "").split(",").flatMap((s) => {
    const match = /^(\d+\.\d+\.\d+\.\d+)\/(\d+)$/.exec(s.trim());
    return match ? [{ base: toNumber(match[1]), bits: Number(match[2]) }] : [];
  });
  const inSubnet = (a: string) =>
    subnets.some(({ base, bits }) => {
      const shift = 32 - bits;
      return bits === 0 || Math.floor(toNumber(a) / 2 ** shift) === Math.floor(base / 2 ** shift);
    });
  const loopback = (a: string) => a.startsWith("127.");
  return [
    ...v4.filter((a) => !loopback(a) && inSubnet(a)),
    ...v4.filter((a) => !loopback(a) && !inSubnet(a)),
    ...v4.filter(loopback),
  ];
}

/** What each rank tells the others when the mesh opens. */
interface Contact {
  host: string;
  addresses: string[];
  port: number;
  token: string;
}

/**
 * Direct TCP connections between every pair of ranks; see the module notes.
 *
 * @example
 * ```ts ignore
 * // Run as: mpirun -np 2 deno run -A script.ts
 * import { MpiTransport } from "./transport.ts";
 * import { SocketMesh } from "./sockets.ts";
 * const mpi = MpiTransport.init();
 * const mesh = await SocketMesh.open(mpi, { deadline: performance.now() + 30_000 });
 * const data = new Float32Array(new SharedArrayBuffer(4 << 20)).fill(mpi.rank);
 * await mesh.broadcast(data, 0, "parameters").wait({ deadline: performance.now() + 30_000 });
 * mesh.close();
 * ```
 */
export class SocketMesh implements BulkCollectives {
  /** This rank (MPI's). */
  readonly rank: number;
  /** Number of ranks. */
  readonly size: number;
  readonly #transport: MpiTransport;
  /** Connection to each peer (`undefined` at this rank's own index). */
  readonly #links: readonly (Link | undefined)[];

  private constructor(transport: MpiTransport, links: (Link | undefined)[]) {
    this.#transport = transport;
    this.rank = transport.rank;
    this.size = transport.size;
    this.#links = links;
  }

  /**
   * Collective. Every rank listens on a free port, the ranks share their addresses through MPI, and
   * each rank connects to every lower rank (greeting with the job's token and its rank, answered
   * with one byte), so each pair holds one connection. Throws a {@link TransportError} naming the
   * peer and the addresses tried when one cannot be reached.
   */
  static async open(transport: MpiTransport, options: WaitOptions = {}): Promise<SocketMesh> {
    const { rank, size } = transport;
    const operation = "open sockets";
    const listener = Deno.listen({ hostname: "0.0.0.0", port: 0, transport: "tcp" });
    const links: (Link | undefined)[] = new Array(size).fill(undefined);
    const link = (connection: Deno.TcpConn): Link => {
      connection.setNoDelay(true);
      return { connection, sends: new Queue(), receives: new Queue() };
    };
    try {
      const token = Array.from(
        crypto.getRandomValues(new Uint8Array(8)),
        (b) => b.toString(16).padStart(2, "0"),
      )
        .join("");
      const own: Contact = {
        host: Deno.hostname(),
        addresses: reachableAddresses(),
        port: listener.addr.port,
        token,
      };
      const contacts = await transport.allgatherJson(own, options, `${operation} (addresses)`);
      const jobToken = contacts[0].token;
      const greeting = (r: number) => {
        const hello = new Uint8Array(HELLO_BYTES);
        for (let i = 0; i < 8; i++) hello[i] = parseInt(jobToken.slice(2 * i, 2 * i + 2), 16);
        new DataView(hello.buffer).setUint32(8, r, true);
        return hello;
      };
      const expected = greeting(0).subarray(0, 8);
      const remaining = () =>
        Math.max(1, (options.deadline ?? performance.now() + 60_000) - performance.now());
      const accepting = (async () => {
        let pending = size - 1 - rank;
        while (pending > 0) {
          const connection = await listener.accept();
          const hello = new Uint8Array(HELLO_BYTES);
          try {
            await withTimeout(readFully(connection, hello, -1), 5_000);
          } catch {
            connection.close();
            continue;
          }
          const peer = new DataView(hello.buffer).getUint32(8, true);
          if (
            hello.subarray(0, 8).some((b, i) => b !== expected[i]) || peer <= rank || peer >= size ||
            links[peer]
          ) {
            connection.close(); // not one of this job's ranks, or a duplicate
            continue;
          }
          await writeFully(connection, new Uint8Array([1]), peer);
          links[peer] = link(connection);
          pending--;
        }
      })();
      // Handled below; a failure before then (listener closed) must not surface as unhandled.
      accepting.catch(() => {});
      for (let peer = 0; peer < rank; peer++) {
        const contact = contacts[peer];
        // Loopback reaches only a rank on this host.
        const candidates = contact.addresses.filter((a) =>
          !a.startsWith("127.") || contact.host === own.host
        );
        const tried: string[] = [];
        for (const address of candidates) {
          tried.push(address);
          try {
            const connection = await withTimeout(
              Deno.connect({ hostname: address, port: contact.port }),
              Math.min(5_000, remaining()),
            );
            try {
              await writeFully(connection, greeting(rank), peer);
              const ack = new Uint8Array(1);
              await withTimeout(readFully(connection, ack, peer), Math.min(5_000, remaining()));
              links[peer] = link(connection);
              break;
            } catch {
              connection.close();
            }
          } catch {
            // Next address.
          }
        }
        if (!links[peer]) {
          throw new TransportError(
            rank,
            operation,
            `could not reach rank ${peer} on ${tried.join(", ") || "no address"} port ${contact.port} ` +
              `(a firewall, or no route between the hosts; dataPlane "mpi" sends everything through MPI)`,
          );
        }
      }
      const late = await withTimeout(accepting.then(() => false), remaining()).catch(() => true);
      if (late) {
        throw new TransportError(
          rank,
          operation,
          `was not reached by rank${size - rank > 2 ? "s" : ""} ${
            links.flatMap((l, r) => (r > rank && !l ? [r] : [])).join(", ")
          } in time`,
        );
      }
      await transport.barrier(`${operation} (ready)`).wait(options);
      return new SocketMesh(transport, links);
    } catch (error) {
      for (const l of links) l?.connection.close();
      throw error;
    } finally {
      listener.close();
    }
  }

  /**
   * A {@link TransportError} for `operation` (the step named when given), after which the MPI
   * transport refuses further collectives too: the job cannot continue in step.
   */
  fail(operation: string, reason: string, step?: number): TransportError {
    const error = new TransportError(this.rank, operation, reason, step);
    this.#transport.poison(error);
    return error;
  }

  #link(peer: number): Link {
    const link = this.#links[peer];
    if (!link) throw new TransportError(this.rank, "sockets", `has no connection to rank ${peer}`);
    return link;
  }

  #send(peer: number, data: Uint8Array): Promise<void> {
    const link = this.#link(peer);
    return link.sends.push(() => writeFully(link.connection, data, peer));
  }

  #receive(peer: number, into: Uint8Array): Promise<void> {
    const link = this.#link(peer);
    return link.receives.push(() => readFully(link.connection, into, peer));
  }

  gather(
    send: MpiBuffer,
    receive: MpiBuffer | undefined,
    root: number,
    operation: string,
    options: { inPlace?: boolean } = {},
  ): BulkRequest {
    if (this.rank !== root) return new SocketRequest(this, operation, [this.#send(root, bytesOf(send))]);
    const all = bytesOf(receive!), block = send.byteLength;
    if (all.length < block * this.size) {
      throw new TransportError(this.rank, operation, `needs a receive buffer of ${block * this.size} bytes`);
    }
    if (!options.inPlace) all.set(bytesOf(send), root * block);
    const parts: Promise<void>[] = [];
    for (let r = 0; r < this.size; r++) {
      if (r !== root) parts.push(this.#receive(r, all.subarray(r * block, (r + 1) * block)));
    }
    return new SocketRequest(this, operation, parts);
  }

  allgather(send: MpiBuffer, receive: MpiBuffer, operation: string): BulkRequest {
    const mine = bytesOf(send), all = bytesOf(receive), block = mine.length;
    if (all.length < block * this.size) {
      throw new TransportError(this.rank, operation, `needs a receive buffer of ${block * this.size} bytes`);
    }
    all.set(mine, this.rank * block);
    const parts: Promise<void>[] = [];
    for (let r = 0; r < this.size; r++) {
      if (r === this.rank) continue;
      parts.push(this.#send(r, mine), this.#receive(r, all.subarray(r * block, (r + 1) * block)));
    }
    return new SocketRequest(this, operation, parts);
  }

  broadcast(buffer: MpiBuffer, root: number, operation: string): BulkRequest {
    const bytes = bytesOf(buffer);
    if (this.rank !== root) return new SocketRequest(this, operation, [this.#receive(root, bytes)]);
    const parts: Promise<void>[] = [];
    for (let r = 0; r < this.size; r++) if (r !== root) parts.push(this.#send(r, bytes));
    return new SocketRequest(this, operation, parts);
  }

  /** Closes every connection; requests still waiting fail. Safe to call twice. */
  close(): void {
    for (const link of this.#links) {
      try {
        link?.connection.close();
      } catch {
        // Already closed.
      }
    }
  }
}

/** `promise`, or a rejection after `ms` milliseconds. */
function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}
