/**
 * The mechanisms that keep bad input from doing harm before it is refused: the `--link` grammar, the
 * rule that tells a real mpirun launch from stale `OMPI_*` variables, the device-count limit, and the
 * nesting limits of the Caffe prototxt parser, the schedule DSL and the safetensors header. Each test
 * names the mutation seen to make it fail. The table of whole-command bad inputs is
 * tests/cli/bad_input_test.ts.
 */

import assert from "node:assert/strict";
import { checkDeviceCount, parseTrainArgs } from "../../cli/args.ts";
import { buildLocal, chooseModel } from "../../cli/model.ts";
import { parseSchedule, ScheduleError, ValueError } from "../../mod.ts";
import { decodeSafetensors, SafetensorsError } from "../../engine/io/mod.ts";
import { detectMpiLaunch, inspectMpiLaunch } from "../../schedule/mpi/mod.ts";
import { DEVICE_COST } from "../../schedule/runtime/start.ts";
import { deviceCapacity, parseLink } from "../../schedule/runtime/mod.ts";
import { MAX_PROTOTXT_DEPTH } from "../../engine/caffe/prototxt.ts";
import { parsePrototxt, PrototxtError } from "../../engine/caffe/mod.ts";
import { CliError } from "../../cli/errors.ts";

const GB = 1e9, MB = 1e6;

// Mutation: dividing bits by 1 instead of 8 (`10Gb/s` read as 10 GB/s, the bug) fails this.
Deno.test("link: bytes and bits, prefixes, latency and presets read as written", () => {
  const cases: [string, number, number][] = [
    ["12GB/s", 12 * GB, 0],
    ["1.2GB/s", 1.2 * GB, 0],
    ["1.2 GB/s", 1.2 * GB, 0],
    ["800MB/s", 800 * MB, 0],
    ["800MB/s,50us", 800 * MB, 50e-6],
    ["800MB/s, 50 us", 800 * MB, 50e-6],
    ["200MB/s,100us", 200 * MB, 100e-6],
    ["1MB/s", MB, 0],
    ["500kB/s", 500e3, 0],
    ["500KB/s", 500e3, 0],
    ["2TB/s,1ns", 2e12, 1e-9],
    ["1GB/s,2ms", GB, 2e-3],
    ["1GB/s,1s", GB, 1],
    ["1GB/s,3µs", GB, 3e-6],
    [".5GB/s", 0.5 * GB, 0],
    ["10Gb/s", 1.25 * GB, 0],
    ["10Gbit/s", 1.25 * GB, 0],
    ["100Mb/s", 12.5 * MB, 0],
    ["8b/s", 1, 0],
    ["pcie3", 12 * GB, 10e-6],
    ["PCIe4", 24 * GB, 10e-6],
    ["nvlink", 150 * GB, 5e-6],
    ["10GbE", 1.2 * GB, 50e-6],
    ["100gbe", 12 * GB, 10e-6],
  ];
  for (const [text, bandwidth, latency] of cases) {
    const link = parseLink(text);
    assert.ok(
      Math.abs(link.bandwidthBytesPerSecond - bandwidth) < 1e-6 * bandwidth,
      `${text}: ${link.label}`,
    );
    assert.ok(Math.abs(link.latencySeconds - latency) < 1e-15, `${text} latency ${link.latencySeconds}`);
  }
  assert.match(parseLink("10Gb/s").label, /^1\.25 GB\/s/);
});

// Mutation: stripping `[\s_-]` before matching, as the old parser did, accepts -5MB/s and 1-2GB/s
// and fails this test.
Deno.test("link: negatives, ranges, exponents, zero, wrong case and stray characters are refused", () => {
  const bad = [
    "-5MB/s",
    "1-2GB/s",
    "1–2GB/s",
    "+5MB/s",
    "0MB/s",
    "0.0GB/s",
    "1e9B/s",
    "Infinity GB/s",
    "NaN GB/s",
    "1.2.3GB/s",
    "12gb/s",
    "1mB/s",
    "1 G B/s",
    "1GB/ s",
    "1GB",
    "GB/s",
    "1GBs",
    "1GB/s,",
    "1GB/s,50",
    "1GB/s,-5us",
    "1GB/s,50us,2",
    "1GB/s;50us",
    "1GB/s 50us",
    "pcie-3",
    "pcie_3",
    "ethernet",
    "0x10GB/s",
    "10GB/s!",
  ];
  for (const text of bad) {
    assert.throws(() => parseLink(text), (e: unknown) => e instanceof ValueError && e.op === "link", text);
    assert.throws(
      () => parseTrainArgs(["--link", text], undefined),
      (e: unknown) =>
        e instanceof CliError && e.message.startsWith("--link ") &&
        e.message.includes(JSON.stringify(text)) && e.message.includes("B/s (bytes)") &&
        !e.message.includes("\n"),
      text,
    );
  }
});

