import assert from "node:assert/strict";
import { ValueError } from "../engine/errors.ts";
import {
  alexnetScalingTable,
  autoSchedule,
  checkProfile,
  commStepSeconds,
  type CostOptions,
  dependenciesOf,
  groupTotals,
  judgeNetwork,
  type LayerProfile,
  overlap,
  parseSchedule,
  type Profile,
  regroupProfile,
  scheduleBuilder,
  ScheduleError,
  sequential,
  simulate,
  STANDARD_LINKS,
  stepLabel,
  validatePlan,
} from "../schedule/mod.ts";

const GROUPS = ["fc", "conv"];
const near = (actual: number, expected: number, what = "", tolerance = 1e-9) =>
  assert.ok(
    Math.abs(actual - expected) <= tolerance * Math.max(1, Math.abs(expected)),
    `${what}: ${actual} vs ${expected}`,
  );

const layer = (name: string, group: string, f: number, b: number, bytes: number): LayerProfile => ({
  name,
  group,
  forwardSeconds: f,
  backwardSeconds: b,
  parameterBytes: bytes,
});

/** conv: forward 1 s, backward 2 s, 100 B; fc: forward 0.5 s, backward 1 s, 1000 B. */
const HAND: Profile = {
  batchSize: 4,
  layers: [
    layer("conv1", "conv", 0.6, 1.2, 60),
    layer("conv2", "conv", 0.4, 0.8, 40),
    layer("fc", "fc", 0.5, 1, 1000),
  ],
};

/** 100 B/s, 0.5 s latency, sums at 1000 B/s, updates at 1 ms/B, 2 devices through one shared link. */
const HAND_COSTS: CostOptions = {
  link: { bandwidthBytesPerSecond: 100, latencySeconds: 0.5 },
  devices: 2,
  mode: "master",
  topology: "shared",
  memoryBandwidthBytesPerSecond: 1000,
  updateSecondsPerByte: 0.001,
};

Deno.test("simulate: sequential is the sum of every step on a hand-made profile", () => {
  // forward 1.5; backward fc 1, conv 2; reduce fc 0.5 + 10 + 1 (sum) = 11.5, conv 0.5 + 1 + 0.1 = 1.6;
  // update fc 1, conv 0.1; broadcast fc 10.5, conv 1.5. Total 30.7.
  const sim = simulate(sequential(GROUPS), HAND, HAND_COSTS);
  near(sim.stepSeconds, 1.5 + 1 + 2 + 11.5 + 1.6 + 1 + 0.1 + 10.5 + 1.5, "step");
  near(sim.stepSeconds, 30.7, "step");
  const expected: [string, number, number][] = [
    ["reduce fc", 4.5, 16],
    ["reduce conv", 16, 17.6],
    ["update fc", 17.6, 18.6],
    ["update conv", 18.6, 18.7],
    ["broadcast fc", 18.7, 29.2],
    ["broadcast conv", 29.2, 30.7],
  ];
  const plan = sequential(GROUPS);
  const comm0 = sim.lanes[0].comm;
  assert.deepEqual(comm0.map((e) => stepLabel(e)), expected.map((e) => e[0]));
  comm0.forEach((e, i) => {
    near(e.start, expected[i][1], `${expected[i][0]} start`);
    near(e.end, expected[i][2], `${expected[i][0]} end`);
    assert.equal(stepLabel(plan.steps[e.step]), expected[i][0]);
  });
  assert.deepEqual(sim.lanes[0].compute.map((e) => [stepLabel(e), e.start, e.end]), [
    ["forward", 0, 1.5],
    ["backward fc", 1.5, 2.5],
    ["backward conv", 2.5, 4.5],
  ]);
  // Only device 0 updates in master mode; device 1 waits in the collectives.
  assert.deepEqual(sim.lanes[1].comm.map((e) => stepLabel(e)), [
    "reduce fc",
    "reduce conv",
    "broadcast fc",
    "broadcast conv",
  ]);
  near(sim.commSeconds, 30.7 - 4.5, "comm");
  assert.equal(sim.hiddenCommSeconds, 0);
  assert.equal(sim.hiddenFraction, 0);
  near(sim.computeSeconds, 4.5, "compute");
});

