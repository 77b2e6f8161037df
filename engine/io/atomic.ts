/**
 * Crash-safe file replacement: write a temporary file next to the target, flush it to disk, then
 * rename it over the target. A rename within one directory is atomic on POSIX file systems (and
 * `MoveFileEx` replaces atomically on NTFS), so readers see either the old file or the complete new
 * one, never a torn write, even if the process dies or the disk fills mid-write.
 *
 * @module
 */

/** Splits `path` into its directory (`"."` when none) and file name. */
function splitPath(path: string): [string, string] {
  const cut = Math.max(path.lastIndexOf("/"), Deno.build.os === "windows" ? path.lastIndexOf("\\") : -1);
  if (cut < 0) return [".", path];
  return [cut === 0 ? path.slice(0, 1) : path.slice(0, cut), path.slice(cut + 1)];
}

async function writeAll(file: Deno.FsFile, bytes: Uint8Array): Promise<void> {
  let written = 0;
  while (written < bytes.length) written += await file.write(bytes.subarray(written));
}

/**
 * Replaces the file at `path` with the concatenation of `chunks`, atomically: the bytes go to a
 * temporary file in the same directory (`.<name>.tmp-<uuid>`), which is fsynced and then renamed over
 * `path`; the directory is fsynced afterwards where the platform allows, so the rename itself survives
 * a power loss. If anything fails (including the chunk source throwing midway) the temporary file is
 * removed, `path` is left as it was, and the error is rethrown.
 *
 * @example
 * ```ts
 * import { writeFileAtomic } from "./atomic.ts";
 * const path = await Deno.makeTempFile();
 * await writeFileAtomic(path, [new TextEncoder().encode("hello")]);
 * ```
 */
export async function writeFileAtomic(
  path: string,
  chunks: Iterable<Uint8Array> | AsyncIterable<Uint8Array>,
): Promise<void> {
  const [directory, name] = splitPath(path);
  const temporary = `${directory}/.${name}.tmp-${crypto.randomUUID()}`;
  let file: Deno.FsFile | undefined;
  try {
    file = await Deno.open(temporary, { write: true, createNew: true, mode: 0o644 });
    for await (const chunk of chunks) await writeAll(file, chunk);
    await file.sync();
    file.close();
    file = undefined;
    await Deno.rename(temporary, path);
  } catch (error) {
    try {
      file?.close();
    } catch {
      // Already closed; the removal below is what matters.
    }
    await Deno.remove(temporary).catch(() => {});
    throw error;
  }
  await syncDirectory(directory);
}

/** Makes a rename in `directory` durable; a no-op where directories cannot be opened (Windows). */
async function syncDirectory(directory: string): Promise<void> {
  let handle: Deno.FsFile | undefined;
  try {
    handle = await Deno.open(directory, { read: true });
    await handle.sync();
  } catch {
    // Durability of the rename is best effort; the data itself was already synced.
  } finally {
    handle?.close();
  }
}
