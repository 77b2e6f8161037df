/**
 * This machine's 128-bit WebAssembly peak, measured: a generated function runs `chains`
 * independent `f32x4` accumulator chains, each step `acc = acc·x + y` (`f32x4.relaxed_madd` where
 * relaxed SIMD is detected, else `f32x4.mul` then `f32x4.add`), enough chains to cover the
 * multiply-add latency on every pipe, so the loop runs at the core's SIMD throughput. Nothing is
 * loaded or stored: it is the ceiling for any 128-bit kernel (GEMM's percentages are against it).
 *
 * Flop counting: one `f32x4.relaxed_madd` (or `f32x4.mul` + `f32x4.add` pair) is 4 lanes × (1
 * multiply + 1 add) = 8 flops, the convention of GEMM's 2·m·n·k (a multiply-add counts 2). With
 * `x = y = 1` every lane counts its steps exactly, so the function's result (the sum of all lanes)
 * is half the flops it ran ({@link probeFlops}; the tests check one against the other).
 *
 * GFLOP/s per core is the best of several calls of about 80 ms on this thread, after a warm-up
 * (V8 first runs WebAssembly in its baseline tier and optimises it in the background). All cores:
 * one Worker per core (`navigator.hardwareConcurrency`), each running the same calls at once (a
 * shared gate starts every round), the sum of their rates in the best round.
 *
 * @module
 */

import { ModuleBuilder, ValType } from "./generate/encoder.ts";
import { detectWasmFeatures } from "./features.ts";

const { i32, f32, v128 } = ValType;

/** The shape of a generated probe. */
export interface PeakProbeShape {
  /** Independent accumulator vectors (registers): ≥ latency × pipes of the multiply-add. */
  chains: number;
  /** Passes over all chains per loop trip (amortises the loop counter). */
  unroll: number;
  /** `f32x4.relaxed_madd` (true) or `f32x4.mul` + `f32x4.add` (false). */
  fma: boolean;
}

/**
 * The shape {@link measureWasmPeak} runs: 12 chains, unrolled 4 times. 12 accumulators plus the two
 * operands (and a product) fit x64's 16 vector registers. Measured on a 2-core AMD EPYC (AVX-512
 * host): `f32x4.relaxed_madd` reaches its plateau (≈ 69 GFLOP/s) from 8 chains, `f32x4.mul` +
 * `f32x4.add` (longer dependency) only at 12, and 14 chains unrolled 4 times lose ~20% to spills.
 *
 * @example
 * ```ts
 * import { PEAK_PROBE_SHAPE } from "./peak.ts";
 * console.log(PEAK_PROBE_SHAPE.chains); // 12
 * ```
 */
export const PEAK_PROBE_SHAPE: Readonly<Omit<PeakProbeShape, "fma">> = { chains: 12, unroll: 4 };

/** Export name of the probe: `(trips: i32, x: f32, y: f32) → f32`. */
export const PEAK_PROBE_EXPORT = "probe";

/**
 * The probe module's bytes: one export `probe(trips, x, y)` that runs `trips` loop trips of
 * `unroll × chains` steps `acc = acc·x + y` (accumulators start at 0) and returns the sum of every
 * lane of every accumulator.
 *
 * @example
 * ```ts
 * import { peakProbeBytes } from "./peak.ts";
 * const bytes = peakProbeBytes({ chains: 12, unroll: 4, fma: false });
 * console.log(WebAssembly.validate(bytes)); // true
 * ```
 */
export function peakProbeBytes(shape: PeakProbeShape): Uint8Array<ArrayBuffer> {
  const { chains, unroll, fma } = shape;
  if (!(Number.isInteger(chains) && chains >= 1 && Number.isInteger(unroll) && unroll >= 1)) {
    throw new RangeError(`peakProbeBytes: chains and unroll must be positive integers`);
  }
  const builder = new ModuleBuilder();
  builder.addFunction(PEAK_PROBE_EXPORT, [i32, f32, f32], [f32], (f) => {
    const [trips, x, y] = [0, 1, 2];
    const xv = f.local(v128), yv = f.local(v128), sum = f.local(v128);
    const acc = Array.from({ length: chains }, () => f.local(v128)); // locals start at zero
    f.localGet(x).f32x4Splat().localSet(xv);
    f.localGet(y).f32x4Splat().localSet(yv);
    f.block().loop();
    f.localGet(trips).i32Eqz().brIf(1);
    for (let u = 0; u < unroll; u++) {
      for (const a of acc) {
        // acc·x + y: the chain runs through the multiplicand, so no two steps share a product.
        if (fma) f.localGet(a).localGet(xv).localGet(yv).f32x4RelaxedMadd();
        else f.localGet(a).localGet(xv).f32x4Mul().localGet(yv).f32x4Add();
        f.localSet(a);
      }
    }
    f.localGet(trips).i32Const(1).i32Sub().localSet(trips);
    f.br(0).end().end();
    f.localGet(acc[0]);
    for (const a of acc.slice(1)) f.localGet(a).f32x4Add();
    f.localSet(sum);
    f.localGet(sum).f32x4ExtractLane(0);
    for (let lane = 1; lane < 4; lane++) f.localGet(sum).f32x4ExtractLane(lane).f32Add();
  });
  return builder.build();
}

