/**
 * Per-machine GEMM cache blocks (MC, NC): where a process finds them (TANDEM_GEMM_BLOCKS, a tuning
 * file keyed by the machine, the cache sizes Linux reports, the defaults), and that whatever it
 * finds, every GEMM and convolution gives the same bits, on 1 and 2 threads.
 *
 * Mutations tried, each made a test here fail: the depth block following MC (`KC = 2·MC` in
 * `gemmBlocked`: bits differ between blocks); a pool thread packing in the default blocks instead
 * of the task's (`runMatmul` and the conv share ignoring `task.mc`/`task.nc`: the 2-thread products
 * in small blocks differ); `blocksForCaches` ignoring how many CPUs share the L3; the lookup
 * reading the tuning file before TANDEM_GEMM_BLOCKS; a tuning filed under another machine being
 * used; `readCacheSizes` not falling back to `/proc/cpuinfo` where sysfs reports no cache (this
 * virtual machine kind lacks the directory); the cpuinfo size read as the L2 on Intel; the driver
 * ignoring the few rows' NC (`fewRowsNc`: every product blocked in NC); the convolution's implicit
 * im2col packing every column block from the image's first column (the 576-column case).
 */

import assert from "node:assert/strict";
import { CpuBackend } from "../../../backends/cpu/backend.ts";
import {
  blocksForCaches,
  cpuinfoCacheSizes,
  machineKey,
  readCacheSizes,
  readTunedBlocks,
  resolveMachineBlocks,
  writeTunedBlocks,
} from "../../../backends/cpu/wasm/blocking.ts";
import {
  DEFAULT_GEMM_BLOCKS,
  gemmBlocked,
  type GemmBlocks,
  gemmBlocksProblem,
  type GemmExports,
  gemmScratchBytes,
  kernelBlocks,
} from "../../../backends/cpu/wasm/gemm.ts";
import { instantiateKernels, kernelModuleBytes } from "../../../backends/cpu/wasm/generate/module.ts";
import { WasmKernels } from "../../../backends/cpu/wasm/kernels.ts";
import { conv2dGeometry } from "../../../backends/geometry.ts";
import type { MatmulSpec } from "../../../backends/backend.ts";
import { tempDirs } from "../../fixtures/process.ts";
import { mulberry32 } from "../../reference/random.ts";
import { assertSameBits } from "../../reference/bits.ts";

const withTempDir = tempDirs("tandem_blocks_");
const random = mulberry32(0xb10c5);

function randomArray(length: number): Float32Array {
  const out = new Float32Array(length);
  for (let i = 0; i < length; i++) out[i] = random() * 2 - 1;
  return out;
}

/** Writes a sysfs-like cache tree: [level, type, size, shared_cpu_list] per index. */
async function fakeCaches(dir: string, entries: [string, string, string, string][]): Promise<string> {
  for (const [i, [level, type, size, shared]] of entries.entries()) {
    const at = `${dir}/cache/index${i}`;
    await Deno.mkdir(at, { recursive: true });
    await Deno.writeTextFile(`${at}/level`, `${level}\n`);
    await Deno.writeTextFile(`${at}/type`, `${type}\n`);
    await Deno.writeTextFile(`${at}/size`, `${size}\n`);
    await Deno.writeTextFile(`${at}/shared_cpu_list`, `${shared}\n`);
  }
  return `${dir}/cache`;
}

/** `exports` with `name` calling `seen` with its arguments before it runs. */
function watching(exports: object, name: keyof GemmExports, seen: (args: number[]) => void): GemmExports {
  const kernel = (exports as Record<string, (...args: number[]) => void>)[name];
  return {
    ...exports,
    [name]: (...args: number[]) => {
      seen(args);
      kernel(...args);
    },
  } as unknown as GemmExports;
}

