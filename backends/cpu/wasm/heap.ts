/**
 * Allocation inside the kernels' WebAssembly memory, so the CPU backend's tensors can live where
 * the kernels (and their threads) read them: a GEMM or convolution on resident operands copies
 * nothing in or out.
 *
 * Blocks are 64-byte aligned (whole cache lines: no two threads' outputs share one). Free blocks
 * sit in an address-ordered list, merged with their neighbours, and a freed block at the top
 * lowers it, so a training loop's steady alternation of the same sizes reuses the same memory.
 * Memory grows on demand (by at least a quarter, so growth is rare) up to a limit; past it
 * {@link KernelHeap.allocate} returns `undefined` and callers use ordinary arrays.
 *
 * @module
 */

const ALIGN = 64;
const PAGE = 65536;

/**
 * A first-fit allocator over a `WebAssembly.Memory`.
 *
 * @example
 * ```ts
 * import { KernelHeap } from "./heap.ts";
 * const memory = new WebAssembly.Memory({ initial: 1, maximum: 256 });
 * const heap = new KernelHeap(memory, 256 * 65536);
 * const at = heap.allocate(1000)!; // a byte address, 64-byte aligned
 * heap.free(at, 1000);
 * ```
 */
export class KernelHeap {
  /** Free blocks as [address, bytes], in address order, never adjacent (merged on free). */
  readonly #free: [number, number][] = [];
  #top: number;

  /** Manages `memory` from byte `start` up to `limitBytes`. */
  constructor(readonly memory: WebAssembly.Memory, readonly limitBytes: number, start = ALIGN) {
    this.#top = align(start);
  }

  /** Bytes below the highest block in use (free blocks included). */
  get usedBytes(): number {
    return this.#top;
  }

  /** Free bytes inside {@link KernelHeap.usedBytes}. */
  get freeBytes(): number {
    return this.#free.reduce((sum, [, bytes]) => sum + bytes, 0);
  }

  /** A block of at least `bytes` bytes, or `undefined` past the limit. */
  allocate(bytes: number): number | undefined {
    const size = align(Math.max(bytes, 1));
    for (let i = 0; i < this.#free.length; i++) {
      const [at, available] = this.#free[i];
      if (available < size) continue;
      if (available === size) this.#free.splice(i, 1);
      else this.#free[i] = [at + size, available - size];
      return at;
    }
    const at = this.#top, end = at + size;
    if (end > this.limitBytes) return undefined;
    const have = this.memory.buffer.byteLength;
    if (end > have) {
      const wanted = Math.min(this.limitBytes, Math.max(end, have + (have >> 2)));
      try {
        this.memory.grow(Math.ceil((wanted - have) / PAGE));
      } catch {
        return undefined;
      }
    }
    this.#top = end;
    return at;
  }

  /** Returns a block from {@link KernelHeap.allocate} (with the size asked for then). */
  free(address: number, bytes: number): void {
    let start = address, size = align(Math.max(bytes, 1));
    // Insertion point: first free block above the address.
    let lo = 0, hi = this.#free.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.#free[mid][0] < address) lo = mid + 1;
      else hi = mid;
    }
    const before = this.#free[lo - 1], after = this.#free[lo];
    let index = lo;
    if (before && before[0] + before[1] === start) {
      start = before[0];
      size += before[1];
      index = lo - 1;
      this.#free.splice(index, 1);
    }
    if (after && start + size === after[0]) {
      size += after[1];
      this.#free.splice(index, 1);
    }
    if (start + size === this.#top) this.#top = start;
    else this.#free.splice(index, 0, [start, size]);
  }
}

function align(bytes: number): number {
  return Math.ceil(bytes / ALIGN) * ALIGN;
}
