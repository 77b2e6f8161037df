/**
 * Buffers past WebGPU's default 128 MiB binding limit (AlexNet's fc6 weights are 151 MB): the
 * backend asks the adapter for its real limits and binds no more than the device allows, so a fused
 * SGD step over 40 M parameters runs and matches the CPU backend. Skipped, visibly, without an adapter.
 */

import assert from "node:assert/strict";
import { CpuBackend } from "../../../backends/cpu/backend.ts";
import { moduleWebGpu } from "../../fixtures/webgpu.ts";
import { uniformValues } from "../../../engine/mod.ts";

const gpu = await moduleWebGpu({ name: "webgpu:large" });
if (!gpu) console.log("webgpu: no adapter, skipping the large-buffer test");

Deno.test({
  name: "webgpu: a 160 MB parameter is updated whole or refused with a clear error, never half-updated",
  ignore: gpu === null,
  fn: async () => {
    const n = 40_000_000;
    const limit = gpu!.device.limits.maxStorageBufferBindingSize;
    if (limit < n * 4) {
      // This adapter cannot bind 160 MB: the backend must say so instead of updating part of it.
      assert.throws(
        () => gpu!.allocate(n, "float32"),
        /160000000 bytes\) exceeds this device's maxStorageBufferBindingSize/,
      );
      console.log(`webgpu: this adapter binds at most ${limit} bytes; checked the clear error instead`);
      gpu!.device.destroy();
      return;
    }
    const param = uniformValues(n, { seed: 1 }, 0, -1, 1);
    const grad = uniformValues(n, { seed: 2 }, 0, -1, 1);
    const step = { rate: 0.01, momentum: 0.9, decay: 5e-4 };
    const cpu = new CpuBackend();
    const [cp, cg, ch] = [cpu.upload(param), cpu.upload(grad), cpu.allocate(n, "float32")];
    cpu.sgdUpdate(cp, cg, ch, step);
    const [gp, gg, gh] = [gpu!.upload(param), gpu!.upload(grad), gpu!.allocate(n, "float32")];
    gpu!.sgdUpdate(gp, gg, gh, step);
    const [expected, actual] = [cpu.readSync(cp), await gpu!.read(gp)];
    // The fused kernels round like the composed ops on both backends; only the last element and a
    // stride of samples are compared to keep the check cheap.
    for (let i = n - 1; i >= 0; i -= 99_991) assert.equal(actual[i], expected[i], `element ${i}`);
    for (const s of [gp, gg, gh]) gpu!.release(s);
    gpu!.device.destroy();
  },
});
