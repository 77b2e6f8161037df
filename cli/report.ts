/**
 * The `--report` file: one self-contained HTML page (inline SVG, no scripts, no external assets)
 * with the loss and accuracy curves and the compute/communication lanes of a few steps.
 *
 * @module
 */

import type { TraceSpan } from "../schedule/runtime/mod.ts";
import { writeFileAtomic } from "../engine/io/mod.ts";

/** One training step's figures. */
export interface StepPoint {
  /** Total step count after the step. */
  step: number;
  /** Loss of the step. */
  loss: number;
  /** Top-1 accuracy on the step's batch. */
  accuracy: number;
}

/** What the report shows. */
export interface ReportInput {
  /** Page title. */
  title: string;
  /** Key/value facts shown in a table (model, data, schedule, link…). */
  facts: [string, string][];
  /** Every step of the run. */
  steps: StepPoint[];
  /** Held-out accuracy after some steps. */
  heldOut: { step: number; accuracy: number }[];
  /** Spans of the steps to draw (all devices, both lanes). */
  spans: readonly TraceSpan[];
}

const escape = (s: string) =>
  s.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]!);

const W = 720, H = 240, PAD = { left: 56, right: 16, top: 16, bottom: 32 };

/** A span and the label of the run it belongs to, for {@link renderLanes}. */
export interface LabelledSpans {
  /** Shown above the run's lanes (e.g. the schedule's name); empty for none. */
  label: string;
  /** The run's spans (all devices, both lanes), in its own clock. */
  spans: readonly TraceSpan[];
}

/**
 * Transfers are drawn as the action they belong to: a `send fc gradients` is part of `reduce fc`, a
 * `receive fc parameters` part of `broadcast fc` (see `figures.ts`).
 */
const VERB_ALIASES: Record<string, string> = { send: "reduce", receive: "broadcast" };

/**
 * One hue family per action kind, one shade per group. `fc` and `conv` have fixed shades far apart
 * (green and yellow for backward), since telling their work apart is the point of the lanes; other
 * groups take the remaining shades by a hash of their name, so a group keeps its colour across reports.
 */
const PALETTE: Record<string, readonly string[]> = {
  forward: ["#4e79a7", "#a0cbe8", "#1f4e79", "#6b9bc3"],
  backward: ["#59a14f", "#edc948", "#8cd17d", "#b6992d", "#499894"],
  reduce: ["#e15759", "#ff9d9a", "#a52a2a", "#d37295"],
  update: ["#f28e2b", "#ffbe7d", "#c85a00", "#e8a33d"],
  broadcast: ["#b07aa1", "#d4a6c8", "#7b4f73", "#9467bd"],
  other: ["#79706e", "#bab0ac", "#9d7660", "#d7b5a6"],
};
const VERB_ORDER = ["forward", "backward", "reduce", "update", "broadcast"];
const FIXED_GROUPS = ["fc", "conv"];

function parseKind(name: string): { verb: string; group: string } {
  const [first = "", group = ""] = name.split(" ");
  return { verb: VERB_ALIASES[first] ?? first, group };
}

/**
 * What a span is drawn as: its action kind and group, e.g. `backward conv`, `update fc`, `forward`;
 * transfers count as their action (`send fc gradients` is `reduce fc`).
 *
 * @example
 * ```ts
 * import { laneKind } from "./report.ts";
 * console.log(laneKind("send fc gradients")); // "reduce fc"
 * ```
 */
export function laneKind(name: string): string {
  const { verb, group } = parseKind(name);
  return group ? `${verb} ${group}` : verb;
}

/**
 * The colour of a span, by {@link laneKind}: the report's one palette.
 *
 * @example
 * ```ts
 * import { laneColour } from "./report.ts";
 * console.log(laneColour("backward fc") !== laneColour("backward conv")); // true
 * ```
 */
export function laneColour(name: string): string {
  const { verb, group } = parseKind(name);
  const shades = PALETTE[verb] ?? PALETTE.other;
  const fixed = FIXED_GROUPS.indexOf(group);
  if (!group || fixed >= 0) return shades[Math.max(0, fixed)];
  let hash = 0;
  for (const c of group) hash = (hash * 31 + c.charCodeAt(0)) >>> 0;
  return shades[FIXED_GROUPS.length + hash % (shades.length - FIXED_GROUPS.length)];
}

/** Legend order: the action order of a plan, then `fc`, `conv`, other groups by name. */
function compareKinds(a: string, b: string): number {
  const pa = parseKind(a), pb = parseKind(b);
  const rank = (v: string) => VERB_ORDER.includes(v) ? VERB_ORDER.indexOf(v) : VERB_ORDER.length;
  const groupRank = (g: string) => FIXED_GROUPS.includes(g) ? FIXED_GROUPS.indexOf(g) : FIXED_GROUPS.length;
  return rank(pa.verb) - rank(pb.verb) || pa.verb.localeCompare(pb.verb) ||
    groupRank(pa.group) - groupRank(pb.group) || pa.group.localeCompare(pb.group);
}

