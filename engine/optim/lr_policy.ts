/**
 * Learning-rate policies with Caffe's definitions (`lr_policy` in `solver.prototxt`), plus cosine
 * annealing with linear warmup.
 *
 * A policy is plain JSON-able data so it can travel in checkpoint metadata and be restored exactly;
 * {@link learningRate} is a pure function of (policy, iteration), so the rate of iteration `i` never
 * depends on how training got there (resumed or not, one device or several).
 *
 * @module
 */

import { ValueError } from "../errors.ts";

/**
 * A learning-rate policy. `baseLr` is Caffe's `base_lr`; iteration numbers count finished training
 * iterations from 0 (the first update uses iteration 0, as in Caffe's `Solver::Step`).
 *
 * - `fixed`: `baseLr`.
 * - `step`: `baseLr · gamma^floor(iter / stepSize)`.
 * - `multistep`: `baseLr · gamma^k`, k = how many of the ascending `stepValues` are ≤ iter.
 * - `exp`: `baseLr · gamma^iter`.
 * - `inv`: `baseLr · (1 + gamma · iter)^(−power)`.
 * - `poly`: `baseLr · (1 − iter / maxIter)^power`, and 0 from `maxIter` on (Caffe never goes past
 *   `max_iter`; clamping keeps the rate defined instead of NaN for a fractional power).
 * - `sigmoid`: `baseLr / (1 + exp(−gamma · (iter − stepSize)))`.
 * - `cosine`: linear warmup `baseLr · (iter + 1) / warmupIters` for `iter < warmupIters` (the first
 *   iteration already learns), then `minLr + (baseLr − minLr) · (1 + cos(π · p)) / 2` with
 *   `p = (iter − warmupIters) / (maxIter − warmupIters)` clamped to [0, 1].
 *
 * @example
 * ```ts
 * import type { LrPolicy } from "./lr_policy.ts";
 * const alexnet: LrPolicy = { policy: "step", baseLr: 0.01, gamma: 0.1, stepSize: 100_000 };
 * ```
 */
export type LrPolicy =
  | { policy: "fixed"; baseLr: number }
  | { policy: "step"; baseLr: number; gamma: number; stepSize: number }
  | { policy: "multistep"; baseLr: number; gamma: number; stepValues: readonly number[] }
  | { policy: "exp"; baseLr: number; gamma: number }
  | { policy: "inv"; baseLr: number; gamma: number; power: number }
  | { policy: "poly"; baseLr: number; power: number; maxIter: number }
  | { policy: "sigmoid"; baseLr: number; gamma: number; stepSize: number }
  | { policy: "cosine"; baseLr: number; maxIter: number; minLr?: number; warmupIters?: number };

/** The policy names {@link LrPolicy} accepts. */
const POLICIES = ["fixed", "step", "multistep", "exp", "inv", "poly", "sigmoid", "cosine"];

function finite(where: string, name: string, value: unknown): void {
  if (typeof value !== "number" || !Number.isFinite(value)) {
    throw new ValueError(where, `${name} must be a finite number, got ${String(value)}`);
  }
}

function positiveInteger(where: string, name: string, value: unknown): void {
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value <= 0) {
    throw new ValueError(where, `${name} must be a positive integer, got ${String(value)}`);
  }
}

/**
 * Throws a `ValueError` naming the field if `policy` is malformed (unknown name, missing or
 * non-finite fields, negative `baseLr`, unsorted `stepValues`, warmup beyond `maxIter`).
 *
 * @example
 * ```ts
 * import { checkLrPolicy } from "./lr_policy.ts";
 * checkLrPolicy({ policy: "poly", baseLr: 0.01, power: 0.5, maxIter: 1000 }); // fine
 * ```
 */
