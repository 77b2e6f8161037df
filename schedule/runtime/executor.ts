/**
 * The plan executor: one training iteration of a validated plan on this process's devices over an
 * {@link Exchange}, the same skeleton for every plan and every exchange (CPU Workers sharing memory,
 * GPU-resident replicas, one device per MPI rank). `DataParallelTrainer.step` checks the batch,
 * settles the previous iteration and runs this; the trainer's state, and what a failure undoes, stay
 * in `trainer.ts`.
 *
 * Each device's compute lane runs forward and the backward groups in plan order and announces each
 * group's gradients as they become final. The communication lane (this thread) walks the plan's
 * `reduce`, `update` and `broadcast` actions in order, each starting as soon as the backward actions it
 * depends on are done on every device of this process — so under `overlap` the FC gradients are
 * shipped, averaged and applied while the devices are still computing conv gradients.
 *
 * A failed step is undone without copying everything each step: an update that may still be
 * followed by a failure (a device still computing, a later action that can fail, or a finite check)
 * is `undoable`, which keeps a copy of that group's parameters and optimizer state as it overwrites
 * them. Without finite checks, an update placed after every backward waits for the devices to finish
 * and, where the exchange's remaining actions cannot fail (shared memory), needs no copy: `sequential`
 * copies nothing, `overlap` copies the FC group while the conv backward runs. With them (the default)
 * every update copies, so none waits for the devices.
 *
 * @module
 */

import { type Optimizer, TandemError } from "../../engine/mod.ts";
import type { ComputeResult } from "../devices/device.ts";
import { dependenciesOf, type Plan } from "../plan/plan.ts";
import { undoableUpdates } from "../plan/undo.ts";
import { type Deferred, deferred } from "./deferred.ts";
import type { Exchange, ExchangeContext } from "./exchange/exchange.ts";
import { type LaneSpan, stepFigures } from "./figures.ts";
import { checkUpdatedGroup, DivergenceError } from "./finite.ts";
import type { HybridHead } from "./hybrid.ts";
import type {
  BatchSplit,
  DataParallelOptions,
  DataParallelStepResult,
  HostBatch,
  LaneEvent,
} from "./options.ts";

/** What one iteration runs on, and the trainer's part in it. */
export interface IterationRun {
  /** How this process's devices are joined. */
  readonly exchange: Exchange;
  /** The plan to run. */
  readonly plan: Plan;
  /** The trainer's options (seed, finite checks, where lane events go). */
  readonly options: DataParallelOptions;
  /** The model-parallel head of a hybrid plan; absent for data-parallel plans. */
  readonly hybrid: HybridHead | undefined;
  /** The training iteration (0-based). */
  readonly iteration: number;
  /** Milliseconds from the start by which every collective must have completed. */
  readonly timeoutMs: number;
  /** The global batch. */
  readonly batch: HostBatch;
  /** How it splits over the devices (checked). */
  readonly split: BatchSplit;
  /** Micro-batches per device (`accumulate`). */
  readonly microBatches: number;
  /**
   * Called once the iteration has completed (updates finished, residuals committed), before its
   * figures are taken; what it throws fails the iteration like any failure.
   */
  readonly completed: () => Promise<void>;
  /** Undoes what the exchange can of a failed iteration and returns the error to throw. */
  readonly fail: (error: unknown, computes: Promise<ComputeResult>[]) => Promise<unknown>;
}

/**
 * Runs one iteration of `run.plan` (see the module notes) and returns its figures; on failure
 * throws what `run.fail` returns.
 *
 * @example
 * ```ts
 * import { runIteration } from "./executor.ts";
 * // const result = await runIteration({ exchange, plan, options, hybrid, iteration, ... });
 * ```
 */
