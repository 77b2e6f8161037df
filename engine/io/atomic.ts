/**
 * Crash-safe output files: where a path really points ({@link resolveOutputPath}), whether it can be
 * written ({@link checkOutputPath}), and replacing it atomically ({@link writeFileAtomic}): a
 * temporary file next to the target, flushed to disk, then renamed over it. A rename within one
 * directory is atomic on POSIX file systems (and `MoveFileEx` replaces atomically on NTFS), so readers
 * see either the old file or the complete new one, never a torn write, even if the process dies or
 * the disk fills mid-write.
 *
 * @module
 */

import { OutputPathError } from "./errors.ts";

/** Where an output path leads, after following symbolic links. */
export interface OutputTarget {
  /** The file written: `path` itself, or the end of its chain of symbolic links. */
  path: string;
  /**
   * `file`: an existing regular file, replaced atomically; `new`: nothing there yet, created
   * atomically; `device`: a character or block device or a FIFO, written in place and never
   * replaced (`/dev/null`, `/dev/stdout`, a named pipe).
   */
  kind: "file" | "new" | "device";
}

/** Symbolic links followed before giving up (Linux's own limit). */
const MAX_LINKS = 40;

/** Read when a path is split, not at import: the engine also loads in browsers, which have no `Deno`. */
const isWindows = () => globalThis.Deno?.build.os === "windows";

/** Splits `path` into its directory (`"."` when none) and file name. */
function splitPath(path: string): [string, string] {
  const cut = Math.max(path.lastIndexOf("/"), isWindows() ? path.lastIndexOf("\\") : -1);
  if (cut < 0) return [".", path];
  return [cut === 0 ? path.slice(0, 1) : path.slice(0, cut), path.slice(cut + 1)];
}

function isAbsolute(path: string): boolean {
  return path.startsWith("/") || (isWindows() && /^([a-zA-Z]:)?[\\/]/.test(path));
}

/** A file-system failure as a one-line {@link OutputPathError} about `path`. */
function cannot(path: string, what: string, error: unknown): OutputPathError {
  if (error instanceof OutputPathError) return error;
  return new OutputPathError(path, `${what} (${(error as Error).message})`, { cause: error });
}

/**
 * Follows `path` through any symbolic links and says what it ends at. Refuses, with an {@link OutputPathError}, an empty path, a
 * directory, a socket, a parent that is not a directory, and a loop of links. A missing parent
 * directory is not refused here (see {@link checkOutputPath}).
 *
 * @example
 * ```ts
 * import { resolveOutputPath } from "./atomic.ts";
 * console.log(await resolveOutputPath("/dev/null")); // { path: "/dev/null", kind: "device" }
 * ```
 */
export async function resolveOutputPath(path: string): Promise<OutputTarget> {
  if (path === "") throw new OutputPathError(path, "empty path; expected a file path");
  let info: Deno.FileInfo;
  try {
    // stat follows every link the way open does, magic ones too (/dev/stdout -> /proc/self/fd/1).
    info = await Deno.stat(path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return { path: await danglingEnd(path), kind: "new" };
    if (error instanceof Deno.errors.NotADirectory) {
      throw new OutputPathError(path, "a parent in the path is not a directory; expected a directory");
    }
    throw cannot(path, "cannot inspect the path", error);
  }
  if (info.isCharDevice || info.isBlockDevice || info.isFifo) return { path, kind: "device" };
  const real = info.isFile || info.isDirectory ? await Deno.realPath(path) : path;
  const via = (await Deno.lstat(path)).isSymlink ? ` (through symbolic links: ${real})` : "";
  if (info.isFile) return { path: real, kind: "file" };
  if (info.isDirectory) throw new OutputPathError(path, `is a directory${via}; expected a file path`);
  throw new OutputPathError(path, `is neither a file nor a device${via} (a socket?); expected a file path`);
}

/**
 * Where a write to the missing `path` creates its file: `path` itself, or the missing end of its chain
 * of symbolic links (relative targets are read against the link's own directory), as `open` would.
 */
async function danglingEnd(path: string): Promise<string> {
  let current = path;
  for (let links = 0; links <= MAX_LINKS; links++) {
    let isLink = false;
    try {
      isLink = (await Deno.lstat(current)).isSymlink;
    } catch {
      return current;
    }
    if (!isLink) return current;
    const link = await Deno.readLink(current);
    current = isAbsolute(link) ? link : `${splitPath(current)[0]}/${link}`;
  }
  throw new OutputPathError(path, `more than ${MAX_LINKS} symbolic links (a loop?); expected a file`);
}

/**
 * Checks, without touching the target, that {@link writeFileAtomic} could write `path`: it resolves
 * (see {@link resolveOutputPath}), its directory exists and is a directory, and a probe file can be
 * created and removed there (named like a temporary file, so a killed probe is cleaned up by the next
 * write). A device is opened for writing and closed; a FIFO is not opened (that would wait for a
 * reader). Throws an {@link OutputPathError} saying what was found; returns the target.
 *
 * @example
 * ```ts
 * import { checkOutputPath } from "./atomic.ts";
 * const dir = await Deno.makeTempDir();
 * console.log((await checkOutputPath(`${dir}/run.safetensors`)).kind); // "new"
 * ```
 */
export async function checkOutputPath(path: string): Promise<OutputTarget> {
  const target = await resolveOutputPath(path);
  if (target.kind === "device") {
    if (!(await Deno.stat(target.path)).isFifo) {
      try {
        (await Deno.open(target.path, { write: true })).close();
      } catch (error) {
        throw cannot(path, `cannot open ${target.path} for writing`, error);
      }
    }
    return target;
  }
  const [directory, name] = splitPath(target.path);
  let isDirectory = false;
  try {
    isDirectory = (await Deno.stat(directory)).isDirectory;
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) {
      throw new OutputPathError(path, `directory ${directory} does not exist; create it first`);
    }
    throw cannot(path, `cannot inspect directory ${directory}`, error);
  }
  if (!isDirectory) throw new OutputPathError(path, `${directory} is not a directory; expected a directory`);
  const probe = temporaryName(directory, name);
  try {
    (await Deno.open(probe, { write: true, createNew: true, mode: 0o644 })).close();
    await Deno.remove(probe);
  } catch (error) {
    throw cannot(path, `cannot create files in ${directory}`, error);
  }
  return target;
}

