/**
 * Records what each device's lanes did, as measured, and turns it into a Chrome trace (opens in
 * Perfetto or chrome://tracing) and into the overlap figures the simulator predicts.
 *
 * Definitions, for one iteration: let C be the union of all compute intervals of all devices and K
 * the union of all communication intervals of all devices — the reduce and broadcast actions and their
 * transfers, not the updates (see `figures.ts`). `commMs` = |K|, the time during which
 * some device communicates; `hiddenMs` = |K ∩ C|, the part of it during which some device computes;
 * `fraction` = hiddenMs / commMs (0 when there is no communication). So `commMs − hiddenMs` is
 * the time the iteration spent only communicating, which is what overlap aims to remove. Using
 * unions means a collective that keeps four devices busy for 10 ms counts as 10 ms, not 40.
 *
 * @module
 */

import { ValueError } from "../../engine/errors.ts";
import { writeFileAtomic } from "../../engine/io/atomic.ts";
import { stepFigures } from "./figures.ts";
import type { Lane } from "../plan/plan.ts";

/**
 * One measured span on one device's lane.
 *
 * @example
 * ```ts
 * import type { TraceSpan } from "./trace.ts";
 * const span: TraceSpan = { device: 1, lane: "comm", name: "reduce fc", step: 7, start: 12.5, end: 30.25 };
 * ```
 */
export interface TraceSpan {
  /** Device index, ≥ 0. */
  readonly device: number;
  /** The lane it ran on. */
  readonly lane: Lane;
  /** What ran, e.g. `backward conv`. */
  readonly name: string;
  /** The training iteration. */
  readonly step: number;
  /** Start, milliseconds (e.g. from `performance.now()`). */
  readonly start: number;
  /** End, milliseconds, ≥ start. */
  readonly end: number;
  /**
   * Bytes the span moved, where it is a transfer that says so (e.g. `send fc gradients`): half as
   * many under a 16-bit wire format (`wire.ts`) as under fp32.
   */
  readonly bytes?: number;
}

/**
 * How much of one iteration's communication overlapped computation (see the module notes).
 *
 * @example
 * ```ts
 * import type { OverlapFigures } from "./trace.ts";
 * const exposedMs = (o: OverlapFigures) => o.commMs - o.hiddenMs;
 * ```
 */
export interface OverlapFigures {
  /** Milliseconds during which some device communicated. */
  readonly commMs: number;
  /** The part of `commMs` during which some device computed. */
  readonly hiddenMs: number;
  /** `hiddenMs / commMs`, 0 without communication. */
  readonly fraction: number;
}

/**
 * One Chrome trace event (the subset Tandem writes).
 *
 * @example
 * ```ts
 * import type { ChromeTraceEvent } from "./trace.ts";
 * const event: ChromeTraceEvent = { name: "backward fc", ph: "X", pid: 0, tid: 0, ts: 0, dur: 1500, cat: "compute" };
 * ```
 */
export interface ChromeTraceEvent {
  /** Event name. */
  readonly name: string;
  /** `X` complete event or `M` metadata. */
  readonly ph: "X" | "M";
  /** Process id: the device. */
  readonly pid: number;
  /** Thread id: 0 compute, 1 communication. */
  readonly tid: number;
  /** Start, microseconds (complete events). */
  readonly ts?: number;
  /** Duration, microseconds (complete events). */
  readonly dur?: number;
  /** Category: the lane (complete events). */
  readonly cat?: string;
  /** Extra data: the iteration (and bytes moved) for spans, the name or sort index for metadata. */
  readonly args?: Readonly<Record<string, string | number>>;
}

/**
 * A Chrome trace-event JSON document.
 *
 * @example
 * ```ts
 * import type { ChromeTrace } from "./trace.ts";
 * const spans = (t: ChromeTrace) => t.traceEvents.filter((e) => e.ph === "X");
 * ```
 */
export interface ChromeTrace {
  /** The events. */
  readonly traceEvents: readonly ChromeTraceEvent[];
  /** Unit the viewer shows. */
  readonly displayTimeUnit: "ms";
}

const THREAD: Record<Lane, { tid: number; name: string }> = {
  compute: { tid: 0, name: "compute" },
  comm: { tid: 1, name: "communication" },
};

/**
 * Collects measured spans from the runtime.
 *
 * @example
 * ```ts
 * import { TraceRecorder } from "./trace.ts";
 * const trace = new TraceRecorder();
 * trace.record({ device: 0, lane: "compute", name: "backward conv", step: 0, start: 0, end: 10 });
 * trace.record({ device: 0, lane: "comm", name: "reduce fc", step: 0, start: 2, end: 6 });
 * console.log(trace.overlap(0)); // { commMs: 4, hiddenMs: 4, fraction: 1 }
 * const json = JSON.stringify(trace.toChromeTrace());
 * ```
 */
