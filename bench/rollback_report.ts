/**
 * What the rollback of a failed data-parallel step costs on real AlexNet (Caffe's bvlc_alexnet,
 * 60,965,224 parameters), written to `bench/ROLLBACK.md`.
 *
 * Before: every step began by copying all of the master's parameters and optimizer state (the
 * old runtime's snapshot), on the critical path. After: an update is made undoable — its group
 * copied as it overwrites it, in the update's own pass on the CPU — only where a failure can still
 * follow; on CPU devices without finite checks `sequential` then copies nothing and `overlap` copies
 * the FC group while the conv backward runs.
 *
 * Measured: (1) the old snapshot itself, on the master's real buffers (the exact copies the old
 * runtime made); (2) the new per-group undo copies, as `step(group, { undoable: true })` minus a
 * plain step; (3) whole 2-device steps under both schedules with the update time and how much of it
 * overlapped compute. Best and median of 5 warm calls each.
 *
 * Run: `npx deno task bench:rollback` (a few minutes; leave the machine otherwise idle).
 *
 * @module
 */

import {
  type CpuBackend,
  DataParallelTrainer,
  getBackend,
  overlapPlan,
  randn,
  sequentialPlan,
  SGD,
} from "../mod.ts";
import { hostParameterEntries } from "../schedule/runtime/exchange/host_parameters.ts";
import { layoutOf } from "../schedule/devices/mod.ts";
import { freeSharedFloats, sharedFloats } from "../schedule/devices/parameter_layout.ts";
import type { StepFigures } from "../schedule/runtime/mod.ts";
import { uniformValues } from "../engine/mod.ts";
import { writeFileAtomic } from "../engine/io/mod.ts";
import { cpuKernelsLabel } from "./kernels/backend_label.ts";
import { measureStamp, stampBlock } from "./stamp.ts";
import { buildModel } from "../schedule/devices/model_spec.ts";

const WARMUP = 2, TIMED = 5;
const GLOBAL_BATCH = 8;
const spec = { kind: "builtin" as const, name: "alexnet" as const };

function summary(values: number[]): { best: number; median: number } {
  const sorted = [...values].sort((a, b) => a - b);
  return { best: sorted[0], median: sorted[Math.floor(sorted.length / 2)] };
}

function timeCalls(fn: () => void): { best: number; median: number } {
  const times: number[] = [];
  for (let i = 0; i < WARMUP + TIMED; i++) {
    const start = performance.now();
    fn();
    if (i >= WARMUP) times.push(performance.now() - start);
  }
  return summary(times);
}

const ms = (t: { best: number; median: number }) => `${t.best.toFixed(1)} / ${t.median.toFixed(1)} ms`;

const stamp = await measureStamp({
  file: "bench/ROLLBACK.md",
  command: "npx deno task bench:rollback",
  sources: ["bench/rollback_report.ts", "bench/kernels/backend_label.ts"],
});

// (1) and (2) on an SGD optimizer over AlexNet-sized host buffers in the CPU backend's kernel memory,
// as the CPU runtime's master has them (`sharedFloats`): its updates run in WebAssembly there.
const reference = await buildModel(spec);
const layout = layoutOf(reference.namedParameters());
reference.dispose();
const parameters = sharedFloats(layout.total);
const gradients = sharedFloats(layout.total);
parameters.set(randn([layout.total], { seed: 1, std: 0.01 }).dataSync() as Float32Array);
gradients.set(randn([layout.total], { seed: 2, std: 1e-3 }).dataSync() as Float32Array);
const optimizer = new SGD(hostParameterEntries(layout, parameters, gradients), {
  lr: 1e-6,
  momentum: 0.9,
  weightDecay: 5e-4,
});
const groupSize = (g: string) => layout.groups.find((r) => r.name === g)!.size;

const oldSnapshot = timeCalls(() => {
  // The old runtime's #snapshot(), verbatim in effect: parameters, then every state slot, copied.
  parameters.slice();
  for (const slots of optimizer.state().perParameter.values()) {
    for (const t of Object.values(slots)) (t.dataSync() as Float32Array).slice();
  }
});
/** One group's update on its own, plain or undoable. */
const updateOf = (group: string, undoable: boolean) =>
  timeCalls(() => {
    optimizer.step(group, { undoable });
    optimizer.finishIteration();
  });
const plainFc = updateOf("fc", false), undoableFc = updateOf("fc", true);
const plainConv = updateOf("conv", false), undoableConv = updateOf("conv", true);
optimizer.dispose();

// (3) whole steps on 2 CPU devices.
function batch(step: number) {
  const shape = [GLOBAL_BATCH, 3, 227, 227];
  const images = randn(shape, { seed: 100 + step }).dataSync() as Float32Array;
  const labels = Int32Array.from(
    uniformValues(GLOBAL_BATCH, { seed: 200 + step }),
    (u) => Math.floor(u * 1000),
  );
  return { images, labels, shape };
}

