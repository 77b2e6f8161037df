/**
 * `deno task cluster --hosts N --rate R [--delay D] -- <train arguments>`: the train command across N
 * real "hosts" on this one machine — Linux network namespaces joined through a switch by veth pairs,
 * every host's link shaped with `tc` to the given rate (both directions) and optional delay — under
 * Open MPI over TCP only, exactly as across real machines. It prints what the train command prints
 * (rank 0 speaks), including its `--json` object, and always removes what it created: on success, on
 * failure and on Ctrl-C.
 *
 * On a real cluster the same launch is `mpirun --host a,b -np 2 --mca btl self,tcp … deno run -A
 * cli/train.ts …` (see {@link mpirunArguments}); here a launch agent enters each host's namespace
 * where mpirun would ssh to the host.
 *
 * Each host runs on cores of its own (this machine's cores split evenly among the hosts, `taskset`),
 * as a real host would: see {@link hostCores}.
 *
 * Needs root, iproute2 (`ip`, `tc`) and Open MPI; without them it says which is missing and exits 2.
 *
 * @module
 */

import { parseArgs } from "node:util";
import { CliError, describeError, EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE } from "./errors.ts";
import { allowedCores, coreList, hostCores } from "./host_cores.ts";

/** What `--help` prints. */
export const CLUSTER_HELP =
  `deno task cluster: the train command across hosts joined by a real, rate-limited link

usage: deno task cluster --hosts N --rate R [--delay D] -- <train arguments>

  --hosts N     hosts (network namespaces), one MPI rank each (default 2)
  --rate R      each host's link rate, as tc writes it: 100mbit, 1gbit, 10gbit (required)
  --delay D     one-way delay added on each host's link: 200us, 1ms (default none)
  --help        this text

Every host's traffic to the others goes through its own shaped link (both directions), over TCP.
Needs root, iproute2 (ip, tc) and Open MPI (mpirun). Everything it creates is removed when it ends.
Each host runs on cores of its own, this machine's cores split evenly (with fewer cores than hosts,
the hosts share them all).
On real machines the same run is:
  mpirun --host a,b -np 2 --bind-to none --mca btl self,tcp ./node_modules/.bin/deno run -A cli/train.ts …`;

/** A cluster's shape, validated. */
export interface ClusterArgs {
  /** Hosts, one rank each. */
  hosts: number;
  /** `tc` rate of every host's link, e.g. `1gbit`. */
  rate: string;
  /** `tc` one-way delay of every host's link, e.g. `1ms`, or none. */
  delay?: string;
  /** Arguments for the train command. */
  train: string[];
}