Deno.test("simulate: written order matters — reduce all after backward all waits for the whole backward", () => {
  const plan = sequential(GROUPS);
  const reduceFc = plan.steps.findIndex((s) => stepLabel(s) === "reduce fc");
  const backwardConv = plan.steps.findIndex((s) => stepLabel(s) === "backward conv");
  assert.deepEqual(plan.steps[reduceFc].waitsFor, [backwardConv]);
  assert.ok(dependenciesOf(plan, reduceFc).includes(backwardConv));
  // The overlap plan needs no extra waits: lane order and data say everything.
  assert.ok(overlap(GROUPS).steps.every((s) => s.waitsFor === undefined));
  // A hand-made plan without program order does overlap reduce fc with backward conv.
  const raw = { ...plan, steps: plan.steps.map(({ waitsFor: _, ...s }) => s) };
  near(simulate(raw, HAND, HAND_COSTS).lanes[0].comm[0].start, 2.5, "reduce fc start without program order");
  const badWait = { ...plan, steps: plan.steps.map((s, i) => (i === 1 ? { ...s, waitsFor: [5] } : s)) };
  assert.throws(
    () => validatePlan(badWait, { mode: "master" }),
    (e: unknown) =>
      e instanceof ScheduleError && e.reason === "backward fc waits for step 5, which is not an earlier step",
  );
});

Deno.test("simulate: overlap runs FC communication during conv backward", () => {
  const sim = simulate(overlap(GROUPS), HAND, HAND_COSTS);
  // reduce fc [2.5, 14], update fc [14, 15], broadcast fc [15, 25.5], reduce conv [25.5, 27.1],
  // update conv [27.1, 27.2], broadcast conv [27.2, 28.7]; conv backward [2.5, 4.5] hides 2 s.
  near(sim.stepSeconds, 28.7, "step");
  near(sim.commSeconds, 26.2, "comm");
  near(sim.hiddenCommSeconds, 2, "hidden");
  near(sim.hiddenFraction, 2 / 26.2, "fraction");
  near(sim.groups.fc.commSeconds, 23, "fc comm");
  near(sim.groups.fc.hiddenCommSeconds, 2, "fc hidden");
  near(sim.groups.conv.commSeconds, 3.2, "conv comm");
  assert.equal(sim.groups.conv.hiddenCommSeconds, 0);
  // Same parameters, same total communication: the saving is exactly the hidden part.
  near(simulate(sequential(GROUPS), HAND, HAND_COSTS).stepSeconds - sim.stepSeconds, 2, "saving");
});

Deno.test("simulate: FC communication shorter than conv backward is hidden completely", () => {
  const profile: Profile = {
    batchSize: 1,
    layers: [layer("conv", "conv", 1, 5, 0), layer("fc", "fc", 0.5, 1, 100)],
  };
  const costs: CostOptions = { ...HAND_COSTS, link: { bandwidthBytesPerSecond: 100, latencySeconds: 0 } };
  const sim = simulate(overlap(GROUPS), profile, costs);
  // reduce fc 1 + 0.1, update 0.1, broadcast 1: 2.2 s inside conv backward's 5 s.
  near(sim.groups.fc.commSeconds, 2.2, "fc comm");
  near(sim.groups.fc.hiddenCommSeconds / sim.groups.fc.commSeconds, 1, "fc fraction");
  near(sim.hiddenFraction, 1, "fraction");
  near(sim.stepSeconds, 1.5 + 1 + 5, "step is just compute");
  near(simulate(sequential(GROUPS), profile, costs).stepSeconds, 1.5 + 1 + 5 + 2.2, "sequential");
  // When FC communication outlasts conv backward, exactly the conv backward's length is hidden.
  const slow = { ...costs, link: { bandwidthBytesPerSecond: 10, latencySeconds: 0 } };
  const long = simulate(overlap(GROUPS), profile, slow);
  near(long.hiddenCommSeconds, 5, "hidden = conv backward");
  near(long.stepSeconds, 1.5 + 1 + (10 + 0.1) + 0.1 + 10, "step");
});

