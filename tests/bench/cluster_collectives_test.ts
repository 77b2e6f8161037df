/**
 * `collectiveTimes` (`bench/cluster/rank.ts`) splits a hybrid step's time at its activation
 * collectives into the collectives' own (from the last rank's entry to the first rank's exit) and
 * the ranks' arrivals apart. Mutations tried, each failing this test: measuring the meeting from the
 * first rank's entry (meeting 5 instead of 1 in the first case), and summing rank 0's spans alone
 * (arrival 0).
 */
import assert from "node:assert/strict";
import { collectiveTimes } from "../../bench/cluster/rank.ts";
import type { TraceSpan } from "../../schedule/runtime/mod.ts";

const span = (device: number, name: string, start: number, end: number, lane = "comm"): TraceSpan =>
  ({ step: 4, device, lane, name, start, end }) as TraceSpan;

Deno.test("bench:cluster collectiveTimes: the collectives' own time and the ranks' arrivals apart", () => {
  // Rank 1 enters the gather 4 ms after rank 0, both leave within 0.5 ms; the scatter meets at once.
  const spans = [
    span(0, "gather fc6 input", 10, 15),
    span(1, "gather fc6 input", 14, 15.5),
    span(0, "scatter fc6 input gradients", 20, 20.25),
    span(1, "scatter fc6 input gradients", 20, 20.5),
    // Neither compute nor the data-parallel exchange is a meeting.
    span(0, "forward fc6", 15.5, 19, "compute"),
    span(1, "forward fc6", 15.6, 19, "compute"),
    span(0, "reduce conv", 30, 40),
    span(1, "reduce conv", 31, 40),
  ];
  assert.deepEqual(collectiveTimes(spans), { meetingMs: 1 + 0.25, arrivalMs: 4 });
});

Deno.test("bench:cluster collectiveTimes: a step without collectives, or one rank's alone, gives zeros", () => {
  assert.deepEqual(collectiveTimes([span(0, "forward", 0, 5, "compute")]), { meetingMs: 0, arrivalMs: 0 });
  assert.deepEqual(collectiveTimes([span(0, "gather fc6 input", 0, 5)]), { meetingMs: 0, arrivalMs: 0 });
});