const RATE = /^\d+(\.\d+)?(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$/;
const DELAY = /^\d+(\.\d+)?(us|ms|s)$/;

/**
 * Parses the cluster's own flags (before `--`) and keeps the rest for the train command.
 *
 * @example
 * ```ts
 * import { parseClusterArgs } from "./cluster.ts";
 * parseClusterArgs(["--rate", "1gbit", "--", "--steps", "10"]); // { hosts: 2, rate: "1gbit", train: ["--steps", "10"] }
 * ```
 */
export function parseClusterArgs(argv: string[]): ClusterArgs | "help" {
  const split = argv.indexOf("--");
  const own = split < 0 ? argv : argv.slice(0, split);
  const train = split < 0 ? [] : argv.slice(split + 1);
  let values;
  try {
    ({ values } = parseArgs({
      args: own,
      options: {
        hosts: { type: "string" },
        rate: { type: "string" },
        delay: { type: "string" },
        help: { type: "boolean" },
      },
      strict: true,
      allowPositionals: false,
    }));
  } catch (error) {
    throw new CliError(`${(error as Error).message} (train arguments go after --; see --help)`);
  }
  if (values.help) return "help";
  const hosts = Number(values.hosts ?? 2);
  if (!Number.isInteger(hosts) || hosts < 2 || hosts > 16) {
    throw new CliError(`--hosts must be an integer from 2 to 16, got "${values.hosts}"`);
  }
  if (values.rate === undefined) throw new CliError("--rate is required, e.g. --rate 1gbit");
  if (!RATE.test(values.rate)) {
    throw new CliError(`--rate must be a tc rate such as 100mbit, 1gbit or 10gbit, got "${values.rate}"`);
  }
  if (values.delay !== undefined && !DELAY.test(values.delay)) {
    throw new CliError(`--delay must be a tc time such as 200us or 1ms, got "${values.delay}"`);
  }
  return { hosts, rate: values.rate, delay: values.delay, train };
}

/** The network namespaces and links of one cluster, and how to take them down. */
export interface Cluster {
  /** Namespace of each host, rank order. */
  namespaces: string[];
  /** Address of each host, rank order. */
  addresses: string[];
  /** The hosts' subnet, for Open MPI's interface selection. */
  subnet: string;
  /** The launch agent mpirun uses instead of ssh. */
  agent: string;
  /**
   * Why packets of one connection may arrive out of order on these links ({@link keepFlowsInOrder}
   * failed), or `undefined` where they arrive in order, as on a real link.
   */
  reorders?: string;
  /**
   * The cores each host runs on, rank order, as `taskset -c` lists (`"0"`, `"2-3"`); `undefined`
   * where the hosts share every core ({@link hostCores}).
   */
  cores?: string[];
  /** Why the hosts share every core (fewer cores than hosts, no `taskset`), or `undefined`. */
  sharesCores?: string;
}

/** Runs a command, throwing a CliError with its stderr if it fails. */
async function run(command: string, args: string[], what: string): Promise<void> {
  const output = await new Deno.Command(command, { args, stdout: "null", stderr: "piped", stdin: "null" })
    .output();
  if (!output.success) {
    const reason = new TextDecoder().decode(output.stderr).trim().split("\n")[0];
    throw new CliError(`could not ${what}: ${command} ${args.join(" ")}: ${reason}`, EXIT_FAILURE);
  }
}

async function found(command: string): Promise<boolean> {
  try {
    const { success } = await new Deno.Command("sh", {
      args: ["-c", `command -v ${command}`],
      stdout: "null",
      stderr: "null",
    }).output();
    return success;
  } catch {
    return false;
  }
}

/**
 * Why this machine cannot build a cluster (not root, no `ip`, `tc` or `mpirun`), or `undefined`.
 *
 * @example
 * ```ts
 * import { missingRequirement } from "./cluster.ts";
 * const why = await missingRequirement();
 * if (why) console.log(why);
 * ```
 */
export async function missingRequirement(): Promise<string | undefined> {
  if (Deno.uid() !== 0) return "it must run as root (network namespaces and tc need it)";
  for (const [command, install] of [["ip", "iproute2"], ["tc", "iproute2"], ["mpirun", "openmpi-bin"]]) {
    if (!(await found(command))) return `${command} is missing (apt-get install ${install})`;
  }
  return undefined;
}

/**
 * Creates `hosts` namespaces, a switch namespace with a bridge, and one veth pair per host, each
 * direction shaped with `tbf` at `rate` (after a `netem` delay when given). Names carry this process's
 * id, so concurrent clusters do not meet. On any failure, what was made is removed before it throws.
 */
export async function createCluster(hosts: number, rate: string, delay?: string): Promise<Cluster> {
  await removeOrphans();
  const tag = `tandem-${Deno.pid}`;
  const switchNs = `${tag}-sw`;
  const namespaces = Array.from({ length: hosts }, (_, i) => `${tag}-h${i}`);
  // 10.213.<pid-derived>.0/24: private, unused by this machine, and only inside our namespaces.
  const third = Deno.pid % 250;
  const subnet = `10.213.${third}.0/24`;
  const addresses = namespaces.map((_, i) => `10.213.${third}.${i + 1}`);
  const cluster: Cluster = { namespaces, addresses, subnet, agent: "" };
  const made: string[] = [];
  try {
    for (const ns of [switchNs, ...namespaces]) {
      await run("ip", ["netns", "add", ns], "create a network namespace");
      made.push(ns);
      await run("ip", ["-n", ns, "link", "set", "lo", "up"], "bring up loopback");
    }
    await run("ip", ["-n", switchNs, "link", "add", "br0", "type", "bridge"], "create the switch");
    await run("ip", ["-n", switchNs, "link", "set", "br0", "up"], "bring up the switch");
    for (const [i, ns] of namespaces.entries()) {
      const port = `p${i}`;
      await run(
        "ip",
        ["-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", switchNs],
        "create a link",
      );
      await run("ip", ["-n", ns, "addr", "add", `${addresses[i]}/24`, "dev", "eth0"], "address a host");
      await run("ip", ["-n", ns, "link", "set", "eth0", "up"], "bring up a link");
      await run("ip", ["-n", switchNs, "link", "set", port, "master", "br0"], "attach a link to the switch");
      await run("ip", ["-n", switchNs, "link", "set", port, "up"], "bring up a switch port");
      // Both ends: the host's sending side and the switch port that sends to the host.
      for (const [where, device] of [[ns, "eth0"], [switchNs, port]]) {
        await shape(where, device, rate, delay);
        cluster.reorders ??= await keepFlowsInOrder(where, device);
      }
    }
    const cores = allowedCores();
    const split = hostCores(hosts, cores);
    if (!split) {
      cluster.sharesCores = `${hosts} hosts on ${cores.length} core${cores.length > 1 ? "s" : ""}`;
    } else if (!(await found("taskset"))) {
      cluster.sharesCores = "taskset is missing (apt-get install util-linux)";
    } else cluster.cores = split.map(coreList);
    cluster.agent = await writeAgent(namespaces, addresses, cluster.cores);
    return cluster;
  } catch (error) {
    await removeNamespaces(made);
    throw error;
  }
}

/**
 * Bits per second of a tc rate (`1gbit`, `100mbit`, `125mbps` …).
 *
 * @example
 * ```ts
 * import { rateBitsPerSecond } from "./cluster.ts";
 * rateBitsPerSecond("1gbit"); // 1e9
 * ```
 */
export function rateBitsPerSecond(rate: string): number {
  const match = RATE.exec(rate);
  if (!match) throw new CliError(`not a tc rate: "${rate}"`);
  const value = parseFloat(rate);
  const unit = rate.slice(String(value).length === rate.length ? rate.length : rate.search(/[a-z]/));
  const scale: Record<string, number> = {
    bit: 1,
    kbit: 1e3,
    mbit: 1e6,
    gbit: 1e9,
    tbit: 1e12,
    bps: 8,
    kbps: 8e3,
    mbps: 8e6,
    gbps: 8e9,
    tbps: 8e12,
  };
  return value * scale[unit];
}

/**
 * A token bucket at `rate` after a netem delay if given. The bucket holds 1 ms of traffic (at least
 * 32 KiB): enough for the kernel's timer, small enough that a transfer cannot outrun the rate for
 * long; the queue holds 5 ms, as a switch port's buffer would, not seconds of bufferbloat.
 */
async function shape(ns: string, device: string, rate: string, delay?: string): Promise<void> {
  const base = ["-n", ns, "qdisc", "add", "dev", device];
  const burst = Math.max(32 * 1024, Math.round(rateBitsPerSecond(rate) / 8 / 1000));
  const tbf = ["tbf", "rate", rate, "burst", String(burst), "latency", "5ms"];
  if (delay) {
    try {
      await run("tc", [...base, "root", "handle", "1:", "netem", "delay", delay], "add a link delay");
    } catch (error) {
      if (!/qdisc kind is unknown/.test((error as Error).message)) throw error;
      throw new CliError(
        `--delay needs the kernel's netem queueing discipline (sch_netem), which this kernel lacks; ` +
          `run without --delay`,
        EXIT_USAGE,
      );
    }
    await run("tc", [...base, "parent", "1:1", "handle", "10:", ...tbf], "shape a link");
  } else {
    await run("tc", [...base, "root", ...tbf], "shape a link");
  }
}

/**
 * A CPU mask of every core as sysfs writes it (`rps_cpus`): hex, in comma-separated groups of 32 bits.
 *
 * @example
 * ```ts
 * import { allCoresMask } from "./cluster.ts";
 * allCoresMask(2); // "3"
 * allCoresMask(40); // "ff,ffffffff"
 * ```
 */
export function allCoresMask(cores: number): string {
  const groups: string[] = [];
  for (let left = Math.max(1, cores); left > 0; left -= 32) {
    const bits = Math.min(32, left);
    groups.unshift((bits === 32 ? 0xffffffff : 2 ** bits - 1).toString(16));
  }
  return groups.map((g, i) => (i === 0 ? g : g.padStart(8, "0"))).join(",");
}

/**
 * Keeps each TCP connection's packets in order on `device`'s receiving side; returns why it could
 * not, or `undefined`. A veth hands each packet to the backlog of whichever core sent it, and on a
 * machine with several cores two cores' backlogs drain at once: packets of one connection overtake
 * each other, which TCP takes for loss, retransmitting and shrinking its window. A real link never
 * reorders a connection, and a real NIC steers each connection to one receive queue (RSS); receive
 * packet steering (RPS) does that in software, queueing each connection on one core by its hash.
 * Measured here (2 cores, 10 Gbit/s, 5 interleaved rounds, medians): without it 45–250 segments
 * were retransmitted per AlexNet-like launch (sequential allreduce) and 5,500–9,900 per 66.5 MB
 * exchange probe, with it 0–1; the AlexNet-like step went 37.3 → 36.4 ms, but the 66.5 MB probe's
 * exchange 71 → 79 ms: a connection's receive work then runs on one of the 2 cores the hosts share,
 * where reordered it ran on both (a real host has its own cores for it).
 */
async function keepFlowsInOrder(ns: string, device: string): Promise<string | undefined> {
  const mask = allCoresMask(navigator.hardwareConcurrency || 1);
  const output = await new Deno.Command("ip", {
    args: [
      "netns",
      "exec",
      ns,
      "sh",
      "-c",
      `for q in /sys/class/net/${device}/queues/rx-*; do echo ${mask} > "$q/rps_cpus" || exit 1; done`,
    ],
    stdout: "null",
    stderr: "piped",
    stdin: "null",
  }).output();
  if (output.success) return undefined;
  const reason = new TextDecoder().decode(output.stderr).trim().split("\n")[0];
  return `receive packet steering could not be set on ${device} (${reason || "no rps_cpus"})`;
}

/**
 * The launch agent: mpirun calls it as `agent [options] host command…`; it enters host's namespace,
 * on host's cores where it has its own (`cores`, taskset lists in rank order).
 */
async function writeAgent(namespaces: string[], addresses: string[], cores?: string[]): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "tandem-cluster-" });
  const path = `${dir}/agent.sh`;
  const cases = addresses.map((a, i) => `  ${a}) ns=${namespaces[i]}; cpus=${cores?.[i] ?? ""} ;;`).join(
    "\n",
  );
  await Deno.writeTextFile(
    path,
    `#!/bin/sh
# mpirun's launch agent for a cluster of network namespaces: "ssh host command" becomes
# "ip netns exec <host's namespace> sh -c command", on the host's own cores where it has them.
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
host="$1"; shift
case "$host" in
${cases}
  *) echo "tandem cluster agent: unknown host $host" >&2; exit 1 ;;
esac
if [ -n "$cpus" ]; then exec ip netns exec "$ns" taskset -c "$cpus" sh -c "$*"; fi
exec ip netns exec "$ns" sh -c "$*"
`,
  );
  await Deno.chmod(path, 0o755);
  return path;
}

