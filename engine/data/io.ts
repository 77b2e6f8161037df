/**
 * File helpers shared by the dataset readers: chunked reads of plain or gzip files, sizes and paths,
 * and atomic writes. Internal to the data layer (not re-exported by its `mod.ts`).
 *
 * Readers pull fixed-size chunks into preallocated typed arrays, so reading a 150 MB dataset never
 * builds a JS array per pixel and peaks at one copy of the data.
 *
 * @module
 */

import { DataError } from "./errors.ts";

/** Bytes pulled per read; large enough to amortise syscalls, small enough to stay cache-friendly. */
export const CHUNK_BYTES = 1 << 20;

/**
 * `dir/name` with exactly one separator.
 *
 * @example
 * ```ts
 * import { joinPath } from "./io.ts";
 * console.log(joinPath("data/", "x.bin")); // "data/x.bin"
 * ```
 */
export function joinPath(dir: string, name: string): string {
  if (dir === "") return name;
  return dir.endsWith("/") || dir.endsWith("\\") ? dir + name : `${dir}/${name}`;
}

/**
 * Whether `path` names an existing regular file.
 *
 * @example
 * ```ts
 * import { isFile } from "./io.ts";
 * console.log(await isFile("deno.json"));
 * ```
 */
export async function isFile(path: string): Promise<boolean> {
  try {
    return (await Deno.stat(path)).isFile;
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return false;
    throw error;
  }
}

/**
 * The size of the file at `path`; a {@link DataError} naming the file when it is missing or not a file.
 *
 * @example
 * ```ts
 * import { fileSize } from "./io.ts";
 * console.log(await fileSize("deno.json"));
 * ```
 */
export async function fileSize(path: string): Promise<number> {
  let info: Deno.FileInfo;
  try {
    info = await Deno.stat(path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) throw new DataError(path, "file not found");
    throw error;
  }
  if (!info.isFile) throw new DataError(path, "expected a regular file, found a directory or special file");
  return info.size;
}

/** A sequential source of bytes (a plain file or a gzip stream). */
export interface ByteReader {
  /** The file the bytes come from, for messages. */
  readonly path: string;
  /** Whether the file is gzip-compressed (so its size on disk says nothing about its content). */
  readonly gzip: boolean;
  /** The size on disk. */
  readonly fileBytes: number;
  /** Bytes delivered so far (decompressed bytes for gzip). */
  readonly position: number;
  /** Fills `target` from the stream; returns how many bytes it wrote (fewer only at end of data). */
  readFull(target: Uint8Array): Promise<number>;
  /** Releases the file; safe to call twice. */
  close(): Promise<void>;
}

/**
 * Opens `path` for sequential reading, decompressing gzip transparently (detected by its magic
 * bytes 1f 8b, not by the name, so a mislabelled file still reads) through the built-in
 * `DecompressionStream`.
 *
 * @example
 * ```ts
 * import { openBytes } from "./io.ts";
 * const reader = await openBytes("deno.json");
 * const head = new Uint8Array(4);
 * await reader.readFull(head);
 * await reader.close();
 * ```
 */
export async function openBytes(path: string): Promise<ByteReader> {
  const fileBytes = await fileSize(path);
  const file = await Deno.open(path, { read: true });
  const magic = new Uint8Array(2);
  let got = 0;
  try {
    while (got < 2) {
      const n = await file.read(magic.subarray(got));
      if (n === null) break;
      got += n;
    }
    await file.seek(0, Deno.SeekMode.Start);
  } catch (error) {
    file.close();
    throw error;
  }
  if (got === 2 && magic[0] === 0x1f && magic[1] === 0x8b) return gzipReader(path, file, fileBytes);
  return plainReader(path, file, fileBytes);
}

function plainReader(path: string, file: Deno.FsFile, fileBytes: number): ByteReader {
  let closed = false;
  let position = 0;
  return {
    path,
    gzip: false,
    fileBytes,
    get position(): number {
      return position;
    },
    async readFull(target: Uint8Array): Promise<number> {
      let filled = 0;
      while (filled < target.length) {
        const n = await file.read(target.subarray(filled));
        if (n === null) break;
        filled += n;
        position += n;
      }
      return filled;
    },
    close(): Promise<void> {
      if (!closed) {
        closed = true;
        file.close();
      }
      return Promise.resolve();
    },
  };
}

function gzipReader(path: string, file: Deno.FsFile, fileBytes: number): ByteReader {
  const reader = file.readable.pipeThrough(new DecompressionStream("gzip")).getReader();
  let pending: Uint8Array = new Uint8Array(0);
  let done = false;
  let closed = false;
  let position = 0;
  return {
    path,
    gzip: true,
    fileBytes,
    get position(): number {
      return position;
    },
    async readFull(target: Uint8Array): Promise<number> {
      let filled = 0;
      while (filled < target.length) {
        if (pending.length === 0) {
          if (done) break;
          let result: ReadableStreamReadResult<Uint8Array>;
          try {
            result = await reader.read();
          } catch (error) {
            done = true;
            throw new DataError(path, `corrupt or truncated gzip data: ${(error as Error).message}`);
          }
          if (result.done) {
            done = true;
            break;
          }
          pending = result.value;
          continue;
        }
        const n = Math.min(pending.length, target.length - filled);
        target.set(pending.subarray(0, n), filled);
        pending = pending.subarray(n);
        filled += n;
        position += n;
      }
      return filled;
    },
    async close(): Promise<void> {
      if (closed) return;
      closed = true;
      // Cancelling the decompressor also cancels file.readable, which closes the file.
      try {
        await reader.cancel();
      } catch {
        // Already errored streams reject cancel; the file is closed either way.
      }
    },
  };
}