Deno.test("cost model: latency and bandwidth scale as documented", () => {
  const b = 1e6;
  const base: CostOptions = {
    link: { bandwidthBytesPerSecond: 1e9, latencySeconds: 1e-4 },
    devices: 4,
    mode: "master",
    memoryBandwidthBytesPerSecond: 1e10,
    updateSecondsPerByte: 1e-10,
  };
  const t = 1e-4 + b / 1e9;
  near(commStepSeconds("reduce", b, base), 3 * t + (3 * b) / 1e10, "shared reduce");
  near(commStepSeconds("broadcast", b, base), 3 * t, "shared broadcast");
  near(commStepSeconds("reduce", b, { ...base, topology: "star" }), t + (3 * b) / 1e10, "star reduce");
  near(commStepSeconds("broadcast", b, { ...base, topology: "star" }), t, "star broadcast");
  near(commStepSeconds("update", b, base), 1e-4, "update");
  const ring = commStepSeconds("reduce", b, { ...base, mode: "allreduce" });
  near(ring, (2 * 3 / 4) * b / 1e9 + 2 * 3 * 1e-4 + (3 / 4) * b / 1e10, "ring");
  assert.equal(commStepSeconds("broadcast", b, { ...base, mode: "allreduce" }), 0);
  assert.equal(commStepSeconds("reduce", b, { ...base, devices: 1 }), 0);
  assert.equal(commStepSeconds("broadcast", b, { ...base, devices: 1 }), 0);
  // Doubling the bandwidth halves only the byte term; latency is paid per message.
  const fast = { ...base, link: { bandwidthBytesPerSecond: 2e9, latencySeconds: 1e-4 } };
  near(
    commStepSeconds("broadcast", b, base) - commStepSeconds("broadcast", b, fast),
    3 * (b / 1e9 - b / 2e9),
    "bw",
  );
  const laggy = { ...base, link: { bandwidthBytesPerSecond: 1e9, latencySeconds: 2e-4 } };
  near(commStepSeconds("broadcast", b, laggy) - commStepSeconds("broadcast", b, base), 3e-4, "latency");
  const laggyRing = commStepSeconds("reduce", b, { ...laggy, mode: "allreduce" });
  near(laggyRing - ring, 6e-4, "ring latency");
});

Deno.test("simulate: N devices — a shared link grows linearly, a star only in the sums", () => {
  const steps = (topology: "star" | "shared") =>
    [1, 2, 3, 4, 5, 6, 7, 8].map((devices) =>
      simulate(sequential(GROUPS), HAND, { ...HAND_COSTS, devices, topology }).stepSeconds
    );
  const shared = steps("shared");
  // One device: no transfers, only compute and updates.
  near(shared[0], 1.5 + 3 + 1.1, "one device");
  // Each extra device adds one transfer per reduce and broadcast and one more sum per reduce.
  const perDevice = 2 * (0.5 + 10) + 2 * (0.5 + 1) + 1 + 0.1;
  for (let n = 2; n < 8; n++) near(shared[n] - shared[n - 1], perDevice, `shared ${n + 1}`);
  const star = steps("star");
  for (let n = 2; n < 8; n++) near(star[n] - star[n - 1], 1 + 0.1, `star ${n + 1}`);
  // All devices are in the timeline.
  const sim = simulate(overlap(GROUPS), HAND, { ...HAND_COSTS, devices: 5 });
  assert.equal(sim.lanes.length, 5);
  assert.ok(sim.lanes.every((l) => l.compute.length === 3));
});

Deno.test("simulate: allreduce updates everywhere and its broadcasts take no time", () => {
  const costs = { ...HAND_COSTS, mode: "allreduce" as const, devices: 4 };
  const sim = simulate(overlap(GROUPS), HAND, costs);
  for (const lanes of sim.lanes) {
    assert.deepEqual(lanes.comm.map((e) => stepLabel(e)), [
      "reduce fc",
      "update fc",
      "broadcast fc",
      "reduce conv",
      "update conv",
      "broadcast conv",
    ]);
    for (const e of lanes.comm.filter((e) => e.kind === "broadcast")) assert.equal(e.end, e.start);
  }
  const ring = (b: number) => 1.5 * b / 100 + 6 * 0.5 + 0.75 * b / 1000;
  const fcDone = 2.5 + ring(1000) + 1;
  near(sim.stepSeconds, fcDone + ring(100) + 0.1, "step");
});