/** Namespaces of clusters whose process is gone (killed before it could clean up). */
async function removeOrphans(): Promise<void> {
  const output = await new Deno.Command("ip", { args: ["netns", "list"], stdout: "piped", stderr: "null" })
    .output();
  const orphans = new TextDecoder().decode(output.stdout).split("\n").flatMap((line) => {
    const match = /^(tandem-(\d+)-(?:h\d+|sw))\b/.exec(line);
    if (!match) return [];
    try {
      Deno.statSync(`/proc/${match[2]}`);
      return [];
    } catch {
      return [match[1]];
    }
  });
  await removeNamespaces(orphans);
}

async function removeNamespaces(namespaces: string[]): Promise<void> {
  // Deleting a namespace deletes the links inside it, and with them their peers.
  for (const ns of namespaces) {
    await new Deno.Command("ip", { args: ["netns", "delete", ns], stdout: "null", stderr: "null" }).output();
  }
}

/** Removes every namespace and the agent of `cluster`; safe to call twice. */
export async function removeCluster(cluster: Cluster): Promise<void> {
  const switchNs = cluster.namespaces[0].replace(/-h0$/, "-sw");
  await removeNamespaces([...cluster.namespaces, switchNs]);
  if (cluster.agent) {
    await Deno.remove(cluster.agent.replace(/\/agent\.sh$/, ""), { recursive: true }).catch(() => {});
  }
}

