/**
 * Open MPI: the transport over `MPI_COMM_WORLD` that `DataParallelTrainer` uses for one process per
 * device (non-blocking collectives driven by polling, so the event loop keeps running while data
 * moves), and detection of an `mpirun` launch from its environment. The FFI bindings behind it stay
 * private.
 *
 * @example
 * ```ts
 * // Run as: mpirun -np 2 deno run -A script.ts
 * import { detectMpiLaunch, MpiTransport } from "./mod.ts";
 *
 * if (detectMpiLaunch()) {
 *   const mpi = MpiTransport.init();
 *   const hosts = await mpi.allgatherJson({ rank: mpi.rank, host: Deno.hostname() });
 *   if (mpi.rank === 0) console.log(hosts);
 *   mpi.finalize();
 * }
 * ```
 *
 * @module
 */

export { MpiError } from "./library.ts";
export { type BulkCollectives, type BulkRequest, type DataPlane, SocketMesh } from "./sockets.ts";
export {
  describeMeasuredLink,
  LINK_PROBE_BYTES,
  LINK_PROBE_REPEATS,
  linkProbeBytes,
  type LinkProbeOptions,
  type MeasuredLink,
  measureLink,
} from "./link_probe.ts";
export { type CpuTimes, parseProcStat, readCpuTimes } from "./cpu_use.ts";
export { detectMpiLaunch, inspectMpiLaunch, type MpiDetection, type MpiLaunch } from "./launch.ts";
export { MpiRequest, TransportError, type WaitOptions } from "./request.ts";
export { type GatherOptions, type MpiBuffer, MpiTransport, type MpiTransportOptions } from "./transport.ts";
