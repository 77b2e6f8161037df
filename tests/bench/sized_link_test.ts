/**
 * `bench:cluster` prices each row's link at the row's FC bytes, between the rates calibrated on the
 * probes around it. Mutations tried, each failing these tests: every size priced at the largest
 * probe's rate (the report's pricing before); interpolation linear in bytes instead of log bytes;
 * the probes taken in the order given rather than by size.
 */
import assert from "node:assert/strict";
import { rateAtSize } from "../../bench/cluster/sized_link.ts";

const close = (actual: number, expected: number) =>
  assert.ok(Math.abs(actual - expected) <= 1e-9 * expected, `${actual} is not ${expected}`);

Deno.test("cluster bench: a row's link rate is interpolated in log bytes and log rate between the probes around it", () => {
  // The probes out of size order, as a report could list them.
  const probes = [
    { bytes: 66.5e6, bytesPerSecond: 8e8 },
    { bytes: 4.2e6, bytesPerSecond: 3e8 },
    { bytes: 16.6e6, bytesPerSecond: 5e8 },
  ];
  for (const p of probes) close(rateAtSize(probes, p.bytes), p.bytesPerSecond);
  // Halfway between two probes in log bytes is their geometric mean.
  close(rateAtSize(probes, Math.sqrt(4.2e6 * 16.6e6)), Math.sqrt(3e8 * 5e8));
  close(rateAtSize(probes, Math.sqrt(16.6e6 * 66.5e6)), Math.sqrt(5e8 * 8e8));
  // A quarter of the way, in log bytes, from 16.6 to 66.5 MB.
  const quarter = 16.6e6 * (66.5e6 / 16.6e6) ** 0.25;
  close(rateAtSize(probes, quarter), 5e8 * (8e8 / 5e8) ** 0.25);
  // Beyond the probes: the nearest one's rate (a hybrid row's small activations, a larger net's FC).
  close(rateAtSize(probes, 0.7e6), 3e8);
  close(rateAtSize(probes, 0), 3e8);
  close(rateAtSize(probes, 240e6), 8e8);
  assert.throws(() => rateAtSize([], 1e6), RangeError);
});
