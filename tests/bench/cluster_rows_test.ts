/**
 * `bench:cluster --rows FILE` refuses a file it cannot write in one line, with exit status 2, before
 * any work: no peak probe, no hosts, no report written. Mutation tried: without the early check the run
 * started (peak probe, hosts, transfers) and failed 42 s later on its first row, exit status 1, and this
 * test failed; the minute's guard below stops a run that would go on.
 */
import assert from "node:assert/strict";

Deno.test("bench:cluster --rows: an unwritable file is refused in one line before any work", async () => {
  const script = new URL("../../bench/cluster/report.ts", import.meta.url).pathname;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", script, "--rows", "/nonexistent-dir/rows.jsonl"],
    stdout: "piped",
    stderr: "piped",
    // A guard, not a speed assert: a run that does not refuse goes on for an hour; SIGTERM stops it
    // and removes any hosts it built.
    signal: AbortSignal.timeout(60_000),
  }).output();
  const stderr = new TextDecoder().decode(out.stderr).trim();
  assert.equal(out.code, 2);
  assert.equal(new TextDecoder().decode(out.stdout), "");
  assert.equal(stderr.split("\n").length, 1, stderr);
  assert.match(stderr, /^bench:cluster: --rows: cannot write "\/nonexistent-dir\/rows\.jsonl": /);
});