function temporaryName(directory: string, name: string): string {
  return `${directory}/.${name}.tmp-${crypto.randomUUID()}`;
}

/** Exactly the temporary files {@link writeFileAtomic} makes for `name` (a v4 UUID suffix). */
function temporaryPattern(name: string): RegExp {
  const escaped = name.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  return new RegExp(
    `^\\.${escaped}\\.tmp-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`,
  );
}

/**
 * Removes temporary files an earlier, killed write of `name` left in `directory` (they can be as
 * large as a checkpoint). Only regular files named exactly as {@link writeFileAtomic} names them for
 * `name`; best effort, as a file that cannot be removed does not stop this write.
 */
async function removeStaleTemporaries(directory: string, name: string): Promise<void> {
  const pattern = temporaryPattern(name);
  try {
    for await (const entry of Deno.readDir(directory)) {
      if (entry.isFile && pattern.test(entry.name)) {
        await Deno.remove(`${directory}/${entry.name}`).catch(() => {});
      }
    }
  } catch {
    // An unreadable directory: the write itself will say what is wrong.
  }
}

async function writeAll(file: Deno.FsFile, bytes: Uint8Array, path: string): Promise<void> {
  let written = 0;
  try {
    while (written < bytes.length) written += await file.write(bytes.subarray(written));
  } catch (error) {
    throw cannot(path, "cannot write", error);
  }
}

/**
 * Writes the concatenation of `chunks` to `path`. A symbolic link is followed and its target
 * written, so the link stays a link. A regular file (or a new one) is replaced atomically: the bytes
 * go to a temporary file in the target's directory (`.<name>.tmp-<uuid>`), which is fsynced and then
 * renamed over the target; the directory is fsynced afterwards where the platform allows, so the
 * rename itself survives a power loss. Temporary files of an earlier, killed write to the same target
 * are removed first. A device or FIFO (`/dev/null`) is written in place, never replaced. A directory
 * is refused.
 *
 * If anything fails (including the chunk source throwing midway) the temporary file is removed and
 * the target is left as it was. Errors of the chunk source are rethrown as they are; those of the file
 * system become an {@link OutputPathError} naming `path`. Two processes writing one path at the same
 * time are not supported (each may remove the other's temporary file).
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
  const target = await resolveOutputPath(path);
  if (target.kind === "device") return await writeInPlace(path, target.path, chunks);
  const [directory, name] = splitPath(target.path);
  await removeStaleTemporaries(directory, name);
  const temporary = temporaryName(directory, name);
  let file: Deno.FsFile | undefined;
  try {
    try {
      file = await Deno.open(temporary, { write: true, createNew: true, mode: 0o644 });
    } catch (error) {
      throw cannot(path, `cannot create a file in ${directory}`, error);
    }
    for await (const chunk of chunks) await writeAll(file, chunk, path);
    try {
      await file.sync();
      file.close();
      file = undefined;
      await Deno.rename(temporary, target.path);
    } catch (error) {
      throw cannot(path, "cannot write", error);
    }
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

/** Writes a device or FIFO as it is: no temporary file, no rename, no truncation, no fsync. */
async function writeInPlace(
  path: string,
  device: string,
  chunks: Iterable<Uint8Array> | AsyncIterable<Uint8Array>,
): Promise<void> {
  let file: Deno.FsFile;
  try {
    file = await Deno.open(device, { write: true });
  } catch (error) {
    throw cannot(path, `cannot open ${device} for writing`, error);
  }
  try {
    for await (const chunk of chunks) await writeAll(file, chunk, path);
  } finally {
    file.close();
  }
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