/**
 * Width of a label at 11 px sans-serif, over-estimated (7 px a character, wider than the average
 * glyph), so that positions computed from it leave room in any browser's fonts.
 */
const textWidth = (text: string) => text.length * 7;
const LINE = 16;

interface LegendItem {
  x: number;
  y: number;
  colour: string;
  text: string;
}

/**
 * Places legend swatches left to right from `(x, y)`, wrapping before `right`, each item as wide
 * as its text: the one legend layout of the page, so no item can reach into another's box.
 */
function layoutLegend(
  entries: { colour: string; text: string }[],
  x: number,
  y: number,
  right: number,
): { items: LegendItem[]; height: number } {
  const items: LegendItem[] = [];
  let cx = x, cy = y;
  for (const { colour, text } of entries) {
    const width = 16 + textWidth(text) + 14;
    if (cx > x && cx + width > right) cx = x, cy += LINE;
    items.push({ x: cx, y: cy, colour, text });
    cx += width;
  }
  return { items, height: entries.length ? cy - y + LINE : 0 };
}

const legendSvg = (items: LegendItem[]) =>
  items.map((i) =>
    `<rect x="${i.x}" y="${i.y}" width="12" height="12" fill="${i.colour}"/>` +
    `<text x="${i.x + 16}" y="${i.y + 10}">${escape(i.text)}</text>`
  ).join("");

/** A tick spacing of 1, 2 or 5 × 10ⁿ giving at most `count` intervals over `span`. */
function niceStep(span: number, count: number): number {
  const raw = span / Math.max(1, count);
  const power = 10 ** Math.floor(Math.log10(raw || 1));
  return [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw) ?? 10 * power;
}

/**
 * The lanes figure: each run a block of lanes (compute and communication per device), the blocks
 * one above the other on one time axis, in milliseconds from each run's first span and scaled to the
 * longest run, so a shorter run ends visibly earlier. The legend, in its own rows above the blocks,
 * lists exactly the kinds drawn.
 *
 * @example
 * ```ts
 * import { renderLanes } from "./report.ts";
 * const span = { device: 0, lane: "compute" as const, name: "forward", step: 0, start: 0, end: 5 };
 * const svg = renderLanes([{ label: "sequential", spans: [span] }, { label: "overlap", spans: [span] }]);
 * ```
 */
export function renderLanes(runs: readonly LabelledSpans[]): string {
  const drawn = runs.filter((r) => r.spans.length > 0);
  if (drawn.length === 0) return "<p>No trace spans recorded.</p>";
  const width = W, right = width - 24, rowH = 22;
  const rowLabel = (device: number, lane: string) =>
    `device ${device} ${lane === "comm" ? "communication" : "compute"}`;
  const devicesOf = (spans: readonly TraceSpan[]) =>
    [...new Set(spans.map((s) => s.device))].sort((a, b) => a - b);
  const left = 12 +
    Math.max(...drawn.flatMap((r) => devicesOf(r.spans).map((d) => textWidth(rowLabel(d, "comm")))));
  const kinds = [...new Set(drawn.flatMap((r) => r.spans.map((s) => laneKind(s.name))))].sort(compareKinds);
  const legend = layoutLegend(kinds.map((k) => ({ colour: laneColour(k), text: k })), left, 4, right);
  const origin = (spans: readonly TraceSpan[]) => Math.min(...spans.map((s) => s.start));
  const duration = (spans: readonly TraceSpan[]) => Math.max(...spans.map((s) => s.end)) - origin(spans);
  const longest = Math.max(...drawn.map((r) => duration(r.spans))) || 1;
  const px = (ms: number) => left + ms / longest * (right - left);
  let y = 4 + legend.height + 8;
  const parts: string[] = [legendSvg(legend.items)];
  for (const run of drawn) {
    const t0 = origin(run.spans);
    if (run.label) {
      parts.push(
        `<text x="4" y="${y + 12}" font-weight="bold">${escape(run.label)}: ${
          duration(run.spans).toFixed(1)
        } ms</text>`,
      );
      y += LINE + 2;
    }
    for (const device of devicesOf(run.spans)) {
      for (const lane of ["compute", "comm"] as const) {
        parts.push(`<text x="${left - 6}" y="${y + 14}" text-anchor="end">${rowLabel(device, lane)}</text>`);
        for (const s of run.spans.filter((s) => s.device === device && s.lane === lane)) {
          const x = px(s.start - t0), w = Math.max(0.5, px(s.end - t0) - x);
          parts.push(
            `<rect x="${x.toFixed(1)}" y="${y}" width="${w.toFixed(1)}" height="${rowH - 4}" fill="${
              laneColour(s.name)
            }"><title>${escape(s.name)} (step ${s.step}): ${(s.end - s.start).toFixed(2)} ms</title></rect>`,
          );
        }
        y += rowH;
      }
    }
    y += 6;
  }
  // Tick labels are spaced by their own widths, and the axis title sits in a row of its own below
  // them, so no label of the axis can meet another.
  const labelWidth = textWidth(longest.toFixed(0)) + 16;
  const step = niceStep(longest, Math.floor((right - left) / labelWidth));
  const ticks = Array.from({ length: Math.floor(longest / step + 1e-9) + 1 }, (_, i) => i * step);
  parts.push(`<line x1="${left}" x2="${right}" y1="${y}" y2="${y}" stroke="#888"/>`);
  for (const t of ticks) {
    parts.push(
      `<line x1="${px(t)}" x2="${px(t)}" y1="${y}" y2="${y + 4}" stroke="#888"/>` +
        `<text x="${px(t)}" y="${y + 16}" text-anchor="middle">${+t.toPrecision(6)}</text>`,
    );
  }
  parts.push(
    `<text x="${left}" y="${y + 16 + LINE}">milliseconds from each run's first span</text>`,
  );
  const height = y + 16 + LINE + 8;
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" font-size="11" font-family="sans-serif" class="lanes">
${parts.join("\n")}</svg>
<p class="note">Transfers are drawn as their action: a <i>send</i> as its group's reduce, a <i>receive</i> as its broadcast.</p>`;
}

