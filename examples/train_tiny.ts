/**
 * Trains a tiny AlexNet-shaped CNN (conv part, then a parameter-heavy FC part) on a synthetic
 * four-class image task with plain SGD + momentum, and reports held-out accuracy.
 *
 * Run: `npx deno task example`
 *
 * @module
 */

import { noGrad, ops, randn, type Tensor, tensor, tidy, zeros } from "../mod.ts";
import { uniformValues } from "../engine/mod.ts";

const imageSize = 16;
const classes = 4;

/** Class k: a bright 5×5 square in quadrant k at a random position within it, on uniform noise. */
function makeBatch(size: number, firstSample: number): { images: Tensor; labels: Tensor } {
  const pixels = new Float32Array(size * imageSize * imageSize);
  const labels = new Int32Array(size);
  for (let s = 0; s < size; s++) {
    const sample = firstSample + s;
    const [r0, r1, r2] = uniformValues(3, { seed: 1, stream: 0 }, sample * 3);
    const label = Math.floor(r0 * classes);
    labels[s] = label;
    const noise = uniformValues(
      imageSize * imageSize,
      { seed: 1, stream: 1 },
      sample * imageSize * imageSize,
    );
    const top = (label >> 1) * 8 + Math.floor(r1 * 4), left = (label & 1) * 8 + Math.floor(r2 * 4);
    for (let i = 0; i < imageSize * imageSize; i++) {
      const y = Math.floor(i / imageSize), x = i % imageSize;
      const inside = y >= top && y < top + 5 && x >= left && x < left + 5;
      pixels[s * imageSize * imageSize + i] = noise[i] + (inside ? 0.25 : 0) - 0.5;
    }
  }
  return {
    images: tensor(pixels, { shape: [size, 1, imageSize, imageSize] }),
    labels: tensor(labels, { dtype: "int32" }),
  };
}

const parameters = {
  conv1: randn([8, 1, 3, 3], { seed: 2, stream: 1, std: 0.3, requiresGrad: true }),
  conv1Bias: zeros([8], { requiresGrad: true }),
  conv2: randn([16, 4, 3, 3], { seed: 2, stream: 2, std: 0.15, requiresGrad: true }),
  conv2Bias: zeros([16], { requiresGrad: true }),
  fc1: randn([128, 16 * 4 * 4], { seed: 2, stream: 3, std: 0.05, requiresGrad: true }),
  fc1Bias: zeros([128], { requiresGrad: true }),
  fc2: randn([classes, 128], { seed: 2, stream: 4, std: 0.05, requiresGrad: true }),
  fc2Bias: zeros([classes], { requiresGrad: true }),
};
const velocity = new Map(Object.values(parameters).map((p) => [p, zeros(p.shape)]));

function forward(images: Tensor, training: boolean, step: number): Tensor {
  const p = parameters;
  let h = ops.relu(ops.conv2d(images, p.conv1, p.conv1Bias, { padding: 1 }));
  h = ops.maxPool2d(h, { kernel: 3, stride: 2 }); // 16 → 8 (Caffe rounding)
  h = ops.relu(ops.conv2d(h, p.conv2, p.conv2Bias, { padding: 1, groups: 2 }));
  h = ops.maxPool2d(h, { kernel: 3, stride: 2 }); // 8 → 4
  h = ops.relu(ops.linear(ops.flatten(h, 1), p.fc1, p.fc1Bias));
  h = ops.dropout(h, { p: 0.3, training, seed: 3, stream: step });
  return ops.linear(h, p.fc2, p.fc2Bias);
}

function sgdStep(learningRate: number, momentum: number): void {
  noGrad(() => {
    for (const [parameter, v] of velocity) {
      tidy(() => {
        v.assign(ops.add(ops.mul(v, momentum), parameter.grad!));
        parameter.assign(ops.sub(parameter, ops.mul(v, learningRate)));
      });
      parameter.grad!.dispose();
      parameter.grad = null;
    }
  });
}

async function accuracy(images: Tensor, labels: Tensor): Promise<number> {
  const predicted = tidy(() => noGrad(() => forward(images, false, 0)));
  const logits = (await predicted.data()) as Float32Array;
  predicted.dispose();
  const truth = labels.hostInts!;
  let correct = 0;
  for (let i = 0; i < truth.length; i++) {
    const row = logits.subarray(i * classes, (i + 1) * classes);
    if (row.indexOf(Math.max(...row)) === truth[i]) correct++;
  }
  return correct / truth.length;
}

const batchSize = 32, steps = 300;
const test = makeBatch(512, 1_000_000);
const started = performance.now();
for (let step = 0; step < steps; step++) {
  const { images, labels } = makeBatch(batchSize, step * batchSize);
  const loss = tidy(() => {
    const loss = ops.softmaxCrossEntropy(forward(images, true, step), labels);
    loss.backward();
    return loss;
  });
  sgdStep(0.05, 0.9);
  if (step % 50 === 0 || step === steps - 1) {
    console.log(`step ${String(step).padStart(3)}  loss ${(await loss.item()).toFixed(4)}`);
  }
  for (const t of [images, labels, loss]) t.dispose();
}
const seconds = (performance.now() - started) / 1000;
const acc = await accuracy(test.images, test.labels);
console.log(
  `trained ${steps} steps of batch ${batchSize} in ${seconds.toFixed(1)} s ` +
    `(${((steps * batchSize) / seconds).toFixed(0)} images/s); held-out accuracy ${(acc * 100).toFixed(1)}%`,
);
