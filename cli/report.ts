/**
 * The `--report` file: one self-contained HTML page (inline SVG, no scripts, no external assets)
 * with the loss and accuracy curves and the compute/communication lanes of a few steps.
 *
 * @module
 */

import { type TraceSpan, writeFileAtomic } from "../mod.ts";

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
  const px = (x: number) => PAD.left + (x - x0) / (x1 - x0) * (W - PAD.left - PAD.right);
  const py = (y: number) => H - PAD.bottom - (y - y0) / (y1 - y0 || 1) * (H - PAD.top - PAD.bottom);
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
  const legend = series.map((s, i) =>
    `<rect x="${PAD.left + 10 + i * 190}" y="${PAD.top}" width="12" height="12" fill="${s.colour}"/>` +
    `<text x="${PAD.left + 28 + i * 190}" y="${PAD.top + 11}">${escape(s.name)}</text>`
  ).join("");
  return `<h2>${escape(title)}</h2>
<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" font-size="11" font-family="sans-serif">
${grid}<line x1="${PAD.left}" x2="${W - PAD.right}" y1="${H - PAD.bottom}" y2="${
    H - PAD.bottom
  }" stroke="#888"/>
<text x="${PAD.left}" y="${H - 10}">step ${x0}</text><text x="${W - PAD.right}" y="${
    H - 10
  }" text-anchor="end">step ${x1}</text>
${lines}${legend}</svg>`;
}

/** Moving average over `window` points, so a noisy per-batch curve shows its trend. */
function smooth(points: [number, number][], window: number): [number, number][] {
  return points.map(([x], i) => {
    const part = points.slice(Math.max(0, i - window + 1), i + 1);
    return [x, part.reduce((s, [, y]) => s + y, 0) / part.length];
  });
}

const LANE_COLOURS: Record<string, string> = {
  forward: "#4e79a7",
  backward: "#59a14f",
  reduce: "#e15759",
  send: "#e15759",
  update: "#f28e2b",
  broadcast: "#b07aa1",
  receive: "#b07aa1",
};

function lanesChart(spans: readonly TraceSpan[]): string {
  if (spans.length === 0) return "<p>No trace spans recorded.</p>";
  const devices = [...new Set(spans.map((s) => s.device))].sort((a, b) => a - b);
  const t0 = Math.min(...spans.map((s) => s.start)), t1 = Math.max(...spans.map((s) => s.end));
  const rowH = 22, left = 130, width = W;
  const rows = devices.flatMap((d) => [[d, "compute"], [d, "comm"]] as const);
  const height = rows.length * rowH + 40;
  const px = (t: number) => left + (t - t0) / (t1 - t0 || 1) * (width - left - PAD.right);
  const body = rows.map(([device, lane], r) => {
    const y = 10 + r * rowH;
    const label = `<text x="${left - 6}" y="${y + 14}" text-anchor="end">device ${device} ${
      lane === "comm" ? "communication" : "compute"
    }</text>`;
    const rects = spans.filter((s) => s.device === device && s.lane === lane).map((s) => {
      const colour = LANE_COLOURS[s.name.split(" ")[0]] ?? "#999";
      const w = Math.max(0.5, px(s.end) - px(s.start));
      return `<rect x="${px(s.start).toFixed(1)}" y="${y}" width="${w.toFixed(1)}" height="${rowH - 4}" ` +
        `fill="${colour}"><title>${escape(s.name)} (step ${s.step}): ${
          (s.end - s.start).toFixed(2)
        } ms</title></rect>`;
    }).join("");
    return label + rects;
  }).join("");
  const legend = Object.entries({
    forward: "forward",
    backward: "backward",
    reduce: "reduce / send",
    update: "update",
    broadcast: "broadcast / receive",
  }).map(([key, text], i) =>
    `<rect x="${left + i * 115}" y="${height - 22}" width="12" height="12" fill="${LANE_COLOURS[key]}"/>` +
    `<text x="${left + 16 + i * 115}" y="${height - 12}">${text}</text>`
  ).join("");
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" font-size="11" font-family="sans-serif">
${body}${legend}<text x="${width - PAD.right}" y="${height - 12}" text-anchor="end">${
    (t1 - t0).toFixed(1)
  } ms</text></svg>`;
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
  const facts = input.facts.map(([k, v]) => `<tr><th>${escape(k)}</th><td>${escape(v)}</td></tr>`).join("");
  return `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>${escape(input.title)}</title>
<style>body{font-family:sans-serif;max-width:760px;margin:2em auto;color:#222}th{text-align:left;padding-right:1em}
h2{font-size:1.1em;margin-top:1.5em}svg{display:block}</style></head><body>
<h1>${escape(input.title)}</h1>
<table>${facts}</table>
${
    lineChart("Training loss", [
      { name: "loss per step", colour: "#c6d4e6", points: loss },
      { name: `moving average (${window} steps)`, colour: "#4e79a7", points: smooth(loss, window) },
    ])
  }
${
    lineChart("Accuracy", [
      {
        name: `training batches (avg. ${window} steps)`,
        colour: "#59a14f",
        points: smooth(accuracy, window),
      },
      {
        name: "held out",
        colour: "#e15759",
        points: input.heldOut.map((h) => [h.step, h.accuracy] as [number, number]),
        dots: true,
      },
    ], [0, 1])
  }
<h2>Lanes of step${stepsShown.length === 1 ? "" : "s"} ${stepsShown.join(", ")}</h2>
${lanesChart(input.spans)}
</body></html>
`;
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
