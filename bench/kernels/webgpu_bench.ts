/**
 * The WebGPU backend on whatever adapter is present, side by side with the CPU backend in the same
 * run: GEMM (including the read-back that makes the GPU finish) and a cifar10_quick training step at
 * batch 64. On this machine the adapter is Mesa's llvmpipe, software on the same two cores, so the
 * figures prove the path works rather than GPU speed.
 *
 * @module
 */

import { createWebGpuBackend } from "../../backends/webgpu/backend.ts";
import { cifarQuick, ops, randn, registerBackend, setBackend, SGD, tensor, trainStep } from "../../mod.ts";
import { uniformValues } from "../../engine/mod.ts";

const gpu = await createWebGpuBackend();
if (gpu) registerBackend(gpu);
else console.log("webgpu: no adapter, benchmarking the CPU backend only");
const backends = gpu ? ["cpu", "webgpu"] : ["cpu"];

function on<T>(backend: string, fn: () => T): T {
  setBackend(backend);
  try {
    return fn();
  } finally {
    setBackend("cpu");
  }
}

for (const n of [256, 512, 1024]) {
  for (const backend of backends) {
    const [a, b] = on(backend, () => [randn([n, n], { seed: 1 }), randn([n, n], { seed: 2 })]);
    Deno.bench(
      { name: `GEMM ${n}³ ${backend}`, group: `gemm ${n}`, n: n >= 1024 ? 3 : 10, warmup: 1 },
      async () => {
        const c = on(backend, () => ops.matmul(a, b));
        await c.data();
        c.dispose();
      },
    );
  }
}

for (const backend of backends) {
  const step = on(backend, () => {
    const model = cifarQuick({ seed: 0 });
    const optimizer = new SGD(model.namedParameters(), { lr: 0.001, momentum: 0.9 });
    const images = randn([64, 3, 32, 32], { seed: 3 });
    const labels = tensor(Int32Array.from(uniformValues(64, { seed: 4 }), (u) => Math.floor(u * 10)), {
      dtype: "int32",
    });
    return () => trainStep(model, optimizer, { images, labels });
  });
  Deno.bench(
    { name: `cifar10_quick training step, batch 64, ${backend}`, group: "train", n: 3, warmup: 1 },
    async () => {
      setBackend(backend);
      try {
        await step();
      } finally {
        setBackend("cpu");
      }
    },
  );
}
