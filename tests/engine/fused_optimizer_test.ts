import assert from "node:assert/strict";
import { Adam, CpuBackend, type Optimizer, randn, registerBackend, setBackend, SGD } from "../../mod.ts";
import type { Backend } from "../../backends/mod.ts";
import type { ParameterEntry } from "../../engine/nn/mod.ts";

/** The CPU backend without its fused updates, so optimizers take the composed-ops path. */
const composed: Backend = Object.assign(Object.create(new CpuBackend()), {
  name: "cpu-composed",
  sgdUpdate: undefined,
  adamUpdate: undefined,
});
registerBackend(composed);

function run(backend: string, make: (p: ParameterEntry[]) => Optimizer): Uint32Array[] {
  setBackend(backend);
  try {
    const params: ParameterEntry[] = [
      {
        name: "w",
        tensor: randn([37, 11], { seed: 1, requiresGrad: true }),
        group: "fc",
        lrMult: 1,
        decayMult: 1,
      },
      {
        name: "b",
        tensor: randn([11], { seed: 2, requiresGrad: true }),
        group: "conv",
        lrMult: 2,
        decayMult: 0,
      },
    ];
    const optimizer = make(params);
    for (let step = 0; step < 6; step++) {
      params.forEach((p, i) => (p.tensor.grad = randn(p.tensor.shape, { seed: 10 * step + i })));
      optimizer.step("fc");
      optimizer.step();
    }
    const state = [...optimizer.state().perParameter.values()].flatMap((slots) => Object.values(slots));
    return [...params.map((p) => p.tensor), ...state].map((t) =>
      new Uint32Array((t.dataSync() as Float32Array).buffer)
    );
  } finally {
    setBackend("cpu");
  }
}

Deno.test("fused SGD and Adam kernels match the composed elementwise updates bit for bit", () => {
  const sgd = (p: ParameterEntry[]) => new SGD(p, { lr: 0.05, momentum: 0.9, weightDecay: 1e-3 });
  const adam = (p: ParameterEntry[]) => new Adam(p, { lr: 0.01, weightDecay: 1e-3 });
  for (const make of [sgd, adam]) {
    const composed = run("cpu-composed", make), fused = run("cpu", make);
    assert.equal(fused.length, composed.length);
    fused.forEach((bits, i) => assert.deepEqual(bits, composed[i], `tensor ${i} differs`));
    assert.ok(
      fused[0].some((v, i) => v !== run("cpu", (p) => new SGD(p, { lr: 0.0 }))[0][i]),
      "updates changed nothing",
    );
  }
});