Deno.test("GEMM blocks: Linux cache sizes give MC from L2 and NC from a thread's share of L3", async () => {
  await withTempDir(async (dir) => {
    const root = await fakeCaches(dir, [
      ["1", "Data", "48K", "0-1"],
      ["1", "Instruction", "32K", "0-1"],
      ["2", "Unified", "2048K", "0-1"],
      ["3", "Unified", "105M", "0-55,112-167"],
    ]);
    const caches = readCacheSizes(root);
    assert.deepEqual(caches, { l1d: 48 << 10, l2: 2 << 20, l3: 105 << 20, l3Sharers: 112 });
    // MC: 3/8 of 2 MiB over 1 KiB rows = 768, capped at 480. NC: 105 MiB / 112 / 4 / 1 KiB = 240 → 256.
    assert.deepEqual(blocksForCaches(caches), { mc: 480, nc: 256 });
  });
  // A 256 KiB L2 gives the tuned defaults' 96 rows; 512 KiB twice that; 32 MiB of L3 over 8 CPUs 1024.
  assert.equal(blocksForCaches({ l2: 256 << 10 }).mc, DEFAULT_GEMM_BLOCKS.mc);
  assert.deepEqual(blocksForCaches({ l2: 512 << 10, l3: 32 << 20, l3Sharers: 8 }), { mc: 192, nc: 1024 });
  assert.deepEqual(blocksForCaches({ l2: 512 << 10, l3: 32 << 20, l3Sharers: 2 }), { mc: 192, nc: 4096 });
  assert.deepEqual(blocksForCaches({}), DEFAULT_GEMM_BLOCKS);
  assert.deepEqual(readCacheSizes("/nonexistent/cache", "/nonexistent/cpuinfo"), {});
  for (const caches of [{ l2: 96 << 10 }, { l2: 5 << 20, l3: 1 << 30, l3Sharers: 1 }]) {
    assert.equal(gemmBlocksProblem(blocksForCaches(caches)), undefined, JSON.stringify(caches));
  }
});

Deno.test("GEMM blocks: without sysfs caches, /proc/cpuinfo's size is AMD's L2 and Intel's shared L3", async () => {
  const amd = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\ncache size\t: 1024 KB\n";
  const intel = "vendor_id\t: GenuineIntel\nsiblings\t: 16\ncache size\t: 36608 KB\n";
  assert.deepEqual(cpuinfoCacheSizes(amd), { l2: 1 << 20 });
  assert.deepEqual(cpuinfoCacheSizes(intel), { l3: 36608 << 10, l3Sharers: 16 });
  // Other vendors' meaning is not known; ARM's cpuinfo has no size at all.
  assert.deepEqual(cpuinfoCacheSizes(amd.replace("AuthenticAMD", "CentaurHauls")), {});
  assert.deepEqual(cpuinfoCacheSizes("processor\t: 0\nBogoMIPS\t: 50.00\n"), {});
  assert.deepEqual(cpuinfoCacheSizes(undefined), {});
  // 3/8 of a 1 MiB L2 over 1 KiB rows: 384 rows, NC stays the default.
  assert.deepEqual(blocksForCaches(cpuinfoCacheSizes(amd)), { mc: 384, nc: DEFAULT_GEMM_BLOCKS.nc });
  await withTempDir(async (dir) => {
    await Deno.writeTextFile(`${dir}/cpuinfo`, amd);
    // No sysfs directory: the cpuinfo size. A sysfs directory that reports caches wins over it.
    assert.deepEqual(readCacheSizes(`${dir}/absent`, `${dir}/cpuinfo`), { l2: 1 << 20 });
    const root = await fakeCaches(dir, [["2", "Unified", "512K", "0"]]);
    assert.deepEqual(readCacheSizes(root, `${dir}/cpuinfo`), { l2: 512 << 10 });
  });
});

