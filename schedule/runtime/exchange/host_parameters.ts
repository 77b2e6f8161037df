/**
 * The host side of a data-parallel update, shared by the in-process runtime and the MPI trainer:
 * the optimizer's view of flat host buffers, and the device-order gradient average that makes every
 * transport and schedule produce the same bits.
 *
 * @module
 */

import { getBackend, type ParameterEntry, TandemError, type Tensor } from "../../../engine/mod.ts";
import { fromStorage } from "../../../engine/creation.ts";
import type { Backend } from "../../../backends/backend.ts";
import type { ParameterLayout } from "../../devices/parameter_layout.ts";

/**
 * Named parameter entries over flat host buffers laid out by `layout`: each parameter a zero-copy
 * tensor of `backend` (default: the current one) over `parameters`, and, when `gradients` is given,
 * its `.grad` a zero-copy tensor over `gradients`. An optimizer built on them updates the buffers in
 * place (the devices' shared memory, or an MPI rank's receive buffer).
 *
 * @example
 * ```ts
 * import { SGD } from "../../../mod.ts";
 * import { layoutOf } from "../../devices/parameter_layout.ts";
 * import { hostParameterEntries } from "./host_parameters.ts";
 * // const layout = layoutOf(model.namedParameters());
 * // const parameters = new Float32Array(layout.total), gradients = new Float32Array(layout.total);
 * // const sgd = new SGD(hostParameterEntries(layout, parameters, gradients), { lr: 0.01 });
 * ```
 */
export function hostParameterEntries(
  layout: ParameterLayout,
  parameters: Float32Array,
  gradients?: Float32Array,
  backend: Backend = getBackend(),
): ParameterEntry[] {
  if (!backend.wrap) {
    throw new TandemError(`data-parallel update: backend "${backend.name}" cannot wrap host memory`);
  }
  return layout.slots.map((slot) => {
    const view = (buffer: Float32Array) => buffer.subarray(slot.offset, slot.offset + slot.size);
    const parameter: Tensor = fromStorage(backend, backend.wrap!(view(parameters)), slot.shape);
    parameter.requiresGrad = true;
    if (gradients) parameter.grad = fromStorage(backend, backend.wrap!(view(gradients)), slot.shape);
    return {
      name: slot.name,
      tensor: parameter,
      group: slot.group,
      lrMult: slot.lrMult,
      decayMult: slot.decayMult,
    };
  });
}

/**
 * `out = (g0 + g1 + … + g(N−1)) · fround(1/N)`, every partial sum rounded to float32 in device order,
 * whatever order the gradients arrived in, on `backend` (default: the current one). One pass over
 * memory; the same bits as summing whole buffers one after another, because each element's
 * additions happen in the same order.
 *
 * @example
 * ```ts
 * import { averageInDeviceOrder } from "./host_parameters.ts";
 * const out = new Float32Array(2);
 * averageInDeviceOrder([new Float32Array([1, 2]), new Float32Array([3, 4])], out);
 * console.log(out); // Float32Array [2, 3]
 * ```
 */
export function averageInDeviceOrder(
  gradients: readonly Float32Array[],
  out: Float32Array,
  backend: Backend = getBackend(),
): void {
  // The CPU backend averages with its WebAssembly kernel, in place where the buffers are in its
  // memory (see `sharedFloats`); the loop below is for backends without the capability.
  if (backend.averageInOrder && backend.wrap) {
    backend.averageInOrder(gradients.map((g) => backend.wrap!(g)), backend.wrap(out));
    return;
  }
  const n = gradients.length;
  if (n === 1) {
    out.set(gradients[0]);
    return;
  }
  const scale = Math.fround(1 / n);
  for (let i = 0; i < out.length; i++) {
    let sum = gradients[0][i];
    for (let d = 1; d < n; d++) sum = Math.fround(sum + gradients[d][i]);
    out[i] = sum * scale;
  }
}
