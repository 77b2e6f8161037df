/**
 * The `--report` page shows what the overlap schedule is for. Unit checks on the palette, legend and
 * the runs page, then a headless-Chromium screenshot of a report rendered from hand-made spans (one
 * sequential run, one overlap run), checked on its pixels and its DOM (skipped with a printed line
 * when Chromium or playwright-core is missing).
 *
 * Mutations tried, each of which made a test here fail:
 * - one colour for every backward span (`laneColour` ignoring the group): "fc and conv backward
 *   differ" and the screenshot's "both colours appear and differ";
 * - the lanes legend drawn at the time-axis label's row (as before issue 17): "no two text labels
 *   intersect";
 * - each run scaled to its own duration (separate axes): "the overlap block ends before the
 *   sequential one";
 * - the one-step branch removed, so a short run says "moving average (1 steps)": "a one-step window
 *   draws no average".
 *
 * @module
 */

import assert from "node:assert/strict";
import {
  type LabelledSpans,
  laneColour,
  laneKind,
  renderReport,
  renderRunsReport,
} from "../../cli/report.ts";
import type { TraceSpan } from "../../schedule/runtime/mod.ts";

import { runSlowTests } from "../fixtures/slow.ts";

const CHROMIUM = "/usr/bin/chromium";

type Part = [lane: "compute" | "comm", name: string, start: number, end: number];

/** Both devices compute alike; device 0 runs the actions, device 1 its transfers. */
function spansOf(compute: Part[], comm0: Part[], comm1: Part[]): TraceSpan[] {
  const spans: TraceSpan[] = [];
  for (const device of [0, 1]) {
    for (const [lane, name, start, end] of [...compute, ...(device === 0 ? comm0 : comm1)]) {
      spans.push({
        device,
        lane,
        name,
        step: 4,
        start: 1000 * (device + 1) + start,
        end: 1000 * (device + 1) + end,
      });
    }
  }
  // Each device's clock starts elsewhere, as Workers' do; what is drawn must not depend on it.
  return spans.map((s) => s.device === 1 ? { ...s, start: s.start - 1000, end: s.end - 1000 } : s);
}

const compute: Part[] = [
  ["compute", "forward", 0, 10],
  ["compute", "backward fc", 10, 14],
  ["compute", "backward conv", 14, 30],
];
const sequentialRun: LabelledSpans = {
  label: "sequential",
  spans: spansOf(compute, [
    ["comm", "reduce fc", 30, 34],
    ["comm", "update fc", 34, 36],
    ["comm", "broadcast fc", 36, 38],
    ["comm", "reduce conv", 38, 39],
    ["comm", "update conv", 39, 40],
    ["comm", "broadcast conv", 40, 41],
  ], [["comm", "send fc gradients", 30, 34], ["comm", "receive fc parameters", 36, 38]]),
};
const overlapRun: LabelledSpans = {
  label: "overlap",
  spans: spansOf(compute, [
    ["comm", "reduce fc", 14, 18],
    ["comm", "update fc", 18, 22],
    ["comm", "broadcast fc", 22, 24],
    ["comm", "reduce conv", 30, 31],
    ["comm", "update conv", 31, 32],
    ["comm", "broadcast conv", 32, 33],
  ], [["comm", "send fc gradients", 14, 18], ["comm", "receive fc parameters", 22, 24]]),
};

const html = renderRunsReport({
  title: "sequential vs overlap",
  facts: [["model", "hand-made spans"]],
  figures: [{ heading: "2 devices", runs: [sequentialRun, overlapRun] }],
});

Deno.test("report: fc and conv backward differ; transfers count as their action", () => {
  assert.notEqual(laneColour("backward fc"), laneColour("backward conv"));
  assert.notEqual(laneColour("update fc"), laneColour("update conv"));
  assert.equal(laneKind("send fc gradients"), "reduce fc");
  assert.equal(laneColour("receive conv parameters"), laneColour("broadcast conv"));
  // Another group's colour is a function of its name alone.
  assert.equal(laneColour("backward head"), laneColour("backward head"));
});

Deno.test("report: the legend lists exactly the kinds drawn", () => {
  const legend = [
    ...html.matchAll(
      /<rect x="[\d.]+" y="[\d.]+" width="12" height="12" fill="[^"]+"\/><text[^>]*>([^<]+)</g,
    ),
  ]
    .map((m) => m[1]);
  assert.deepEqual(legend, [
    "forward",
    "backward fc",
    "backward conv",
    "reduce fc",
    "reduce conv",
    "update fc",
    "update conv",
    "broadcast fc",
    "broadcast conv",
  ]);
});

Deno.test("report: a one-step window draws no average", () => {
  const steps = [1, 2, 3].map((step) => ({ step, loss: 3 - step / 2, accuracy: step / 10 }));
  const page = renderReport({ title: "t", facts: [], steps, heldOut: [], spans: sequentialRun.spans });
  assert.doesNotMatch(page, /\(1 steps?\)|avg\. 1 step/);
  assert.match(page, /loss per step/);
  const many = Array.from({ length: 200 }, (_, i) => ({ step: i + 1, loss: 1, accuracy: 0.5 }));
  assert.match(
    renderReport({ title: "t", facts: [], steps: many, heldOut: [], spans: [] }),
    /moving average \(4 steps\)/,
  );
});

async function exists(path: string): Promise<boolean> {
  return await Deno.stat(path).then(() => true, () => false);
}

