/**
 * Backends that watch their own calls: a proxy that logs them and can hide an optional capability,
 * and a CPU backend that counts its standalone ReLU passes, to tell fused runs apart.
 */

import type { Backend, Storage, UnaryOp } from "../../backends/backend.ts";
import { CpuBackend } from "../../backends/cpu/backend.ts";
import { registerBackend } from "../../mod.ts";

/**
 * Registers `backend` under `name` as a proxy that hands each method call to `log(method, args)`
 * first (a label it returns is pushed onto `calls`) and, with `hide`, lacks that optional method,
 * so the engine takes its other route.
 *
 * @example
 * ```ts
 * import { CpuBackend } from "../../backends/cpu/backend.ts";
 * import { registerLogged } from "./logged_backend.ts";
 * const calls: string[] = [];
 * registerLogged(new CpuBackend(), "cpu-logged", calls, (method) => method === "matmul" ? method : undefined);
 * ```
 */
export function registerLogged(
  backend: Backend,
  name: string,
  calls: string[],
  log: (method: string, args: unknown[]) => string | undefined,
  hide?: keyof Backend,
): void {
  registerBackend(
    new Proxy(backend, {
      get(target, prop) {
        const value = Reflect.get(target, prop, target);
        if (prop === "name") return name;
        if (prop === hide) return undefined;
        if (typeof value !== "function") return value;
        return (...args: unknown[]) => {
          const label = log(String(prop), args);
          if (label !== undefined) calls.push(label);
          return value.apply(target, args);
        };
      },
    }),
  );
}

/**
 * The CPU backend, counting the ReLU passes it runs on their own (`unary("relu")`), not those in a
 * product's epilogue: a layer that runs fused with its convolution or product adds none.
 */
export class CountingCpu extends CpuBackend {
  /** Standalone ReLU passes so far. */
  reluPasses = 0;
  override unary(op: UnaryOp, x: Storage, out: Storage): void {
    if (op === "relu") this.reluPasses++;
    super.unary(op, x, out);
  }
}