// Mutations tried, each made this test fail: the pipeline costed as the sum of its three stages per
// chunk instead of their maximum; the broadcast's outbound stage counted in allreduce mode; the
// update and broadcast steps keeping their blocking lengths after the fused reduce.
Deno.test("simulate: a pipelined exchange costs one stage per chunk plus the pipeline's fill, not three steps", () => {
  const costs: CostOptions = { ...HAND_COSTS, pipelineChunkBytes: 100 };
  // fc, 1000 B in 10 chunks: inbound 1 s, CPU 100/1000 + 100 · 0.001 = 0.2 s, outbound 1 s per chunk;
  // 0.5 + 1 + 0.2 + 1 + 9 · max(1, 0.2, 1) = 11.7 s from the end of backward fc (2.5 s). conv, one
  // 100 B chunk: 0.5 + 1 + 0.2 + 1 = 2.7 s, after fc's pipeline frees the lane (14.2 s).
  const master = simulate(overlap(GROUPS), HAND, costs);
  assert.deepEqual(master.lanes[0].comm.map((e) => [stepLabel(e), e.start, e.end].join(" ")), [
    "reduce fc 2.5 14.2",
    "update fc 14.2 14.2",
    "broadcast fc 14.2 14.2",
    "reduce conv 14.2 16.9",
    "update conv 16.9 16.9",
    "broadcast conv 16.9 16.9",
  ]);
  near(master.stepSeconds, 16.9, "master step");
  // Blocking, the same plan takes reduce 11.5 + update 1 + broadcast 10.5 for fc alone.
  near(
    simulate(overlap(GROUPS), HAND, HAND_COSTS).stepSeconds,
    2.5 + 11.5 + 1 + 10.5 + 1.6 + 0.1 + 1.5,
    "blocking",
  );
  // All-reduce: every device all-gathers (1 s per chunk in) and updates; nothing goes back out.
  near(
    simulate(overlap(GROUPS), HAND, { ...costs, mode: "allreduce" }).stepSeconds,
    2.5 + 10.7 + 1.7,
    "allreduce",
  );
  // A reduce not followed by its update (the sequential plan) stays a blocking step.
  near(simulate(sequential(GROUPS), HAND, costs).stepSeconds, 30.7, "sequential");
});

Deno.test("simulate: rejects plans and profiles that do not match, and bad options", () => {
  assert.throws(() => simulate(overlap(["fc", "conv", "extra"]), HAND, HAND_COSTS), /lacks/);
  assert.throws(() => simulate(overlap(["fc"]), HAND, HAND_COSTS), /not in plan/);
  const broken = parseSchedule("forward; backward all; update all; reduce all; broadcast all", {
    groups: GROUPS,
  });
  assert.throws(() => simulate(broken, HAND, HAND_COSTS), ScheduleError);
  assert.throws(() => simulate(overlap(GROUPS), HAND, { ...HAND_COSTS, devices: 0 }), ValueError);
  assert.throws(
    () =>
      simulate(overlap(GROUPS), HAND, {
        ...HAND_COSTS,
        link: { bandwidthBytesPerSecond: 0, latencySeconds: 0 },
      }),
    ValueError,
  );
  assert.throws(
    () => simulate(overlap(GROUPS), HAND, { ...HAND_COSTS, topology: "mesh" as "star" }),
    ValueError,
  );
});

Deno.test("profile: group totals in backward order; contiguity and values are checked", () => {
  assert.deepEqual(groupTotals(HAND), [
    { group: "fc", layers: ["fc"], forwardSeconds: 0.5, backwardSeconds: 1, parameterBytes: 1000 },
    { group: "conv", layers: ["conv1", "conv2"], forwardSeconds: 1, backwardSeconds: 2, parameterBytes: 100 },
  ]);
  const split = {
    batchSize: 1,
    layers: [layer("a", "x", 1, 1, 1), layer("b", "y", 1, 1, 1), layer("c", "x", 1, 1, 1)],
  };
  assert.throws(() => checkProfile(split), /group x is not contiguous/);
  assert.throws(
    () => checkProfile({ batchSize: 1, layers: [layer("a", "x", -1, 1, 1)] }),
    /forwardSeconds -1/,
  );
  assert.throws(() => checkProfile({ batchSize: 0, layers: [layer("a", "x", 1, 1, 1)] }), /batchSize/);
  assert.throws(
    () => checkProfile({ batchSize: 1, layers: [layer("a", "x", 1, 1, 1), layer("a", "x", 1, 1, 1)] }),
    /twice/,
  );
  assert.throws(() => checkProfile({ batchSize: 1, layers: [layer("a", "all", 1, 1, 1)] }), ValueError);
  assert.deepEqual(regroupProfile(HAND, { conv2: "fc" }).layers.map((l) => l.group), ["conv", "fc", "fc"]);
});

// Per-image forward multiply-adds of Caffe's AlexNet and its parameter counts (../shared/reference/facts.md).
const ALEXNET: [string, number, number][] = [
  ["conv1", 105_415_200, 34_944],
  ["norm1", 0, 0],
  ["pool1", 0, 0],
  ["conv2", 223_948_800, 307_456],
  ["norm2", 0, 0],
  ["pool2", 0, 0],
  ["conv3", 149_520_384, 885_120],
  ["conv4", 112_140_288, 663_936],
  ["conv5", 74_760_192, 442_624],
  ["pool5", 0, 0],
  ["fc6", 37_748_736, 37_752_832],
  ["fc7", 16_777_216, 16_781_312],
  ["fc8", 4_096_000, 4_097_000],
];

