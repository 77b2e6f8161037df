/**
 * Fused optimizer updates for the CPU backend: one pass over memory instead of the five or six
 * temporary tensors the composed elementwise ops need. Every product and sum is rounded to float32
 * with `Math.fround`, exactly where the composed ops would store a float32 result, so the fused and
 * composed updates agree bit for bit.
 *
 * @module
 */

import type { AdamStep, SgdStep } from "../backend.ts";

const f = Math.fround;

/**
 * Caffe SGD in place: `diff = g + w·decay; h = h·momentum + diff·rate; w = w − h`; with `saved`, each
 * w and h it overwrites is written there first. Returns whether every new w is finite.
 */
export function sgdUpdateKernel(
  param: Float32Array,
  grad: Float32Array,
  history: Float32Array,
  { rate, momentum, decay }: SgdStep,
  saved?: { param: Float32Array; history: Float32Array },
): boolean {
  const r = f(rate), m = f(momentum), d = f(decay);
  let finite = true;
  for (let i = 0; i < param.length; i++) {
    const w = param[i], before = history[i];
    if (saved) {
      saved.param[i] = w;
      saved.history[i] = before;
    }
    const diff = d !== 0 ? f(grad[i] + f(w * d)) : grad[i];
    const h = f(f(before * m) + f(diff * r));
    history[i] = h;
    const updated = f(w - h);
    param[i] = updated;
    if (!Number.isFinite(updated)) finite = false;
  }
  return finite;
}

/** Adam in place, in the operation order of the composed update (PyTorch's single-tensor Adam). */
export function adamUpdateKernel(
  param: Float32Array,
  grad: Float32Array,
  m: Float32Array,
  v: Float32Array,
  { rate, beta1, beta2, eps, decay, correction1, correction2 }: AdamStep,
): void {
  const b1 = f(beta1), b2 = f(beta2), d = f(decay), e = f(eps);
  const oneMinusB1 = f(1 - beta1), oneMinusB2 = f(1 - beta2);
  const root2 = f(Math.sqrt(correction2)), step = f(rate / correction1);
  for (let i = 0; i < param.length; i++) {
    const w = param[i];
    const g = d !== 0 ? f(grad[i] + f(w * d)) : grad[i];
    const mi = f(f(m[i] * b1) + f(g * oneMinusB1));
    const vi = f(f(v[i] * b2) + f(f(g * g) * oneMinusB2));
    m[i] = mi;
    v[i] = vi;
    const denominator = f(f(f(Math.sqrt(vi)) / root2) + e);
    param[i] = w - f(f(mi / denominator) * step);
  }
}