/**
 * Flops of one `probe(trips, …)` call: 8 per `f32x4` multiply-add (4 lanes × multiply and add)
 * × `chains × unroll` per trip.
 *
 * @example
 * ```ts
 * import { probeFlops } from "./peak.ts";
 * console.log(probeFlops({ chains: 12, unroll: 4, fma: true }, 1000)); // 384000
 * ```
 */
export function probeFlops(shape: PeakProbeShape, trips: number): number {
  return 8 * shape.chains * shape.unroll * trips;
}

/** The measured peak. */
export interface WasmPeak {
  /** GFLOP/s of one thread (best call). */
  perCore: number;
  /** GFLOP/s of `threads` Workers at once (sum of their rates, best round). */
  allCores: number;
  /** Threads of the all-cores figure (`navigator.hardwareConcurrency`). */
  threads: number;
  /** Measured with `f32x4.relaxed_madd` (true) or `f32x4.mul` + `f32x4.add` (false). */
  fma: boolean;
  /** The probe's shape. */
  shape: PeakProbeShape;
}

type Probe = (trips: number, x: number, y: number) => number;

/** Target length of one timed call, ms. */
const CALL_MS = 80;
/** Warm-up per thread, ms (and at least one call of the calibrated length). */
const WARM_MS = 150;
/** Timed calls (one thread) or rounds (all threads). */
const RUNS = 5;
/** How long the Workers may take to answer one message (start-up and warm-up included). */
const WORKER_TIMEOUT_MS = 30_000;

/** Warms `probe` up and returns trips for a call of about {@link CALL_MS}. */
function calibrate(probe: Probe): number {
  let trips = 1024, ms = 0;
  const warmUntil = performance.now() + WARM_MS;
  for (;;) {
    const t0 = performance.now();
    probe(trips, 1, 1);
    ms = performance.now() - t0;
    if (ms < 2) trips *= 4;
    else if (performance.now() >= warmUntil) break;
  }
  return Math.min(0x7fffffff, Math.max(1, Math.round(trips * CALL_MS / ms))); // an i32 argument
}

/** Best GFLOP/s of {@link RUNS} calls on this thread. */
function measureHere(
  bytes: Uint8Array<ArrayBuffer>,
  shape: PeakProbeShape,
): { gflops: number; trips: number } {
  const probe = new WebAssembly.Instance(new WebAssembly.Module(bytes)).exports[PEAK_PROBE_EXPORT] as Probe;
  const trips = calibrate(probe);
  let best = Infinity;
  for (let r = 0; r < RUNS; r++) {
    const t0 = performance.now();
    probe(trips, 1, 1);
    best = Math.min(best, performance.now() - t0);
  }
  return { gflops: probeFlops(shape, trips) / (best * 1e6), trips };
}

/**
 * A Worker's script (no imports, so it runs from a `blob:` URL): instantiate the probe, warm it
 * up, then per round report "armed", spin until the shared gate reaches the round, and time one
 * call. It never blocks in `Atomics.wait`, so `terminate()` always ends it.
 */
const WORKER_SOURCE = `
let probe;
self.onmessage = ({ data }) => {
  if (data.type === "init") {
    probe = new WebAssembly.Instance(new WebAssembly.Module(data.bytes)).exports.${PEAK_PROBE_EXPORT};
    const until = performance.now() + data.warmMs;
    do probe(data.trips, 1, 1); while (performance.now() < until);
    self.postMessage({ type: "ready" });
  } else {
    const gate = new Int32Array(data.gate);
    self.postMessage({ type: "armed" });
    while (Atomics.load(gate, 0) < data.round);
    const t0 = performance.now();
    probe(data.trips, 1, 1);
    self.postMessage({ type: "done", ms: performance.now() - t0 });
  }
};
`;

