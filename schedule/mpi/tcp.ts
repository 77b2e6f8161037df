/**
 * Open MPI's TCP tuning: the settings the MPI transport asks for before `MPI_Init` (a 1 MiB eager
 * limit and a TCP progress thread, each kept where the launch set its own), and the message size
 * that still goes out eagerly under the limit in force.
 *
 * @module
 */

/** The variable that turns Open MPI's TCP progress thread on (`1`) or off (`0`). */
export const TCP_PROGRESS_THREAD = "OMPI_MCA_btl_tcp_progress_thread";

/** Open MPI's TCP eager limit this transport asks for, unless the launch set one: 1 MiB. */
export const TCP_EAGER_LIMIT = 1024 * 1024;

/**
 * Open MPI's TCP settings this transport asks for (read by `MPI_Init` from the environment); each
 * one the launch set (`--mca …`, `OMPI_MCA_…`) is kept.
 *
 * - **Eager limit 1 MiB.** Open MPI sends a TCP message up to its eager limit (64 KiB by default)
 *   without waiting for the receiver; a larger one needs a handshake, and a broadcast posted behind a
 *   stream of gathers then waits for all of them, so a pipelined exchange uses one direction of the
 *   link at a time. At 1 MiB the exchange sends 512 KiB messages both ways at once: at 10 Gbit/s,
 *   5 Gbit/s instead of 3.6 with 32 KiB messages under the default limit (measured here).
 * - **A progress thread.** Without one, bytes move between the sockets and MPI's buffers only
 *   inside `MPI_Test`, so while this rank averages, updates, or sleeps between polls beside a
 *   computing device, its transfers stall once the socket buffers are full. Open MPI's TCP
 *   progress thread moves them meanwhile, but on a host short of cores it competes with the
 *   devices' threads and delays small collectives. Interleaved launches off/on, 3–4 each, 2
 *   namespaces on one 2-core machine, gradients over sockets unless marked `mpi`, medians in ms
 *   (before the yield below):
 *   - 10 Gbit/s: AlexNet-like `hybrid` 36.0/40.4 (master), 39.6/44.3 (allreduce); `overlap`
 *     allreduce `mpi` 41.7/43.9; bvlc_alexnet (global batch 16) `hybrid` 670/681 (master),
 *     622/617 (allreduce); `overlap` master `mpi` 938/978.
 *   - 1 Gbit/s: AlexNet-like `hybrid` 36.0/37.5 (master), 36.1/38.5 and 40.4/40.8 (allreduce,
 *     two sessions); `overlap` allreduce 57.9/60.9; bvlc_alexnet `hybrid` master 780/737,
 *     `overlap` master `mpi` 2,491/2,450.
 *
 *   Off wins at 10 Gbit/s and on the small net, on wins on bvlc_alexnet over 1 Gbit/s (by 2–6%,
 *   inside the launches' spread of up to 19%), and a rank cannot know its link before `MPI_Init`,
 *   so the default stays on. The MPI transfers alone, with no compute beside them, run faster
 *   with it off over 10 Gbit/s (`bench/CLUSTER.md`).
 * - **Yielding the core to it.** With the thread on, `MPI_Test` on the main thread no longer moves
 *   the bytes: the thread does, when it gets a core. A wait polling at full speed (a hybrid step's
 *   activation collectives, any wait with the CPU to itself) held its host's one core for a
 *   scheduler slice while the thread that would move its bytes waited: a piece of a hybrid
 *   step's collective arrived 2–9 ms after both ranks had entered (about 0.2 ms otherwise), 2 to
 *   14 times per launch of 10 AlexNet-like steps over 10 Gbit/s (median 6 of 20 launches, both
 *   modes), and 0 to 7 times with the yield (median 1.5). So the transport calls `sched_yield`
 *   between full-speed polls where the thread is on (`MpiRequest.wait`). Interleaved launches with the
 *   yield / without / thread off, medians in ms, 5 each over 10 Gbit/s: AlexNet-like `hybrid`
 *   38.7 / 44.2 / 42.6 (master), 37.9 / 48.4 / 37.6 (allreduce); `overlap` allreduce `mpi`
 *   47.6 / 55.9 / 42.7; bvlc_alexnet (global batch 16) `hybrid` 580 / 576 / 700 (master),
 *   588 / 618 / 588 (allreduce). 3 each over 1 Gbit/s: AlexNet-like `hybrid` 36.0 / 37.8 / 38.3
 *   (master), 45.2 / 38.9 / 37.9 (allreduce: the launches spread 36–48 in each column);
 *   `overlap` master `mpi` 59.4 / 66.4 / 73.1; bvlc_alexnet `hybrid` master 646 / 655 / 650.
 *   With the yield the thread on is faster than off by more than 1% in 4 of these 9 rows, within
 *   1% either way in 3, and slower by more than 1% in 2 (`overlap` `mpi` over 10 Gbit/s,
 *   AlexNet-like `hybrid` allreduce over 1 Gbit/s): the default stays on.
 *
 * @internal Called by {@link MpiTransport.init} before `MPI_Init`; exported for tests.
 */
export function tuneTcpTransport(): void {
  if (Deno.env.get("OMPI_MCA_btl_tcp_eager_limit") === undefined) {
    Deno.env.set("OMPI_MCA_btl_tcp_eager_limit", String(TCP_EAGER_LIMIT));
    Deno.env.set("OMPI_MCA_btl_tcp_rndv_eager_limit", String(TCP_EAGER_LIMIT));
    Deno.env.set("OMPI_MCA_btl_tcp_max_send_size", String(TCP_EAGER_LIMIT));
  }
  if (Deno.env.get(TCP_PROGRESS_THREAD) === undefined) Deno.env.set(TCP_PROGRESS_THREAD, "1");
}

/**
 * Bytes a message may have and still go out eagerly over Open MPI's TCP transport: half the eager
 * limit in force (headers need some of it), so 512 KiB under this transport's 1 MiB, 32 KiB under
 * Open MPI's default 64 KiB.
 *
 * @example
 * ```ts
 * import { eagerMessageBytes } from "./tcp.ts";
 * console.log(eagerMessageBytes());
 * ```
 */
export function eagerMessageBytes(): number {
  const limit = Number(Deno.env.get("OMPI_MCA_btl_tcp_eager_limit") ?? 64 * 1024);
  return Math.max(4096, Math.floor((Number.isFinite(limit) ? limit : 64 * 1024) / 2));
}