/** What mpirun (Open MPI 4.1.4, Debian) set for `mpirun -np 1 env`, less the rest. */
const REAL_LAUNCH = {
  OMPI_COMM_WORLD_SIZE: "2",
  OMPI_COMM_WORLD_RANK: "1",
  OMPI_COMM_WORLD_LOCAL_RANK: "1",
  OMPI_COMM_WORLD_LOCAL_SIZE: "2",
  OMPI_MCA_ess_base_jobid: "2073690113",
  OMPI_MCA_orte_hnp_uri: "2073690112.0;tcp://192.0.2.2:56851",
  PMIX_NAMESPACE: "2073690113",
  PMIX_RANK: "1",
  PMIX_SERVER_URI2: "2073690112.0;tcp4://127.0.0.1:60565",
  PMIX_SERVER_URI21: "2073690112.0;tcp4://127.0.0.1:60565",
  PMIX_SERVER_URI3: "2073690112.0;tcp4://127.0.0.1:60565",
  PMIX_SERVER_URI4: "2073690112.0;tcp4://127.0.0.1:60565",
  PMIX_SERVER_URI41: "2073690112.0;tcp4://127.0.0.1:60565",
  PMIX_SERVER_TMPDIR: "/tmp/ompi.vm.0/pid.6132",
};

const env = (vars: Record<string, string | undefined>) =>
  new Map(Object.entries(vars).filter(([, v]) => v !== undefined)) as Map<string, string>;
const alive = () => true;

// Mutation: returning the launch as soon as OMPI_COMM_WORLD_SIZE/RANK parse (the old rule) makes
// every stale row a launch and fails this test (and the mpirun one below).
Deno.test("mpi detection: a launch needs mpirun's PMIx identity and a live session directory", () => {
  assert.deepEqual(detectMpiLaunch(env(REAL_LAUNCH), alive), {
    rank: 1,
    size: 2,
    localRank: 1,
    localSize: 2,
  });
  assert.deepEqual(inspectMpiLaunch(env({}), alive), {});
  const stale: [Record<string, string | undefined>, RegExp, (dir: string) => boolean][] = [
    [{ OMPI_COMM_WORLD_SIZE: "2", OMPI_COMM_WORLD_RANK: "0" }, /PMIX_RANK is not set/, alive],
    [{ ...REAL_LAUNCH, PMIX_RANK: "0" }, /PMIX_RANK is 0/, alive],
    [{ ...REAL_LAUNCH, PMIX_NAMESPACE: undefined }, /PMIX_NAMESPACE is not set/, alive],
    [
      {
        ...REAL_LAUNCH,
        PMIX_SERVER_URI2: undefined,
        PMIX_SERVER_URI21: undefined,
        PMIX_SERVER_URI3: undefined,
        PMIX_SERVER_URI4: undefined,
        PMIX_SERVER_URI41: undefined,
      },
      /no PMIX_SERVER_URI\* is set/,
      alive,
    ],
    [
      REAL_LAUNCH,
      /session directory PMIX_SERVER_TMPDIR=\/tmp\/ompi\.vm\.0\/pid\.6132 does not exist/,
      () => false,
    ],
    [{ ...REAL_LAUNCH, OMPI_COMM_WORLD_RANK: "2" }, /not a rank below a size/, alive],
    [{ ...REAL_LAUNCH, OMPI_COMM_WORLD_SIZE: "two" }, /not a rank below a size/, alive],
    [{ OMPI_COMM_WORLD_RANK: "0" }, /OMPI_COMM_WORLD_SIZE=\(unset\)/, alive],
  ];
  for (const [vars, why, exists] of stale) {
    const detection = inspectMpiLaunch(env(vars), exists);
    assert.equal(detection.launch, undefined, JSON.stringify(vars));
    assert.match(detection.ignored ?? "", why);
    assert.match(detection.ignored!, /so mpirun did not start this process/);
    // The run goes on as one local process, saying so in one line; --transport mpi is refused.
    const args = parseTrainArgs(["--batch", "8"], detection);
    assert.equal(args.transport, "local");
    assert.equal(args.devices, 2);
    assert.equal(args.warnings.length, 1);
    assert.match(args.warnings[0], /running as one local process$/);
    assert.throws(
      () => parseTrainArgs(["--transport", "mpi"], detection),
      (e: unknown) => e instanceof CliError && why.test(e.message) && /start it with mpirun/.test(e.message),
    );
  }
  assert.deepEqual(parseTrainArgs([], {}).warnings, []);
  assert.equal(
    parseTrainArgs(["--batch", "8"], { launch: detectMpiLaunch(env(REAL_LAUNCH), alive) }).transport,
    "mpi",
  );
});