interface Series {
  name: string;
  colour: string;
  points: [number, number][];
  dots?: boolean;
}

function lineChart(title: string, series: Series[], yRange?: [number, number]): string {
  const all = series.flatMap((s) => s.points).filter(([, y]) => Number.isFinite(y));
  if (all.length === 0) return `<p>${escape(title)}: no data</p>`;
  const xs = all.map(([x]) => x), ys = all.map(([, y]) => y);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs, Math.min(...xs) + 1)];
  const [y0, y1] = yRange ?? [Math.min(0, ...ys), Math.max(...ys) * 1.05 || 1];
  // The legend has rows of its own above the plot, so it covers neither curves nor axis labels.
  const legend = layoutLegend(
    series.map((s) => ({ colour: s.colour, text: s.name })),
    PAD.left,
    PAD.top,
    W - PAD.right,
  );
  const top = PAD.top + legend.height + 8;
  const px = (x: number) => PAD.left + (x - x0) / (x1 - x0) * (W - PAD.left - PAD.right);
  const py = (y: number) => H - PAD.bottom - (y - y0) / (y1 - y0 || 1) * (H - top - PAD.bottom);
  const ticks = Array.from({ length: 5 }, (_, i) => y0 + (y1 - y0) * i / 4);
  const grid = ticks.map((t) =>
    `<line x1="${PAD.left}" x2="${W - PAD.right}" y1="${py(t)}" y2="${py(t)}" stroke="#eee"/>` +
    `<text x="${PAD.left - 6}" y="${py(t) + 4}" text-anchor="end">${+t.toPrecision(3)}</text>`
  ).join("");
  const lines = series.map((s) => {
    const pts = s.points.filter(([, y]) => Number.isFinite(y));
    const path = pts.map(([x, y], i) => `${i ? "L" : "M"}${px(x).toFixed(1)},${py(y).toFixed(1)}`).join("");
    const dots = s.dots
      ? pts.map(([x, y]) => `<circle cx="${px(x)}" cy="${py(y)}" r="4" fill="${s.colour}"/>`).join("")
      : "";
    return `<path d="${path}" fill="none" stroke="${s.colour}" stroke-width="1.5"/>${dots}`;
  }).join("");
  return `<h2>${escape(title)}</h2>
<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" font-size="11" font-family="sans-serif">
${grid}<line x1="${PAD.left}" x2="${W - PAD.right}" y1="${H - PAD.bottom}" y2="${
    H - PAD.bottom
  }" stroke="#888"/>
<text x="${PAD.left}" y="${H - 10}">step ${x0}</text><text x="${W - PAD.right}" y="${
    H - 10
  }" text-anchor="end">step ${x1}</text>
${lines}${legendSvg(legend.items)}</svg>`;
}

/** Moving average over `window` points, so a noisy per-batch curve shows its trend. */
function smooth(points: [number, number][], window: number): [number, number][] {
  return points.map(([x], i) => {
    const part = points.slice(Math.max(0, i - window + 1), i + 1);
    return [x, part.reduce((s, [, y]) => s + y, 0) / part.length];
  });
}

