/**
 * The peers a user would pick instead of Tandem: TensorFlow.js 4.22.0 on its pure-JS CPU backend and
 * on its WebAssembly backend (XNNPACK, SIMD, one thread: tfjs-wasm in Deno has no threads), loaded
 * from `node_modules` (devDependencies `@tensorflow/tfjs-core`, `-backend-cpu`, `-backend-wasm`).
 *
 * tfjs-wasm as shipped cannot train a CNN (`Conv2DBackpropFilter` is not registered), so
 * {@link conv2dForwardGrads} wraps each convolution in `tf.customGrad` and computes both
 * gradients as forward convolutions: the weight gradient as a conv of the input with dy (batch and
 * channels swapped), the input gradient as a conv of dy with the flipped, channel-swapped weights.
 *
 * @module
 */

import * as tf from "@tensorflow/tfjs-core";
// The tfjs-core bundle has no gradient definitions; the umbrella package registers them.
import "@tensorflow/tfjs";
import "@tensorflow/tfjs-backend-cpu";
import { setWasmPaths } from "@tensorflow/tfjs-backend-wasm";

export { tf };

/** The tfjs version actually loaded. */
export const TFJS_VERSION: string = tf.version_core;

export type PeerBackend = "cpu" | "wasm";

let wasmReady = false;

/** Switches tfjs to `backend`; the first switch to wasm loads the SIMD build, single-threaded. */
export async function useBackend(backend: PeerBackend): Promise<void> {
  if (backend === "wasm" && !wasmReady) {
    setWasmPaths(new URL("../../node_modules/@tensorflow/tfjs-backend-wasm/dist/", import.meta.url).pathname);
    tf.env().set("WASM_HAS_SIMD_SUPPORT", true);
    tf.env().set("WASM_HAS_MULTITHREAD_SUPPORT", false);
    wasmReady = true;
  }
  if (!(await tf.setBackend(backend))) throw new Error(`tfjs backend ${backend} did not initialise`);
  await tf.ready();
}

/**
 * A stride-1 "same" 5×5-style convolution (NHWC input, HWIO filter, odd square kernel) whose
 * gradients are forward convolutions, so it trains on backends without conv backprop kernels.
 */
export function conv2dForwardGrads(x: tf.Tensor4D, w: tf.Tensor4D): tf.Tensor4D {
  const k = w.shape[0];
  const pad = (k - 1) / 2;
  const f = tf.customGrad((...args: (tf.Tensor | tf.GradSaveFunc)[]) => {
    const [x4, w4, save] = args as [tf.Tensor4D, tf.Tensor4D, tf.GradSaveFunc];
    save([x4, w4]);
    return {
      value: tf.conv2d(x4, w4, 1, "same"),
      gradFunc: (dy: tf.Tensor, saved: tf.Tensor[]) => {
        const [xs, ws] = saved as tf.Tensor4D[];
        const dy4 = dy as tf.Tensor4D;
        // dX = conv(dy, flip(W) with in/out channels swapped), same padding.
        const wFlip = tf.transpose(tf.reverse(ws, [0, 1]), [0, 1, 3, 2]) as tf.Tensor4D;
        const dx = tf.conv2d(dy4, wFlip, 1, "same");
        // dW[kh,kw,ci,co] = Σ_n,h,w xpad[n,h+kh,w+kw,ci]·dy[n,h,w,co]: channels as batch, batch as channels.
        const xT = tf.transpose(xs, [3, 1, 2, 0]) as tf.Tensor4D; // [Cin, H, W, N]
        const dyT = tf.transpose(dy4, [1, 2, 0, 3]) as tf.Tensor4D; // [H, W, N, Cout]
        const r = tf.conv2d(xT, dyT, 1, [[0, 0], [pad, pad], [pad, pad], [0, 0]]); // [Cin, k, k, Cout]
        const dw = tf.transpose(r, [1, 2, 0, 3]);
        return [dx, dw];
      },
    };
  });
  return f(x, w) as tf.Tensor4D;
}