/** Best summed GFLOP/s of `threads` Workers running `trips`-trip calls at once. */
async function measureWorkers(
  bytes: Uint8Array<ArrayBuffer>,
  shape: PeakProbeShape,
  threads: number,
  trips: number,
): Promise<number> {
  const url = URL.createObjectURL(new Blob([WORKER_SOURCE], { type: "text/javascript" }));
  const workers: Worker[] = [];
  const gate = new Int32Array(new SharedArrayBuffer(4));
  try {
    for (let i = 0; i < threads; i++) workers.push(new Worker(url, { type: "module" }));
    /**
     * Posts `message(i)` (unless undefined) to each Worker and resolves with their next replies of
     * type `type`; rejects on a Worker's error or after {@link WORKER_TIMEOUT_MS}.
     */
    const all = async <T>(type: string, message: (i: number) => unknown): Promise<T[]> => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const timeout = new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`peak probe Workers sent no "${type}" within ${WORKER_TIMEOUT_MS} ms`)),
          WORKER_TIMEOUT_MS,
        );
      });
      const replies = Promise.all(workers.map((worker, i) =>
        new Promise<T>((resolve, reject) => {
          worker.onmessage = (event: MessageEvent) => {
            if (event.data.type === type) resolve(event.data as T);
          };
          worker.onerror = (event: ErrorEvent) => {
            event.preventDefault();
            reject(new Error(`peak probe Worker ${i}: ${event.message}`));
          };
          const m = message(i);
          if (m !== undefined) worker.postMessage(m);
        })
      ));
      try {
        return await Promise.race([replies, timeout]);
      } finally {
        clearTimeout(timer);
      }
    };
    // Small warm-up calls (a tenth of a timed one) until WARM_MS has passed on each.
    const warmTrips = Math.max(1, Math.round(trips / 10));
    await all("ready", () => ({ type: "init", bytes, trips: warmTrips, warmMs: WARM_MS }));
    let best = 0;
    for (let round = 1; round <= RUNS + 1; round++) {
      const armed = all("armed", () => ({ type: "round", gate: gate.buffer, round, trips }));
      await armed;
      const done = all<{ ms: number }>("done", () => undefined);
      Atomics.store(gate, 0, round);
      const replies = await done;
      const gflops = replies.reduce((sum, { ms }) => sum + probeFlops(shape, trips) / (ms * 1e6), 0);
      if (round > 1) best = Math.max(best, gflops); // the first round is one more warm-up
    }
    return best;
  } finally {
    for (const worker of workers) worker.terminate();
    URL.revokeObjectURL(url);
  }
}

let measured: Promise<WasmPeak> | undefined;

/**
 * Measures (once per process, then cached) the 128-bit peak of this machine: GFLOP/s of one
 * thread and of one Worker per core at once, with `f32x4.relaxed_madd` where relaxed SIMD is
 * detected, else `f32x4.mul` + `f32x4.add` (`fma` says which). About 1.5 s. Rejects where
 * SIMD128 or Workers are missing.
 *
 * @example
 * ```ts
 * import { measureWasmPeak } from "./peak.ts";
 * const { perCore, allCores, threads, fma } = await measureWasmPeak();
 * console.log(`${perCore.toFixed(1)} GFLOP/s per core, ${allCores.toFixed(1)} on ${threads} (FMA ${fma})`);
 * ```
 */
export function measureWasmPeak(): Promise<WasmPeak> {
  measured ??= (async () => {
    const features = detectWasmFeatures();
    if (!features.simd128) throw new Error("measureWasmPeak: this runtime has no WebAssembly SIMD128");
    const shape: PeakProbeShape = { ...PEAK_PROBE_SHAPE, fma: features.relaxedSimd };
    const bytes = peakProbeBytes(shape);
    const here = measureHere(bytes, shape);
    const threads = Math.max(1, navigator.hardwareConcurrency || 1);
    const allCores = threads === 1 ? here.gflops : await measureWorkers(bytes, shape, threads, here.trips);
    return { perCore: here.gflops, allCores, threads, fma: shape.fma, shape };
  })();
  return measured;
}

/**
 * One line for reports, e.g. `"128-bit WebAssembly peak (f32x4.relaxed_madd, 12 chains, best of 5):
 * 1 thread 69.1 GFLOP/s, 2 threads 139.4 GFLOP/s"`.
 *
 * @example
 * ```ts
 * import { describeWasmPeak, measureWasmPeak } from "./peak.ts";
 * console.log(describeWasmPeak(await measureWasmPeak()));
 * ```
 */
export function describeWasmPeak(peak: WasmPeak): string {
  const op = peak.fma ? "f32x4.relaxed_madd" : "f32x4.mul + f32x4.add, no relaxed SIMD";
  return `128-bit WebAssembly peak (${op}, ${peak.shape.chains} chains, best of ${RUNS}): 1 thread ` +
    `${peak.perCore.toFixed(1)} GFLOP/s, ${peak.threads} thread${peak.threads > 1 ? "s" : ""} ` +
    `${peak.allCores.toFixed(1)} GFLOP/s`;
}