const mpirun = await (async () => {
  try {
    return (await new Deno.Command("mpirun", { args: ["--version"], stdout: "null", stderr: "null" })
      .output())
      .success;
  } catch {
    return false;
  }
})();

Deno.test({
  name: "mpi detection: a process mpirun starts is a launch; the same variables after mpirun ended are not",
  ignore: !mpirun,
  fn: async () => {
    const script = `import { inspectMpiLaunch } from "${new URL(
      "../../schedule/mpi/mod.ts",
      import.meta.url,
    )}";
      console.log(JSON.stringify({ detection: inspectMpiLaunch(), env: Deno.env.toObject() }));`;
    const output = await new Deno.Command("mpirun", {
      args: ["--allow-run-as-root", "-np", "1", Deno.execPath(), "eval", "--no-check", script],
      env: { OMPI_MCA_btl: "self", NO_COLOR: "1" },
      stdout: "piped",
      stderr: "piped",
      signal: AbortSignal.timeout(60_000),
    }).output();
    assert.equal(output.code, 0, new TextDecoder().decode(output.stderr));
    const { detection, env: seen } = JSON.parse(
      new TextDecoder().decode(output.stdout).trim().split("\n").at(-1)!,
    );
    assert.deepEqual(detection, { launch: { rank: 0, size: 1, localRank: 0, localSize: 1 } });
    // Exported into a later shell, the same variables point at a session directory that is gone.
    assert.match(
      inspectMpiLaunch(new Map(Object.entries(seen))).ignored ?? "",
      /PMIX_SERVER_TMPDIR=.* does not exist/,
    );
  },
});

const SMALL = { memoryBytes: 8 * 2 ** 30, cores: 4 };

// Mutation: dropping the thread bound (byThreads = Infinity) or the memory bound (byMemory =
// Infinity) fails the matching assertions below.
Deno.test("devices: the limit is min(memory share / bytes per device, threads) and is said in one line", async () => {
  const lenet = deviceCapacity(
    { parameters: 431_080, activationsPerSample: 10_000, samplesPerDevice: 4 },
    SMALL,
  );
  const perDevice = DEVICE_COST.baseBytes + 4 * (4 * 431_080 + 2 * 10_000 * 4);
  assert.equal(lenet.bytesPerDevice, perDevice);
  assert.equal(lenet.byMemory, Math.floor(0.75 * SMALL.memoryBytes / perDevice));
  assert.equal(lenet.byThreads, 32);
  assert.equal(lenet.maxDevices, Math.min(lenet.byMemory, 32));
  // 61 M parameters (AlexNet): memory binds long before threads.
  const alexnet = deviceCapacity({ parameters: 61e6 }, SMALL);
  assert.ok(alexnet.maxDevices === alexnet.byMemory && alexnet.maxDevices < 10, JSON.stringify(alexnet));

  // In the CLI: the thread bound at parse time, the memory bound once the model is built.
  assert.throws(
    () => parseTrainArgs(["--devices", "1000", "--batch", "1000"], undefined, SMALL),
    (e: unknown) =>
      e instanceof CliError &&
      e.message === "--devices 1000: at most 32 devices on this machine (4 cores, one thread per device)",
  );
  assert.equal(parseTrainArgs(["--devices", "32", "--batch", "64"], undefined, SMALL).devices, 32);
  const choice = await chooseModel("lenet", 1);
  if (typeof choice === "symbol") throw new Error("lenet needs no input shape");
  const network = await buildLocal(choice.spec(10));
  try {
    const tiny = { memoryBytes: 2 ** 30, cores: 64 };
    const args = parseTrainArgs(["--devices", "32", "--batch", "64"], undefined, tiny);
    assert.throws(
      () => checkDeviceCount(args, network, tiny),
      /: --devices 32: at most 1[0-9] devices for this model on this machine \(1\.0 GiB memory, 64 cores; about \d+ MiB per device\)$/,
    );
    checkDeviceCount({ ...args, devices: 2 }, network, tiny);
    // Under MPI the ranks may be on other hosts: no local bound.
    checkDeviceCount({ ...args, transport: "mpi" }, network, tiny);
  } finally {
    network.dispose();
  }
});