/**
 * A synthetic AlexNet profile at batch 128 per device: real parameter bytes (fp32), times from the
 * multiply-adds at 4 TFLOP/s for convolutions and 2 TFLOP/s for the FC layers, backward twice the
 * forward, 0.2 ms for each parameter-free layer. FC is then ~15% of the compute.
 */
function alexnetProfile(): Profile {
  const batch = 128;
  return {
    batchSize: batch,
    description: "synthetic",
    layers: ALEXNET.map(([name, macs, params]) => {
      const forward = macs === 0 ? 2e-4 : (2 * macs * batch) / (name.startsWith("fc") ? 2e12 : 4e12);
      return layer(name, name.startsWith("fc") ? "fc" : "conv", forward, 2 * forward, 4 * params);
    }),
  };
}

/** Parameters spread evenly, like a ResNet: eight 1 MB conv layers and a 0.5 MB classifier. */
function resnetLikeProfile(): Profile {
  const layers = Array.from({ length: 8 }, (_, i) => layer(`conv${i + 1}`, "conv", 0.005, 0.01, 1e6));
  return { batchSize: 32, layers: [...layers, layer("fc", "fc", 0.0005, 0.001, 5e5)] };
}

Deno.test("judgeNetwork: AlexNet is AlexNet-like; the split hides the most communication", () => {
  const profile = alexnetProfile();
  const totals = groupTotals(profile);
  const fcShare = (totals[0].forwardSeconds + totals[0].backwardSeconds) /
    profile.layers.reduce((s, l) => s + l.forwardSeconds + l.backwardSeconds, 0);
  assert.ok(fcShare > 0.05 && fcShare < 0.2, `FC share of compute ${fcShare}`);

  const link = STANDARD_LINKS.find((l) => l.name === "PCIe 3")!;
  const verdict = judgeNetwork(profile, { link, devices: 2 });
  assert.equal(verdict.alexnetLike, true);
  near(verdict.suffixParameterFraction, 58_631_144 / 60_965_224, "byte share");
  assert.ok(
    verdict.reason.startsWith(
      "AlexNet-like: the output-side layers fc6..fc8 hold 96.2% of the parameter bytes (234.5 MB of 243.9 MB) and take ",
    ),
    verdict.reason,
  );
  assert.ok(
    verdict.reason.includes("within the thresholds (≥ 50.0% of the bytes in ≤ 35.0% of the backward time)"),
  );
  assert.ok(verdict.reason.includes("at 12.0 GB/s with 2 devices (master)"));
  const split = verdict.split!;
  // Brute force: no other boundary hides more communication.
  for (let b = 1; b < profile.layers.length; b++) {
    if (profile.layers[b].parameterBytes === 0) continue;
    const assignment = Object.fromEntries(profile.layers.map((l, i) => [l.name, i < b ? "body" : "head"]));
    const sim = simulate(overlap(["head", "body"]), regroupProfile(profile, assignment), {
      link,
      devices: 2,
      mode: "master",
    });
    assert.ok(sim.hiddenCommSeconds <= split.hiddenCommSeconds + 1e-12, profile.layers[b].name);
  }
  // FC traffic over PCIe 3 fits under the conv backward with room to spare, so the largest suffix
  // that still fits also takes conv4 and conv5 (their bytes are few, their backward is long).
  assert.equal(split.boundaryLayer, "conv4");
  assert.deepEqual(split.groups, ["head", "body"]);
  assert.equal(split.assignment.conv3, "body");
  assert.equal(split.assignment.conv4, "head");
  assert.equal(split.assignment.fc8, "head");
  assert.ok(split.overlapSeconds < split.sequentialSeconds);
  assert.ok(verdict.reason.includes(`Split before conv4 into head and body`));

  // Over 10 GbE the FC traffic dwarfs the conv backward; the best cut leaves fc6 with the input side.
  const slow = judgeNetwork(profile, { link: STANDARD_LINKS.find((l) => l.name === "10 GbE")!, devices: 2 });
  assert.equal(slow.alexnetLike, true);
  assert.equal(slow.split!.boundaryLayer, "fc7");
});

