/**
 * The MPI transport's own policies, without MPI: the Open MPI settings it asks for before
 * `MPI_Init`, and how a wait polls (full speed or 1 ms sleeps) while a device computes and after.
 * Each test names the deliberate bugs ("mutations") it was seen to catch.
 *
 * @module
 */

import assert from "node:assert/strict";
import { MpiRequest } from "../../schedule/mpi/request.ts";
import { tuneTcpTransport } from "../../schedule/mpi/tcp.ts";
import type { MpiTransport } from "../../schedule/mpi/transport.ts";

const TUNED = [
  "OMPI_MCA_btl_tcp_eager_limit",
  "OMPI_MCA_btl_tcp_rndv_eager_limit",
  "OMPI_MCA_btl_tcp_max_send_size",
  "OMPI_MCA_btl_tcp_progress_thread",
];

/** Runs `body` with `preset` as the only tuned variables set, restoring the environment after. */
function withEnvironment(preset: Record<string, string>, body: () => void): void {
  const saved = TUNED.map((name) => [name, Deno.env.get(name)] as const);
  try {
    for (const name of TUNED) Deno.env.delete(name);
    for (const [name, value] of Object.entries(preset)) Deno.env.set(name, value);
    body();
  } finally {
    for (const [name, value] of saved) {
      value === undefined ? Deno.env.delete(name) : Deno.env.set(name, value);
    }
  }
}

Deno.test("mpi transport: asks Open MPI for a 1 MiB TCP eager limit and a TCP progress thread, keeping what the launch set", () => {
  // Mutations seen caught: not setting the progress thread (its value stays unset); setting it
  // over the launch's own `--mca btl_tcp_progress_thread 0` (reads "1").
  withEnvironment({}, () => {
    tuneTcpTransport();
    assert.deepEqual(TUNED.map((name) => Deno.env.get(name)), ["1048576", "1048576", "1048576", "1"]);
  });
  withEnvironment({ OMPI_MCA_btl_tcp_progress_thread: "0", OMPI_MCA_btl_tcp_eager_limit: "65536" }, () => {
    tuneTcpTransport();
    assert.deepEqual(TUNED.map((name) => Deno.env.get(name)), ["65536", undefined, undefined, "0"]);
  });
});

/**
 * A request on a stand-in transport whose `MPI_Test` reports completion at the `completeAt`-th
 * call; counts the 1 ms sleeps between polls (timers), the polls, and the yields of the core to a
 * progress thread (where `progressThread`).
 */
async function pollsAndSleeps(
  completeAt: number,
  shareCpu: boolean | (() => boolean),
  { progressThread = false } = {},
): Promise<{ polls: number; sleeps: number; yields: number }> {
  let polls = 0, sleeps = 0, yields = 0;
  const transport = {
    rank: 0,
    spinMs: 0,
    yieldCore: progressThread ? () => void yields++ : undefined,
    activity: "",
    check: () => {},
    poison: () => {},
    library: {
      symbols: {
        MPI_Test: (_slot: unknown, flag: Int32Array) => {
          flag[0] = ++polls >= completeAt ? 1 : 0;
          return 0;
        },
      },
    },
  } as unknown as MpiTransport;
  // A stand-in buffer as large as a terabyte: a wait with the CPU to itself polls at full speed for
  // as long as that would take at 1 GB/s, so it never sleeps here however loaded the machine is;
  // one beside a computing device sleeps after the stand-in's spin of 0.
  const buffer = { byteLength: 1e12 };
  const request = new MpiRequest(transport, "reduce fc", "MPI_Igather", [buffer], () => 0);
  const realSetTimeout = globalThis.setTimeout;
  globalThis.setTimeout = ((handler: () => void, ms?: number) => {
    sleeps++;
    return realSetTimeout(handler, ms);
  }) as typeof setTimeout;
  try {
    await request.wait({ shareCpu, deadline: performance.now() + 60_000 });
  } finally {
    globalThis.setTimeout = realSetTimeout;
  }
  return { polls, sleeps, yields };
}

Deno.test("mpi transport: a wait sleeps between polls while the device computes, and polls at full speed once it is done", async () => {
  // While computing, every poll after the (here zero) spin sleeps 1 ms, leaving the core to the
  // device; not computing, the large transfer's wait polls through the event loop without timers.
  const computing = await pollsAndSleeps(20, true);
  assert.equal(computing.sleeps, 19, "a wait beside a computing device sleeps between its polls");
  const alone = await pollsAndSleeps(20, false);
  assert.equal(alone.sleeps, 0, "a wait with the CPU to itself does not sleep");
  // The device finishes after the 5th poll: the rest run at full speed. Mutation seen caught:
  // `shareCpu` read once when the wait starts (as before), which slept 199 times here.
  let polled = 0;
  const flips = await pollsAndSleeps(200, () => ++polled <= 5);
  assert.ok(flips.sleeps <= 5, `slept ${flips.sleeps} times after the device finished computing`);
  assert.equal(flips.polls, 200);
});

Deno.test("mpi transport: a wait polling at full speed yields the core between polls where a progress thread moves the bytes", async () => {
  // Over 10 Gbit/s a hybrid step's small collectives stalled 2-9 ms, 5 to 18 times per 10 steps,
  // while the waiting rank polled without yielding and Open MPI's progress thread waited for its
  // core (0 to 1 times with the yield: see tcp.ts). Mutations seen caught: no yield (0 yields);
  // yielding only before a 1 ms sleep (0 here, where the wait never sleeps).
  const alone = await pollsAndSleeps(20, false, { progressThread: true });
  assert.equal(alone.sleeps, 0);
  assert.equal(alone.yields, 19, "one yield after every poll that found the operation still running");
  // Without a progress thread MPI_Test moves the bytes itself: nothing to yield to.
  assert.equal((await pollsAndSleeps(20, false)).yields, 0);
  // Sleeping between polls already leaves the core: no yield there.
  const computing = await pollsAndSleeps(20, true, { progressThread: true });
  assert.equal(computing.sleeps, 19);
  assert.equal(computing.yields, 0);
});
