/**
 * The WebAssembly peak probe (`backends/cpu/wasm/peak.ts`): its generated modules validate, the
 * flops it counts are the flops it runs (checked exactly, not by timing: with x = y = 1 each lane
 * counts its own steps), and the measurement returns plausible positive figures, cached.
 */

import assert from "node:assert/strict";
import { detectWasmFeatures } from "../../../backends/cpu/wasm/features.ts";
import {
  measureWasmPeak,
  PEAK_PROBE_EXPORT,
  PEAK_PROBE_SHAPE,
  peakProbeBytes,
  type PeakProbeShape,
  probeFlops,
} from "../../../backends/cpu/wasm/peak.ts";

const features = detectWasmFeatures();
const fmaVariants = features.relaxedSimd ? [false, true] : [false];

Deno.test("peak probe: every variant's module validates", () => {
  for (const fma of [false, true]) {
    // The relaxed-SIMD variant only validates where relaxed SIMD is detected.
    const expected = fma ? features.relaxedSimd : features.simd128;
    for (const [chains, unroll] of [[1, 1], [3, 2], [PEAK_PROBE_SHAPE.chains, PEAK_PROBE_SHAPE.unroll]]) {
      assert.equal(
        WebAssembly.validate(peakProbeBytes({ chains, unroll, fma })),
        expected,
        `${chains}/${unroll}/${fma}`,
      );
    }
  }
  assert.throws(() => peakProbeBytes({ chains: 0, unroll: 1, fma: false }), RangeError);
});

// Mutations tried, each fails this test: probeFlops counting 4 flops per f32x4 multiply-add instead
// of 8 (every case off by 2×), leaving `unroll` out of probeFlops (the unroll-4 cases off by 4×),
// and the generator emitting one pass per trip whatever `unroll` says (the unroll > 1 cases).
Deno.test("peak probe: probeFlops counts exactly the multiply-adds the module runs", () => {
  if (!features.simd128) return;
  for (const fma of fmaVariants) {
    for (
      const [chains, unroll] of [[1, 1], [3, 2], [PEAK_PROBE_SHAPE.chains, PEAK_PROBE_SHAPE.unroll], [12, 1]]
    ) {
      const shape: PeakProbeShape = { chains, unroll, fma };
      const probe = new WebAssembly.Instance(new WebAssembly.Module(peakProbeBytes(shape)))
        .exports[PEAK_PROBE_EXPORT] as (trips: number, x: number, y: number) => number;
      for (const trips of [0, 1, 7, 1000]) {
        // acc = acc·1 + 1 from 0: each lane ends at unroll × trips, exactly (well below 2^24), and
        // each lane step is one multiply and one add: 2 flops.
        const lanes = probe(trips, 1, 1);
        assert.equal(
          2 * lanes,
          probeFlops(shape, trips),
          `${chains} chains, unroll ${unroll}, fma ${fma}, ${trips} trips`,
        );
      }
      // The chains really run acc·x + y: with x = 0.5 and y = 1 every lane tends to 2.
      assert.ok(Math.abs(probe(100, 0.5, 1) - 2 * 4 * chains) < 1e-3);
    }
  }
});

Deno.test("peak probe: measureWasmPeak returns plausible positive figures, once per process", async () => {
  if (!features.simd128) {
    await assert.rejects(measureWasmPeak(), /SIMD128/);
    return;
  }
  const first = measureWasmPeak();
  assert.equal(measureWasmPeak(), first, "cached: the same promise");
  const peak = await first;
  // A rate, not a speed bound: how fast it is depends on the machine and its load.
  assert.ok(peak.perCore > 0 && Number.isFinite(peak.perCore), `perCore ${peak.perCore}`);
  assert.ok(peak.allCores > 0 && Number.isFinite(peak.allCores), `allCores ${peak.allCores}`);
  assert.equal(peak.threads, Math.max(1, navigator.hardwareConcurrency));
  assert.equal(peak.fma, features.relaxedSimd);
});