export function checkLrPolicy(policy: LrPolicy): void {
  const where = "lr policy";
  if (policy === null || typeof policy !== "object" || !POLICIES.includes(policy.policy)) {
    const got = policy !== null && typeof policy === "object" ? policy.policy : policy;
    throw new ValueError(where, `unknown policy ${JSON.stringify(got)}; known: ${POLICIES.join(", ")}`);
  }
  const w = `lr policy "${policy.policy}"`;
  finite(w, "baseLr", policy.baseLr);
  if (policy.baseLr < 0) throw new ValueError(w, `baseLr must be ≥ 0, got ${policy.baseLr}`);
  switch (policy.policy) {
    case "fixed":
      return;
    case "step":
    case "sigmoid":
      finite(w, "gamma", policy.gamma);
      if (policy.policy === "step") positiveInteger(w, "stepSize", policy.stepSize);
      else finite(w, "stepSize", policy.stepSize);
      return;
    case "multistep": {
      finite(w, "gamma", policy.gamma);
      if (!Array.isArray(policy.stepValues)) throw new ValueError(w, "stepValues must be an array");
      let previous = -1;
      for (const value of policy.stepValues) {
        if (!Number.isSafeInteger(value) || value <= previous) {
          throw new ValueError(
            w,
            `stepValues must be strictly increasing non-negative integers, got [${policy.stepValues}]`,
          );
        }
        previous = value;
      }
      return;
    }
    case "exp":
      finite(w, "gamma", policy.gamma);
      return;
    case "inv":
      finite(w, "gamma", policy.gamma);
      finite(w, "power", policy.power);
      return;
    case "poly":
      finite(w, "power", policy.power);
      positiveInteger(w, "maxIter", policy.maxIter);
      return;
    case "cosine": {
      positiveInteger(w, "maxIter", policy.maxIter);
      if (policy.minLr !== undefined) finite(w, "minLr", policy.minLr);
      const warmup = policy.warmupIters ?? 0;
      if (!Number.isSafeInteger(warmup) || warmup < 0 || warmup >= policy.maxIter) {
        throw new ValueError(w, `warmupIters must be an integer in [0, maxIter), got ${warmup}`);
      }
      return;
    }
  }
}

/**
 * The learning rate of `policy` at training iteration `iteration` (0-based), computed in float64.
 *
 * @example
 * ```ts
 * import { learningRate } from "./lr_policy.ts";
 * const policy = { policy: "step", baseLr: 0.01, gamma: 0.1, stepSize: 100 } as const;
 * console.log(learningRate(policy, 0), learningRate(policy, 250)); // 0.01 0.0001 (up to rounding)
 * ```
 */
export function learningRate(policy: LrPolicy, iteration: number): number {
  checkLrPolicy(policy);
  if (!Number.isSafeInteger(iteration) || iteration < 0) {
    throw new ValueError("learningRate", `iteration must be a non-negative integer, got ${iteration}`);
  }
  const base = policy.baseLr;
  switch (policy.policy) {
    case "fixed":
      return base;
    case "step":
      return base * Math.pow(policy.gamma, Math.floor(iteration / policy.stepSize));
    case "multistep": {
      let passed = 0;
      while (passed < policy.stepValues.length && iteration >= policy.stepValues[passed]) passed++;
      return base * Math.pow(policy.gamma, passed);
    }
    case "exp":
      return base * Math.pow(policy.gamma, iteration);
    case "inv":
      return base * Math.pow(1 + policy.gamma * iteration, -policy.power);
    case "poly":
      if (iteration >= policy.maxIter) return 0;
      return base * Math.pow(1 - iteration / policy.maxIter, policy.power);
    case "sigmoid":
      return base * (1 / (1 + Math.exp(-policy.gamma * (iteration - policy.stepSize))));
    case "cosine": {
      const warmup = policy.warmupIters ?? 0;
      if (iteration < warmup) return (base * (iteration + 1)) / warmup;
      const minLr = policy.minLr ?? 0;
      const progress = Math.min(1, (iteration - warmup) / (policy.maxIter - warmup));
      return minLr + ((base - minLr) * (1 + Math.cos(Math.PI * progress))) / 2;
    }
  }
}