Deno.test("judgeNetwork: a network with evenly spread parameters is not AlexNet-like", () => {
  const verdict = judgeNetwork(resnetLikeProfile());
  assert.equal(verdict.alexnetLike, false);
  near(verdict.suffixParameterFraction, 4.5 / 8.5, "byte share");
  near(verdict.suffixBackwardFraction, 0.041 / 0.081, "time share");
  assert.equal(
    verdict.reason,
    "not AlexNet-like: the output-side layers conv5..fc hold 52.9% of the parameter bytes (4.5 MB of 8.5 MB) " +
      "and take 50.6% of the backward time (41.00 ms of 81.00 ms); more than 35.0% of the backward time, so " +
      "most parameters are ready too late to hide their communication; use sequential",
  );
  // Looser thresholds make it pass; the verdict follows the stated numbers.
  assert.equal(
    judgeNetwork(resnetLikeProfile(), { thresholds: { maxSuffixBackwardFraction: 0.6 } }).alexnetLike,
    true,
  );
  // Nothing before the big layers has parameters: nothing to hide behind.
  const headOnly = { batchSize: 1, layers: [layer("pool", "conv", 1, 1, 0), layer("fc", "fc", 1, 1, 100)] };
  const lonely = judgeNetwork(headOnly);
  assert.equal(lonely.alexnetLike, false);
  assert.ok(lonely.reason.includes("no layer before them has parameters"), lonely.reason);
});

Deno.test("autoSchedule: overlap on the split for AlexNet, sequential with the reason otherwise", () => {
  const link = STANDARD_LINKS[0];
  const alex = autoSchedule(alexnetProfile(), link, 4);
  assert.equal(alex.name, "overlap");
  assert.deepEqual(alex.groups, alex.judgement.split!.groups);
  assert.equal(alex.assignment.fc6, alex.groups[0]);
  validatePlan(alex, { mode: "master" });
  const resnet = autoSchedule(resnetLikeProfile(), link, 4);
  assert.equal(resnet.name, "sequential");
  assert.deepEqual(resnet.groups, ["fc", "conv"]);
  assert.equal(resnet.assignment.conv3, "conv");
  assert.ok(resnet.judgement.reason.startsWith("not AlexNet-like"));
  const builtIn = scheduleBuilder(["fc", "conv"]).forward().backward("all").reduce("all").update("all")
    .broadcast("all").build("sequential");
  assert.deepEqual(resnet.steps, builtIn.steps);
});

Deno.test("alexnetScalingTable: every link, device count and mode; overlap never loses", () => {
  const profile = alexnetProfile();
  const table = alexnetScalingTable(profile);
  assert.equal(table.rows.length, 5 * 2 * 7);
  for (const row of table.rows) {
    assert.ok(row.overlapSeconds <= row.sequentialSeconds + 1e-12, JSON.stringify(row));
    assert.ok(row.hiddenFraction > 0 && row.hiddenFraction <= 1);
    near(row.imagesPerSecond, (row.devices * 128) / row.overlapSeconds, "images/s");
    assert.ok(row.scalingEfficiency > 0 && row.scalingEfficiency <= 1 + 1e-12, JSON.stringify(row));
  }
  const at = (link: string, devices: number, mode: string) =>
    table.rows.find((r) => r.link === link && r.devices === devices && r.mode === mode)!;
  assert.ok(at("NVLink", 8, "allreduce").scalingEfficiency > at("10 GbE", 8, "allreduce").scalingEfficiency);
  // Master mode through one shared link degrades with N; the ring barely does.
  assert.ok(at("PCIe 3", 8, "master").overlapSeconds > at("PCIe 3", 2, "master").overlapSeconds * 2);
  assert.ok(at("PCIe 3", 8, "allreduce").overlapSeconds < at("PCIe 3", 2, "allreduce").overlapSeconds * 1.5);
  // PCIe 3 and 100 GbE have the same bandwidth here; only latency differs.
  near(
    at("PCIe 3", 4, "master").sequentialSeconds,
    at("100 GbE", 4, "master").sequentialSeconds,
    "same link",
    1e-6,
  );
  const lines = table.markdown.trimEnd().split("\n");
  assert.equal(lines.length, 2 + 70);
  assert.ok(lines[0].startsWith("| link | devices | mode | sequential ms | overlap ms |"));
  const small = alexnetScalingTable(profile, { devices: [2], modes: ["master"], links: [STANDARD_LINKS[2]] });
  assert.equal(small.rows.length, 1);
});
