/**
 * A stride-1 input gradient sums its column matrix onto padded planes in whole vectors
 * (`conv_col2im_padded`, then `conv_unpad`); that must give the bits of the general col2im
 * (`conv_col2im_add` onto dx itself), which adds the same contributions in the same order. Runs
 * of 1 to 14 floats, kernels wider than the input, rectangular kernels and padding.
 *
 * Mutations tried, each made this test fail: the last vector of a run added unmasked (the next
 * run's values land on real elements); the lane mask one lane short; a run's next start taken
 * where the vectors stopped instead of OW floats on; `unpad` reading from the wrong row.
 */

import assert from "node:assert/strict";
import { instantiateKernels, kernelModuleBytes } from "../../../backends/cpu/wasm/generate/module.ts";
import { columnRows, im2colArgs } from "../../../backends/cpu/wasm/conv.ts";
import { conv2dGeometry, type Conv2dOptions } from "../../../backends/geometry.ts";
import { mulberry32 } from "../../reference/random.ts";

const memory = new WebAssembly.Memory({ initial: 64, maximum: 256 });
const kernels = instantiateKernels(
  new WebAssembly.Module(kernelModuleBytes({ fma: false, shared: false })),
  memory,
);

const CASES: [number[], number[], Conv2dOptions][] = [
  [[1, 32, 14, 14], [64, 16, 3, 3], { padding: 1, groups: 2 }],
  [[1, 8, 7, 7], [4, 8, 3, 3], { padding: 1 }],
  [[1, 3, 16, 16], [2, 3, 5, 5], { padding: 2 }],
  [[1, 2, 3, 3], [3, 2, 5, 5], { padding: 1 }],
  [[1, 3, 9, 11], [4, 3, 3, 2], { padding: [1, 0] }],
  [[1, 4, 10, 13], [5, 4, 4, 3], { padding: [2, 1] }],
  [[1, 3, 6, 5], [2, 3, 2, 2], {}],
];

Deno.test("wasm col2im: stride-1 sums onto padded planes in whole vectors keep the general col2im's bits", () => {
  const random = mulberry32(5);
  for (const [x, w, options] of CASES) {
    const g = conv2dGeometry(x, w, options);
    const rows = columnRows(g), P = g.outHeight * g.outWidth;
    const Hp = g.inHeight + 2 * g.padH, Wq = g.kernelW - 1 + 4 * Math.ceil(g.outWidth / 4);
    const dxFloats = g.inChannels * g.inHeight * g.inWidth;
    // col, then dx by the general path, then the padded planes, then dx by the padded path.
    const col = 1024, general = col + 4 * rows * P + 64, padded = general + 4 * dxFloats + 64;
    const viaPadded = padded + 4 * g.inChannels * Hp * Wq + 64;
    const view = new Float32Array(memory.buffer);
    for (let i = 0; i < rows * P; i++) view[col / 4 + i] = random() * 2 - 1;
    kernels.fill_zero(general, 4 * dxFloats);
    kernels.conv_col2im_add(general, col, 0, rows, ...im2colArgs(g));
    kernels.fill_zero(padded, 4 * g.inChannels * Hp * Wq);
    view.fill(NaN, viaPadded / 4, viaPadded / 4 + dxFloats);
    kernels.conv_col2im_padded(
      padded,
      col,
      rows,
      g.outHeight,
      g.outWidth,
      g.kernelH,
      g.kernelW,
      4 * Hp * Wq,
      4 * Wq,
    );
    kernels.conv_unpad(padded, viaPadded, g.inChannels, g.inHeight, g.inWidth, g.padH, g.padW, Hp, Wq);
    const a = new Uint32Array(memory.buffer, general, dxFloats),
      b = new Uint32Array(memory.buffer, viaPadded, dxFloats);
    const first = a.findIndex((v, i) => v !== b[i]);
    assert.equal(first, -1, `${JSON.stringify([x, w, options])}: element ${first}`);
  }
});
