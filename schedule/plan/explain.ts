/**
 * A plain-text picture of a plan: what each action does on which devices, what it waits for, and the
 * order of actions on every device's compute and communication lanes. A hybrid plan (`Plan.sharded`)
 * also gets a section saying what its model-parallel actions move: the activation all-gathers inside
 * `forward`, the input-gradient reduce-scatters inside `backward g`, and the local `update g` and
 * the compute it runs beside.
 *
 * @module
 */

import { ValueError } from "../../engine/errors.ts";
import { actionLabel, dependenciesOf, isSharded, type Plan, type ReductionMode } from "./plan.ts";
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
 * Explains `plan` for `options.devices` devices in `options.mode`. Actions are numbered by their
 * index in `plan.actions` (`#0` is the first), the numbering `dependenciesOf` and the simulator use.
 * Validation problems and notes are listed at the end instead of thrown, so a broken plan can be
 * explained too. For a hybrid plan the devices column marks the actions that carry activation traffic
 * (`+ all-gathers`, `+ reduce-scatter`) and the sharded updates (`own 1/N each`, on every device in
 * either mode), and a "model-parallel actions" section spells them out; other plans read as before.
 *
 * @example
 * ```ts
 * import { overlapPlan } from "./builtins.ts";
 * import { explain } from "./explain.ts";
 * console.log(explain(overlapPlan(["fc", "conv"]), { devices: 2, mode: "master" }));
 * // schedule "overlap": 9 actions, 2 devices, master mode (reduce on device 0, update there, broadcast)
 * // groups in backward order: fc, conv
 * //
 * // action  what            lane     devices  waits for
 * // #0      forward         compute  0..1     -
 * // #1      backward fc     compute  0..1     #0 forward
 * // #2      reduce fc       comm     1 -> 0   #1 backward fc
 * // ...
 * ```
 *
 * @example
 * ```ts
 * import { hybridPlan } from "./builtins.ts";
 * import { explain } from "./explain.ts";
 * console.log(explain(hybridPlan(["fc", "conv"]), { devices: 2, mode: "master" }));
 * // ...
 * // #2      update fc       comm     0..1, own 1/2 each     #1 backward fc
 * // ...
 * // model-parallel actions (sharded: fc; data-parallel: conv):
 * //   #0 forward: each device runs conv on its own b samples; the body output is all-gathered ...
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

  const sharded = plan.sharded ?? [];
  const hybrid = sharded.length > 0;
  const where = (kind: string, group?: string): string => {
    const split = hybrid && devices > 1;
    if (kind === "forward") return split ? `${everyone} + all-gathers` : everyone;
    if (kind === "backward") {
      return split && isSharded(plan, group) ? `${everyone} + reduce-scatter` : everyone;
    }
    if (kind === "update" && isSharded(plan, group)) {
      return split ? `${everyone}, own 1/${devices} each` : everyone;
    }
    if (kind === "update") return master ? "0" : everyone;
    if (devices === 1) return "0 (nothing to send)";
    if (kind === "reduce") return master ? `${others} -> 0` : `ring ${everyone}`;
    return master ? `0 -> ${others}` : "no-op";
  };
  const name = (i: number) => `#${i} ${actionLabel(plan.actions[i])}`;
  const description = master
    ? "master mode (reduce on device 0, update there, broadcast)"
    : "allreduce mode (every device reduces and updates its own copy; broadcasts are no-ops)";

  const rows = plan.actions.map((action, i) => {
    const deps = dependenciesOf(plan, i);
    return [
      `#${i}`,
      actionLabel(action),
      action.lane,
      where(action.kind, action.group),
      deps.length === 0 ? "-" : deps.map(name).join(", "),
      action.line > 0 ? `${action.line}:${action.column}` : "",
    ];
  });
  const header = ["action", "what", "lane", "devices", "waits for", "line:col"];
  const hasLines = plan.actions.some((s) => s.line > 0);
  const table = [header, ...rows].map((r) => (hasLines ? r : r.slice(0, 5)));
  const widths = table[0].map((_, c) => Math.max(...table.map((r) => r[c].length)));
  const render = (r: string[]) => r.map((cell, c) => cell.padEnd(widths[c])).join("  ").trimEnd();

  const out = [
    `schedule ${JSON.stringify(plan.name)}: ${plan.actions.length} actions, ${devices} device${
      devices === 1 ? "" : "s"
    }, ${description}`,
    `groups in backward order: ${plan.groups.join(", ")}`,
    "",
    ...table.map(render),
    "",
    ...(hybrid ? [...modelParallelSection(plan, devices), ""] : []),
    "lanes (actions in the order each lane runs them):",
  ];
  for (let d = 0; d < devices; d++) {
    const runsHere = (i: number) =>
      !(plan.actions[i].kind === "update" && master && d > 0 && !isSharded(plan, plan.actions[i].group));
    const lane = (which: string) =>
      plan.actions.map((s, i) => (s.lane === which && runsHere(i) ? name(i) : undefined)).filter((x) => x)
        .join(" -> ") || "(idle)";
    out.push(`  device ${d}`, `    compute | ${lane("compute")}`, `    comm    | ${lane("comm")}`);
  }
  if (report.errors.length > 0) {
    out.push("", "problems:", ...report.errors.map((e) => `  ${e.message.split("\n")[0]}`));
  }
  if (report.notes.length > 0) out.push("", "notes:", ...report.notes.map((n) => `  ${n}`));
  return out.join("\n") + "\n";
}

