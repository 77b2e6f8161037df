/**
 * `deno task cluster`: 2 ranks in 2 network namespaces over a tc-shaped 1 Gbit/s link train exactly as
 * 2 Worker devices in one process, under `overlap` and `sequential`, and the namespaces are gone
 * afterwards. Skipped, saying so, without root, iproute2 or mpirun.
 */

import assert from "node:assert/strict";
import {
  allCoresMask,
  type Cluster,
  commandAcross,
  createCluster,
  missingRequirement,
  removeCluster,
} from "../../cli/cluster.ts";
import { allowedCores, coreList, hostCores } from "../../cli/host_cores.ts";

import { runSlowTests } from "../fixtures/slow.ts";
import { overlapGoal } from "../../bench/cluster/overlap_goal.ts";

const missing = await missingRequirement();
if (missing) console.log(`cluster: skipping the cluster tests: ${missing}`);

const root = new URL("../..", import.meta.url).pathname;
const decoder = new TextDecoder();

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

async function deno(script: string, args: string[], env: Record<string, string> = {}): Promise<Run> {
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--no-check", `${root}${script}`, ...args],
    env: { NO_COLOR: "1", XDG_RUNTIME_DIR: Deno.env.get("XDG_RUNTIME_DIR") ?? "/tmp", ...env },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(180_000),
  }).output();
  return { code: output.code, stdout: decoder.decode(output.stdout), stderr: decoder.decode(output.stderr) };
}

/** The train command's `--json` object from a run's stdout. */
function json(run: Run): Record<string, unknown> & { paramsSha256: string; stepMs: Record<string, number> } {
  assert.equal(run.code, 0, run.stderr);
  const line = run.stdout.trim().split("\n").at(-1)!;
  return JSON.parse(line);
}

async function namespaces(): Promise<string[]> {
  const output = await new Deno.Command("ip", { args: ["netns", "list"], stdout: "piped" }).output();
  return decoder.decode(output.stdout).split("\n").filter((l) => l.startsWith("tandem-"))
    .map((l) => l.split(" ")[0]);
}

/**
 * Fails if a namespace exists now that did not before. Not an equality: a cluster removes the
 * namespaces that killed clusters left behind (their process is gone) as it starts, so `before`
 * may lose some. (An equality failed a full run after an earlier test run had been killed.)
 */
async function assertNoneLeft(before: string[], message = "the cluster's namespaces were left behind") {
  assert.deepEqual((await namespaces()).filter((ns) => !before.includes(ns)), [], message);
}

const TRAIN = ["--steps", "4", "--batch", "32", "--json"];

// Catches: a transport or exchange that changes bits across a real network (e.g. MPI's own MPI_SUM
// instead of the rank-order average, or chunks averaged out of order), and a cluster left behind
// (removing `removeCluster` leaves the namespaces listed).
Deno.test({
  name: "cluster: 2 hosts over a 1 Gbit/s tc-shaped link equal 2 in-process Workers bit for bit",
  // Slow (four training runs as processes): runs with the slow tests. The default set runs the same
  // MPI transport across 2 processes against in-process Workers (mpi_test.ts) and builds, shapes and
  // removes the cluster (the next two tests).
  ignore: !runSlowTests || missing !== undefined,
  fn: async () => {
    const before = await namespaces();
    for (const schedule of ["overlap", "sequential"]) {
      const across = json(
        await deno("cli/cluster.ts", [
          "--hosts",
          "2",
          "--rate",
          "1gbit",
          "--",
          ...TRAIN,
          "--schedule",
          schedule,
        ]),
      );
      const local = json(
        await deno("cli/train.ts", [
          ...TRAIN,
          "--schedule",
          schedule,
          "--transport",
          "local",
          "--devices",
          "2",
        ]),
      );
      assert.equal(across.transport, "mpi");
      assert.equal(
        across.paramsSha256,
        local.paramsSha256,
        `${schedule}: the cluster run differs from the local one`,
      );
    }
    await assertNoneLeft(before);
  },
});

