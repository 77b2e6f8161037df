/**
 * End-to-end browser test: bundles the library, serves examples/browser, trains the AlexNet-like
 * default in headless Chromium (WebGPU through SwiftShader, or the CPU fallback) and checks the
 * loss fell. Skipped with a message when Chromium or playwright-core is not installed.
 *
 * @module
 */

import assert from "node:assert/strict";
import { bundle } from "../examples/browser/build.ts";

import { runSlowTests } from "./fixtures/slow.ts";

const CHROMIUM = "/usr/bin/chromium";
/** Training steps the page runs; overridable to probe a slow adapter. */
const STEPS = Number(Deno.env.get("TANDEM_BROWSER_STEPS") ?? 30);
const TIMEOUT_MS = 240_000;
const PAGE_DIR = new URL("../examples/browser/", import.meta.url);

async function exists(path: string | URL): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch {
    return false;
  }
}

const CONTENT_TYPES: Record<string, string> = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".map": "application/json",
};

/** Serves files under PAGE_DIR; a few lines instead of a std/http dependency the repo does not pin. */
async function serveFile(request: Request): Promise<Response> {
  const path = new URL(request.url).pathname;
  if (path.includes("..")) return new Response("bad path", { status: 400 });
  const file = new URL(`.${path === "/" ? "/index.html" : path}`, PAGE_DIR);
  try {
    const body = await Deno.readFile(file);
    const type = CONTENT_TYPES[path.slice(path.lastIndexOf("."))] ?? "application/octet-stream";
    return new Response(body, { headers: { "content-type": type } });
  } catch {
    return new Response("not found", { status: 404 });
  }
}

type Playwright = typeof import("playwright-core");

/** playwright-core is an optional dev dependency, so a missing package means skip, not fail. */
async function loadPlaywright(): Promise<Playwright | string> {
  if (!await exists(new URL("../node_modules/playwright-core/package.json", import.meta.url))) {
    return "playwright-core is not installed in node_modules";
  }
  try {
    return await import("playwright-core");
  } catch (error) {
    return `playwright-core failed to load: ${(error as Error).message}`;
  }
}

const playwright = await loadPlaywright();
const skipReason = typeof playwright === "string"
  ? playwright
  : !await exists(CHROMIUM)
  ? `${CHROMIUM} is missing (apt-get install -y chromium)`
  : null;
if (skipReason) console.warn(`SKIP tests/browser_test.ts: ${skipReason}`);

interface Progress {
  steps: number;
  totalSteps: number;
  losses: number[];
  backend: string;
  fallbackReason: string | null;
  imagesPerSecond: number;
  done: boolean;
  error: string | null;
}

const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;

Deno.test({
  name: "browser: the bundled page trains alexnet-like on WebGPU and the loss falls",
  // Slow (the suite's longest test, Chromium training for about 2 minutes on 2 cores): runs with the
  // slow tests (`deno task test:all`, .ci/run). The default set type-checks the page and the library it
  // bundles (`deno task check`) and runs the engine's WebGPU parity and WebGPU training tests.
  ignore: !runSlowTests || skipReason !== null,
  // Chromium's and the server's resources outlive single awaits; both are closed in finally blocks.
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const { chromium } = playwright as Playwright;
    const { outputs } = await bundle();
    assert.ok(outputs.some((o) => o.path.endsWith("main.js")), "bundle wrote no main.js");

    const server = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen: () => {} }, serveFile);
    const userDataDir = await Deno.makeTempDir({ prefix: "tandem-chromium-" });
    try {
      const context = await chromium.launchPersistentContext(userDataDir, {
        executablePath: CHROMIUM,
        headless: true,
        args: [
          "--headless",
          "--no-sandbox",
          "--enable-unsafe-webgpu",
          "--disable-quic",
          "--no-first-run",
          "--disable-background-networking",
          "--disable-component-update",
          "--disable-sync",
        ],
      });
      try {
        const page = context.pages()[0] ?? await context.newPage();
        const pageErrors: string[] = [];
        page.on("pageerror", (error) => pageErrors.push(error.message));
        page.on("console", (message) => {
          if (message.type() === "error") pageErrors.push(message.text());
        });
        const started = performance.now();
        await page.goto(`http://127.0.0.1:${server.addr.port}/index.html?steps=${STEPS}`);
        // The library bundle alone must also import cleanly in a browser (no Deno-only code at load).
        const exported = await page.evaluate(async () => {
          const url = "./dist/tandem.js";
          const mod = await import(url);
          return ["alexnetLike", "createWebGpuBackend", "trainStep", "setBackend"].filter((k) =>
            typeof mod[k] === "function"
          ).length;
        });
        assert.deepEqual(exported, 4, "dist/tandem.js lacks expected exports");
        const read = () =>
          page.evaluate(() => (globalThis as unknown as { tandemProgress?: Progress }).tandemProgress);
        const deadline = started + TIMEOUT_MS;
        let progress = await read();
        while (!progress?.done && performance.now() < deadline) {
          await new Promise((resolve) => setTimeout(resolve, 250));
          progress = await read();
        }
        // A timeout says how far training got, which tells a slow adapter from a hung one.
        assert.ok(
          progress?.done,
          `training did not finish in ${TIMEOUT_MS / 1000} s: ${progress?.steps ?? 0} of ${
            progress?.totalSteps ?? "?"
          } steps on ${progress?.backend ?? "?"}, ${progress?.imagesPerSecond.toFixed(1) ?? 0} images/s`,
        );
        const seconds = (performance.now() - started) / 1000;
        assert.deepEqual(progress.error, null, `training failed in the page: ${progress.error}`);
        assert.deepEqual(pageErrors, [], "the page logged errors");
        assert.deepEqual(progress.steps, progress.totalSteps);
        if (progress.backend === "webgpu") {
          console.log(`browser trained on webgpu`);
        } else {
          // SwiftShader normally gives headless Chromium an adapter; say loudly when it did not.
          assert.deepEqual(progress.backend, "cpu");
          console.warn(`browser had no WebGPU, the CPU fallback ran: ${progress.fallbackReason}`);
        }
        const first = mean(progress.losses.slice(0, 5)), last = mean(progress.losses.slice(-5));
        console.log(
          `${progress.steps} steps in ${seconds.toFixed(1)} s, ${
            progress.imagesPerSecond.toFixed(1)
          } images/s, ` +
            `loss ${first.toFixed(3)} → ${last.toFixed(3)}`,
        );
        assert.ok(last < 0.8 * first, `loss did not fall: first 5 mean ${first}, last 5 mean ${last}`);
      } finally {
        await context.close();
      }
    } finally {
      await server.shutdown();
      await Deno.remove(userDataDir, { recursive: true }).catch(() => {});
    }
  },
});
