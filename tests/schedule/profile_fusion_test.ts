/**
 * The simulator's profile times layers as training runs them: a Conv2d or Linear with its ReLU,
 * and the MaxPool2d after a Conv2d and ReLU, as one op (`fusedRun`), on a chain and on a graph. Timed one by one, AlexNet-like's ReLU and pooling passes and their backward cost as much
 * again as its convolutions, which put most of a step in the wrong place.
 */

import assert from "node:assert/strict";
import {
  Concat,
  Conv2d,
  Flatten,
  Graph,
  Linear,
  LRN,
  MaxPool2d,
  type Module,
  Network,
  ReLU,
  Sequential,
} from "../../engine/nn/mod.ts";
import { registerBackend, setBackend } from "../../mod.ts";
import { measureProfile } from "../../schedule/simulator/measure.ts";
import { CountingCpu } from "../backends/logged_backend.ts";
import { tinyAlexNet } from "../fixtures/networks.ts";

/** `build`'s profile at batch 4 on a counting backend: the profile and the ReLU passes it ran. */
function profiled(name: string, build: () => Network) {
  const backend = new CountingCpu({ name, threads: 1 });
  registerBackend(backend);
  setBackend(name);
  try {
    const network = build();
    try {
      const profile = measureProfile(network, 4, { repeats: 1 });
      return { profile, reluPasses: backend.reluPasses };
    } finally {
      network.dispose();
    }
  } finally {
    setBackend("cpu");
  }
}

/** Each layer's name → its entry's forward and backward seconds, both 0 or both > 0 as `timed` says. */
function assertTimed(profile: ReturnType<typeof profiled>["profile"], timed: Record<string, boolean>) {
  for (const [name, expected] of Object.entries(timed)) {
    const layer = profile.layers.find((l) => l.name === name)!;
    assert.ok(layer, `${name} is in the profile`);
    const seconds = [layer.forwardSeconds, layer.backwardSeconds];
    assert.ok(seconds.every((s) => expected ? s > 0 : s === 0), `${name}: ${seconds} (timed: ${expected})`);
  }
}

// Mutations seen failing: measureProfile timing every leaf alone (`fusedRun` dropped: 2 ReLU passes
// per repeat, relu1 and relu2 timed); measureGraph timing every node alone (`fusedFrom` dropped: the graph test).
Deno.test("measureProfile times a chain's Conv2d → ReLU (→ MaxPool2d) and Linear → ReLU as one op each", () => {
  const { profile, reluPasses } = profiled("cpu-profile-chain", () => tinyAlexNet(1));
  assert.equal(reluPasses, 0, "standalone ReLU passes while profiling");
  // conv1 → relu1 (then LRN), conv2 → relu2 → pool2, fc1 → relu3: the fused layers' time is on the first.
  assertTimed(profile, {
    conv1: true,
    relu1: false,
    norm1: true,
    pool1: true,
    conv2: true,
    relu2: false,
    pool2: false,
    fc1: true,
    relu3: false,
    fc2: true,
  });
  // The fused-away layers keep their own output bytes (a hybrid plan's activations are priced by them).
  const bytes = Object.fromEntries(profile.layers.map((l) => [l.name, l.outputBytes]));
  assert.equal(bytes.relu2, 4 * 4 * 16 * 8 * 8);
  assert.equal(bytes.pool2, 4 * 4 * 16 * 4 * 4);
});

// Mutation seen failing: the chain path fusing the leaves of one container across a nested one
// (conv1 and relu1 around `inner`, as a filter on the parent did), where Sequential runs them apart.
Deno.test("measureProfile fuses only what Sequential fuses: not across a nested container", () => {
  const net = () =>
    new Network("nested", [2, 8, 8], 5, {
      conv1: new Conv2d(2, 4, 3, { padding: 1 }),
      inner: new Sequential({ norm: new LRN({ size: 3 }) }),
      relu1: new ReLU(),
      flatten: new Flatten(),
      fc: new Linear(4 * 8 * 8, 5),
    }).initialize(1);
  const { profile, reluPasses } = profiled("cpu-profile-nested", net);
  // relu1 runs alone in training (conv1 is followed by `inner`): once in the warm-up, once timed.
  assert.equal(reluPasses, 2, "standalone ReLU passes while profiling");
  assertTimed(profile, { conv1: true, "inner.norm": true, relu1: true, fc: true });
});

/**
 * A branching net on a graph: conv1 → relu1 → pool1 (one op); pool1 read by two branches (so it
 * ends that run), conv2a → relu2a (one op) and conv2b alone; a concat, flatten and fc → relu3 → fc2
 * (fc and relu3 as one op).
 */
function forkNet(): Network {
  const conv = (cin: number, cout: number, k: number) => new Conv2d(cin, cout, k, { padding: (k - 1) / 2 });
  const node = (name: string, module: Module, bottoms: string[]) => ({ name, module, bottoms, top: name });
  return new Network(
    "fork",
    [2, 8, 8],
    5,
    new Graph({
      input: "data",
      nodes: [
        node("conv1", conv(2, 4, 3), ["data"]),
        node("relu1", new ReLU(), ["conv1"]),
        node("pool1", new MaxPool2d({ kernel: 2 }), ["relu1"]),
        node("conv2a", conv(4, 4, 3), ["pool1"]),
        node("relu2a", new ReLU(), ["conv2a"]),
        node("conv2b", conv(4, 2, 1), ["pool1"]),
        node("concat", new Concat(), ["relu2a", "conv2b"]),
        node("flatten", new Flatten(), ["concat"]),
        node("fc", new Linear(6 * 4 * 4, 8), ["flatten"]),
        node("relu3", new ReLU(), ["fc"]),
        node("fc2", new Linear(8, 5), ["relu3"]),
      ],
    }),
  ).initialize(1);
}

Deno.test("measureProfile times a graph's fused runs as one op, where each blob between has one reader", () => {
  const { profile, reluPasses } = profiled("cpu-profile-graph", forkNet);
  assert.equal(reluPasses, 0, "standalone ReLU passes while profiling");
  assertTimed(profile, {
    conv1: true,
    relu1: false,
    pool1: false,
    conv2a: true,
    relu2a: false,
    conv2b: true,
    concat: true,
    fc: true,
    relu3: false,
    fc2: true,
  });
  const bytes = Object.fromEntries(profile.layers.map((l) => [l.name, l.outputBytes]));
  assert.equal(bytes.relu1, 4 * 4 * 4 * 8 * 8);
  assert.equal(bytes.pool1, 4 * 4 * 4 * 4 * 4);
});