Deno.test("GEMM blocks: TANDEM_GEMM_BLOCKS, then this machine's tuning, then the caches, then the defaults", async () => {
  await withTempDir(async (dir) => {
    const caches = { l1d: 32 << 10, l2: 512 << 10, l3: 32 << 20, l3Sharers: 2 };
    const model = "Test CPU 9000";
    const here = machineKey(caches, model), elsewhere = machineKey({ ...caches, l2: 1 << 20 }, model);
    assert.equal(here, "Test CPU 9000 · L1d 32K · L2 512K · L3 32768K/2");
    const file = `${dir}/sub/gemm-blocks.json`;
    const entry = (mc: number, nc: number) => ({
      mc,
      nc,
      gflops: 30,
      untunedGflops: 28,
      tuned: "2026-12-01",
    });
    writeTunedBlocks(file, elsewhere, entry(240, 512));
    const lookup = { file, caches, model };
    // Only another machine's tuning on file: the caches decide.
    assert.deepEqual(resolveMachineBlocks(lookup), {
      blocks: { mc: 192, nc: 4096 },
      source: "caches",
      machine: here,
      caches,
    });
    writeTunedBlocks(file, here, entry(144, 1024));
    assert.deepEqual(readTunedBlocks(file, elsewhere)?.mc, 240, "the other machine's entry is kept");
    assert.deepEqual([...Deno.readDirSync(`${dir}/sub`)].map((e) => e.name), ["gemm-blocks.json"]);
    const tuned = resolveMachineBlocks(lookup);
    assert.deepEqual([tuned.blocks, tuned.source, tuned.warning], [
      { mc: 144, nc: 1024 },
      "tuned",
      undefined,
    ]);
    const forced = resolveMachineBlocks({ ...lookup, override: "36, 512" });
    assert.deepEqual([forced.blocks, forced.source], [{ mc: 36, nc: 512 }, "environment"]);
    const packed = resolveMachineBlocks({ ...lookup, override: "36,512,0" });
    assert.deepEqual([packed.blocks, packed.source], [{ mc: 36, nc: 512, inPlaceRows: 0 }, "environment"]);
    const few = resolveMachineBlocks({ ...lookup, override: "36,512,0,1024" });
    assert.deepEqual(few.blocks, { mc: 36, nc: 512, inPlaceRows: 0, fewRowsNc: 1024 });
    assert.match(
      resolveMachineBlocks({ ...lookup, override: "36,512,6,100" }).warning!,
      /^TANDEM_GEMM_BLOCKS: fewRowsNc 100 is not a multiple of 8 in \[256, 8192\]; using the blocks/,
    );
    // A tuning that chose the in-place rows keeps them (a field older tuning files lack).
    writeTunedBlocks(file, here, { ...entry(144, 1024), inPlaceRows: 5, fewRowsNc: 2048 });
    assert.deepEqual(resolveMachineBlocks(lookup).blocks, {
      mc: 144,
      nc: 1024,
      inPlaceRows: 5,
      fewRowsNc: 2048,
    });
    writeTunedBlocks(file, here, entry(144, 1024));
    // A bad variable is skipped with a one-line reason naming it.
    const bad = resolveMachineBlocks({ ...lookup, override: "100,2048" });
    assert.equal(bad.source, "tuned");
    assert.equal(
      bad.warning,
      "TANDEM_GEMM_BLOCKS: mc 100 is not a multiple of 12 in [12, 480]; using the blocks `deno task tune` measured instead",
    );
    assert.match(resolveMachineBlocks({ ...lookup, override: "96" }).warning!, /"96" is not mc,nc/);
    assert.match(
      resolveMachineBlocks({ ...lookup, override: "96,2048,7" }).warning!,
      /^TANDEM_GEMM_BLOCKS: inPlaceRows 7 is not one of 0, 5, 6; using the blocks/,
    );
    // A corrupt file is skipped the same way; without caches the defaults remain.
    await Deno.writeTextFile(file, "{ not json");
    const corrupt = resolveMachineBlocks({ file, caches: {}, model });
    assert.deepEqual([corrupt.blocks, corrupt.source], [DEFAULT_GEMM_BLOCKS, "default"]);
    assert.match(corrupt.warning!, new RegExp(`^${file}: is not JSON.*using the default blocks`));
    assert.doesNotMatch(corrupt.warning!, /\n/);
    assert.throws(() => readTunedBlocks(file, here), /is not JSON/);
    await Deno.writeTextFile(file, JSON.stringify({ version: 1, machines: { [here]: { mc: 7, nc: 2048 } } }));
    assert.match(
      resolveMachineBlocks(lookup).warning!,
      /machine "Test CPU 9000 · .*": mc 7 is not a multiple/,
    );
    assert.throws(() => writeTunedBlocks(`${dir}/w.json`, here, entry(13, 2048)), /refusing to write mc 13/);
  });
});

