/**
 * Whether Open MPI's `mpirun` started this process, read from the launcher's environment before MPI
 * starts (so a CLI can decide to train across ranks, or say why stale variables were ignored,
 * without loading the MPI library).
 *
 * @module
 */

/**
 * Where this process sits in an MPI job, read from the launcher's environment before MPI starts.
 *
 * @example
 * ```ts
 * import type { MpiLaunch } from "./launch.ts";
 * const launch: MpiLaunch = { rank: 0, size: 2, localRank: 0, localSize: 2 };
 * ```
 */
export interface MpiLaunch {
  /** Rank in `MPI_COMM_WORLD`. */
  readonly rank: number;
  /** Number of ranks. */
  readonly size: number;
  /** Rank among the processes on this host (pick a GPU or socket with it). */
  readonly localRank: number;
  /** Processes of the job on this host: they share its cores. */
  readonly localSize: number;
}

/**
 * What the environment says about an MPI launch: the job, or why `OMPI_COMM_WORLD_*` variables that
 * are present were not taken for one.
 *
 * @example
 * ```ts
 * import type { MpiDetection } from "./launch.ts";
 * const stale: MpiDetection = { ignored: "OMPI_COMM_WORLD_SIZE=2 is set but PMIX_RANK is not" };
 * ```
 */
export interface MpiDetection {
  /** The job, when mpirun really started this process. */
  readonly launch?: MpiLaunch;
  /** One line saying which variables were found and why they do not make a launch. */
  readonly ignored?: string;
}

/** The URI variables through which PMIx 2.x to 4.x (Open MPI 4 and 5) tell a rank its server. */
const PMIX_SERVER_URIS = [
  "PMIX_SERVER_URI2",
  "PMIX_SERVER_URI21",
  "PMIX_SERVER_URI3",
  "PMIX_SERVER_URI4",
  "PMIX_SERVER_URI41",
];

function directoryExists(path: string): boolean {
  try {
    return Deno.statSync(path).isDirectory;
  } catch (error) {
    // Without read permission we cannot tell: trust the variables.
    return !(error instanceof Deno.errors.NotFound || error instanceof Deno.errors.NotADirectory);
  }
}

/**
 * Reads the environment for an MPI job that Open MPI's `mpirun` started. `OMPI_COMM_WORLD_SIZE`
 * and `OMPI_COMM_WORLD_RANK` alone are not enough, since they survive in exported shells and copied
 * environments: the launcher also gives every rank its PMIx identity (`PMIX_RANK` equal to the rank,
 * `PMIX_NAMESPACE`, a `PMIX_SERVER_URI*`), and the server's session directory (`PMIX_SERVER_TMPDIR`)
 * exists only while mpirun runs. All of that, or `ignored` says what is missing.
 *
 * @example
 * ```ts
 * import { inspectMpiLaunch } from "./launch.ts";
 * const env = new Map([["OMPI_COMM_WORLD_SIZE", "2"], ["OMPI_COMM_WORLD_RANK", "1"]]);
 * console.log(inspectMpiLaunch(env).ignored); // "OMPI_COMM_WORLD_SIZE=2 … PMIX_RANK is not set …"
 * ```
 */
export function inspectMpiLaunch(
  env: { get(name: string): string | undefined } = Deno.env,
  exists: (directory: string) => boolean = directoryExists,
): MpiDetection {
  const sizeText = env.get("OMPI_COMM_WORLD_SIZE"), rankText = env.get("OMPI_COMM_WORLD_RANK");
  if (sizeText === undefined && rankText === undefined) return {};
  const found = `OMPI_COMM_WORLD_SIZE=${sizeText ?? "(unset)"} OMPI_COMM_WORLD_RANK=${rankText ?? "(unset)"}`;
  const ignore = (why: string): MpiDetection => ({
    ignored: `${found} found, but ${why}, so mpirun did not start this process (stale variables?)`,
  });
  const size = Number(sizeText), rank = Number(rankText);
  if (!/^\d+$/.test(sizeText ?? "") || !/^\d+$/.test(rankText ?? "") || size < 1 || rank >= size) {
    return ignore("they are not a rank below a size");
  }
  const pmixRank = env.get("PMIX_RANK");
  if (pmixRank === undefined) return ignore("PMIX_RANK is not set");
  if (pmixRank !== rankText) return ignore(`PMIX_RANK is ${pmixRank}`);
  if (!env.get("PMIX_NAMESPACE")) return ignore("PMIX_NAMESPACE is not set");
  if (!PMIX_SERVER_URIS.some((name) => env.get(name))) return ignore("no PMIX_SERVER_URI* is set");
  const sessionDir = env.get("PMIX_SERVER_TMPDIR");
  if (sessionDir && !exists(sessionDir)) {
    return ignore(`mpirun's session directory PMIX_SERVER_TMPDIR=${sessionDir} does not exist`);
  }
  const local = Number(env.get("OMPI_COMM_WORLD_LOCAL_RANK") ?? rank);
  const localSize = Number(env.get("OMPI_COMM_WORLD_LOCAL_SIZE") ?? size);
  return {
    launch: {
      rank,
      size,
      localRank: Number.isInteger(local) ? local : rank,
      localSize: Number.isInteger(localSize) && localSize >= 1 ? localSize : size,
    },
  };
}

/**
 * The MPI job this process was started in by Open MPI's `mpirun`, or `undefined` outside one,
 * including when only stale `OMPI_COMM_WORLD_*` variables are set (see {@link inspectMpiLaunch}).
 *
 * @example
 * ```ts
 * import { detectMpiLaunch } from "./launch.ts";
 * const env = new Map([
 *   ["OMPI_COMM_WORLD_SIZE", "2"], ["OMPI_COMM_WORLD_RANK", "1"],
 *   ["PMIX_RANK", "1"], ["PMIX_NAMESPACE", "1234"], ["PMIX_SERVER_URI4", "1234.0;tcp4://127.0.0.1:5"],
 * ]);
 * console.log(detectMpiLaunch(env)); // { rank: 1, size: 2, localRank: 1, localSize: 2 }
 * ```
 */
export function detectMpiLaunch(
  env: { get(name: string): string | undefined } = Deno.env,
  exists: (directory: string) => boolean = directoryExists,
): MpiLaunch | undefined {
  return inspectMpiLaunch(env, exists).launch;
}