const nested = (depth: number) => `${"a {\n".repeat(depth)}b: 1\n${"}\n".repeat(depth)}`;

// Mutation: skipping the depth check in openMessage makes the 5,000-deep file end in
// "RangeError: Maximum call stack size exceeded" and fails this test.
Deno.test("prototxt: nesting is limited, with the line and column of the first message too deep", () => {
  assert.equal(parsePrototxt(nested(MAX_PROTOTXT_DEPTH)).fields.length, 1);
  for (const depth of [MAX_PROTOTXT_DEPTH + 1, 5_000, 50_000]) {
    assert.throws(() => parsePrototxt(nested(depth), "deep.prototxt"), (e: unknown) => {
      assert.ok(e instanceof PrototxtError, String(e));
      assert.equal(e.line, MAX_PROTOTXT_DEPTH + 1);
      assert.equal(e.column, 3);
      assert.equal(e.message, `deep.prototxt:101:3: messages nest deeper than ${MAX_PROTOTXT_DEPTH} levels`);
      return true;
    });
  }
  // Lists of messages nest too.
  const listed = `${"a: [{\n".repeat(200)}${"}]\n".repeat(200)}`;
  assert.throws(() => parsePrototxt(listed), /<prototxt>:101:5: messages nest deeper than 100 levels/);
});

Deno.test("schedule DSL: it cannot nest, so deep brackets or a huge statement fail at the first character", () => {
  for (
    const text of ["(".repeat(5_000), `backward ${"[".repeat(5_000)}fc`, `reduce ${"fc,".repeat(20_000)}`]
  ) {
    assert.throws(
      () => parseSchedule(text, { groups: ["fc", "conv"], fileName: "deep.sched" }),
      ScheduleError,
    );
  }
});

function safetensorsBytes(header: string): Uint8Array {
  const json = new TextEncoder().encode(header);
  const bytes = new Uint8Array(8 + json.length);
  new DataView(bytes.buffer).setBigUint64(0, BigInt(json.length), true);
  bytes.set(json, 8);
  return bytes;
}

// Mutation: removing the depth scan before JSON.parse leaves messages quoting megabytes of nested
// JSON (and at a few million levels, JSON.stringify's RangeError); this test then fails.
Deno.test("safetensors: a header nested deeper than the format's 3 levels is refused before JSON.parse", () => {
  const ok = '{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"__metadata__":{"a":"b"}}';
  const file = safetensorsBytes(ok);
  const withData = new Uint8Array(file.length + 4);
  withData.set(file);
  assert.equal(decodeSafetensors(withData).tensors.size, 1);
  const deep = [
    `{"w":${"[".repeat(5_000)}${"]".repeat(5_000)}}`,
    `{${'"a":{'.repeat(5_000)}${"}".repeat(5_001)}`,
    `{"w":{"dtype":"F32","shape":[[1]],"data_offsets":[0,4]}}`,
    `{"__metadata__":{"x":{"y":["z"]}}}`,
  ];
  for (const header of deep) {
    assert.throws(() => decodeSafetensors(safetensorsBytes(header), "deep.safetensors"), (e: unknown) => {
      assert.ok(e instanceof SafetensorsError, String(e));
      assert.match(e.message, /^deep\.safetensors: header nests deeper than 3 levels at character \d+/);
      assert.ok(e.message.length < 200);
      return true;
    });
  }
  // Brackets inside strings are not nesting.
  const quoted = '{"w[[[[":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"__metadata__":{"a":"{{{{"}}';
  const quotedFile = new Uint8Array(safetensorsBytes(quoted).length + 4);
  quotedFile.set(safetensorsBytes(quoted));
  assert.equal(decodeSafetensors(quotedFile).metadata.a, "{{{{");
});
