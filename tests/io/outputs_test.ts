/**
 * Output paths (engine/io/atomic.ts): symbolic links are followed and their targets replaced,
 * devices and FIFOs are written in place and never replaced, directories are refused, and stale
 * temporary files of a killed write are removed at the next write to the same path.
 */

import assert from "node:assert/strict";
import { TandemError } from "../../mod.ts";
import { checkOutputPath, OutputPathError, resolveOutputPath, writeFileAtomic } from "../../engine/io/mod.ts";

const encode = (text: string) => new TextEncoder().encode(text);
const root = Deno.uid() === 0;

async function inTempDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.realPath(await Deno.makeTempDir({ prefix: "tandem_outputs_test_" }));
  try {
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

async function listDir(dir: string): Promise<string[]> {
  const names: string[] = [];
  for await (const entry of Deno.readDir(dir)) names.push(entry.name);
  return names.sort();
}

// Mutation: renaming the temporary file over `path` instead of the resolved target (writeFileAtomic
// using `path` rather than `target.path`) replaces the link by a file and leaves the target stale,
// so this fails on `isSymlink` and on the target's bytes.
Deno.test("atomic writes: a symbolic link is followed, its target replaced, the link kept", async () => {
  await inTempDir(async (dir) => {
    await Deno.mkdir(`${dir}/runs`);
    await Deno.writeTextFile(`${dir}/runs/real.safetensors`, "old");
    // A relative link, read against the link's own directory, through a second link.
    await Deno.symlink("runs/real.safetensors", `${dir}/middle.safetensors`);
    await Deno.symlink(`${dir}/middle.safetensors`, `${dir}/latest.safetensors`);
    await writeFileAtomic(`${dir}/latest.safetensors`, [encode("new")]);
    assert.ok((await Deno.lstat(`${dir}/latest.safetensors`)).isSymlink);
    assert.ok((await Deno.lstat(`${dir}/middle.safetensors`)).isSymlink);
    assert.equal(await Deno.readTextFile(`${dir}/runs/real.safetensors`), "new");
    // The temporary file went to the target's directory and is gone.
    assert.deepEqual(await listDir(`${dir}/runs`), ["real.safetensors"]);
    assert.deepEqual(await listDir(dir), ["latest.safetensors", "middle.safetensors", "runs"]);

    // A dangling link: the write creates its target, as `echo > link` would.
    await Deno.symlink("runs/fresh.json", `${dir}/dangling.json`);
    await writeFileAtomic(`${dir}/dangling.json`, [encode("{}")]);
    assert.ok((await Deno.lstat(`${dir}/dangling.json`)).isSymlink);
    assert.equal(await Deno.readTextFile(`${dir}/runs/fresh.json`), "{}");

    // A link to a directory is refused like the directory, naming the path given.
    await Deno.symlink("runs", `${dir}/to-dir`);
    await assert.rejects(
      writeFileAtomic(`${dir}/to-dir`, [encode("x")]),
      (e: Error) =>
        e instanceof OutputPathError && e.message.startsWith(`${dir}/to-dir: is a directory`) &&
        e.message.includes(`${dir}/runs`) && !e.message.includes("\n"),
    );
  });
});

// Mutation: dropping the `kind === "device"` branch of writeFileAtomic (writing through a temporary
// file and a rename) replaces the FIFO and the device node by regular files, so `isFifo` and
// `isCharDevice` fail. (Tried on the FIFO and the private device nodes only, never on /dev/null.)
Deno.test("atomic writes: a FIFO and device nodes are written in place, never replaced", async () => {
  await inTempDir(async (dir) => {
    const fifo = `${dir}/pipe`;
    const made = await new Deno.Command("mkfifo", { args: [fifo] }).output();
    assert.ok(made.success, "mkfifo failed");
    // A second name for the FIFO, to release the reader should a broken write replace `pipe`.
    await Deno.link(fifo, `${dir}/spare`);
    // The reader must open the FIFO before the writer's open returns.
    const reader = Deno.readTextFile(fifo);
    await writeFileAtomic(fifo, [encode("through "), encode("the pipe")]);
    const stillFifo = (await Deno.lstat(fifo)).isFifo;
    if (!stillFifo) (await Deno.open(`${dir}/spare`, { write: true })).close();
    assert.ok(stillFifo, "the FIFO was replaced");
    assert.equal(await reader, "through the pipe");
    await Deno.remove(`${dir}/spare`);
    assert.equal((await resolveOutputPath(fifo)).kind, "device");

    await writeFileAtomic("/dev/null", [encode("nothing")]);
    assert.ok((await Deno.lstat("/dev/null")).isCharDevice);

    if (!root) {
      console.log("atomic writes: not root, skipping the private /dev/null and /dev/full nodes");
      return;
    }
    // Private copies of /dev/null (1, 3) and /dev/full (1, 7), so a broken build replaces these.
    for (const [name, minor] of [["null", "3"], ["full", "7"]]) {
      const node = await new Deno.Command("mknod", { args: [`${dir}/${name}`, "c", "1", minor] }).output();
      assert.ok(node.success, `mknod ${name} failed`);
    }
    await writeFileAtomic(`${dir}/null`, [encode("gone")]);
    assert.ok((await Deno.lstat(`${dir}/null`)).isCharDevice);
    // A full device: the write fails with one line naming the path, and the node stays a node.
    await assert.rejects(
      writeFileAtomic(`${dir}/full`, [encode("does not fit")]),
      (e: Error) =>
        e instanceof OutputPathError && e instanceof TandemError &&
        e.message.startsWith(`${dir}/full: cannot write`) && /no space/i.test(e.message) &&
        !e.message.includes("\n"),
    );
    assert.ok((await Deno.lstat(`${dir}/full`)).isCharDevice);
    assert.deepEqual(await listDir(dir), ["full", "null", "pipe"]);
  });
});

// Mutation: dropping the `isDirectory` refusal in resolveOutputPath makes the write fail later, in
// the rename, with the file system's words instead of "is a directory", so the message check fails.
Deno.test("atomic writes: a directory or an empty path is refused, naming the path", async () => {
  await inTempDir(async (dir) => {
    await assert.rejects(
      writeFileAtomic(dir, [encode("x")]),
      (e: Error) =>
        e instanceof OutputPathError && e.message === `${dir}: is a directory; expected a file path`,
    );
    await assert.rejects(
      writeFileAtomic("", [encode("x")]),
      (e: Error) => e instanceof OutputPathError && e.message === '"": empty path; expected a file path',
    );
    assert.deepEqual(await listDir(dir), []);
  });
});

// Mutation: not calling removeStaleTemporaries leaves the stale file; loosening its pattern to any
// `.<name>.tmp-` prefix removes the decoys. Either makes this fail.
Deno.test("atomic writes: stale temporary files of the same name are removed, nothing else", async () => {
  await inTempDir(async (dir) => {
    const uuid = crypto.randomUUID();
    const stale = [`.run.safetensors.tmp-${uuid}`, `.run.safetensors.tmp-${crypto.randomUUID()}`];
    const decoys = [
      `.run.safetensors.tmp-${uuid}.keep`, // a suffix after the UUID
      `.run.safetensors.tmp-not-a-uuid`,
      `run.safetensors.tmp-${uuid}`, // no leading dot
      `.other.safetensors.tmp-${uuid}`, // another file's temporary
      `.run.safetensors.tmp-${uuid.toUpperCase()}`,
      `.runXsafetensors.tmp-${uuid}`, // "." in the name is not a wildcard
    ];
    for (const name of [...stale, ...decoys]) await Deno.writeTextFile(`${dir}/${name}`, "partial");
    // A directory of a stale name is not a file this module made.
    await Deno.mkdir(`${dir}/.run.safetensors.tmp-${crypto.randomUUID()}`);
    const kept = await listDir(dir);
    await writeFileAtomic(`${dir}/run.safetensors`, [encode("whole")]);
    assert.equal(await Deno.readTextFile(`${dir}/run.safetensors`), "whole");
    assert.deepEqual(
      await listDir(dir),
      [...kept.filter((name) => !stale.includes(name)), "run.safetensors"].sort(),
    );
  });
});

// Mutation: dropping the directory check of checkOutputPath (the probe then fails in the file
// system's words, not "does not exist"), or the NotADirectory branch of resolveOutputPath, makes this
// fail; so would touching the target instead of a probe (a file is left behind).
Deno.test("checkOutputPath: a missing or non-directory parent is refused; the target is not touched", async () => {
  await inTempDir(async (dir) => {
    await assert.rejects(
      checkOutputPath(`${dir}/missing/run.safetensors`),
      (e: Error) =>
        e instanceof OutputPathError &&
        e.message ===
          `${dir}/missing/run.safetensors: directory ${dir}/missing does not exist; create it first`,
    );
    await Deno.writeTextFile(`${dir}/file`, "");
    await assert.rejects(
      checkOutputPath(`${dir}/file/run.safetensors`),
      (e: Error) => e instanceof OutputPathError && e.message.includes("is not a directory"),
    );
    assert.deepEqual(await checkOutputPath(`${dir}/run.safetensors`), {
      path: `${dir}/run.safetensors`,
      kind: "new",
    });
    assert.deepEqual(await checkOutputPath("/dev/null"), { path: "/dev/null", kind: "device" });
    assert.deepEqual(await listDir(dir), ["file"]);
    if (root) {
      console.log("checkOutputPath: root writes anywhere, skipping the read-only directory");
      return;
    }
    await Deno.mkdir(`${dir}/locked`, { mode: 0o555 });
    await assert.rejects(
      checkOutputPath(`${dir}/locked/run.safetensors`),
      (e: Error) =>
        e instanceof OutputPathError && e.message.includes(`cannot create files in ${dir}/locked`),
    );
  });
});