/** What a hybrid plan's forward, sharded backward and sharded update actions do, one line each. */
function modelParallelSection(plan: Plan, devices: number): string[] {
  const actions = plan.actions;
  const sharded = plan.sharded ?? [];
  const body = plan.groups.filter((g) => !sharded.includes(g));
  const name = (i: number) => `#${i} ${actionLabel(actions[i])}`;
  const forwardOrder = (groups: readonly string[]) => [...groups].reverse().join(", ");
  const n = devices;
  const rows = n === 1 ? "all b" : `all ${n}·b`;
  const slice = `1/${n}`;
  // Transitive waits, to find the compute actions each sharded update runs beside.
  const ancestors: Set<number>[] = [];
  actions.forEach((_, i) => {
    const mine = new Set<number>();
    for (const d of dependenciesOf(plan, i)) {
      mine.add(d);
      for (const a of ancestors[d] ?? []) mine.add(a);
    }
    ancestors.push(mine);
  });
  const bodyBackward = actions.findIndex((s) => s.kind === "backward" && s.group === body[0]);
  const lines = [
    `model-parallel actions (sharded: ${sharded.join(", ")}; data-parallel: ${body.join(", ")}):`,
  ];
  actions.forEach((action, i) => {
    if (action.kind === "forward") {
      lines.push(
        `  ${name(i)}: each device runs ${forwardOrder(body)} on its own b samples; the body output is ` +
          `all-gathered (every device gets ${rows} rows); each layer of ${forwardOrder(sharded)} computes ` +
          `this device's ${slice} of its output units for ${rows} samples, and the slices are ` +
          `all-gathered (by columns) before the next layer, the logits too, so every device computes ` +
          `the loss gradient on the full batch`,
      );
    } else if (action.kind === "backward" && isSharded(plan, action.group)) {
      const first = action.group === sharded[sharded.length - 1];
      const feeds = first
        ? `; below the first sharded layer each device gets the rows of its own samples${
          bodyBackward >= 0 ? `, which feed ${name(bodyBackward)}` : ""
        }`
        : "";
      lines.push(
        `  ${name(i)}: each layer's weight and bias gradients stay with the device owning that ` +
          `${slice} slice (never communicated); its partial input gradient for ${rows} samples is ` +
          `reduce-scattered (summed in device order): each device gets the columns of its own units ` +
          `of the layer below${feeds}`,
      );
    } else if (action.kind === "update" && isSharded(plan, action.group)) {
      const beside = actions
        .map((s, j) => (s.lane === "compute" && !ancestors[i].has(j) && !ancestors[j].has(i) ? j : -1))
        .filter((j) => j >= 0);
      lines.push(
        `  ${name(i)}: local: every device updates its own ${slice} slice with its own optimizer ` +
          `state, on the comm lane${
            beside.length > 0 ? `, alongside ${beside.map(name).join(", ")}` : ""
          }; nothing is reduced or broadcast`,
      );
    }
  });
  return lines;
}