/** The page around the figures: title, facts table, then `body`. */
function page(title: string, facts: [string, string][], body: string): string {
  const rows = facts.map(([k, v]) => `<tr><th>${escape(k)}</th><td>${escape(v)}</td></tr>`).join("");
  return `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>${escape(title)}</title>
<style>body{font-family:sans-serif;max-width:760px;margin:2em auto;color:#222}th{text-align:left;padding-right:1em}
h2{font-size:1.1em;margin-top:1.5em}svg{display:block}.note{font-size:0.85em;color:#555}</style></head><body>
<h1>${escape(title)}</h1>
<table>${rows}</table>
${body}
</body></html>
`;
}

/**
 * The report as an HTML string.
 *
 * @example
 * ```ts
 * import { renderReport } from "./report.ts";
 * const html = renderReport({ title: "run", facts: [], steps: [{ step: 1, loss: 2.3, accuracy: 0.1 }], heldOut: [], spans: [] });
 * ```
 */
export function renderReport(input: ReportInput): string {
  const window = Math.max(1, Math.round(input.steps.length / 50));
  const loss = input.steps.map((s) => [s.step, s.loss] as [number, number]);
  const accuracy = input.steps.map((s) => [s.step, s.accuracy] as [number, number]);
  const stepsShown = [...new Set(input.spans.map((s) => s.step))].sort((a, b) => a - b);
  const heldOut: Series = {
    name: "held out",
    colour: "#e15759",
    points: input.heldOut.map((h) => [h.step, h.accuracy] as [number, number]),
    dots: true,
  };
  // A window of one step averages nothing: the raw curve is then drawn alone, in the strong colour.
  const lossSeries: Series[] = window === 1 ? [{ name: "loss per step", colour: "#4e79a7", points: loss }] : [
    { name: "loss per step", colour: "#c6d4e6", points: loss },
    { name: `moving average (${window} steps)`, colour: "#4e79a7", points: smooth(loss, window) },
  ];
  const accuracySeries: Series[] = [{
    name: window === 1 ? "training batches" : `training batches (avg. ${window} steps)`,
    colour: "#59a14f",
    points: smooth(accuracy, window),
  }, heldOut];
  return page(
    input.title,
    input.facts,
    `${lineChart("Training loss", lossSeries)}
${lineChart("Accuracy", accuracySeries, [0, 1])}
<h2>Lanes of step${stepsShown.length === 1 ? "" : "s"} ${stepsShown.join(", ")}</h2>
${renderLanes([{ label: "", spans: input.spans }])}`,
  );
}

/**
 * Writes {@link renderReport} to `path` atomically.
 *
 * @example
 * ```ts ignore
 * import { writeReport } from "./report.ts";
 * await writeReport("run.html", { title: "run", facts: [], steps: [], heldOut: [], spans: [] });
 * ```
 */
export async function writeReport(path: string, input: ReportInput): Promise<void> {
  await writeFileAtomic(path, [new TextEncoder().encode(renderReport(input))]);
}

/** What {@link renderRunsReport} shows: figures comparing labelled runs, e.g. two schedules. */
export interface RunsReportInput {
  /** Page title. */
  title: string;
  /** Key/value facts shown in a table. */
  facts: [string, string][];
  /** Each figure's heading and runs, drawn one above the other on one time axis. */
  figures: { heading: string; runs: readonly LabelledSpans[] }[];
}

/**
 * A page of lanes figures, each comparing runs on one time axis (see {@link renderLanes}).
 *
 * @example
 * ```ts
 * import { renderRunsReport } from "./report.ts";
 * const span = { device: 0, lane: "compute" as const, name: "forward", step: 0, start: 0, end: 5 };
 * const html = renderRunsReport({
 *   title: "schedules",
 *   facts: [],
 *   figures: [{ heading: "no link", runs: [{ label: "sequential", spans: [span] }] }],
 * });
 * ```
 */
export function renderRunsReport(input: RunsReportInput): string {
  return page(
    input.title,
    input.facts,
    input.figures.map((f) => `<h2>${escape(f.heading)}</h2>\n${renderLanes(f.runs)}`).join("\n"),
  );
}

/**
 * Writes {@link renderRunsReport} to `path` atomically.
 *
 * @example
 * ```ts ignore
 * import { writeRunsReport } from "./report.ts";
 * await writeRunsReport("bench/SCHEDULE.html", { title: "schedules", facts: [], figures: [] });
 * ```
 */
export async function writeRunsReport(path: string, input: RunsReportInput): Promise<void> {
  await writeFileAtomic(path, [new TextEncoder().encode(renderRunsReport(input))]);
}
