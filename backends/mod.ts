/**
 * The backend contract: the kernels every Tandem backend implements over opaque storage, and the
 * geometry the engine hands them. Implement {@link Backend} and pass it to `registerBackend` to
 * run every op, gradient and optimizer on new hardware; the engine never imports a concrete backend.
 *
 * @example
 * ```ts
 * import type { Backend, DType, HostArray } from "./mod.ts";
 *
 * async function roundTrip(backend: Backend, values: HostArray): Promise<DType> {
 *   const storage = backend.upload(values);
 *   const back = await backend.read(storage);
 *   backend.release(storage);
 *   return back.length === values.length ? storage.dtype : "int32";
 * }
 * ```
 *
 * @module
 */

export type {
  Activation,
  AdamStep,
  Backend,
  BinaryOp,
  DropoutMaskSpec,
  DType,
  HostArray,
  MatmulSpec,
  MaxPoolBackwardEpilogue,
  MemoryLoan,
  ReduceOp,
  RowSpec,
  SgdSaved,
  SgdStep,
  StagedValues,
  Storage,
  StridedView,
  UnaryOp,
} from "./backend.ts";
export type { Conv2dGeometry, LrnParams, Pair, Pool2dGeometry } from "./geometry.ts";
