import assert from "node:assert/strict";
import { lavapipeInstalled } from "../../fixtures/webgpu_driver.ts";
import { moduleWebGpu } from "../../fixtures/webgpu.ts";

// After the fixture: "vulkan" (its choice, or the environment's), or a backend the environment named.
const backend = Deno.env.get("DENO_WEBGPU_BACKEND");
const lavapipe = lavapipeInstalled();
const checked = lavapipe && (backend === undefined || backend === "vulkan");
if (!lavapipe) {
  console.log("webgpu driver: lavapipe (mesa-vulkan-drivers) not installed; WebGPU keeps wgpu's default");
} else if (!checked) console.log(`webgpu driver: DENO_WEBGPU_BACKEND=${backend} set by the environment`);
const gpu = checked ? await moduleWebGpu({ name: "webgpu:driver" }) : null;

// Mutation tried: without the fixture's `Deno.env.set`, the adapter request opens libEGL (this
// process's maps list libEGL.so.1 and libEGL_mesa.so.0) and the test fails naming them.
Deno.test({
  name: "webgpu: where lavapipe is installed, the tests' WebGPU runs on Vulkan alone and never opens EGL",
  ignore: !checked, // lavapipeInstalled() is false off Linux, where /proc/self/maps is absent
  fn: () => {
    assert.ok(gpu, "lavapipe is installed, yet WebGPU found no adapter on Vulkan");
    const maps = Deno.readTextFileSync("/proc/self/maps").split("\n");
    const egl = [...new Set(maps.filter((l) => /libEGL/.test(l)).map((l) => l.split(/\s+/).at(-1)))];
    assert.deepEqual(
      egl,
      [],
      `this test process opened EGL (${egl.join(", ")}), whose teardown can crash it at exit`,
    );
    assert.ok(maps.some((l) => /libvulkan/.test(l)), "no Vulkan library in this process");
    assert.equal(Deno.env.get("DENO_WEBGPU_BACKEND"), "vulkan");
  },
});