Deno.test("GEMM blocks: a process takes TANDEM_GEMM_BLOCKS or its tuning file, and warns in one line about a bad one", async () => {
  await withTempDir(async (dir) => {
    const script = `import { CpuBackend, machineGemmBlocks, describeMachineBlocks } from "${new URL(
      "../../../backends/cpu/mod.ts",
      import.meta.url,
    )}";
      const cpu = new CpuBackend({ threads: 1 }), { source, machine } = machineGemmBlocks();
      console.log(JSON.stringify({ ...cpu.gemmBlocks, source, machine }));
      console.log(describeMachineBlocks(machineGemmBlocks()));`;
    const run = async (env: Record<string, string>) => {
      const child = new Deno.Command(Deno.execPath(), {
        args: ["eval", "--ext=ts", script],
        env: { TANDEM_CACHE_DIR: dir, ...env },
        stdout: "piped",
        stderr: "piped",
      });
      const { code, stdout, stderr } = await child.output();
      const [json, line] = new TextDecoder().decode(stdout).trim().split("\n");
      const { machine, ...blocks } = JSON.parse(json);
      return { code, blocks, machine, line, stderr: new TextDecoder().decode(stderr) };
    };
    const forced = await run({ TANDEM_GEMM_BLOCKS: "24,768,5" });
    assert.deepEqual([forced.code, forced.blocks, forced.stderr], [0, {
      mc: 24,
      nc: 768,
      inPlaceRows: 5,
      fewRowsNc: 768,
      source: "environment",
    }, ""]);
    assert.match(forced.line, /^MC 24, NC 768, KC 256, in-place rows 5 \(TANDEM_GEMM_BLOCKS; /);
    const few = await run({ TANDEM_GEMM_BLOCKS: "24,768,5,2048" });
    assert.match(
      few.line,
      /^MC 24, NC 768 \(2048 for few rows\), KC 256, in-place rows 5 \(TANDEM_GEMM_BLOCKS; /,
    );
    // A tuning filed under the machine key the child reported, in its TANDEM_CACHE_DIR.
    const entry = { mc: 60, nc: 1536, inPlaceRows: 0, gflops: 1, untunedGflops: 1, tuned: "2026-12-01" };
    writeTunedBlocks(`${dir}/gemm-blocks.json`, forced.machine, entry);
    const tuned = await run({});
    assert.deepEqual([tuned.code, tuned.blocks, tuned.stderr], [
      0,
      { mc: 60, nc: 1536, inPlaceRows: 0, fewRowsNc: 1536, source: "tuned" },
      "",
    ]);
    const bad = await run({ TANDEM_GEMM_BLOCKS: "60,100" });
    assert.deepEqual([bad.code, bad.blocks.mc, bad.blocks.nc], [0, 60, 1536]);
    assert.equal(
      bad.stderr.trim(),
      "tandem: TANDEM_GEMM_BLOCKS: nc 100 is not a multiple of 8 in [256, 8192]; using the blocks `deno task tune` measured instead",
    );
  });
  assert.throws(() => new CpuBackend({ gemmBlocks: { mc: 96, nc: 100 } }), {
    name: "RangeError",
    message: "GEMM blocks: nc 100 is not a multiple of 8 in [256, 8192]",
  });
});

Deno.test("GEMM blocks: the FC forward product reads W in place in the chosen rows, or packs it with 0", () => {
  // Which kernels run, counted through the exports: the choice is honoured, and the bits (same in
  // any choice) are checked in the next test. Mutation seen failing: the driver ignoring
  // inPlaceRows (always 6 rows).
  const memory = new WebAssembly.Memory({ initial: 512, maximum: 1024 });
  const exports = instantiateKernels(
    new WebAssembly.Module(kernelModuleBytes({ fma: false, shared: false })),
    memory,
  );
  const calls: Record<string, number> = {};
  const counted = Object.fromEntries(
    ["gemm_macro", "gemm_macro_rows5", "gemm_macro_rows6", "gemm_pack_b"].map((name) => {
      const f = (exports as unknown as Record<string, (...args: number[]) => void>)[name];
      return [name, (...args: number[]) => {
        calls[name] = (calls[name] ?? 0) + 1;
        f(...args);
      }];
    }),
  );
  const x = { ...exports, ...counted } as unknown as GemmExports;
  // X (8×600) · Wᵀ (W 30×600): W read in 5 or 6 rows per tile, or packed panel by panel.
  const [m, n, k] = [8, 30, 600];
  const problem = {
    m,
    n,
    k,
    a: 1 << 16,
    lda: k,
    transA: false,
    b: 1 << 18,
    ldb: k,
    transB: true,
    c: 1 << 20,
    ldc: n,
    accumulate: false,
  };
  const scratch = 1 << 21;
  for (
    const [inPlaceRows, expected] of [[6, "gemm_macro_rows6"], [5, "gemm_macro_rows5"], [
      0,
      "gemm_macro",
    ]] as const
  ) {
    const blocks = { ...DEFAULT_GEMM_BLOCKS, inPlaceRows };
    assert.ok(scratch + gemmScratchBytes(blocks) <= memory.buffer.byteLength);
    for (const name of Object.keys(calls)) delete calls[name];
    gemmBlocked(x, problem, scratch, blocks);
    assert.deepEqual(
      Object.keys(calls).filter((name) => name.startsWith("gemm_macro")),
      [expected],
      `inPlaceRows ${inPlaceRows}`,
    );
  }
  // In an L1-sized MC (24: 20 rows of A per block) a batch of 64 still counts as few rows
  // (`fewRows`): W read in place, or packed panel by panel with X whole in one block (every
  // gemm_pack_a call packs all 64 rows), never the KC × NC blocks. Mutation seen failing: the
  // path taken only while m ≤ blockRows, as before (the blocked loop: gemm_pack_a for 20 rows).
  const small = { ...problem, m: 64 };
  const packedRows: number[] = [];
  const withRows = watching(x, "gemm_pack_a", (args) => packedRows.push(args[3]));
  for (
    const [inPlaceRows, expected] of [[6, "gemm_macro_rows6"], [0, "gemm_macro"]] as const
  ) {
    const blocks = { mc: 24, nc: 1024, inPlaceRows };
    assert.ok(scratch + gemmScratchBytes(blocks) <= memory.buffer.byteLength);
    for (const name of Object.keys(calls)) delete calls[name];
    packedRows.length = 0;
    gemmBlocked(withRows, small, scratch, blocks);
    assert.deepEqual(
      Object.keys(calls).filter((name) => name.startsWith("gemm_macro")),
      [expected],
      `MC 24, inPlaceRows ${inPlaceRows}`,
    );
    assert.deepEqual(packedRows, inPlaceRows === 0 ? [64, 64, 64] : [], `MC 24, inPlaceRows ${inPlaceRows}`);
  }
  // Without the fused multiply-add each product needs a temporary register and 6 rows would spill,
  // so such kernels take 5 (mutation seen failing: the rule removed).
  const plain = WasmKernels.create({
    threads: 1,
    fma: false,
    blocks: { ...DEFAULT_GEMM_BLOCKS, inPlaceRows: 6 },
  })!;
  assert.deepEqual([plain.fma, plain.blocks.inPlaceRows], [false, 5]);
  assert.equal(kernelBlocks({ ...DEFAULT_GEMM_BLOCKS, inPlaceRows: 6 }, true).inPlaceRows, 6);
  assert.equal(kernelBlocks({ ...DEFAULT_GEMM_BLOCKS, inPlaceRows: 0 }, false).inPlaceRows, 0);
});

Deno.test("GEMM blocks: a product with few rows packs B in the few rows' NC, any other in NC", () => {
  // The macro-kernel's column counts, recorded through the exports: the choice is honoured (its
  // bits, the same in any blocks, are checked in the next test). Mutation seen failing: the driver
  // ignoring fewRowsNc (every product in NC).
  const memory = new WebAssembly.Memory({ initial: 512, maximum: 1024 });
  const exports = instantiateKernels(
    new WebAssembly.Module(kernelModuleBytes({ fma: false, shared: false })),
    memory,
  );
  const columns: number[] = [];
  const x = watching(exports, "gemm_macro", (args) => columns.push(args[4]));
  const blocks = { mc: 48, nc: 1024, fewRowsNc: 256 };
  const scratch = 1 << 22;
  assert.ok(scratch + gemmScratchBytes(blocks) <= memory.buffer.byteLength);
  // fewRows is 128 here: 64 rows are few (B in 256-column blocks), 200 are not (1024).
  // 45 rows per block (MC 48 in MR-row panels): 2 blocks of the 64 rows, 5 of the 200.
  const repeat = (columns: number, times: number) => Array<number>(times).fill(columns);
  for (
    const [m, expected] of [
      [64, [...repeat(256, 10), 24, 24]],
      [200, [...repeat(1024, 5), ...repeat(280, 5)]],
    ] as const
  ) {
    const [n, k] = [1304, 40];
    columns.length = 0;
    gemmBlocked(
      x,
      {
        m,
        n,
        k,
        a: 1 << 16,
        lda: k,
        transA: false,
        b: 1 << 18,
        ldb: n,
        transB: false,
        c: 1 << 20,
        ldc: n,
        accumulate: false,
      },
      scratch,
      blocks,
    );
    assert.deepEqual(columns, expected, `m ${m}`);
  }
});

const TRANSPOSES: [boolean, boolean][] = [[false, false], [true, false], [false, true], [true, true]];

function spec(m: number, n: number, k: number, transA: boolean, transB: boolean): MatmulSpec {
  return { batch: 1, m, n, k, transA, transB, aBatchStride: 0, bBatchStride: 0 };
}

Deno.test("GEMM blocks: products and convolutions have the same bits in any blocks, on 1 and 2 threads", async () => {
  const choices: GemmBlocks[] = [
    DEFAULT_GEMM_BLOCKS,
    { mc: 12, nc: 256, inPlaceRows: 5 },
    {
      mc: 480,
      nc: 8192,
      inPlaceRows: 0,
    },
    { mc: 36, nc: 520 },
    { mc: 96, nc: 2048, inPlaceRows: 5 },
    { mc: 96, nc: 2048, inPlaceRows: 0 },
    // W packed panel by panel with more rows of X than one MC block holds (m 64 > 20).
    { mc: 24, nc: 1024, inPlaceRows: 0 },
    // Few rows (m 7 and 64, and the convolutions' 40 and 12 output channels per group) in other
    // column blocks than the rest.
    { mc: 96, nc: 2048, fewRowsNc: 256 },
    { mc: 12, nc: 256, inPlaceRows: 5, fewRowsNc: 520 },
  ];
  // Shapes crossing every block: m past 12, 36 and 96 rows, n past 256 and 520 columns, k past KC;
  // a few-row deep product with transposed B (W read in place in 6 or 5 rows, or packed, while
  // m ≤ fewRows: 128 or MC; blocked otherwise).
  const shapes: [number, number, number][] = [[130, 601, 530], [64, 300, 4133], [7, 1100, 300]];
  const convs = [
    conv2dGeometry([4, 16, 13, 13], [40, 16, 3, 3], { padding: 1 }),
    conv2dGeometry([3, 12, 9, 9], [24, 6, 5, 5], { padding: 2, groups: 2 }),
    // 576 output columns per image, past the 256- and 520-column blocks: its packed columns start
    // inside the image (few rows, 8 filters, so in the few rows' NC where one is set).
    conv2dGeometry([2, 3, 24, 24], [8, 3, 3, 3], { padding: 1 }),
  ];
  const operands = shapes.map(([m, n, k]) => ({ a: randomArray(m * k), b: randomArray(k * n) }));
  const convOperands = convs.map((g) => ({
    x: randomArray(g.batch * g.inChannels * g.inHeight * g.inWidth),
    w: randomArray(g.outChannels * (g.inChannels / g.groups) * g.kernelH * g.kernelW),
    dy: randomArray(g.batch * g.outChannels * g.outHeight * g.outWidth),
  }));
  let reference: Float32Array[] | undefined;
  for (const blocks of choices) {
    for (const threads of [1, 2]) {
      const kernels = WasmKernels.create({ threads, blocks })!;
      try {
        assert.deepEqual(kernels.blocks, kernelBlocks(blocks, kernels.fma));
        assert.equal(await kernels.startThreads(), threads);
        const results: Float32Array[] = [];
        shapes.forEach(([m, n, k], i) => {
          for (const [transA, transB] of TRANSPOSES) {
            const out = new Float32Array(m * n).fill(NaN);
            assert.ok(kernels.matmul(operands[i].a, operands[i].b, out, spec(m, n, k, transA, transB)));
            results.push(out);
          }
        });
        convs.forEach((g, i) => {
          const { x, w, dy } = convOperands[i];
          const y = new Float32Array(dy.length).fill(NaN), dx = new Float32Array(x.length).fill(NaN);
          const dw = new Float32Array(w.length).fill(NaN);
          assert.ok(kernels.conv2dForward(x, w, y, g));
          assert.ok(kernels.conv2dBackwardInput(dy, w, dx, g));
          assert.ok(kernels.conv2dBackwardFilter(x, dy, dw, g));
          results.push(y, dx, dw);
        });
        if (!reference) {
          // The reference itself is right: the first product against a float64 dot product.
          const [m, n, k] = shapes[0], { a, b } = operands[0];
          for (const [i, j] of [[0, 0], [m - 1, n - 1], [77, 333]]) {
            let dot = 0;
            for (let p = 0; p < k; p++) dot += a[i * k + p] * b[p * n + j];
            assert.ok(Math.abs(results[0][i * n + j] - dot) < 1e-4, `C[${i},${j}]`);
          }
          assert.ok(results.every((r) => r.every(Number.isFinite)), "every output written");
          reference = results;
        } else {
          results.forEach((r, i) =>
            assertSameBits(
              r,
              reference![i],
              `MC ${blocks.mc} NC ${blocks.nc}, ${threads} threads, output ${i}`,
            )
          );
        }
      } finally {
        kernels.dispose();
      }
    }
  }
});
