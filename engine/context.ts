/**
 * Engine-wide state: the registered backends and the current one, gradient recording on or off,
 * the stack of `tidy` scopes, and live-memory counters.
 *
 * It knows tensors only as things that can be disposed, so it sits below `tensor.ts` in the
 * dependency order.
 *
 * @module
 */

import type { Backend } from "../backends/backend.ts";
import { TandemError } from "./errors.ts";

/** Something a `tidy` scope can free. */
export interface ScopedResource {
  /** Frees the resource. */
  dispose(): void;
  /** True once disposed; disposed resources are skipped. */
  readonly isDisposed: boolean;
}

const backends = new Map<string, Backend>();
let currentBackend: Backend | undefined;
let gradientRecording = true;
const scopes: Set<ScopedResource>[] = [];
let liveTensors = 0;
let liveBytes = 0;

/**
 * Makes a backend available under its name; the first one registered becomes the current one.
 *
 * @example
 * ```ts
 * import { registerBackend } from "./context.ts";
 * import { CpuBackend } from "../backends/cpu/backend.ts";
 * registerBackend(new CpuBackend());
 * ```
 */
export function registerBackend(backend: Backend): void {
  backends.set(backend.name, backend);
  currentBackend ??= backend;
}

/**
 * Selects the backend that new tensors are created on.
 *
 * @example
 * ```ts
 * import { setBackend } from "./context.ts";
 * setBackend("cpu");
 * ```
 */
export function setBackend(name: string): void {
  const backend = backends.get(name);
  if (!backend) {
    const known = [...backends.keys()].join(", ") || "none";
    throw new TandemError(`setBackend: unknown backend "${name}"; registered: ${known}`);
  }
  currentBackend = backend;
}

/**
 * The backend new tensors are created on.
 *
 * @example
 * ```ts
 * import { getBackend } from "./context.ts";
 * console.log(getBackend().name);
 * ```
 */
export function getBackend(): Backend {
  if (!currentBackend) {
    throw new TandemError("no backend registered: import Tandem from mod.ts, or call registerBackend()");
  }
  return currentBackend;
}

/** Whether ops currently record gradient graphs. */
export function isGradientRecording(): boolean {
  return gradientRecording;
}

/**
 * Runs `fn` without recording gradients (evaluation, optimizer updates).
 *
 * @example
 * ```ts
 * import { noGrad } from "./context.ts";
 * const accuracy = noGrad(() => 0.97);
 * ```
 */
export function noGrad<T>(fn: () => T): T {
  const previous = gradientRecording;
  gradientRecording = false;
  try {
    return fn();
  } finally {
    gradientRecording = previous;
  }
}

/** Adds a new resource to the innermost `tidy` scope, if any. */
export function trackInScope(resource: ScopedResource): void {
  scopes[scopes.length - 1]?.add(resource);
}

/** Removes a resource from every open scope so it outlives them (e.g. a parameter's `.grad`). */
export function untrackFromScopes(resource: ScopedResource): void {
  for (const scope of scopes) scope.delete(resource);
}

/**
 * Runs `fn` and then disposes every tensor created inside it, except those it returns (directly,
 * or inside returned arrays and plain objects). Scopes nest. `fn` must be synchronous.
 *
 * @example
 * ```ts
 * import { tidy } from "./context.ts";
 * const n = tidy(() => 1 + 1);
 * ```
 */
export function tidy<T>(fn: () => T): T {
  const scope = new Set<ScopedResource>();
  scopes.push(scope);
  let result: T;
  try {
    result = fn();
  } finally {
    scopes.pop();
  }
  if (result instanceof Promise) {
    throw new TandemError("tidy: the function returned a Promise; tidy scopes are synchronous");
  }
  const escaping = new Set<ScopedResource>();
  collectKept(result, escaping);
  for (const resource of scope) {
    if (!escaping.has(resource)) resource.dispose();
  }
  // Survivors belong to the enclosing scope, as if created there.
  for (const resource of escaping) if (scope.has(resource)) trackInScope(resource);
  return result;
}

function collectKept(value: unknown, into: Set<ScopedResource>): void {
  if (value === null || typeof value !== "object") return;
  if (Array.isArray(value)) {
    for (const item of value) collectKept(item, into);
  } else if (typeof (value as ScopedResource).dispose === "function") {
    into.add(value as ScopedResource);
  } else if (Object.getPrototypeOf(value) === Object.prototype) {
    for (const item of Object.values(value)) collectKept(item, into);
  }
}

/** Counters for leak checks: live tensor handles and the bytes their storages hold. */
export interface MemoryInfo {
  /** Tensor handles not yet disposed. */
  tensors: number;
  /** Bytes held by live storages (including storage kept only for a pending backward). */
  bytes: number;
}

/**
 * Live tensors and bytes. A training loop whose numbers grow step by step is leaking.
 *
 * @example
 * ```ts
 * import { memory } from "./context.ts";
 * console.log(memory().tensors);
 * ```
 */
export function memory(): MemoryInfo {
  return { tensors: liveTensors, bytes: liveBytes };
}

/** Bookkeeping hooks for `tensor.ts`. */
export function countTensor(delta: number): void {
  liveTensors += delta;
}

/** Bookkeeping hooks for `tensor.ts`. */
export function countBytes(delta: number): void {
  liveBytes += delta;
}