// Catches: links left unshaped (dropping `shape` in createCluster leaves no tbf qdisc), a rate or
// delay not applied, or one direction forgotten (the switch ports shape the traffic to each host).
Deno.test({
  name: "cluster: every host's link is shaped to the rate and delay, both ways, and removed after",
  ignore: missing !== undefined,
  fn: async () => {
    const before = await namespaces();
    // netem (for --delay) is a kernel module some kernels lack (this sandbox's does): then --delay
    // must be refused in one line, with nothing left behind, and the rate alone is checked.
    let delay: string | undefined = "1ms";
    try {
      await removeCluster(await createCluster(2, "1gbit", delay));
    } catch (error) {
      assert.match((error as Error).message, /^--delay needs the kernel's netem queueing discipline/);
      console.log("cluster: this kernel has no netem; checked that --delay is refused and the rate alone");
      delay = undefined;
    }
    await assertNoneLeft(before, "a failed cluster left namespaces behind");
    const cluster = await createCluster(2, "1gbit", delay);
    try {
      const qdiscs = async (ns: string, device: string) =>
        decoder.decode(
          (await new Deno.Command("tc", { args: ["-n", ns, "qdisc", "show", "dev", device], stdout: "piped" })
            .output()).stdout,
        );
      const switchNs = cluster.namespaces[0].replace(/-h0$/, "-sw");
      for (const [i, ns] of cluster.namespaces.entries()) {
        for (const [where, device] of [[ns, "eth0"], [switchNs, `p${i}`]]) {
          const shown = await qdiscs(where, device);
          assert.match(shown, /tbf .*rate 1Gbit/, `${where} ${device} is not shaped:\n${shown}`);
          if (delay) assert.match(shown, /netem .*delay 1ms/, `${where} ${device} has no delay:\n${shown}`);
        }
      }
    } finally {
      await removeCluster(cluster);
    }
    await assertNoneLeft(before);
  },
});

// Catches a cluster that leaves a killed cluster's namespaces in place, or removes a live one.
// Mutations tried, each failing it: the `removeOrphans()` call dropped from createCluster (the
// orphan stays listed); every tandem namespace taken for an orphan (the live one is removed).
Deno.test({
  name: "cluster: a new cluster removes the namespaces a killed one left, and no live one",
  ignore: missing !== undefined,
  fn: async () => {
    // A process id no process has now: one that has just exited.
    const child = new Deno.Command("true").spawn();
    await child.status;
    const orphan = `tandem-${child.pid}-sw`;
    const live = `tandem-${Deno.pid}-h9`; // named as a cluster host, but of this process, which runs
    for (const ns of [orphan, live]) {
      await new Deno.Command("ip", { args: ["netns", "add", ns], stderr: "null" }).output();
    }
    try {
      assert.ok((await namespaces()).includes(orphan), `could not create ${orphan}`);
      await removeCluster(await createCluster(2, "1gbit"));
      const after = await namespaces();
      assert.ok(!after.includes(orphan), `the killed cluster's ${orphan} was left in place`);
      assert.ok(after.includes(live), `the live ${live} was removed`);
    } finally {
      for (const ns of [orphan, live]) {
        await new Deno.Command("ip", { args: ["netns", "delete", ns], stderr: "null" }).output();
      }
    }
  },
});

Deno.test("cluster: the receive-steering mask names every core, in sysfs's 32-bit groups", () => {
  assert.equal(allCoresMask(1), "1");
  assert.equal(allCoresMask(2), "3");
  assert.equal(allCoresMask(32), "ffffffff");
  assert.equal(allCoresMask(33), "1,ffffffff");
  assert.equal(allCoresMask(72), "ff,ffffffff,ffffffff");
});

Deno.test("cluster: the hosts get this machine's cores split evenly, in order, or share them all when too few", () => {
  assert.deepEqual(hostCores(2, [0, 1]), [[0], [1]]);
  assert.deepEqual(hostCores(2, [4, 5, 6, 7]), [[4, 5], [6, 7]]);
  // The rest unused, so the hosts stay alike.
  assert.deepEqual(hostCores(2, [0, 1, 2]), [[0], [1]]);
  assert.deepEqual(hostCores(4, [0, 1, 2, 3, 4, 5, 6, 7, 8]), [[0, 1], [2, 3], [4, 5], [6, 7]]);
  assert.equal(hostCores(3, [0, 1]), undefined);
  assert.equal(coreList([0, 1, 2, 5]), "0-2,5");
  assert.equal(coreList([3]), "3");
  const own = allowedCores();
  assert.ok(own.length >= 1 && own.every((c) => Number.isInteger(c) && c >= 0), `cores: ${own}`);
  assert.equal(own.length, navigator.hardwareConcurrency);
});

/** The lines every rank of `cluster` prints running `script` (`deno eval`), in arrival order. */
async function everyRankPrints(cluster: Cluster, script: string): Promise<string[]> {
  const output = await commandAcross(cluster, [Deno.execPath(), "eval", script], {
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(60_000),
  }).output();
  assert.ok(output.success, decoder.decode(output.stderr));
  return decoder.decode(output.stdout).trim().split("\n");
}

// Every rank must run on its own host's cores, and the train command's default threads (from
// `navigator.hardwareConcurrency`) must see that host's share, as on a real host. Mutations tried,
// each failing it: the agent's taskset dropped (rank 1 inherits mpirun's core 0, the host 0's);
// commandAcross's taskset dropped (rank 0 runs on every core and counts them all).
Deno.test({
  name: "cluster: each host's rank runs on that host's own cores, and counts only them",
  ignore: missing !== undefined || navigator.hardwareConcurrency < 2,
  fn: async () => {
    const cluster = await createCluster(2, "1gbit");
    try {
      assert.equal(cluster.sharesCores, undefined);
      const split = hostCores(2, allowedCores())!;
      assert.equal(cluster.cores?.length, 2);
      const script = "const r = Deno.env.get('OMPI_COMM_WORLD_RANK'); " +
        "const cpus = /Cpus_allowed_list:\\s*(\\S+)/.exec(Deno.readTextFileSync('/proc/self/status'))[1]; " +
        "console.log(JSON.stringify({ r: Number(r), cpus, threads: navigator.hardwareConcurrency }));";
      const ranks = (await everyRankPrints(cluster, script)).map((l) => JSON.parse(l))
        .sort((a, b) => a.r - b.r);
      assert.deepEqual(
        ranks,
        split.map((cores, r) => ({ r, cpus: cluster.cores![r], threads: cores.length })),
      );
    } finally {
      await removeCluster(cluster);
    }
  },
});

// With more hosts than cores no host can have one of its own: the hosts share every core, and the
// cluster says why. Mutation tried: hostCores handing out empty core lists instead of refusing (the
// cluster then gives its hosts cores it does not have; the test fails on its first check).
Deno.test({
  name: "cluster: with more hosts than cores, every rank runs on every core, and the cluster says why",
  ignore: missing !== undefined,
  fn: async () => {
    const hosts = navigator.hardwareConcurrency + 1;
    const cluster = await createCluster(hosts, "1gbit");
    try {
      assert.equal(cluster.cores, undefined);
      assert.equal(
        cluster.sharesCores,
        `${hosts} hosts on ${navigator.hardwareConcurrency} cores`.replace(/ 1 cores$/, " 1 core"),
      );
      assert.deepEqual(
        (await everyRankPrints(cluster, "console.log(String(navigator.hardwareConcurrency))")).map(Number),
        Array(hosts).fill(navigator.hardwareConcurrency),
      );
    } finally {
      await removeCluster(cluster);
    }
  },
});

/** TCP counters of namespace `ns` from /proc (`TcpExt` and `Tcp` lines), by name. */
async function tcpCounters(ns: string): Promise<Record<string, number>> {
  const text = decoder.decode(
    (await new Deno.Command("ip", {
      args: ["netns", "exec", ns, "cat", "/proc/net/netstat", "/proc/net/snmp"],
      stdout: "piped",
    }).output()).stdout,
  );
  const counters: Record<string, number> = {};
  const lines = text.split("\n");
  for (let i = 0; i + 1 < lines.length; i++) {
    const [names, values] = [lines[i].split(" "), lines[i + 1].split(" ")];
    if (!/^(TcpExt|Tcp):$/.test(names[0]) || names[0] !== values[0] || !/^\d/.test(values[1] ?? "")) continue;
    names.slice(1).forEach((name, k) => counters[name] = Number(values[k + 1]));
  }
  return counters;
}

// A veth queues each packet on the backlog of the core that sent it, and two cores' backlogs drain
// at once, so without receive packet steering one connection's packets overtake each other: TCP
// counts them out of order and retransmits segments it took for lost, which no real link makes it
// do. Mutation tried: keepFlowsInOrder made a no-op — on this 2-core machine 96 MB each way at
// 10 Gbit/s then arrived with out-of-order segments (the test failed, 3 runs of 3).
Deno.test({
  name: "cluster: one connection's packets arrive in order over the links, as on a real link",
  ignore: missing !== undefined || navigator.hardwareConcurrency < 2,
  fn: async () => {
    const cluster = await createCluster(2, "10gbit");
    try {
      assert.equal(cluster.reorders, undefined);
      const end = (i: number, role: string) =>
        new Deno.Command("ip", {
          args: [
            "netns",
            "exec",
            cluster.namespaces[i],
            Deno.execPath(),
            "run",
            "-A",
            "--no-check",
            `${root}tests/fixtures/tcp_duplex.ts`,
            role,
            cluster.addresses[0],
            "16",
            "6",
          ],
          stdout: "null",
          stderr: "piped",
          signal: AbortSignal.timeout(60_000),
        }).output();
      const ends = await Promise.all([end(0, "server"), end(1, "client")]);
      for (const e of ends) assert.ok(e.success, decoder.decode(e.stderr));
      for (const ns of cluster.namespaces) {
        const counters = await tcpCounters(ns);
        assert.ok(counters.InSegs > 1_000, `${ns}: too few segments to tell (${counters.InSegs})`);
        // Out-of-order arrivals, not retransmissions, are what reordering leaves: under load a lone
        // timer-driven loss probe (1 segment, seen once in CI) retransmits on an in-order link too.
        assert.equal(
          counters.TCPOFOQueue,
          0,
          `${ns}: segments arrived out of order (${counters.RetransSegs} retransmitted)`,
        );
      }
    } finally {
      await removeCluster(cluster);
    }
  },
});

Deno.test({
  name: "cluster: bad flags and a machine without the tools get one line and exit 2, creating nothing",
  ignore: missing !== undefined,
  fn: async () => {
    const before = await namespaces();
    const bad = await deno("cli/cluster.ts", ["--rate", "fast"]);
    assert.equal(bad.code, 2);
    assert.match(
      bad.stderr,
      /^tandem cluster: --rate must be a tc rate such as 100mbit, 1gbit or 10gbit, got "fast"\n$/,
    );
    const hosts = await deno("cli/cluster.ts", ["--hosts", "1", "--rate", "1gbit"]);
    assert.equal(hosts.code, 2);
    assert.match(hosts.stderr, /--hosts must be an integer from 2 to 16, got "1"/);
    // A PATH with a shell, ip and tc but no mpirun.
    const bin = await Deno.makeTempDir({ prefix: "tandem-path-" });
    for (const tool of ["sh", "ip", "tc"]) {
      const which = decoder.decode(
        (await new Deno.Command("sh", { args: ["-c", `command -v ${tool}`], stdout: "piped" }).output())
          .stdout,
      ).trim();
      await Deno.symlink(which, `${bin}/${tool}`);
    }
    const noMpi = await deno("cli/cluster.ts", ["--rate", "1gbit", "--", "--steps", "1"], { PATH: bin });
    await Deno.remove(bin, { recursive: true });
    assert.equal(noMpi.code, 2, noMpi.stderr);
    assert.equal(
      noMpi.stderr,
      "tandem cluster: cannot build the hosts: mpirun is missing (apt-get install openmpi-bin)\n",
    );
    // A train error is the train command's own line, and the cluster is removed after it too.
    const trainError = await deno("cli/cluster.ts", ["--rate", "1gbit", "--", "--bogus"]);
    assert.notEqual(trainError.code, 0);
    assert.match(trainError.stderr, /tandem train: unknown option --bogus/);
    await assertNoneLeft(before);
  },
});

// Mutations tried, each failing this test: choosePlan saying the measured link but pricing at the
// assumed one (12 GB/s in the why line; at batch 16 hybrid still wins there, so the choice alone
// would not tell); the probe's rate over the sum of its timed transfers instead of their median (a
// third of the link's rate); each rank's bytes counted twice (twice the link's rate).
Deno.test({
  name: "cluster: --schedule auto across hosts prices at the link it measured between them (100 Mbit/s)",
  ignore: missing !== undefined,
  fn: async () => {
    const run = await deno("cli/cluster.ts", [
      "--hosts",
      "2",
      "--rate",
      "100mbit",
      "--",
      "--model",
      "alexnet-like",
      "--steps",
      "1",
      "--batch",
      "16",
      "--schedule",
      "auto",
    ]);
    assert.equal(run.code, 0, run.stderr);
    const priced =
      /^auto schedule: (\S+) over groups .* \(priced at the link measured between the 2 ranks: ([\d.]+) Gbit\/s per direction both ways, ([\d.]+) one way, (\d+) µs/m
        .exec(run.stdout);
    assert.ok(priced, run.stdout);
    const [, chosen, twoWay, oneWay] = priced;
    // tc's token bucket holds each direction to 100 Mbit/s: what the probe measured is at most that
    // (a few percent over for its burst and the clocks) and, with the cores idle but for it, most of it.
    for (const rate of [Number(twoWay), Number(oneWay)]) assert.ok(rate >= 0.05 && rate <= 0.105, priced[0]);
    // At 100 Mbit/s the FC gradients (4.2 MB) take a third of a second each way; their activations
    // (0.5 MB at batch 16) far less: sharding the FC layers wins, as bench/CLUSTER.md measured at 1 Gbit/s.
    assert.equal(chosen, "hybrid", run.stdout);
    // And the candidates were priced at it (0.0125 GB/s), not at the assumed link (12 GB/s).
    assert.match(run.stdout, /^ {2}why: hybrid: .* at 0\.0 GB\/s with 2 devices \(master\)/m);
  },
});

// Mutation tried: the paired trainer skipping its last step (or stepping with another learning rate)
// makes the digests differ, and a pairedWith the rank script ignores leaves no paired figures.
Deno.test({
  name:
    "cluster bench: a row paired with sequential steps over a real link trains both trainers to the same bits",
  ignore: missing !== undefined,
  fn: async () => {
    const cluster = await createCluster(2, "1gbit");
    try {
      const config = {
        net: "alexnet-like",
        schedule: "overlap",
        mode: "master",
        batch: 16,
        steps: 2,
        warmup: 1,
        linkBytesPerSecond: 125e6,
        deviceThreads: 1,
        pairedWith: "sequential",
      };
      const output = await commandAcross(
        cluster,
        [Deno.execPath(), "run", "-A", "--no-check", `${root}bench/cluster/rank.ts`, JSON.stringify(config)],
        { stdin: "null", stdout: "piped", stderr: "piped", signal: AbortSignal.timeout(180_000) },
      ).output();
      assert.ok(output.success, decoder.decode(output.stderr).slice(-3000));
      const r = JSON.parse(decoder.decode(output.stdout).trim().split("\n").at(-1)!);
      assert.equal(r.schedule, "overlap");
      assert.equal(r.paired?.schedule, "sequential");
      assert.ok(r.stepMs > 0 && r.paired.stepMs > 0 && r.paired.fcCommMs > 0);
      // Two trainers on one transport, their steps in turn: each got its own bytes, and the overlap
      // schedule's parameters equal the sequential one's bit for bit.
      assert.match(r.paramsSha256, /^[0-9a-f]{64}$/);
      assert.equal(r.paramsSha256, r.paired.paramsSha256);
    } finally {
      await removeCluster(cluster);
    }
  },
});

// Mutations tried, each made this test fail: the branch taken on T_fc_comm ≥ conv backward instead
// of conv backward ≥ T_fc_comm; what stays visible taken against the row's own FC comm instead of its
// sequential reference's; every row checked against the first row's reference instead of its own.
Deno.test("cluster bench: the overlap goal asks 0.8 hidden where the conv backward covers the exchange, else at most the difference visible, each row against its own sequential steps", () => {
  const ms = (v: number) => `${v} ms`;
  // Covered: conv backward 50 ms ≥ the exchange's 40 ms.
  const covered = { stepMs: 100, fcCommMs: 40, bodyBackwardMs: 50 };
  // Not covered: 20 ms of conv backward against 33 ms of exchange leaves 13 ms that may stay visible;
  // T_seq − T_fc_comm = 47 ms of the sequential step is not the exchange.
  const short = { stepMs: 80, fcCommMs: 33, bodyBackwardMs: 20 };
  const row = (stepMs: number) => ({ stepMs, fcCommMs: 60, bodyBackwardMs: 45 });
  const sentence = overlapGoal("master", [
    { name: "overlap", r: row(66), seq: covered },
    { name: "bucketed", r: row(70), seq: covered },
    { name: "auto", r: row(60), seq: short },
    { name: "hybrid", r: row(58), seq: short },
    { name: "overlap, again", r: row(66), seq: short },
  ], ms);
  assert.match(sentence, /^\*\*Overlap goal, master\*\* /);
  const parts = sentence.slice(sentence.indexOf("): ") + 3).split("; ");
  assert.deepEqual(parts, [
    "overlap: the conv backward (50 ms) covers the FC exchange (40 ms), so the hidden fraction should reach 0.8: 0.85 (met)",
    "bucketed: the conv backward (50 ms) covers the FC exchange (40 ms), so the hidden fraction should reach 0.8: 0.75 (not met)",
    "auto: the conv backward (20 ms) is shorter than the FC exchange (33 ms), so at most the difference, 13 ms, may stay visible: 13 ms (met)",
    "hybrid: the conv backward (20 ms) is shorter than the FC exchange (33 ms), so at most the difference, 13 ms, may stay visible: 11 ms (met)",
    "overlap, again: the conv backward (20 ms) is shorter than the FC exchange (33 ms), so at most the difference, 13 ms, may stay visible: 19 ms (not met).",
  ]);
});
