/**
 * A plain-text picture of a plan: what each step does on which devices, what it waits for, and the
 * order of steps on every device's compute and communication lanes.
 *
 * @module
 */

import { ValueError } from "../../engine/errors.ts";
import { dependenciesOf, type Plan, type ReductionMode, stepLabel } from "./plan.ts";
import { checkPlan } from "./validate.ts";

/**
 * Options of {@link explain}.
 *
 * @example
 * ```ts
 * import type { ExplainOptions } from "./explain.ts";
 * const options: ExplainOptions = { devices: 4, mode: "allreduce" };
 * ```
 */
export interface ExplainOptions {
  /** Number of devices, ≥ 1. */
  readonly devices: number;
  /** How gradients are combined. */
  readonly mode: ReductionMode;
}

function deviceList(from: number, to: number): string {
  return from === to ? `${from}` : `${from}..${to}`;
}

/**
 * Explains `plan` for `options.devices` devices in `options.mode`. Steps are numbered by their
 * index in `plan.steps` (`#0` is the first), the numbering `dependenciesOf` and the simulator use.
 * Validation problems and notes are listed at the end instead of thrown, so a broken plan can be
 * explained too.
 *
 * @example
 * ```ts
 * import { overlap } from "./builtins.ts";
 * import { explain } from "./explain.ts";
 * console.log(explain(overlap(["fc", "conv"]), { devices: 2, mode: "master" }));
 * // schedule "overlap": 9 steps, 2 devices, master mode (reduce on device 0, update there, broadcast)
 * // groups in backward order: fc, conv
 * //
 * // step  what            lane     devices  waits for
 * // #0    forward         compute  0..1     -
 * // #1    backward fc     compute  0..1     #0 forward
 * // #2    reduce fc       comm     1 -> 0   #1 backward fc
 * // ...
 * ```
 */
export function explain(plan: Plan, options: ExplainOptions): string {
  const { devices, mode } = options;
  if (!Number.isInteger(devices) || devices < 1) {
    throw new ValueError("explain", `devices must be an integer >= 1, got ${devices}`);
  }
  const report = checkPlan(plan, { mode });
  const last = devices - 1;
  const others = devices > 1 ? deviceList(1, last) : undefined;
  const everyone = deviceList(0, last);
  const master = mode === "master";

  const where = (kind: string): string => {
    if (kind === "forward" || kind === "backward") return everyone;
    if (kind === "update") return master ? "0" : everyone;
    if (devices === 1) return "0 (nothing to send)";
    if (kind === "reduce") return master ? `${others} -> 0` : `ring ${everyone}`;
    return master ? `0 -> ${others}` : "no-op";
  };
  const name = (i: number) => `#${i} ${stepLabel(plan.steps[i])}`;
  const description = master
    ? "master mode (reduce on device 0, update there, broadcast)"
    : "allreduce mode (every device reduces and updates its own copy; broadcasts are no-ops)";

  const rows = plan.steps.map((step, i) => {
    const deps = dependenciesOf(plan, i);
    return [
      `#${i}`,
      stepLabel(step),
      step.lane,
      where(step.kind),
      deps.length === 0 ? "-" : deps.map(name).join(", "),
      step.line > 0 ? `${step.line}:${step.column}` : "",
    ];
  });
  const header = ["step", "what", "lane", "devices", "waits for", "line:col"];
  const hasLines = plan.steps.some((s) => s.line > 0);
  const table = [header, ...rows].map((r) => (hasLines ? r : r.slice(0, 5)));
  const widths = table[0].map((_, c) => Math.max(...table.map((r) => r[c].length)));
  const render = (r: string[]) => r.map((cell, c) => cell.padEnd(widths[c])).join("  ").trimEnd();

  const out = [
    `schedule ${JSON.stringify(plan.name)}: ${plan.steps.length} steps, ${devices} device${
      devices === 1 ? "" : "s"
    }, ${description}`,
    `groups in backward order: ${plan.groups.join(", ")}`,
    "",
    ...table.map(render),
    "",
    "lanes (steps in the order each lane runs them):",
  ];
  for (let d = 0; d < devices; d++) {
    const runsHere = (i: number) => !(plan.steps[i].kind === "update" && master && d > 0);
    const lane = (which: string) =>
      plan.steps.map((s, i) => (s.lane === which && runsHere(i) ? name(i) : undefined)).filter((x) => x)
        .join(" -> ") || "(idle)";
    out.push(`  device ${d}`, `    compute | ${lane("compute")}`, `    comm    | ${lane("comm")}`);
  }
  if (report.errors.length > 0) {
    out.push("", "problems:", ...report.errors.map((e) => `  ${e.message.split("\n")[0]}`));
  }
  if (report.notes.length > 0) out.push("", "notes:", ...report.notes.map((n) => `  ${n}`));
  return out.join("\n") + "\n";
}