export class TraceRecorder {
  readonly #spans: TraceSpan[] = [];

  /** All recorded spans, in recording order. */
  get spans(): readonly TraceSpan[] {
    return this.#spans;
  }

  /** Adds one span; throws a `ValueError` naming the span if a field is out of range. */
  record(span: TraceSpan): void {
    const fail: (message: string) => never = (message) => {
      throw new ValueError("TraceRecorder.record", `${JSON.stringify(span.name)}: ${message}`);
    };
    if (!Number.isInteger(span.device) || span.device < 0) {
      fail(`device must be an integer >= 0, got ${span.device}`);
    }
    if (span.lane !== "compute" && span.lane !== "comm") {
      fail(`lane must be "compute" or "comm", got ${span.lane}`);
    }
    if (!Number.isInteger(span.step) || span.step < 0) fail(`step must be an integer >= 0, got ${span.step}`);
    if (!Number.isFinite(span.start) || !Number.isFinite(span.end)) {
      fail(`start and end must be finite, got ${span.start}, ${span.end}`);
    }
    if (span.end < span.start) fail(`ends (${span.end}) before it starts (${span.start})`);
    if (span.bytes !== undefined && !(Number.isFinite(span.bytes) && span.bytes >= 0)) {
      fail(`bytes must be a finite number >= 0, got ${span.bytes}`);
    }
    this.#spans.push({ ...span });
  }

  /**
   * Runs `fn` and records its span from `performance.now()` before to after (also when it throws).
   *
   * @example
   * ```ts
   * import { TraceRecorder } from "./trace.ts";
   * const trace = new TraceRecorder();
   * await trace.time({ device: 0, lane: "comm", name: "reduce fc", step: 0 }, async () => {});
   * console.log(trace.spans.length); // 1
   * ```
   */
  async time<T>(span: Omit<TraceSpan, "start" | "end">, fn: () => T | Promise<T>): Promise<T> {
    const start = performance.now();
    try {
      return await fn();
    } finally {
      this.record({ ...span, start, end: performance.now() });
    }
  }

  /** Communication and hidden communication of iteration `step` (see the module notes). */
  overlap(step: number): OverlapFigures {
    const figures = stepFigures(this.#spans.filter((s) => s.step === step), 0);
    const commMs = figures.communication, hiddenMs = figures.hiddenCommunication;
    return { commMs, hiddenMs, fraction: commMs > 0 ? hiddenMs / commMs : 0 };
  }

  /**
   * The spans as a Chrome trace: one process per device (`device 0`, …), threads `compute` and
   * `communication`, complete (`X`) events in microseconds from the earliest span, the iteration in
   * `args.step` and, for a transfer that recorded them, the bytes moved in `args.bytes`.
   */
  toChromeTrace(): ChromeTrace {
    const origin = Math.min(...this.#spans.map((s) => s.start));
    const devices = [...new Set(this.#spans.map((s) => s.device))].sort((a, b) => a - b);
    const events: ChromeTraceEvent[] = [];
    for (const pid of devices) {
      events.push({ name: "process_name", ph: "M", pid, tid: 0, args: { name: `device ${pid}` } });
      events.push({ name: "process_sort_index", ph: "M", pid, tid: 0, args: { sort_index: pid } });
      for (const { tid, name } of Object.values(THREAD)) {
        events.push({ name: "thread_name", ph: "M", pid, tid, args: { name } });
        events.push({ name: "thread_sort_index", ph: "M", pid, tid, args: { sort_index: tid } });
      }
    }
    for (const s of this.#spans) {
      events.push({
        name: s.name,
        cat: s.lane,
        ph: "X",
        pid: s.device,
        tid: THREAD[s.lane].tid,
        ts: (s.start - origin) * 1e3,
        dur: (s.end - s.start) * 1e3,
        args: s.bytes === undefined ? { step: s.step } : { step: s.step, bytes: s.bytes },
      });
    }
    return { traceEvents: events, displayTimeUnit: "ms" };
  }

  /**
   * Writes {@link toChromeTrace} as JSON to `path` atomically (temporary file, then rename), so a
   * crash never leaves a truncated trace.
   *
   * @example
   * ```ts
   * import { TraceRecorder } from "./trace.ts";
   * const trace = new TraceRecorder();
   * trace.record({ device: 0, lane: "compute", name: "forward", step: 0, start: 0, end: 1 });
   * await trace.writeChromeTrace(await Deno.makeTempFile({ suffix: ".json" }));
   * ```
   */
  async writeChromeTrace(path: string): Promise<void> {
    const json = JSON.stringify(this.toChromeTrace());
    await writeFileAtomic(path, [new TextEncoder().encode(json)]);
  }
}