/**
 * mpirun's arguments for `ranks` ranks on this one machine (tests, benchmarks): as root, more ranks
 * than cores allowed, and no pinning — mpirun pins each rank to one core by default, and a rank runs
 * its device's Worker beside its main thread.
 *
 * @example
 * ```ts
 * import { localMpirunArguments } from "./cluster.ts";
 * localMpirunArguments(2); // ["--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2"]
 * ```
 */
export function localMpirunArguments(ranks: number): string[] {
  return ["--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", String(ranks)];
}

/**
 * mpirun's arguments for one rank per host over TCP only, as on real machines; `agent` replaces ssh
 * where the hosts are namespaces of this machine.
 *
 * @example
 * ```ts
 * import { mpirunArguments } from "./cluster.ts";
 * mpirunArguments(["10.0.0.1", "10.0.0.2"], "10.0.0.0/24");
 * ```
 */
export function mpirunArguments(addresses: string[], subnet: string, agent?: string): string[] {
  return [
    "--allow-run-as-root",
    "--host",
    addresses.map((a) => `${a}:1`).join(","),
    "-np",
    String(addresses.length),
    // Each rank runs a Worker beside its main thread: no pinning to one core (a host of this
    // machine gets its own cores from the launch agent, the rank all of them).
    "--bind-to",
    "none",
    ...(agent ? ["--mca", "plm_rsh_agent", agent] : []),
    // Every daemon talks to mpirun directly, and ranks reach each other over TCP on the hosts' link.
    "--mca",
    "routed",
    "direct",
    "--mca",
    "btl",
    "self,tcp",
    "--mca",
    "btl_tcp_if_include",
    subnet,
    "--mca",
    "oob_tcp_if_include",
    subnet,
    // No topology in shared memory: each daemon's rtc/hwloc component writes hwloc's topology into a
    // segment mapped at an address it guesses free, and on a 2-core Xeon the daemon of a third host
    // segfaulted there (hwloc_shmem_topology_write) in 4 of 30 launches; without it, 0 of 40. The
    // cores are the launch agent's business here (taskset), and binding is off anyway.
    "--mca",
    "rtc",
    "^hwloc",
    // Quiet: a rank that fails says why itself; mpirun's own banner would only repeat it.
    "--quiet",
    ...["PATH", "NO_COLOR", "XDG_RUNTIME_DIR"].filter((name) => Deno.env.get(name) !== undefined)
      .flatMap((name) => ["-x", name]),
  ];
}

