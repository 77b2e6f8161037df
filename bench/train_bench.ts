/**
 * Training throughput on one CPU device: one SGD step (forward, backward, update) of cifar10_quick
 * and of the AlexNet-like default at batch 64, on the default CPU backend (WebAssembly SIMD kernels,
 * one thread per core) and, for cifar10_quick, on the pure-TypeScript kernels. Prints images/s;
 * `deno bench` reports the step time.
 *
 * For the same step on TensorFlow.js's pure-JS CPU and WebAssembly backends, measured beside
 * Tandem's in one run, see section 2 of `bench/RESULTS.md` (`npx deno task bench:report`).
 *
 * @module
 */

import { CpuBackend } from "../backends/cpu/backend.ts";
import {
  alexnetLike,
  cifarQuick,
  type Network,
  randn,
  registerBackend,
  setBackend,
  SGD,
  tensor,
  trainStep,
} from "../mod.ts";
import { uniformValues } from "../engine/mod.ts";

const BATCH = 64;

function setup(model: Network) {
  const images = randn([BATCH, ...model.inputShape], { seed: 1 });
  const labels = tensor(
    Int32Array.from(uniformValues(BATCH, { seed: 2 }), (u) => Math.floor(u * model.classes)),
    {
      dtype: "int32",
    },
  );
  const optimizer = new SGD(model.namedParameters(), { lr: 0.001, momentum: 0.9, weightDecay: 5e-4 });
  return () => trainStep(model, optimizer, { images, labels });
}

/** The TypeScript kernels under their own name, to build a model on them beside the default. */
registerBackend(new CpuBackend({ name: "cpu-typescript", kernels: "ts" }));

/** A step built and run with `name` as the current backend (new tensors inside the step land there). */
function onBackend(name: string, model: () => Network): () => Promise<unknown> {
  setBackend(name);
  let step: () => Promise<unknown>;
  try {
    step = setup(model());
  } finally {
    setBackend("cpu");
  }
  return async () => {
    setBackend(name);
    try {
      return await step();
    } finally {
      setBackend("cpu");
    }
  };
}

const cases = [
  { name: "cifar10_quick training step, batch 64", step: setup(cifarQuick()) },
  { name: "AlexNet-like default training step, batch 64", step: setup(alexnetLike()) },
  {
    name: "cifar10_quick training step, batch 64, TypeScript kernels",
    step: onBackend("cpu-typescript", () => cifarQuick()),
  },
];

for (const { name, step } of cases) {
  Deno.bench({ name, group: "train", n: 5, warmup: 1 }, async () => {
    await step();
  });
}

if (import.meta.main || Deno.args.includes("--report")) {
  for (const { name, step } of cases) {
    await step();
    const t0 = performance.now();
    for (let i = 0; i < 3; i++) await step();
    const seconds = (performance.now() - t0) / 3000;
    console.log(`${name}: ${(seconds * 1000).toFixed(0)} ms, ${(BATCH / seconds).toFixed(0)} images/s`);
  }
}