async function steps(plan: typeof sequentialPlan, checkFinite: boolean): Promise<StepFigures[]> {
  const trainer = await DataParallelTrainer.create({
    model: spec,
    devices: 2,
    plan: plan(["fc", "conv"]),
    optimizer: (p) => new SGD(p, { lr: 1e-4, momentum: 0.9, weightDecay: 5e-4 }),
    checkFinite,
  });
  const figures: StepFigures[] = [];
  try {
    for (let i = 0; i < WARMUP + TIMED; i++) {
      const result = await trainer.step(batch(i));
      if (i >= WARMUP) figures.push(result.ms);
    }
  } finally {
    await trainer.close();
  }
  return figures;
}

// (4) The finite checks (the default): every update undoable, and each updated group's new
// parameters checked for NaN and ±∞ — by SGD's update itself on the CPU; the scan that follows an
// update that does not look (Adam's) timed here on its own (the CPU backend's WebAssembly reduction).
const cpu = getBackend() as CpuBackend;
const checkOf = (group: string) => {
  // In kernel memory, where the CPU runtime keeps the master's parameters (allocateShared).
  const values = cpu.allocateShared(groupSize(group));
  try {
    values.set(parameters.subarray(0, values.length));
    const storage = cpu.wrap(values);
    return timeCalls(() => cpu.firstNonFinite(storage));
  } finally {
    cpu.freeShared(values);
  }
};
const fcCheck = checkOf("fc"), convCheck = checkOf("conv");
freeSharedFloats(parameters);
freeSharedFloats(gradients);

const rows: string[] = [];
for (const plan of [sequentialPlan, overlapPlan]) {
  for (const checkFinite of [false, true]) {
    const figures = await steps(plan, checkFinite);
    const total = summary(figures.map((f) => f.total));
    const update = summary(figures.map((f) => f.update));
    const hidden = summary(figures.map((f) => f.hiddenUpdate));
    rows.push(
      `| ${plan(["fc", "conv"]).name} | ${checkFinite ? "on (default)" : "off"} | ${ms(total)} | ${
        ms(update)
      } | ${hidden.median.toFixed(1)} ms | ${(100 * oldSnapshot.median / total.median).toFixed(1)}% |`,
    );
    console.log(rows.at(-1));
  }
}

const mb = (n: number) => `${(n * 4 * 2 / 1e6).toFixed(0)} MB`;
const report = `# Rollback cost on real AlexNet

${stampBlock(stamp)}

Generated by \`npx deno task bench:rollback\` (\`bench/rollback_report.ts\`) with the ${
  cpuKernelsLabel(getBackend() as CpuBackend)
}; Caffe's bvlc_alexnet, ${
  layout.total.toLocaleString("en-US")
} parameters, SGD with momentum (one state slot per parameter). Best / median of ${TIMED} warm calls.

A failed step must leave the master's parameters and optimizer state as they were. The old runtime
copied all of them at the start of every step; now an update copies them, group by group, as it
overwrites them (the CPU backend's update writes the copies in its own pass over memory), and only
where a failure can still follow (\`Optimizer.step(group, { undoable })\`). Measured on buffers in the
CPU backend's kernel memory, where the runtime's master keeps them.

## The copies themselves

| what | copies | time (best / median) |
| --- | --- | --- |
| old: whole snapshot at the start of every step (parameters + momentum) | ${mb(layout.total)} | ${
  ms(oldSnapshot)
} |
| new, \`overlap\`: FC group undoable (\`step("fc", { undoable: true })\` − plain step) | ${
  mb(groupSize("fc"))
} | ${(undoableFc.median - plainFc.median).toFixed(1)} ms (median; ${ms(undoableFc)} vs ${ms(plainFc)}) |
| new, \`sequential\` with \`checkFinite: false\` (every update after all backward, on CPU devices) | 0 MB | 0 ms |
| for reference: the conv group undoable | ${mb(groupSize("conv"))} | ${
  (undoableConv.median - plainConv.median).toFixed(1)
} ms (median; ${ms(undoableConv)} vs ${ms(plainConv)}) |

## The finite checks

With finite checks (\`checkFinite\`, the default) every update is undoable, so a step whose new parameters
hold a NaN or ±∞ is rolled back: \`sequential\` then copies both groups too. SGD's update on the CPU checks
the new parameters in its own pass, so nothing is read again after it; where an update does not look (Adam's),
or to name a bad parameter, the group is scanned (the CPU backend's \`firstNonFinite\`, a threaded
WebAssembly SIMD reduction): FC group ${ms(fcCheck)}, conv group ${
  ms(convCheck)
} (best / median of ${TIMED} calls, on the master's buffers).

## Whole steps, 2 CPU devices, global batch ${GLOBAL_BATCH} (227×227), master reduction

"Update" is the time of the plan's update actions (including any undo copy); "hidden" the part of it
that overlapped some device's compute. The last column is what the old snapshot would add to the
median step, on the critical path. "Finite checks" off is \`checkFinite: false\`: no undo copy where
no failure can follow, no scan.

| schedule | finite checks | step (best / median) | update (best / median) | update hidden (median) | old snapshot / step |
| --- | --- | --- | --- | --- | --- |
${rows.join("\n")}
`;
await writeFileAtomic(new URL("./ROLLBACK.md", import.meta.url).pathname, [new TextEncoder().encode(report)]);
console.log(report);
Deno.exit(0);
