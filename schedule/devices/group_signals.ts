/**
 * The "this group's gradients are final" signal between a CPU device's Worker and the runtime: one
 * shared `Int32Array` word per group, which the worker sets to `iteration + 1` (`Atomics.store`,
 * then `notify`) as each group's backward ends, and which the runtime awaits with
 * `Atomics.waitAsync`, so no message queue sits in the overlap path.
 *
 * @module
 */

/** Worker side: marks `slot`'s group final for `iteration` and wakes the runtime's watcher. */
export function signalGroup(signals: Int32Array, slot: number, iteration: number): void {
  Atomics.store(signals, slot, iteration + 1);
  Atomics.notify(signals, slot);
}

/**
 * Runtime side: calls `report(group)` for each of `groups` (in backward order, the order the worker
 * finishes them) once its word says it is final for `iteration`. Stops early, without reporting
 * more, once `current()` turns false (the iteration failed or ended; its end reports the rest).
 *
 * One watcher walks the groups in order, not one watcher per group: nothing orders the wake-ups
 * of two watchers that land together, and a CI run once saw the conv report reach the runtime
 * before the FC one (whose update the conv backward's gate then waited for in vain). The worker
 * finishes groups in this order, so waiting on the first unreported one delays nothing.
 */
export async function watchGroups(
  signals: Int32Array,
  slots: readonly number[],
  groups: readonly string[],
  iteration: number,
  current: () => boolean,
  report: (group: string) => void,
): Promise<void> {
  for (let i = 0; i < groups.length;) {
    if (!current()) return;
    const value = Atomics.load(signals, slots[i]);
    if (value > iteration) {
      report(groups[i++]);
      continue;
    }
    // Wake at least every 100 ms, so a failed device's watcher ends.
    const wait = Atomics.waitAsync(signals, slots[i], value, 100);
    if (wait.async) await wait.value;
  }
}
