/** A backend seen through a proxy that logs its calls and can hide an optional capability. */

import type { Backend } from "../../backends/backend.ts";
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