/** Largest relative difference between the rewritten conv gradients and tfjs's own (current backend). */
export function checkConvRewrite(): number {
  return tf.tidy(() => {
    const x = tf.randomNormal([3, 9, 9, 4], 0, 1, "float32", 1) as tf.Tensor4D;
    const w = tf.randomNormal([5, 5, 4, 6], 0, 1, "float32", 2) as tf.Tensor4D;
    const up = tf.randomNormal([3, 9, 9, 6], 0, 1, "float32", 3);
    const ours = tf.grads((a: tf.Tensor, b: tf.Tensor) =>
      tf.sum(tf.mul(conv2dForwardGrads(a as tf.Tensor4D, b as tf.Tensor4D), up))
    )([x, w]);
    const theirs = tf.grads((a: tf.Tensor, b: tf.Tensor) =>
      tf.sum(tf.mul(tf.conv2d(a as tf.Tensor4D, b as tf.Tensor4D, 1, "same"), up))
    )([x, w]);
    let worst = 0;
    for (let i = 0; i < 2; i++) {
      const diff = tf.max(tf.abs(tf.sub(ours[i], theirs[i]))).dataSync()[0];
      const scale = tf.max(tf.abs(theirs[i])).dataSync()[0];
      worst = Math.max(worst, diff / scale);
    }
    return worst;
  });
}

/** Times `fn` (which must finish its work synchronously or return a tensor to read back). */
export function timeTf(fn: () => tf.Tensor): number {
  const t0 = performance.now();
  const out = fn();
  out.dataSync();
  const dt = performance.now() - t0;
  out.dispose();
  return dt / 1000;
}

/**
 * Caffe's cifar10_quick in tfjs ops, NHWC: conv 5×5 pad 2 (32, 32, 64), pools 3×3/2 (max, avg,
 * avg; "same" padding gives Caffe's ceil-mode sizes 16, 8, 4), ip1 64, ip2 10; momentum SGD.
 * Returns a function running one training step at `batch`.
 */
export function cifarQuickStep(
  batch: number,
  options: { rewriteConvGrads: boolean },
): { step: () => number; dispose: () => void } {
  const conv = options.rewriteConvGrads
    ? conv2dForwardGrads
    : (x: tf.Tensor4D, w: tf.Tensor4D) => tf.conv2d(x, w, 1, "same");
  const v = (shape: number[], std: number, seed: number) =>
    tf.variable(std === 0 ? tf.zeros(shape) : tf.randomNormal(shape, 0, std, "float32", seed));
  const p = {
    c1w: v([5, 5, 3, 32], 1e-4, 1),
    c1b: v([32], 0, 0),
    c2w: v([5, 5, 32, 32], 0.01, 2),
    c2b: v([32], 0, 0),
    c3w: v([5, 5, 32, 64], 0.01, 3),
    c3b: v([64], 0, 0),
    f1w: v([1024, 64], 0.1, 4),
    f1b: v([64], 0, 0),
    f2w: v([64, 10], 0.1, 5),
    f2b: v([10], 0, 0),
  };
  const images = tf.randomNormal([batch, 32, 32, 3], 0, 1, "float32", 6) as tf.Tensor4D;
  const labels = tf.oneHot(
    tf.tensor1d(Array.from({ length: batch }, (_, i) => (i * 7) % 10), "int32"),
    10,
  );
  const optimizer = tf.train.momentum(0.001, 0.9);
  const loss = () => {
    let h = tf.add(conv(images, p.c1w as unknown as tf.Tensor4D), p.c1b) as tf.Tensor4D;
    h = tf.relu(tf.maxPool(h, 3, 2, "same"));
    h = tf.relu(tf.add(conv(h, p.c2w as unknown as tf.Tensor4D), p.c2b)) as tf.Tensor4D;
    h = tf.avgPool(h, 3, 2, "same");
    h = tf.relu(tf.add(conv(h, p.c3w as unknown as tf.Tensor4D), p.c3b)) as tf.Tensor4D;
    h = tf.avgPool(h, 3, 2, "same");
    // Flatten in Caffe's C×H×W order so ip1 sees the same layout.
    const flat = tf.reshape(tf.transpose(h, [0, 3, 1, 2]), [batch, 1024]);
    const z = tf.add(tf.matMul(tf.add(tf.matMul(flat, p.f1w), p.f1b), p.f2w), p.f2b);
    return tf.losses.softmaxCrossEntropy(labels, z) as tf.Scalar;
  };
  return {
    step() {
      const value = optimizer.minimize(loss, true);
      const out = value!.dataSync()[0];
      value!.dispose();
      return out;
    },
    dispose() {
      for (const t of Object.values(p)) t.dispose();
      images.dispose();
      labels.dispose();
      optimizer.dispose();
    },
  };
}
