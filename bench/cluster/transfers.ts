/**
 * The MPI transfers alone, as every rank of `bench/cluster/report.ts` runs them: no model, no
 * averaging, no update; just the FC exchange's messages (`eagerMessageBytes()` each, all posted at
 * once, as `schedule/mpi/exchange.ts` posts them) in both directions of the link. It tells the link
 * and transport's own rate apart from the CPU work an exchange adds.
 *
 * - `gather`: rank 1's buffer to rank 0 (`MPI_Igather`), the reduce direction of master mode;
 * - `broadcast`: rank 0's buffer to rank 1 (`MPI_Ibcast`), the parameters coming back.
 *
 * Each is waited on two ways: polling at full speed (`spin`), and as a rank beside a computing
 * device waits (`shareCpu`: 1 ms sleeps between polls after the first 2 ms). Prints one JSON line
 * on rank 0: `{ rawTcp?, duplexTcp?, megabytes, messageBytes, progressThread, rows: [{ direction, polling, bestMs, medianMs }] }`,
 * best and median of 5 timed runs after 1 warm-up.
 *
 * With rank 0's address as a second argument it also times one plain TCP connection carrying the
 * same bytes from rank 1 to rank 0 (`rawTcp`): what the link gives without MPI; and both ways at
 * once (`duplexTcp`), what a two-way exchange can get when the hosts share the machine's cores.
 *
 * Usage (under mpirun, 2 ranks): `deno run -A bench/cluster/transfers.ts <MiB> [rank 0's address]`.
 *
 * @module
 */

import type { WaitOptions } from "../../schedule/mpi/request.ts";
import { eagerMessageBytes, TCP_PROGRESS_THREAD } from "../../schedule/mpi/tcp.ts";
import { MpiTransport } from "../../schedule/mpi/transport.ts";

const transport = MpiTransport.init();
const megabytes = Number(Deno.args[0] ?? 64);
const floats = Math.round(megabytes * (1 << 20) / 4);
const buffer = new Float32Array(new SharedArrayBuffer(4 * floats)).fill(transport.rank + 1);
const gathered = new Float32Array(new SharedArrayBuffer(4 * floats * transport.size));
const perMessage = eagerMessageBytes() / 4;

/** `[start, end)` element ranges of the messages. */
const messages: [number, number][] = [];
for (let at = 0; at < floats; at += perMessage) messages.push([at, Math.min(floats, at + perMessage)]);

async function run(direction: "gather" | "broadcast", wait: WaitOptions): Promise<number> {
  await transport.barrier("transfers: line up").wait({ spin: true });
  const start = performance.now();
  const requests = messages.map(([from, to]) =>
    direction === "gather"
      ? transport.gather(
        buffer.subarray(from, to),
        transport.rank === 0 ? gathered.subarray(transport.size * from, transport.size * to) : undefined,
        0,
        "transfers: gather",
      )
      : transport.broadcast(buffer.subarray(from, to), 0, "transfers: broadcast")
  );
  for (const request of requests) await request.wait(wait);
  // Done when both ranks are: the receiving side finishes last.
  await transport.barrier("transfers: done").wait({ spin: true });
  return performance.now() - start;
}

const rows = [];
for (const direction of ["gather", "broadcast"] as const) {
  for (const polling of ["spin", "shareCpu"] as const) {
    const wait: WaitOptions = polling === "spin" ? { spin: true } : { shareCpu: true };
    const times: number[] = [];
    for (let i = 0; i < 6; i++) {
      const ms = await run(direction, { ...wait, deadline: performance.now() + 120_000 });
      if (i > 0) times.push(ms);
    }
    times.sort((a, b) => a - b);
    rows.push({ direction, polling, bestMs: times[0], medianMs: times[Math.floor(times.length / 2)] });
  }
}
/**
 * The link itself: rank 1 writes `megabytes` over one plain TCP connection to rank 0 six times in a
 * row (`Deno.connect`, 4 MiB writes); rank 0 times each arrival, the first one dropped as warm-up
 * (TCP's slow start). Milliseconds, sorted.
 */
