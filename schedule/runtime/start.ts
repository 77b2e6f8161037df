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
import { layoutOf } from "../devices/parameter_layout.ts";
import { bufferLayoutOf, copyBuffers, loadInitialBuffers } from "../devices/buffer_layout.ts";
import { buildModel } from "../devices/model_spec.ts";
import { type HeadLayout, headLayout } from "../devices/head_layout.ts";
import { ScheduleError } from "../plan/errors.ts";
import type { Plan } from "../plan/plan.ts";
import type { Exchange, ReplicaReference } from "./exchange/exchange.ts";
import { ResidentExchange } from "./exchange/resident_exchange.ts";
import { SharedMemoryExchange } from "./exchange/shared_memory_exchange.ts";
import type { DataParallelOptions } from "./options.ts";

/**
 * The one check of whether `plan` can run a model with `bufferCount` buffers (BatchNorm statistics):
 * every device kind keeps its replica's own (CPU Workers, WebGPU devices, one device per MPI rank),
 * but a hybrid plan's head shards cannot carry them yet, so a hybrid plan over such a model throws a
 * {@link ScheduleError} whose `reason` says so. {@link referenceOf} calls it before any device
 * starts; the train command calls it too, to name its flags.
 *
 * @example
 * ```ts
 * import { checkBuffersCarried } from "./start.ts";
 * import { hybridPlan } from "../plan/builtins.ts";
 * try {
 *   checkBuffersCarried(3, hybridPlan(["fc", "conv"]));
 * } catch (error) {
 *   console.log((error as Error).message); // schedule "hybrid": the net keeps BatchNorm statistics (3 buffers), …
 * }
 * ```
 */
export function checkBuffersCarried(bufferCount: number, plan: Plan): void {
  if (bufferCount === 0 || !plan.sharded?.length) return;
  throw new ScheduleError(
    `the net keeps BatchNorm statistics (${bufferCount} buffers), which a hybrid schedule's head shards ` +
      "cannot carry yet; use a data-parallel schedule",
    { schedule: plan.name, line: 0, column: 0 },
  );
}

/**
 * The layout and initial parameters of the model, checked against the plan's groups (and, with
 * buffers, by {@link checkBuffersCarried}), and for a hybrid plan the head's split over `devices`.
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
  const buffers = bufferLayoutOf(reference.namedBuffers());
  const initialBuffers = new Float32Array(buffers.total);
  copyBuffers(buffers, reference.namedBuffers(), initialBuffers, "flat");
  try {
    checkBuffersCarried(buffers.slots.length, options.plan);
    const sharded = options.plan.sharded ?? [];
    const head = sharded.length ? headLayout(reference, sharded, devices, options.plan.name) : undefined;
    return { layout, initial, modelName, head, buffers, initialBuffers };
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
  { layout, initial, buffers, initialBuffers }: ReplicaReference,
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
          : await CpuDevice.start(d, options.model, layout, {
            timeoutSeconds,
            threads: options.deviceThreads,
            nice: options.computeNice,
          }),
      );
    }
    for (const device of devices) device.parameters.set(initial);
    // Each replica keeps its own statistics from here on; all start from the reference's.
    loadInitialBuffers(devices, buffers, initialBuffers);
    // A hybrid plan's body is exchanged like any plan's; its head slices stay on resident devices
    // too (`HybridHead` over each device's `residentSlice`).
    return devices.every((device) => device.resident)
      ? new ResidentExchange(devices, layout, mode, options.link, options.optimizer, options)
      : new SharedMemoryExchange(devices, layout, mode, options.link, options.optimizer, options);
  } catch (error) {
    await Promise.all(devices.map((d) => d.close()));
    throw error;
  }
}

/**
 * What one device of this process costs, the basis of {@link deviceCapacity}. `baseBytes`: a Worker
 * with its own JavaScript heap and WebAssembly kernel memory (measured: 66-80 MiB of resident memory
 * per LeNet device, 1.7 MB of it parameters). `parameterCopies`: float32 copies of the parameters per
 * device (the shared parameters and gradients, the replica's own weights and their gradients).
 * `activationCopies`: each layer's output is kept for backward and meets a gradient of its size.
 */
export const DEVICE_COST = {
  baseBytes: 64 * 2 ** 20,
  parameterCopies: 4,
  activationCopies: 2,
  /** Share of the machine's memory the devices may take together; the rest is the host's. */
  memoryShare: 0.75,
  /** Device threads per core beyond which a run only thrashes (at least `minThreads`). */
  threadsPerCore: 8,
  minThreads: 16,
} as const;

/** How big the machine is. */
export interface MachineSize {
  /** Bytes of memory (`Deno.systemMemoryInfo().total`). */
  readonly memoryBytes: number;
  /** Logical cores (`navigator.hardwareConcurrency`). */
  readonly cores: number;
}

/**
 * This machine's memory and cores.
 *
 * @example
 * ```ts
 * import { machineSize } from "./start.ts";
 * console.log(machineSize().cores);
 * ```
 */
export function machineSize(): MachineSize {
  return { memoryBytes: Deno.systemMemoryInfo().total, cores: navigator.hardwareConcurrency || 1 };
}

/** What a device count is held against: see {@link deviceCapacity}. */
export interface DeviceCapacity {
  /** The most devices this process may start: the smaller of the two limits below. */
  readonly maxDevices: number;
  /** Estimated bytes per device. */
  readonly bytesPerDevice: number;
  /** Devices that fit in `memoryShare` of the memory. */
  readonly byMemory: number;
  /** Devices the cores can run as threads. */
  readonly byThreads: number;
}

/**
 * How many in-process devices a model fits on `machine`: bytes per device = `baseBytes` + 4 bytes ×
 * (`parameterCopies` × parameters + `activationCopies` × activations per sample × samples per
 * device); at most `memoryShare` of the memory for all devices, and at most max(`minThreads`,
 * `threadsPerCore` × cores) device threads. A cheap estimate, meant to refuse counts that cannot
 * work (a thousand devices), not to pack the machine tightly.
 *
 * @example
 * ```ts
 * import { deviceCapacity } from "./start.ts";
 * const { maxDevices } = deviceCapacity({ parameters: 431_080 }, { memoryBytes: 2 ** 34, cores: 8 });
 * console.log(maxDevices); // 64 (by threads)
 * ```
 */
export function deviceCapacity(
  model: { parameters: number; activationsPerSample?: number; samplesPerDevice?: number },
  machine: MachineSize = machineSize(),
): DeviceCapacity {
  const activations = (model.activationsPerSample ?? 0) * (model.samplesPerDevice ?? 0);
  const bytesPerDevice = DEVICE_COST.baseBytes +
    4 * (DEVICE_COST.parameterCopies * model.parameters + DEVICE_COST.activationCopies * activations);
  const byMemory = Math.floor(DEVICE_COST.memoryShare * machine.memoryBytes / bytesPerDevice);
  const byThreads = Math.max(DEVICE_COST.minThreads, DEVICE_COST.threadsPerCore * machine.cores);
  return { maxDevices: Math.min(byMemory, byThreads), bytesPerDevice, byMemory, byThreads };
}
