import assert from "node:assert/strict";
import { parseProcStat, readCpuTimes } from "../../schedule/mpi/cpu_use.ts";

// A 2-core /proc/stat: user 300, nice 10, system 120, idle 5000, iowait 70, irq 5, softirq 75, steal 40.
const STAT = [
  "cpu  300 10 120 5000 70 5 75 40 0 0",
  "cpu0 150 5 60 2500 35 3 40 20 0 0",
  "cpu1 150 5 60 2500 35 2 35 20 0 0",
  "intr 12345 0 0",
  "ctxt 999",
  "",
].join("\n");

// Mutations: counting iowait or steal as busy, or leaving softirq (the network stack's receive path)
// out of the kernel's part, fails this test; so does counting the `cpu` total line as a core.
Deno.test("parseProcStat: busy and kernel seconds at 100 ticks a second, and the cores listed", () => {
  const times = parseProcStat(STAT);
  assert.equal(times.cores, 2);
  assert.ok(Math.abs(times.busy - (300 + 10 + 120 + 5 + 75) / 100) < 1e-12, `busy ${times.busy}`);
  assert.ok(Math.abs(times.kernel - (120 + 5 + 75) / 100) < 1e-12, `kernel ${times.kernel}`);
  assert.throws(() => parseProcStat("intr 1 2 3\n"), /no cpu line/);
});

Deno.test("readCpuTimes: this machine's counters move forward while it works (where /proc/stat exists)", () => {
  const before = readCpuTimes();
  if (!before) {
    console.log("no /proc/stat here: skipped");
    return;
  }
  const until = performance.now() + 100;
  let x = 0;
  while (performance.now() < until) x += Math.sqrt(x + 1);
  const after = readCpuTimes()!;
  assert.ok(x > 0);
  assert.ok(after.cores >= 1);
  // 100 ms of spinning is about 10 ticks; some of them must land in the counters.
  assert.ok(after.busy - before.busy >= 0.05, `busy ${after.busy - before.busy} s over 100 ms of spinning`);
});