/**
 * A command that runs `argv` as one MPI rank per host of `cluster` (mpirun started in the first
 * host's namespace). What every launch across the hosts shares: the train command's and the
 * benchmarks'.
 *
 * @example
 * ```ts ignore
 * import { commandAcross, createCluster } from "./cluster.ts";
 * const cluster = await createCluster(2, "1gbit");
 * await commandAcross(cluster, ["hostname"], { stdout: "inherit" }).output();
 * ```
 */
export function commandAcross(
  cluster: Cluster,
  argv: string[],
  options: Deno.CommandOptions = {},
): Deno.Command {
  return new Deno.Command("ip", {
    ...options,
    args: [
      "netns",
      "exec",
      cluster.namespaces[0],
      // mpirun starts host 0's rank itself: on host 0's cores (the agent places the others).
      ...(cluster.cores ? ["taskset", "-c", cluster.cores[0]] : []),
      "mpirun",
      ...mpirunArguments(cluster.addresses, cluster.subnet, cluster.agent),
      // gloo (PyTorch's transport, for the benchmarks) must take the hosts' link, not the loopback
      // address their shared hostname resolves to.
      "-x",
      "GLOO_SOCKET_IFNAME",
      ...argv,
    ],
    env: {
      ...options.env,
      // Mesa's software WebGPU adapter (for --backend webgpu) warns without a runtime directory.
      XDG_RUNTIME_DIR: Deno.env.get("XDG_RUNTIME_DIR") ?? "/tmp",
      // PMIx's shared-memory store complains about permissions when a job ends early; its hash
      // store does the same job quietly.
      PMIX_MCA_gds: "hash",
      GLOO_SOCKET_IFNAME: "eth0",
    },
  });
}