async function rawTcp(address: string): Promise<number[]> {
  const port = 29_611, bytes = 4 * floats, block = new Uint8Array(4 << 20);
  const listener = transport.rank === 0 ? Deno.listen({ hostname: address, port }) : undefined;
  await transport.barrier("transfers: listening").wait({ spin: true });
  const times: number[] = [];
  if (listener) {
    const connection = await listener.accept();
    for (let run = 0; run < 6; run++) {
      let got = 0, start = 0;
      while (got < bytes) {
        // Never past this run's bytes, so each run times its own.
        const n = await connection.read(block.subarray(0, Math.min(block.length, bytes - got)));
        if (n === null) throw new Error(`raw TCP: the connection closed after ${got} bytes`);
        if (got === 0) start = performance.now();
        got += n;
      }
      if (run > 0) times.push(performance.now() - start);
    }
    connection.close();
    listener.close();
  } else if (transport.rank === 1) {
    const connection = await Deno.connect({ hostname: address, port });
    for (let sent = 0; sent < 6 * bytes; sent += block.length) {
      const part = block.subarray(0, Math.min(block.length, 6 * bytes - sent));
      for (let written = 0; written < part.length;) written += await connection.write(part.subarray(written));
    }
    connection.close();
  }
  await transport.barrier("transfers: tcp done").wait({ spin: true });
  return times.sort((a, b) => a - b);
}

/**
 * The link both ways at once, as an exchange uses it: the two ranks each write `megabytes` to the
 * other over one plain TCP connection while reading the other's, six times (the first dropped);
 * rank 0 times each run from a barrier to the end of both its read and its write. On a machine whose
 * cores carry the hosts' network stack this is its ceiling for a two-way exchange. Milliseconds, sorted.
 */
async function duplexTcp(address: string): Promise<number[]> {
  const port = 29_612, bytes = 4 * floats, out = new Uint8Array(bytes), into = new Uint8Array(bytes);
  const listener = transport.rank === 0 ? Deno.listen({ hostname: address, port }) : undefined;
  await transport.barrier("transfers: listening").wait({ spin: true });
  const connection = listener
    ? await listener.accept()
    : transport.rank === 1
    ? await Deno.connect({ hostname: address, port })
    : undefined;
  const times: number[] = [];
  for (let run = 0; run < 6; run++) {
    await transport.barrier("transfers: duplex").wait({ spin: true });
    if (!connection) continue;
    const start = performance.now();
    const reading = (async () => {
      for (let got = 0; got < bytes;) {
        const n = await connection.read(into.subarray(got));
        if (n === null) throw new Error(`raw TCP: the connection closed after ${got} bytes`);
        got += n;
      }
    })();
    for (let written = 0; written < bytes;) {
      written += await connection.write(out.subarray(written, Math.min(bytes, written + (4 << 20))));
    }
    await reading;
    if (run > 0) times.push(performance.now() - start);
  }
  connection?.close();
  listener?.close();
  await transport.barrier("transfers: duplex done").wait({ spin: true });
  return times.sort((a, b) => a - b);
}

const tcp = Deno.args[1] ? await rawTcp(Deno.args[1]) : [];
const duplex = Deno.args[1] ? await duplexTcp(Deno.args[1]) : [];
if (transport.rank === 0) {
  console.log(JSON.stringify({
    rawTcp: tcp.length ? { bestMs: tcp[0], medianMs: tcp[Math.floor(tcp.length / 2)] } : undefined,
    duplexTcp: duplex.length
      ? { bestMs: duplex[0], medianMs: duplex[Math.floor(duplex.length / 2)] }
      : undefined,
    megabytes: 4 * floats / 1e6,
    messageBytes: 4 * perMessage,
    progressThread: Deno.env.get(TCP_PROGRESS_THREAD) === "1",
    rows,
  }));
}
transport.finalize();