type Playwright = typeof import("playwright-core");
const playwright: Playwright | string =
  !await exists(new URL("../../node_modules/playwright-core/package.json", import.meta.url).pathname)
    ? "playwright-core is not installed in node_modules"
    : !await exists(CHROMIUM)
    ? `${CHROMIUM} is missing`
    : await import("playwright-core").catch((e) => `playwright-core failed to load: ${e.message}`);
if (typeof playwright === "string") console.log(`SKIP tests/cli/report_test.ts screenshot: ${playwright}`);

interface Box {
  text: string;
  left: number;
  right: number;
  top: number;
  bottom: number;
}

/** Every SVG text's box on the page (a string, since this file is type-checked without DOM types). */
async function textBoxes(page: { evaluate(script: string): Promise<unknown> }): Promise<Box[]> {
  return await page.evaluate(`[...document.querySelectorAll("svg text")].map((t) => {
    const r = t.getBoundingClientRect();
    return { text: t.textContent, left: r.left, right: r.right, top: r.top, bottom: r.bottom };
  })`) as Box[];
}

/** The pairs of labels whose boxes intersect, as text. */
function collisions(boxes: Box[]): string[] {
  const meets = (a: Box, b: Box) =>
    a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  return boxes.flatMap((a, i) =>
    boxes.slice(i + 1).filter((b) => meets(a, b)).map((b) => `${a.text} / ${b.text}`)
  );
}

const hex = (c: string) => [1, 3, 5].map((i) => parseInt(c.slice(i, i + 2), 16));

Deno.test({
  name:
    "report: in Chromium, fc update runs under conv backward in the overlap block only, and no labels meet",
  // Slow (Chromium): runs with the slow tests. The palette, legend and one-step checks above run in
  // the default set on the same renderer's output.
  ignore: !runSlowTests || typeof playwright === "string",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const { chromium } = playwright as Playwright;
    const browser = await chromium.launch({
      executablePath: CHROMIUM,
      headless: true,
      args: [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        // Screenshot pixels then carry the palette's sRGB values unchanged.
        "--force-color-profile=srgb",
      ],
    });
    try {
      const page = await browser.newPage({ viewport: { width: 900, height: 700 }, deviceScaleFactor: 1 });
      // The training report's line charts too: their legends once shared a row with the curves.
      const steps = Array.from(
        { length: 120 },
        (_, i) => ({ step: i + 1, loss: 2 - i / 100, accuracy: i / 120 }),
      );
      const heldOut = [{ step: 60, accuracy: 0.4 }, { step: 120, accuracy: 0.8 }];
      await page.setContent(
        renderReport({ title: "train", facts: [], steps, heldOut, spans: overlapRun.spans }),
      );
      assert.deepEqual(collisions(await textBoxes(page)), [], "text labels of the training report overlap");
      await page.setContent(html);
      const boxes = await textBoxes(page);
      assert.deepEqual(collisions(boxes), [], "text labels overlap");
      const screenshot = await page.screenshot({ fullPage: true });
      // Decoded by the browser itself, so the test needs no PNG library.
      const decoder = await browser.newPage();
      const { width, data } = await decoder.evaluate(`(async () => {
        const image = new Image();
        image.src = "data:image/png;base64,${screenshot.toString("base64")}";
        await image.decode();
        const canvas = document.createElement("canvas");
        canvas.width = image.width, canvas.height = image.height;
        const context = canvas.getContext("2d");
        context.drawImage(image, 0, 0);
        return { width: image.width, data: [...context.getImageData(0, 0, image.width, image.height).data] };
      })()`) as { width: number; data: number[] };
      /** x of the pixels of `colour` in the rows of the lane labelled `label` of block `block`. */
      const columns = (block: string, label: string, colour: string) => {
        const title = boxes.find((b) => b.text.startsWith(`${block}:`))!;
        const row = boxes.find((b) => b.text === label && b.top > title.bottom)!;
        const [r, g, b] = hex(colour), xs = new Set<number>();
        for (let y = Math.ceil(row.top); y < row.bottom; y++) {
          for (let x = 0; x < width; x++) {
            const i = 4 * (y * width + x);
            if (Math.abs(data[i] - r) + Math.abs(data[i + 1] - g) + Math.abs(data[i + 2] - b) <= 6) xs.add(x);
          }
        }
        return xs;
      };
      const fc = laneColour("backward fc"),
        conv = laneColour("backward conv"),
        update = laneColour("update fc");
      for (const block of ["sequential", "overlap"]) {
        assert.ok(columns(block, "device 0 compute", fc).size > 0, `${block}: no backward fc pixels`);
        assert.ok(columns(block, "device 0 compute", conv).size > 0, `${block}: no backward conv pixels`);
      }
      assert.equal(
        [...columns("overlap", "device 0 compute", fc)].filter((x) =>
          columns("overlap", "device 0 compute", conv).has(x)
        ).length,
        0,
        "fc and conv backward pixels are not told apart",
      );
      const under = (block: string) => {
        const convXs = columns(block, "device 0 compute", conv);
        return [...columns(block, "device 0 communication", update)].filter((x) => convXs.has(x)).length;
      };
      assert.ok(columns("overlap", "device 0 communication", update).size > 0, "no update fc pixels");
      assert.ok(under("overlap") > 0, "update fc overlaps backward conv in the overlap block");
      assert.equal(under("sequential"), 0, "update fc runs after backward conv in the sequential block");
      const end = (block: string) =>
        Math.max(...columns(block, "device 0 communication", laneColour("broadcast conv")));
      assert.ok(end("overlap") < end("sequential") - 50, "the overlap block ends before the sequential one");
    } finally {
      await browser.close();
    }
  },
});