export async function runIteration(run: IterationRun): Promise<DataParallelStepResult> {
  const { exchange, plan, options, hybrid, iteration, batch, microBatches } = run;
  const { shardSize, sampleSize, sample } = run.split;
  const started = performance.now();
  const spans: LaneSpan[] = [];
  const record = (
    device: number,
    lane: "compute" | "comm",
    name: string,
    start: number,
    end: number,
    bytes?: number,
  ) => {
    spans.push({ lane, name, start, end });
    const event: LaneEvent = {
      device,
      lane,
      name,
      step: iteration,
      start,
      end,
      ...(bytes === undefined ? {} : { bytes }),
    };
    options.onEvent?.(event);
    options.trace?.record(event);
  };

  // Per local device and group, resolved when that group's gradients are final.
  const ready = exchange.local.map(() =>
    new Map<string, Deferred<void>>(plan.groups.map((g) => [g, deferred()]))
  );
  const backwardGroups = plan.actions.filter((s) => s.kind === "backward").map((s) => s.group!);
  let computing = exchange.local.length;
  const shardedGroups = new Set(plan.sharded ?? []);
  const headComputes = hybrid?.compute({
    iteration,
    seed: options.seed ?? 0,
    images: batch.images,
    labels: batch.labels,
    shape: batch.shape,
    ready,
    record: (device, name, start, end, bytes) => record(device, "comm", name, start, end, bytes),
    bodyGroups: backwardGroups.filter((g) => !shardedGroups.has(g)),
    microBatches,
  });
  const computes: Promise<ComputeResult>[] = exchange.local.map((device, i) => {
    const d = device.index;
    const compute = headComputes ? headComputes[i] : device.compute(
      {
        iteration,
        images: batch.images.subarray(d * shardSize * sampleSize, (d + 1) * shardSize * sampleSize),
        labels: batch.labels.subarray(d * shardSize, (d + 1) * shardSize),
        shape: [shardSize, ...sample],
        sampleOffset: d * shardSize,
        seed: options.seed ?? 0,
        backwardGroups,
        microBatches,
      },
      (group) => ready[i].get(group)!.resolve(),
    );
    // A failing device fails every wait on it, so the communication lane cannot hang.
    compute.then(() => computing--, (error) => {
      computing--;
      for (const r of ready[i].values()) r.reject(error);
    });
    return compute;
  });
  const context: ExchangeContext = {
    iteration,
    deadline: started + run.timeoutMs,
    started,
    computing: () => computing > 0,
    record: (device, name, start, end, bytes) => record(device, "comm", name, start, end, bytes),
  };
  const lastBackward = plan.actions.findLastIndex((s) => s.kind === "backward");
  const checkFinite = options.checkFinite ?? true;
  // Replicas update identically, so the master's optimizer speaks for all of them; a hybrid
  // head's slices differ, so every slice is checked.
  const checked = exchange.optimizers.slice(0, 1);
  // Each check starts right after its update (a CPU scan runs there, behind compute; a GPU
  // reduction is queued there) and is awaited at the end of the step, so it never stalls the
  // communication lane behind a device's queue. Every update is still undoable then.
  const finiteChecks: Promise<void>[] = [];
  const checkLater = (optimizers: readonly Optimizer[], group: string) => {
    const check = checkUpdatedGroup(optimizers, group, iteration);
    check.catch(() => {}); // awaited below; not an unhandled rejection meanwhile
    finiteChecks.push(check);
  };

  try {
    const waitForBackward = async (index: number) => {
      for (const dep of dependenciesOf(plan, index)) {
        const needed = plan.actions[dep];
        if (needed.kind === "backward") await Promise.all(ready.map((r) => r.get(needed.group!)!.promise));
      }
    };
    // An update copies for the undo only where a failure can still follow it (`undoableUpdates`,
    // the rule the simulator prices too). Where a failed step is undone, an update after every
    // backward that need not copy waits for the devices to finish (their gradients are final
    // already): then no device can fail the step behind it any more. One that copies anyway (a
    // finite check follows it) starts at once: a device failing behind it is undone like any.
    const undoableAt = undoableUpdates(plan, {
      rollsBack: exchange.rollsBack,
      transfersCanFail: exchange.transfersCanFail,
      checkFinite,
    });
    const undoable = (index: number) => undoableAt[index];
    const waitsForDevices = (index: number) => index > lastBackward && exchange.rollsBack && !undoable(index);
    const same = (index: number, kind: string, group: string) =>
      plan.actions[index]?.kind === kind && plan.actions[index]?.group === group;
    for (let i = 0; i < plan.actions.length; i++) {
      const action = plan.actions[i];
      if (action.lane !== "comm") continue;
      const group = action.group!;
      await waitForBackward(i);
      if (action.kind === "reduce" && exchange.pipeline && same(i + 1, "update", group)) {
        // reduce g; update g (; broadcast g) as one chunked pipeline: each chunk updated and sent
        // back while the next is still arriving.
        const withBroadcast = same(i + 2, "broadcast", group);
        await waitForBackward(i + 1);
        if (waitsForDevices(i + 1)) await Promise.all(computes);
        const options = { undoable: undoable(i + 1) };
        const parts = await exchange.pipeline(group, {
          update: (range) => {
            for (const optimizer of exchange.optimizers) optimizer.step(group, { ...options, range });
          },
          broadcast: withBroadcast,
        }, context);
        if (checkFinite && parts.update) checkLater(checked, group);
        record(exchange.rank, "comm", `reduce ${group}`, ...parts.reduce);
        if (parts.update && exchange.optimizers.length) {
          record(exchange.rank, "comm", `update ${group}`, ...parts.update);
        }
        if (parts.broadcast) record(exchange.rank, "comm", `broadcast ${group}`, ...parts.broadcast);
        i += withBroadcast ? 2 : 1;
        continue;
      }
      if (action.kind === "update" && waitsForDevices(i)) await Promise.all(computes);
      const start = performance.now();
      if (action.kind === "reduce") {
        await exchange.reduce(group, context);
        record(exchange.rank, "comm", `reduce ${group}`, start, performance.now());
      } else if (action.kind === "update" && shardedGroups.has(group)) {
        // Each device's own slice, with its own optimizer state: nothing travels.
        hybrid!.update(group, { undoable: undoable(i) });
        if (checkFinite) checkLater(hybrid!.optimizers, group);
        record(exchange.rank, "comm", `update ${group}`, start, performance.now());
      } else if (action.kind === "update") {
        for (const optimizer of exchange.optimizers) optimizer.step(group, { undoable: undoable(i) });
        if (checkFinite) checkLater(checked, group);
        if (exchange.optimizers.length) {
          record(exchange.rank, "comm", `update ${group}`, start, performance.now());
        }
      } else if (action.kind === "broadcast") {
        if (await exchange.broadcast(group, context)) {
          record(exchange.rank, "comm", `broadcast ${group}`, start, performance.now());
        }
      } else {
        throw new TandemError(`DataParallelTrainer: "${action.kind}" is not a communication action`);
      }
    }
    const results = await Promise.all(computes);
    results.forEach((r, i) =>
      r.spans.forEach((s) => record(exchange.local[i].index, "compute", s.name, s.start, s.end))
    );
    const combined = await exchange.combine(results, context);
    for (const check of finiteChecks) await check; // the first failing group in plan order
    if (checkFinite && !Number.isFinite(combined.loss)) {
      // Backends that read asynchronously (WebGPU) leave the loss check to here.
      throw new DivergenceError(iteration + 1, "loss", undefined, `is ${combined.loss}`);
    }
    for (const optimizer of exchange.optimizers) optimizer.finishIteration();
    hybrid?.finishIteration();
    // Only a completed step's error-feedback residuals carry on (a failed one's are dropped).
    exchange.wire?.commit();
    await run.completed();
    const total = performance.now() - started;
    const ms = stepFigures(spans, total);
    return {
      iteration,
      ...combined,
      seconds: total / 1000,
      ms,
      hiddenFraction: ms.communication > 0 ? ms.hiddenCommunication / ms.communication : 0,
    };
  } catch (error) {
    throw await run.fail(error, computes);
  }
}
