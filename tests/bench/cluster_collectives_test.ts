/**
 * `collectiveTimes` (`bench/cluster/rank.ts`) splits a hybrid step's time at its activation
 * collectives into the last rank to enter's time inside them (the shortest span) and how much longer
 * the first rank spent (the longest less the shortest), from each rank's spans on its own clock.
 * Also the cost of the ranks being late by turns between collectives. Mutations tried, each failing
 * these tests: taking the longest span as the last rank's (5.5 instead of 1.75 in the first case),
 * reading rank 0's spans alone (zeros), and measuring a stretch from the previous collective's start
 * instead of its end (3 ms of turns instead of 2 in the last case).
 */
import assert from "node:assert/strict";
import { collectiveTimes } from "../../bench/cluster/rank.ts";
import type { TraceSpan } from "../../schedule/runtime/mod.ts";

const span = (device: number, name: string, start: number, end: number, lane = "comm"): TraceSpan =>
  ({ step: 4, device, lane, name, start, end }) as TraceSpan;

Deno.test("bench:cluster collectiveTimes: the last rank in's time in the collectives and how much longer the first one's was", () => {
  // Rank 1 enters the gather 3.5 ms after rank 0 and spends 1.5 ms in it, rank 0 3.5 ms more; rank 1's
  // clock runs 100 ms ahead of rank 0's, which changes nothing. The scatter's spans differ by 0.25 ms.
  const spans = [
    span(0, "gather fc6 input", 10, 15),
    span(1, "gather fc6 input", 113.5, 115),
    span(0, "scatter fc6 input gradients", 20, 20.25),
    span(1, "scatter fc6 input gradients", 120, 120.5),
    // Neither compute nor the data-parallel exchange is an activation collective.
    span(0, "forward fc6", 15.5, 19, "compute"),
    span(1, "forward fc6", 115.6, 119, "compute"),
    span(0, "reduce conv", 30, 40),
    span(1, "reduce conv", 131, 140),
  ];
  // Each rank takes as long before each collective as the other (0 and 5 ms): no cost of turns.
  assert.deepEqual(collectiveTimes(spans), { lastInMs: 1.5 + 0.25, waitMs: 3.5 + 0.25, turnsMs: 0 });
});

Deno.test("bench:cluster collectiveTimes: a step without collectives, or one rank's alone, gives zeros", () => {
  const none = { lastInMs: 0, waitMs: 0, turnsMs: 0 };
  assert.deepEqual(collectiveTimes([span(0, "forward", 0, 5, "compute")]), none);
  assert.deepEqual(collectiveTimes([span(0, "gather fc6 input", 0, 5)]), none);
});

Deno.test("bench:cluster collectiveTimes: ranks late by turns cost the longer stretch before each collective", () => {
  // Before gather A rank 1 takes 8 ms to rank 0's 5; before gather B rank 0 takes 3 to rank 1's 1.
  // The step waits 8 + 3 = 11 ms where the slower rank's own stretches sum to 9: 2 ms of turns.
  const spans = [
    span(0, "forward", 0, 5, "compute"),
    span(0, "gather A", 5, 9),
    span(0, "forward fc6", 9, 12, "compute"),
    span(0, "gather B", 12, 12.5),
    span(1, "forward", 0, 8, "compute"),
    span(1, "gather A", 8, 9),
    span(1, "forward fc6", 9, 10, "compute"),
    span(1, "gather B", 10, 12.5),
  ];
  assert.deepEqual(collectiveTimes(spans), { lastInMs: 1 + 0.5, waitMs: 3 + 2, turnsMs: 2 });
});
