/**
 * How a data-parallel run's replicas come to be: the reference model that fixes the parameter layout
 * and the initial values every replica starts from, and the devices of one process joined by the
 * exchange they support (`DataParallelTrainer.create` uses both; MPI ranks start theirs in
 * `mpi/exchange.ts`).
 *
 * @module
 */

import { ValueError } from "../../engine/mod.ts";
import { CpuDevice } from "../devices/cpu_device.ts";
import type { Device } from "../devices/device.ts";
import { layoutOf } from "../devices/layout.ts";
import { buildModel } from "../devices/model_spec.ts";
import { type HeadLayout, headLayout } from "../devices/sharded_head.ts";
import type { Exchange, ReplicaReference } from "./exchange.ts";
import { ResidentExchange } from "./resident_exchange.ts";
import { SharedMemoryExchange } from "./shared_memory_exchange.ts";
import type { DataParallelOptions } from "./trainer.ts";

/**
 * The layout and initial parameters of the model, checked against the plan's groups, and for a
 * hybrid plan the head's split over `devices`.
 *
 * @example
 * ```ts
 * import { referenceOf } from "./start.ts";
 * // const { layout, initial } = await referenceOf(options, 2);
 * ```
 */
export async function referenceOf(
  options: DataParallelOptions,
  devices: number,
): Promise<ReplicaReference & { head?: HeadLayout }> {
  const reference = await buildModel(options.model);
  const entries = reference.namedParameters();
  const layout = layoutOf(entries);
  const unknown = options.plan.groups.filter((g) => !layout.groups.some((r) => r.name === g));
  const missing = layout.groups.filter((r) => !options.plan.groups.includes(r.name)).map((r) => r.name);
  if (unknown.length || missing.length) {
    reference.dispose();
    throw new ValueError(
      "DataParallelTrainer",
      `schedule "${options.plan.name}" names groups [${options.plan.groups}] but the model has [${
        layout.groups.map((g) => g.name)
      }]`,
    );
  }
  const initial = new Float32Array(layout.total);
  for (const slot of layout.slots) {
    initial.set(entries.find((e) => e.name === slot.name)!.tensor.dataSync() as Float32Array, slot.offset);
  }
  const modelName = reference.name;
  try {
    const sharded = options.plan.sharded ?? [];
    const head = sharded.length ? headLayout(reference, sharded, devices) : undefined;
    return { layout, initial, modelName, head };
  } finally {
    reference.dispose();
  }
}

/**
 * Starts `count` devices in this process (CPU Workers, or what `options.startDevice` starts), gives
 * each the initial parameters, and joins them by the exchange they support.
 *
 * @example
 * ```ts
 * import { referenceOf, startInProcess } from "./start.ts";
 * // const reference = await referenceOf(options, 2);
 * // const exchange = await startInProcess(options, reference, 2);
 * ```
 */
export async function startInProcess(
  options: DataParallelOptions,
  { layout, initial }: ReplicaReference,
  count: number,
): Promise<Exchange> {
  const timeoutSeconds = options.timeoutSeconds ?? 120;
  const mode = options.mode ?? "master";
  const devices: Device[] = [];
  try {
    for (let d = 0; d < count; d++) {
      devices.push(
        options.startDevice
          ? await options.startDevice(d, options.model, layout, timeoutSeconds)
          : await CpuDevice.start(d, options.model, layout, { timeoutSeconds }),
      );
    }
    for (const device of devices) device.parameters.set(initial);
    // A hybrid plan's head slices are updated on the host, so its devices take the host path.
    const hybrid = (options.plan.sharded ?? []).length > 0;
    return devices.every((device) => device.resident) && !hybrid
      ? new ResidentExchange(devices, layout, mode, options.link, options.optimizer, options)
      : new SharedMemoryExchange(devices, layout, mode, options.link, options.optimizer, options);
  } catch (error) {
    await Promise.all(devices.map((d) => d.close()));
    throw error;
  }
}
