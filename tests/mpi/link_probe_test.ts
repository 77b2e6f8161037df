/**
 * The link probe's pure parts: how much it sends for a model's gradients, and the line `auto` prints.
 * The probe itself runs across 2 hosts in cluster_test.ts. Mutation tried: linkProbeBytes without
 * its upper clamp sent bvlc_alexnet's 244 MB (8 s both ways over 1 Gbit/s), and this test failed.
 */
import assert from "node:assert/strict";
import { describeMeasuredLink, LINK_PROBE_BYTES, linkProbeBytes } from "../../schedule/mpi/mod.ts";

Deno.test("link probe: the gradients' size, clamped to 1–32 MiB in whole floats", () => {
  assert.equal(linkProbeBytes(244e6), 32 << 20);
  assert.equal(linkProbeBytes(4_353_834), 4_353_832);
  assert.equal(linkProbeBytes(1000), 1 << 20);
  assert.deepEqual(LINK_PROBE_BYTES, { min: 1 << 20, max: 32 << 20 });
});

Deno.test("link probe: the line auto prints says both rates in Gbit/s, the latency and the cores", () => {
  assert.equal(
    describeMeasuredLink(2, 116e6, 119e6, 80e-6, 0.3),
    "the link measured between the 2 ranks: 0.93 Gbit/s per direction both ways, 0.95 one way, 80 µs; " +
      "transfers kept 30% of the cores busy",
  );
  // Without /proc/stat there is no share to state.
  assert.equal(
    describeMeasuredLink(4, 1.25e9, 1.25e9, 12e-6, undefined),
    "the link measured between the 4 ranks: 10.00 Gbit/s per direction both ways, 10.00 one way, 12 µs",
  );
});