/**
 * Builds the cluster, runs the train command across it, removes the cluster, and returns the exit
 * status (the train command's, 130 after Ctrl-C).
 */
export async function runCluster(argv: string[]): Promise<number> {
  const args = parseClusterArgs(argv);
  if (args === "help") {
    console.log(CLUSTER_HELP);
    return 0;
  }
  const missing = await missingRequirement();
  if (missing) throw new CliError(`cannot build the hosts: ${missing}`, EXIT_USAGE);
  const cluster = await createCluster(args.hosts, args.rate, args.delay);
  if (cluster.reorders) {
    console.error(
      `tandem cluster: the links may reorder packets, which TCP takes for loss: ${cluster.reorders}`,
    );
  }
  if (cluster.sharesCores) {
    console.error(`tandem cluster: the hosts share every core (${cluster.sharesCores})`);
  }
  let interrupted = false;
  let child: Deno.ChildProcess | undefined;
  const onSignal = () => {
    interrupted = true;
    // mpirun passes the signal to every rank; what the ranks print is theirs.
    try {
      child?.kill("SIGINT");
    } catch { /* already gone */ }
  };
  Deno.addSignalListener("SIGINT", onSignal);
  Deno.addSignalListener("SIGTERM", onSignal);
  try {
    const train = new URL("./train.ts", import.meta.url).pathname;
    child = commandAcross(cluster, [
      Deno.execPath(),
      "run",
      "-A",
      train,
      "--transport",
      "mpi",
      // One device per rank: the train command checks --devices against the ranks it finds.
      ...(args.train.includes("--devices") ? [] : ["--devices", String(args.hosts)]),
      ...args.train,
    ], { stdin: "null", stdout: "inherit", stderr: "inherit" }).spawn();
    const { code } = await child.status;
    return interrupted ? EXIT_INTERRUPTED : code;
  } finally {
    Deno.removeSignalListener("SIGINT", onSignal);
    Deno.removeSignalListener("SIGTERM", onSignal);
    await removeCluster(cluster);
  }
}

if (import.meta.main) {
  let code: number;
  try {
    code = await runCluster(Deno.args);
  } catch (error) {
    const known = describeError(error);
    if (known) {
      console.error(`tandem cluster: ${known.message}`);
      code = known.exitCode;
    } else {
      console.error("tandem cluster: unexpected error (a bug; please report it):", error);
      code = EXIT_FAILURE;
    }
  }
  Deno.exit(code);
}
