import assert from "node:assert/strict";
import { TandemError, ValueError } from "../../engine/errors.ts";
import { OutputPathError } from "../../engine/io/errors.ts";
import {
  actionLabel,
  bucketedPlan,
  builtinPlan,
  checkPlan,
  dependenciesOf,
  explain,
  formatPlan,
  hybridPlan,
  isSharded,
  loadSchedule,
  overlapPlan,
  parseSchedule,
  type Plan,
  schedule,
  scheduleBuilder,
  ScheduleError,
  sequentialPlan,
  validatePlan,
} from "../../schedule/mod.ts";
import { stepFigures } from "../../schedule/runtime/mod.ts";
import { TraceRecorder } from "../../mod.ts";

const GROUPS = ["fc", "conv"] as const;
const SEED =
  "forward; backward fc; reduce fc; update fc; backward conv; reduce conv; update conv; broadcast all";

/** The plan without text positions, for comparing text-built and code-built plans. */
function shape(plan: Plan) {
  return {
    name: plan.name,
    groups: [...plan.groups],
    actions: plan.actions.map(({ kind, group, lane, waitsFor }) => ({ kind, group, lane, waitsFor })),
  };
}

const labels = (plan: Plan) => plan.actions.map(actionLabel);

/** Parses `text` for fc, conv and returns the first validation error in `mode`. */
function firstError(text: string, mode: "master" | "allreduce" = "master"): ScheduleError {
  const plan = parseSchedule(text, { groups: GROUPS, fileName: "my.sched" });
  const { errors } = checkPlan(plan, { mode });
  assert.ok(errors.length > 0, `expected an error for:\n${text}`);
  return errors[0];
}

function assertAt(error: ScheduleError, line: number, column: number, reason: string): void {
  assert.equal(error.reason, reason);
  assert.equal(error.line, line, error.message);
  assert.equal(error.column, column, error.message);
}

Deno.test("parse: the seed's example expands broadcast all in backward order", () => {
  const plan = parseSchedule(SEED, { groups: GROUPS, name: "seed" });
  assert.equal(plan.name, "seed");
  assert.deepEqual(plan.groups, ["fc", "conv"]);
  assert.deepEqual(labels(plan), [
    "forward",
    "backward fc",
    "reduce fc",
    "update fc",
    "backward conv",
    "reduce conv",
    "update conv",
    "broadcast fc",
    "broadcast conv",
  ]);
  assert.deepEqual(plan.actions.map((s) => s.lane), [
    "compute",
    "compute",
    "comm",
    "comm",
    "compute",
    "comm",
    "comm",
    "comm",
    "comm",
  ]);
  // Positions are the keyword's; both expanded broadcasts share the `broadcast all` position.
  assert.deepEqual(plan.actions.map((s) => [s.line, s.column]), [
    [1, 1],
    [1, 10],
    [1, 23],
    [1, 34],
    [1, 45],
    [1, 60],
    [1, 73],
    [1, 86],
    [1, 86],
  ]);
  assert.deepEqual(validatePlan(plan, { mode: "master" }).notes, []);
});

Deno.test("parse: comments, newlines, blank statements, header, groups declaration and lists", () => {
  const text = [
    "# overlap for AlexNet",
    "schedule overlap-2  # the name",
    "groups fc, conv",
    "",
    "forward;;",
    "  backward fc ; reduce fc;update fc # FC first",
    "backward conv",
    "reduce conv\tupdate conv".replace("\t", "; "),
    "broadcast fc, conv",
  ].join("\n");
  const plan = parseSchedule(text);
  assert.equal(plan.name, "overlap-2");
  assert.deepEqual(plan.groups, ["fc", "conv"]);
  assert.deepEqual(labels(plan), labels(parseSchedule(SEED, { groups: GROUPS })));
  assert.deepEqual([plan.actions[1].line, plan.actions[1].column], [6, 3]);
  assert.deepEqual([plan.actions[3].line, plan.actions[3].column], [6, 27]);
  assert.equal(plan.source?.text, text);
  // Space-separated lists, `all` in every position, and CRLF line ends parse the same.
  const crlf = parseSchedule("forward\r\nbackward all\r\nreduce conv fc\r\nupdate all\r\nbroadcast all\r\n", {
    groups: GROUPS,
  });
  assert.deepEqual(labels(crlf), [
    "forward",
    "backward fc",
    "backward conv",
    "reduce conv",
    "reduce fc",
    "update fc",
    "update conv",
    "broadcast fc",
    "broadcast conv",
  ]);
});

Deno.test("parse: names come from the header, then options.name, then the file name", () => {
  assert.equal(parseSchedule("schedule a\nforward", { groups: GROUPS, name: "b" }).name, "a");
  assert.equal(parseSchedule("forward", { groups: GROUPS, name: "b" }).name, "b");
  assert.equal(parseSchedule("forward", { groups: GROUPS, fileName: "dir/fast.sched" }).name, "fast");
  assert.equal(parseSchedule("forward", { groups: GROUPS }).name, "schedule");
});

Deno.test("parse: syntax errors carry line, column, the source line and a caret", () => {
  const cases: [string, number, number, string][] = [
    [
      "forward\nbackwrd fc",
      2,
      1,
      `unknown action "backwrd" (did you mean "backward"?); actions are forward, backward, reduce, update, broadcast`,
    ],
    [
      "forward\nbackward fc\nreduce fcc",
      3,
      8,
      `unknown group "fcc" (did you mean "fc"?); groups are fc, conv`,
    ],
    ["forward\nreduce lstm", 2, 8, `unknown group "lstm"; groups are fc, conv`],
    ["forward fc", 1, 9, "forward takes no group"],
    ["forward\n  reduce", 2, 3, "reduce needs a group or `all`"],
    ["forward; reduce all, fc", 1, 17, "`all` cannot be combined with other groups"],
    ["forward; reduce fc,, conv", 1, 20, `expected a group name before ","`],
    ["forward; reduce fc,", 1, 19, `a group name must follow the last ","`],
    ["forward; reduce ,fc", 1, 17, `expected a group name before ","`],
    ["forward; reduce fc @", 1, 20, `unexpected character "@"`],
    ["forward\nschedule late", 2, 1, "the `schedule NAME` header must be the first statement"],
    ["schedule a b", 1, 12, "`schedule` takes exactly one name, e.g. `schedule overlap`"],
    ["groups fc, conv\nforward\ngroups fc, conv", 3, 1, "groups are declared twice"],
    ["forward\ngroups fc, conv", 2, 1, "`groups` must come before the first action"],
    [
      "groups conv, fc",
      1,
      1,
      "declared groups conv, fc differ from the model's groups fc, conv (backward order, output side first)",
    ],
    ["groups fc, fc", 1, 12, "group fc is declared twice"],
    ["groups fc, all", 1, 12, `"all" is reserved and cannot name a group`],
    ["; , forward", 1, 3, "a statement cannot start with a comma"],
  ];
  for (const [text, line, column, reason] of cases) {
    const groups = text.startsWith("groups fc, fc") || text.startsWith("groups fc, all") ||
        text.startsWith("groups fc, conv\nforward\ngroups")
      ? undefined
      : GROUPS;
    assert.throws(() => parseSchedule(text, { groups, fileName: "my.sched" }), (e: unknown) => {
      assert.ok(e instanceof ScheduleError && e instanceof TandemError, String(e));
      assertAt(e, line, column, reason);
      const sourceLine = text.split("\n")[line - 1];
      assert.equal(e.sourceLine, sourceLine);
      assert.equal(
        e.message,
        `schedule "my.sched" line ${line}, column ${column}: ${reason}\n  ${sourceLine}\n  ${
          " ".repeat(column - 1)
        }^`,
      );
      return true;
    }, text);
  }
});

Deno.test("parse: groups must be known from the model or declared", () => {
  assert.throws(
    () => parseSchedule("forward\nbackward fc"),
    (e: unknown) =>
      e instanceof ScheduleError && e.line === 2 && e.column === 1 &&
      e.reason.startsWith("backward names a group but no groups are known"),
  );
  assert.throws(
    () => parseSchedule("forward"),
    (e: unknown) => e instanceof ScheduleError && e.line === 1 && e.reason.startsWith("no groups are known"),
  );
  assert.throws(() => parseSchedule("forward", { groups: [] }), ValueError);
  assert.throws(() => parseSchedule("forward", { groups: ["fc", "fc"] }), ValueError);
  assert.throws(() => parseSchedule("forward", { groups: ["all"] }), ValueError);
  assert.throws(() => parseSchedule("forward", { groups: ["a b"] }), ValueError);
});

Deno.test("parse: a caret under a tab-indented line keeps the tab", () => {
  assert.throws(() => parseSchedule("forward\n\t  reduce x", { groups: GROUPS, name: "t" }), (e: unknown) => {
    assert.ok(e instanceof ScheduleError);
    assert.equal(
      e.message,
      `schedule "t" line 2, column 11: unknown group "x"; groups are fc, conv\n  \t  reduce x\n  \t         ^`,
    );
    return true;
  });
});

Deno.test("parse: with mode the plan is validated too", () => {
  assert.throws(
    () => parseSchedule("forward; backward all; reduce all; update all", { groups: GROUPS, mode: "master" }),
    ScheduleError,
  );
  const plan = parseSchedule("forward; backward all; reduce all; update all", {
    groups: GROUPS,
    mode: "allreduce",
  });
  assert.equal(plan.actions.length, 7);
});

Deno.test("schedule tag: declared groups, options, interpolation", () => {
  const group = "conv";
  const a = schedule`
    schedule seed
    groups fc, conv
    forward; backward fc; reduce fc; update fc
    backward ${group}; reduce ${group}; update ${group}; broadcast all
  `;
  const b = schedule({ groups: GROUPS, name: "seed", mode: "master" })`${SEED}`;
  assert.deepEqual(shape(a), shape(b));
  assert.equal(a.actions[4].line, 5);
  assert.throws(() => schedule`forward; backward fc`, ScheduleError);
});

Deno.test("text and builder give the same plans (builder positions are 0)", () => {
  const built = scheduleBuilder(GROUPS)
    .forward()
    .backward("fc").reduce("fc").update("fc")
    .backward("conv").reduce("conv").update("conv")
    .broadcast("all")
    .build("seed");
  const parsed = parseSchedule(SEED, { groups: GROUPS, name: "seed" });
  assert.deepEqual(shape(built), shape(parsed));
  assert.ok(built.actions.every((s) => s.line === 0 && s.column === 0));
  assert.equal(built.source, undefined);
  // Lists keep the order given; "all" follows the backward order.
  const listed = scheduleBuilder(GROUPS).forward().backward("all").reduce(["conv", "fc"]).build();
  assert.deepEqual(
    labels(listed),
    labels(parseSchedule("forward; backward all; reduce conv, fc", { groups: GROUPS })),
  );
  // Builders are immutable, so a prefix can be shared.
  const prefix = scheduleBuilder(GROUPS).forward();
  prefix.backward("fc");
  assert.equal(prefix.build().actions.length, 1);
});

Deno.test("builder: bad groups are caller errors; validation names action indices", () => {
  // @ts-expect-error "fcc" is not one of the groups
  assert.throws(() => scheduleBuilder(GROUPS).backward("fcc"), ValueError);
  assert.throws(() => scheduleBuilder(GROUPS).reduce([]), ValueError);
  assert.throws(() => scheduleBuilder([]), ValueError);
  assert.throws(
    () => scheduleBuilder(GROUPS).forward().update("fc").build("b", { mode: "master" }),
    (e: unknown) => {
      assert.ok(e instanceof ScheduleError);
      assert.equal(e.line, 0);
      assert.equal(e.actionIndex, 1);
      assert.equal(e.message, `schedule "b" action 1: update fc comes before reduce fc`);
      return true;
    },
  );
});

Deno.test("formatPlan round-trips through the parser", () => {
  for (
    const plan of [sequentialPlan(GROUPS), overlapPlan(GROUPS), bucketedPlan(["fc8", "fc7", "fc6", "conv"])]
  ) {
    const text = formatPlan(plan);
    assert.deepEqual(shape(parseSchedule(text)), shape(plan));
  }
  assert.equal(
    formatPlan(sequentialPlan(GROUPS)),
    "schedule sequential\ngroups fc, conv\nforward\nbackward fc\nbackward conv\nreduce fc\nreduce conv\n" +
      "update fc\nupdate conv\nbroadcast fc\nbroadcast conv\n",
  );
});

Deno.test("loadSchedule reads a file and names it in errors", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const good = `${dir}/fast.sched`;
    await Deno.writeTextFile(good, `# two groups\n${SEED.replaceAll("; ", "\n")}\n`);
    const plan = await loadSchedule(good, { groups: GROUPS, mode: "master" });
    assert.equal(plan.name, "fast");
    assert.equal(plan.source?.fileName, good);
    assert.deepEqual(shape(plan), shape(parseSchedule(SEED, { groups: GROUPS, name: "fast" })));
    const bad = `${dir}/bad.sched`;
    await Deno.writeTextFile(bad, "forward\nbackward fc\nupdate fc\n");
    await assert.rejects(loadSchedule(bad, { groups: GROUPS, mode: "master" }), (e: unknown) => {
      assert.ok(e instanceof ScheduleError);
      assert.equal(
        e.message,
        `schedule "${bad}" line 3, column 1: update fc comes before reduce fc\n  update fc\n  ^`,
      );
      return true;
    });
    await assert.rejects(loadSchedule(`${dir}/missing.sched`, { groups: GROUPS }), Deno.errors.NotFound);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("validate: each rule reports the exact line and column", () => {
  const full = "backward conv; reduce conv; update conv; broadcast conv";
  const cases: [string, number, number, string][] = [
    [
      `forward\nreduce fc\nbackward fc\nupdate fc\nbroadcast fc\n${full}`,
      2,
      1,
      "reduce fc comes before backward fc",
    ],
    [
      `forward\nbackward fc\n  update fc; reduce fc\nbroadcast fc\n${full}`,
      3,
      3,
      "update fc comes before reduce fc",
    ],
    [
      `forward\nbackward fc; reduce fc; broadcast fc; update fc\n${full}`,
      2,
      25,
      "broadcast fc comes before update fc",
    ],
    [
      "forward; backward fc; reduce fc; update fc; broadcast fc",
      1,
      45,
      "group conv is never backwarded",
    ],
    [
      "forward; backward all; reduce fc; update fc; broadcast fc",
      1,
      10,
      "group conv is never reduced after its backward",
    ],
    [
      "forward; backward all; reduce all; update fc; broadcast fc",
      1,
      24,
      "group conv is never updated after its reduce",
    ],
    [
      "forward; backward all; reduce all\nupdate all\nbroadcast fc",
      2,
      1,
      "group conv is never broadcast after its update: in master mode only device 0 has the new parameters, so the replicas would diverge",
    ],
    [
      "forward; backward fc; reduce fc\nreduce fc; update all; backward conv; reduce conv; broadcast all",
      2,
      1,
      "reduce fc is repeated (first at line 1, column 23)",
    ],
    [
      "forward\nforward; backward all; reduce all; update all; broadcast all",
      2,
      1,
      "forward is repeated (first at line 1, column 1)",
    ],
    [
      "forward\nbackward conv; reduce conv\nbackward fc; reduce fc; update all; broadcast all",
      2,
      1,
      "backward conv comes before backward fc; autograd produces groups in the order fc, conv (output side first)",
    ],
    [
      "backward fc\n  forward; backward conv; reduce all; update all; broadcast all",
      2,
      3,
      "forward must be the first action, but backward fc comes before it",
    ],
    [
      "backward all; reduce all; update all; broadcast all",
      1,
      1,
      "forward is missing; a plan starts with forward",
    ],
  ];
  for (const [text, line, column, reason] of cases) {
    const error = firstError(text);
    assertAt(error, line, column, reason);
    assert.throws(
      () => validatePlan(parseSchedule(text, { groups: GROUPS }), { mode: "master" }),
      ScheduleError,
    );
    assert.ok(error.message.startsWith(`schedule "my.sched" line ${line}, column ${column}: ${reason}\n`));
  }
});

Deno.test("validate: one mistake gives one error", () => {
  const plan = parseSchedule(
    `forward\nbackward fc\nupdate fc\nbroadcast fc\nbackward conv; reduce conv; update conv\nbroadcast conv`,
    {
      groups: GROUPS,
    },
  );
  const { errors } = checkPlan(plan, { mode: "master" });
  assert.deepEqual(errors.map((e) => e.reason), ["update fc comes before reduce fc"]);
});

Deno.test("validate: allreduce allows missing or early broadcasts and notes each one as a no-op", () => {
  const noBroadcast = parseSchedule("forward; backward all; reduce all; update all", { groups: GROUPS });
  assert.deepEqual(validatePlan(noBroadcast, { mode: "allreduce" }).notes, [
    "every reduce comes after the last backward, so no communication overlaps computation (a sequential schedule)",
  ]);
  const early = parseSchedule("forward\nbackward all; reduce all; broadcast all; update all", {
    groups: GROUPS,
  });
  assert.deepEqual(validatePlan(early, { mode: "allreduce" }).notes.slice(0, 2), [
    "broadcast fc (line 2, column 27) is a no-op in allreduce mode: every device updates its own copy",
    "broadcast conv (line 2, column 27) is a no-op in allreduce mode: every device updates its own copy",
  ]);
  assert.throws(() => validatePlan(early, { mode: "master" }), ScheduleError);
  assert.throws(() => validatePlan(early, { mode: "ring" as "master" }), ValueError);
});

Deno.test("validate: hand-made plans with unknown groups, wrong lanes or no groups", () => {
  const base = sequentialPlan(GROUPS);
  const unknown: Plan = {
    ...base,
    actions: base.actions.map((s, i) => (i === 3 ? { ...s, group: "lstm" } : s)),
  };
  assert.throws(() => validatePlan(unknown, { mode: "master" }), (e: unknown) => {
    assert.ok(e instanceof ScheduleError);
    assert.equal(e.message, `schedule "sequential" action 3: unknown group "lstm"; groups are fc, conv`);
    return true;
  });
  const wrongLane: Plan = {
    ...base,
    actions: base.actions.map((s, i) => (i === 5 ? { ...s, lane: "compute" } : s)),
  };
  assert.throws(
    () => validatePlan(wrongLane, { mode: "master" }),
    (e: unknown) =>
      e instanceof ScheduleError && e.reason === "update fc must run on the comm lane, not compute",
  );
  assert.throws(
    () => validatePlan({ name: "empty", groups: [], actions: [] }, { mode: "master" }),
    (e: unknown) => e instanceof ScheduleError && e.message === `schedule "empty": the plan has no groups`,
  );
  assert.throws(
    () => validatePlan({ name: "empty", groups: ["fc"], actions: [] }, { mode: "allreduce" }),
    (e: unknown) =>
      e instanceof ScheduleError && e.reason === "forward is missing; a plan starts with forward",
  );
});

Deno.test("builtins: valid in both modes, with the documented shapes", () => {
  for (const groups of [["fc", "conv"], ["only"], ["fc8", "fc7", "fc6", "conv5", "conv1"]]) {
    for (const plan of [sequentialPlan(groups), overlapPlan(groups), bucketedPlan(groups)]) {
      assert.deepEqual(shape(plan).groups, groups);
      assert.deepEqual(validatePlan(plan, { mode: "master" }).notes.filter((n) => n.includes("no-op")), []);
      const notes = validatePlan(plan, { mode: "allreduce" }).notes;
      assert.equal(notes.filter((n) => n.includes("no-op")).length, groups.length);
    }
  }
  assert.deepEqual(
    shape(sequentialPlan(GROUPS)),
    shape(parseSchedule("forward; backward all; reduce all; update all; broadcast all", {
      groups: GROUPS,
      name: "sequential",
    })),
  );
  assert.deepEqual(
    shape(overlapPlan(GROUPS)),
    shape(parseSchedule(
      "forward\nbackward fc; reduce fc; update fc; broadcast fc\nbackward conv; reduce conv; update conv; broadcast conv",
      { groups: GROUPS, name: "overlap" },
    )),
  );
  assert.deepEqual(labels(bucketedPlan(["a", "b", "c"])), [
    "forward",
    ...["a", "b", "c"].flatMap((g) => [`backward ${g}`, `reduce ${g}`, `update ${g}`, `broadcast ${g}`]),
  ]);
  assert.equal(builtinPlan("overlap", GROUPS).name, "overlap");
  assert.equal(builtinPlan("sequential", GROUPS).name, "sequential");
  assert.equal(builtinPlan("bucketed", GROUPS).name, "bucketed");
  assert.throws(() => builtinPlan("fast" as "overlap", GROUPS), ValueError);
});

Deno.test("overlap: the FC broadcast waits only for the FC update, not for the conv backward", () => {
  const plan = overlapPlan(GROUPS);
  const index = (label: string) => labels(plan).indexOf(label);
  assert.deepEqual(dependenciesOf(plan, index("broadcast fc")), [index("update fc")]);
  assert.deepEqual(dependenciesOf(plan, index("backward conv")), [index("forward"), index("backward fc")]);
  assert.deepEqual(dependenciesOf(plan, index("reduce conv")), [
    index("broadcast fc"),
    index("backward conv"),
  ]);
});

Deno.test("explain: lists every action, device role and dependency per lane", () => {
  const plan = parseSchedule(SEED, { groups: GROUPS, name: "seed" });
  const text = explain(plan, { devices: 3, mode: "master" });
  assert.ok(text.startsWith(`schedule "seed": 9 actions, 3 devices, master mode`));
  const rows = text.split("\n");
  plan.actions.forEach((action, i) => {
    const row = rows.find((r) => r.startsWith(`#${i} `));
    assert.ok(row, `no row for action ${i}`);
    assert.ok(row.includes(actionLabel(action)));
    assert.ok(row.includes(action.lane));
    assert.ok(row.includes(`${action.line}:${action.column}`));
    for (const d of dependenciesOf(plan, i)) {
      assert.ok(row.includes(`#${d} ${actionLabel(plan.actions[d])}`), row);
    }
  });
  assert.ok(rows.find((r) => r.startsWith("#2 "))!.includes("1..2 -> 0"));
  assert.ok(rows.find((r) => r.startsWith("#7 "))!.includes("0 -> 1..2"));
  // Device 0 runs the updates; devices 1 and 2 do not.
  assert.ok(text.includes(
    "  device 0\n    compute | #0 forward -> #1 backward fc -> #4 backward conv\n" +
      "    comm    | #2 reduce fc -> #3 update fc -> #5 reduce conv -> #6 update conv -> #7 broadcast fc -> #8 broadcast conv",
  ));
  assert.ok(text.includes(
    "  device 2\n    compute | #0 forward -> #1 backward fc -> #4 backward conv\n" +
      "    comm    | #2 reduce fc -> #5 reduce conv -> #7 broadcast fc -> #8 broadcast conv",
  ));

  const ring = explain(sequentialPlan(GROUPS), { devices: 2, mode: "allreduce" });
  assert.ok(ring.includes("ring 0..1"));
  assert.ok(ring.includes("no-op"));
  assert.ok(ring.includes("notes:\n  broadcast fc (action 7) is a no-op in allreduce mode"));
  assert.ok(!ring.includes("line:col"));

  const broken = explain(parseSchedule("forward; update fc", { groups: GROUPS }), {
    devices: 1,
    mode: "master",
  });
  assert.ok(
    broken.includes(`problems:\n  schedule "schedule" line 1, column 10: update fc comes before reduce fc`),
  );
  assert.throws(() => explain(plan, { devices: 0, mode: "master" }), ValueError);
});

function handTrace(): TraceRecorder {
  const trace = new TraceRecorder();
  const t0 = 1000; // performance.now() values do not start at 0
  trace.record({ device: 0, lane: "compute", name: "backward conv", step: 3, start: t0, end: t0 + 10 });
  trace.record({ device: 0, lane: "comm", name: "reduce fc", step: 3, start: t0 + 2, end: t0 + 6 });
  trace.record({ device: 0, lane: "comm", name: "reduce conv", step: 3, start: t0 + 8, end: t0 + 14 });
  trace.record({ device: 1, lane: "compute", name: "backward conv", step: 3, start: t0, end: t0 + 9 });
  trace.record({ device: 1, lane: "comm", name: "reduce fc", step: 3, start: t0 + 2, end: t0 + 6 });
  trace.record({ device: 1, lane: "comm", name: "reduce conv", step: 3, start: t0 + 8, end: t0 + 14 });
  // Another iteration, which must not leak into step 3's figures.
  trace.record({ device: 0, lane: "comm", name: "reduce fc", step: 4, start: t0 + 20, end: t0 + 30 });
  return trace;
}

Deno.test("trace: overlap figures on hand-made spans", () => {
  const trace = handTrace();
  // Communication covers [2, 6] ∪ [8, 14] = 10 ms; compute covers [0, 10]; hidden [2, 6] ∪ [8, 10] = 6 ms.
  assert.deepEqual(trace.overlap(3), { commMs: 10, hiddenMs: 6, fraction: 0.6 });
  assert.deepEqual(trace.overlap(4), { commMs: 10, hiddenMs: 0, fraction: 0 });
  assert.deepEqual(trace.overlap(9), { commMs: 0, hiddenMs: 0, fraction: 0 });
  // Compute on another device hides communication too.
  const cross = new TraceRecorder();
  cross.record({ device: 1, lane: "compute", name: "backward conv", step: 0, start: 0, end: 4 });
  cross.record({ device: 0, lane: "comm", name: "reduce fc", step: 0, start: 2, end: 6 });
  // An update is arithmetic, not communication: it does not count (it used to, overstating it).
  cross.record({ device: 0, lane: "comm", name: "update fc", step: 0, start: 6, end: 9 });
  assert.deepEqual(cross.overlap(0), { commMs: 4, hiddenMs: 2, fraction: 0.5 });
  assert.deepEqual(stepFigures(cross.spans, 9), {
    total: 9,
    compute: 4,
    communication: 4,
    hiddenCommunication: 2,
    update: 3,
    hiddenUpdate: 0,
  });
});

Deno.test("trace: Chrome trace-event JSON names processes and threads and uses microseconds", () => {
  const trace = handTrace().toChromeTrace();
  assert.equal(trace.displayTimeUnit, "ms");
  const meta = trace.traceEvents.filter((e) => e.ph === "M");
  for (const pid of [0, 1]) {
    assert.ok(
      meta.some((e) => e.name === "process_name" && e.pid === pid && e.args?.name === `device ${pid}`),
    );
    assert.ok(
      meta.some((e) =>
        e.name === "thread_name" && e.pid === pid && e.tid === 0 && e.args?.name === "compute"
      ),
    );
    assert.ok(
      meta.some((e) =>
        e.name === "thread_name" && e.pid === pid && e.tid === 1 && e.args?.name === "communication"
      ),
    );
  }
  const spans = trace.traceEvents.filter((e) => e.ph === "X");
  assert.equal(spans.length, 7);
  assert.deepEqual(spans[2], {
    name: "reduce conv",
    cat: "comm",
    ph: "X",
    pid: 0,
    tid: 1,
    ts: 8000,
    dur: 6000,
    args: { step: 3 },
  });
  assert.equal(spans[0].ts, 0);
  assert.equal(spans[3].pid, 1);
  assert.equal(spans[3].tid, 0);
  assert.deepEqual(JSON.parse(JSON.stringify(trace)), trace);
  assert.deepEqual(new TraceRecorder().toChromeTrace().traceEvents, []);
});

Deno.test("trace: writeChromeTrace writes the JSON atomically and leaves no temporary file", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const trace = handTrace();
    const path = `${dir}/trace.json`;
    await Deno.writeTextFile(path, "old");
    await trace.writeChromeTrace(path);
    assert.deepEqual(JSON.parse(await Deno.readTextFile(path)), trace.toChromeTrace());
    const names = [];
    for await (const entry of Deno.readDir(dir)) names.push(entry.name);
    assert.deepEqual(names, ["trace.json"]);
    // A missing directory is one line naming the path (atomic.ts), not a raw file-system error.
    await assert.rejects(trace.writeChromeTrace(`${dir}/no/such/dir/trace.json`), OutputPathError);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("trace: record rejects bad spans; time records a span even when the work throws", async () => {
  const trace = new TraceRecorder();
  const ok = { device: 0, lane: "compute" as const, name: "forward", step: 0, start: 1, end: 2 };
  assert.throws(() => trace.record({ ...ok, end: 0 }), ValueError);
  assert.throws(() => trace.record({ ...ok, device: -1 }), ValueError);
  assert.throws(() => trace.record({ ...ok, device: 0.5 }), ValueError);
  assert.throws(() => trace.record({ ...ok, lane: "gpu" as "comm" }), ValueError);
  assert.throws(() => trace.record({ ...ok, step: -1 }), ValueError);
  assert.throws(() => trace.record({ ...ok, start: NaN }), ValueError);
  assert.equal(trace.spans.length, 0);
  assert.equal(await trace.time({ device: 1, lane: "comm", name: "reduce fc", step: 2 }, () => 42), 42);
  await assert.rejects(
    trace.time({ device: 1, lane: "comm", name: "reduce conv", step: 2 }, () => {
      throw new Error("link down");
    }),
    /link down/,
  );
  assert.deepEqual(trace.spans.map((s) => s.name), ["reduce fc", "reduce conv"]);
  assert.ok(trace.spans.every((s) => s.end >= s.start && s.device === 1 && s.lane === "comm"));
});

// ---------------------------------------------------------------------------------------------
// Hybrid plans: `shard`, `Plan.sharded`, the `hybrid` built-in.

const HYBRID_TEXT =
  "shard fc; forward; backward fc; update fc; backward conv; reduce conv; update conv; broadcast conv";

/** `shape` plus the sharded groups, for hybrid plans. */
function hybridShape(plan: Plan) {
  return { ...shape(plan), sharded: plan.sharded === undefined ? undefined : [...plan.sharded] };
}

// Mutation tried: formatPlan without its `shard` line — the round trip lost `sharded` and failed; and
// the parser storing the names as written instead of in backward order — the fc7, fc8 case failed.
Deno.test("shard: parses into Plan.sharded, in backward order, and round-trips through formatPlan", () => {
  const plan = parseSchedule(`schedule h\n${HYBRID_TEXT.replaceAll("; ", "\n")}`, { groups: GROUPS });
  assert.deepEqual(plan.sharded, ["fc"]);
  assert.equal(isSharded(plan, "fc"), true);
  assert.equal(isSharded(plan, "conv"), false);
  assert.deepEqual(labels(plan), HYBRID_TEXT.split("; ").slice(1));
  // `shard` is a declaration, not an action: the actions start at line 2.
  assert.deepEqual([plan.actions[0].line, plan.actions[0].column], [3, 1]);
  const text = formatPlan(plan);
  assert.equal(
    text,
    "schedule h\ngroups fc, conv\nshard fc\nforward\nbackward fc\nupdate fc\nbackward conv\nreduce conv\n" +
      "update conv\nbroadcast conv\n",
  );
  assert.deepEqual(hybridShape(parseSchedule(text)), hybridShape(plan));
  // Lists in any order, commas or spaces, after the headers; stored in backward order.
  const four = ["fc8", "fc7", "fc6", "conv"];
  const deep = parseSchedule(
    "schedule deep\ngroups fc8, fc7, fc6, conv\nshard fc7 fc8\nforward; backward fc8; update fc8\n" +
      "backward fc7; update fc7; backward fc6; reduce fc6; update fc6; broadcast fc6\n" +
      "backward conv; reduce conv; update conv; broadcast conv",
    { mode: "master" },
  );
  assert.deepEqual(deep.sharded, ["fc8", "fc7"]);
  assert.deepEqual(deep.groups, four);
  assert.deepEqual(hybridShape(parseSchedule(formatPlan(deep))), hybridShape(deep));
  assert.ok(formatPlan(deep).includes("\nshard fc8, fc7\n"));
  // Plans without `shard` have no `sharded` field at all, and their text has no `shard` line.
  for (const p of [sequentialPlan(GROUPS), overlapPlan(GROUPS), parseSchedule(SEED, { groups: GROUPS })]) {
    assert.equal("sharded" in p, false);
    assert.ok(!formatPlan(p).includes("shard"));
  }
  // Text and builder agree.
  const built = scheduleBuilder(GROUPS).shard("fc").forward().backward("fc").update("fc")
    .backward("conv").reduce("conv").update("conv").broadcast("conv").build("h");
  assert.deepEqual(hybridShape(built), hybridShape(plan));
  assert.deepEqual(
    hybridShape(scheduleBuilder(four).shard(["fc7", "fc8"]).build()).sharded,
    ["fc8", "fc7"],
  );
});

// Mutations tried, each made this test fail: dropping the "before the first action" check (the
// `forward\nshard fc` case parsed); letting `all` through (then "every group is sharded" came at
// column 1 instead of the `all` token's column 7); pointing the prefix error at the keyword instead
// of the offending name (column 1, not 11).
Deno.test("shard: syntax and declaration errors carry line, column, the source line and a caret", () => {
  const cases: [string, number, number, string][] = [
    ["forward\nshard fc", 2, 1, "`shard` must come before the first action"],
    ["shard fc\nshard fc", 2, 1, "`shard` is declared twice"],
    ["shard", 1, 1, "shard needs one or more groups, e.g. `shard fc`"],
    [
      "shard all",
      1,
      7,
      "`shard all` is not allowed: at least one group must stay unsharded (data-parallel); name the output-side groups, e.g. `shard fc`",
    ],
    ["  shard fcc", 1, 9, `unknown group "fcc" (did you mean "fc"?); groups are fc, conv`],
    ["shard lstm", 1, 7, `unknown group "lstm"; groups are fc, conv`],
    ["shard fc, fc", 1, 11, "group fc is sharded twice"],
    [
      "schedule x; shard conv",
      1,
      19,
      "conv is sharded but fc, on its output side, is not: sharded groups must be a prefix of the groups in backward order (fc, conv)",
    ],
    [
      "shard fc, conv",
      1,
      1,
      "every group is sharded; at least one group must stay unsharded (data-parallel): the body whose output is all-gathered into the sharded layers",
    ],
    [
      "shards fc",
      1,
      1,
      `unknown action "shards" (did you mean "shard"?); actions are forward, backward, reduce, update, broadcast`,
    ],
  ];
  for (const [text, line, column, reason] of cases) {
    assert.throws(() => parseSchedule(text, { groups: GROUPS, fileName: "h.sched" }), (e: unknown) => {
      assert.ok(e instanceof ScheduleError, String(e));
      assertAt(e, line, column, reason);
      const sourceLine = text.split("\n")[line - 1];
      assert.equal(
        e.message,
        `schedule "h.sched" line ${line}, column ${column}: ${reason}\n  ${sourceLine}\n  ${
          " ".repeat(column - 1)
        }^`,
      );
      return true;
    }, text);
  }
  // Without the model's groups, `shard` needs a `groups` header first, and `groups` cannot follow it.
  assert.throws(
    () => parseSchedule("shard fc\ngroups fc, conv"),
    (e: unknown) =>
      e instanceof ScheduleError && e.line === 1 && e.column === 1 &&
      e.reason.startsWith("shard names a group but no groups are known"),
  );
  assert.throws(
    () => parseSchedule("shard fc\ngroups fc, conv", { groups: GROUPS }),
    (e: unknown) =>
      e instanceof ScheduleError && e.line === 2 && e.column === 1 &&
      e.reason === "`groups` must come before `shard`",
  );
  // With fc8, fc7, fc6, conv: fc6 alone leaves a gap on its output side; the error names fc8.
  assert.throws(
    () => parseSchedule("groups fc8, fc7, fc6, conv\nshard fc8, fc6", { fileName: "h.sched" }),
    (e: unknown) => {
      assert.ok(e instanceof ScheduleError);
      assertAt(
        e,
        2,
        12,
        "fc6 is sharded but fc7, on its output side, is not: sharded groups must be a prefix of the groups in backward order (fc8, fc7, fc6, conv)",
      );
      return true;
    },
  );
});

// Mutations tried, each made this test fail: validation letting `reduce` of a sharded group through
// (the first case reported "group fc is never updated…" elsewhere instead); the sharded update
// needing its reduce as before ("update fc comes before reduce fc" for the valid hybrid plan); the
// sharded stages still including reduce ("group fc is never reduced" instead of "never updated").
Deno.test("validate: a sharded group is never reduced or broadcast and is updated after its backward", () => {
  const conv = "backward conv; reduce conv; update conv; broadcast conv";
  const cases: [string, number, number, string, ("master" | "allreduce")[]][] = [
    [
      `shard fc\nforward\nbackward fc; reduce fc; update fc\n${conv}`,
      3,
      14,
      "fc is sharded (model-parallel): its gradients never travel; remove `reduce fc`",
      ["master", "allreduce"],
    ],
    [
      `shard fc\nforward\nbackward fc; update fc; broadcast fc\n${conv}`,
      3,
      25,
      "fc is sharded (model-parallel): each device keeps and updates its own slice, so there is nothing to broadcast; remove `broadcast fc`",
      // An error in allreduce mode too, not a no-op note.
      ["master", "allreduce"],
    ],
    [
      "shard fc\nforward; backward all\n  reduce all; update all; broadcast conv",
      3,
      3,
      "fc is sharded (model-parallel): its gradients never travel; remove `reduce fc` (name the unsharded groups instead of `all`: reduce conv)",
      ["master"],
    ],
    [
      `shard fc\nforward\nupdate fc; backward fc\n${conv}`,
      3,
      1,
      "update fc comes before backward fc",
      ["master", "allreduce"],
    ],
    [
      `shard fc\nforward\nbackward fc\n${conv}`,
      3,
      1,
      "group fc is never updated after its backward",
      ["master", "allreduce"],
    ],
  ];
  for (const [text, line, column, reason, modes] of cases) {
    for (const mode of modes) {
      const error = firstError(text, mode);
      assertAt(error, line, column, reason);
      assert.ok(
        error.message.startsWith(`schedule "my.sched" line ${line}, column ${column}: ${reason}\n  `),
        error.message,
      );
      assert.throws(() => parseSchedule(text, { groups: GROUPS, mode }), ScheduleError);
    }
  }
  // The hybrid plan itself is valid, with no note claiming it overlaps nothing.
  const good = parseSchedule(HYBRID_TEXT, { groups: GROUPS });
  assert.deepEqual(validatePlan(good, { mode: "master" }).notes, []);
  // Its sharded update after every backward: nothing overlaps, and the note says so.
  const late = parseSchedule("shard fc; forward; backward all; update fc; reduce conv; update conv", {
    groups: GROUPS,
  });
  assert.deepEqual(validatePlan(late, { mode: "allreduce" }).notes, [
    "every reduce and sharded update comes after the last backward, so no communication or update overlaps computation",
  ]);
  // Hand-made plans with a bad `sharded` list: no line to quote, the plan's name instead.
  const base = hybridPlan(GROUPS);
  for (
    const [sharded, reason] of [
      [
        ["conv"],
        "shard: conv is sharded but fc, on its output side, is not: sharded groups must be a prefix of the groups in backward order (fc, conv)",
      ],
      [
        ["fc", "conv"],
        "shard: every group is sharded; at least one group must stay unsharded (data-parallel): the body whose output is all-gathered into the sharded layers",
      ],
      [["lstm"], `shard: unknown group "lstm"; groups are fc, conv`],
    ] as const
  ) {
    const { errors } = checkPlan({ ...base, sharded }, { mode: "master" });
    assert.equal(errors[0].message, `schedule "hybrid": ${reason}`);
  }
});

// Mutations tried, each made this test fail: `hybrid` reducing its sharded group like `overlap`
// (validation failed in both modes); the default `sharded` being every group (ValueError for fc, conv).
Deno.test("hybrid built-in: the documented text, valid in both modes", () => {
  const plan = hybridPlan(GROUPS);
  assert.equal(plan.name, "hybrid");
  assert.deepEqual(
    hybridShape(plan),
    hybridShape(parseSchedule(HYBRID_TEXT, { groups: GROUPS, name: "hybrid" })),
  );
  assert.deepEqual(hybridShape(builtinPlan("hybrid", GROUPS)), hybridShape(plan));
  for (
    const [groups, sharded] of [
      [["fc", "conv"], undefined],
      [["fc8", "fc7", "fc6", "conv5", "conv1"], ["fc8", "fc7", "fc6"]],
      [["fc8", "fc7", "conv5", "conv1"], undefined],
    ] as const
  ) {
    const p = hybridPlan(groups, sharded);
    const shardedGroups = sharded ?? groups.slice(0, 1);
    assert.deepEqual(p.sharded, shardedGroups);
    assert.deepEqual(validatePlan(p, { mode: "master" }).notes, []);
    const notes = validatePlan(p, { mode: "allreduce" }).notes;
    assert.deepEqual(
      notes,
      groups.filter((g) => !shardedGroups.includes(g as never)).map((g) =>
        `broadcast ${g} (action ${
          labels(p).indexOf(`broadcast ${g}`)
        }) is a no-op in allreduce mode: every device updates its own copy`
      ),
    );
    // Sharded groups: backward, update. Unsharded ones: bucketed as in overlap.
    assert.deepEqual(labels(p), [
      "forward",
      ...groups.flatMap((g) =>
        shardedGroups.includes(g as never)
          ? [`backward ${g}`, `update ${g}`]
          : [`backward ${g}`, `reduce ${g}`, `update ${g}`, `broadcast ${g}`]
      ),
    ]);
  }
  assert.throws(() => hybridPlan(["only"]), ValueError);
  assert.throws(() => hybridPlan(GROUPS, ["conv"]), ValueError);
});

// Mutations tried, each made this test fail: the builder's `shard` skipping the prefix check; a second
// `shard` call replacing the first instead of throwing.
Deno.test("builder: shard checks its groups at once and is kept by later actions", () => {
  const b = scheduleBuilder(["fc8", "fc7", "conv"]);
  assert.throws(() => b.shard("fc7"), /fc7 is sharded but fc8, on its output side, is not/);
  assert.throws(() => b.shard(["fc8", "fc7", "conv"]), /every group is sharded/);
  assert.throws(() => b.shard([]), ValueError);
  // @ts-expect-error "fc6" is not one of the groups
  assert.throws(() => b.shard("fc6"), /unknown group "fc6"/);
  assert.throws(() => b.shard("all" as "fc8"), /"all" is not allowed/);
  assert.throws(() => b.shard("fc8").shard("fc8"), /shard is declared twice/);
  const plan = b.forward().shard("fc8").backward("fc8").update("fc8").build("late-shard");
  assert.deepEqual(plan.sharded, ["fc8"]);
  assert.throws(
    () =>
      b.shard("fc8").forward().backward("all").reduce("all").update("all").broadcast("all")
        .build("x", { mode: "master" }),
    (e: unknown) =>
      e instanceof ScheduleError && e.actionIndex === 4 &&
      e.reason === "fc8 is sharded (model-parallel): its gradients never travel; remove `reduce fc8`",
  );
});

// Mutation tried: dependenciesOf ignoring `sharded` (an update always needs its reduce) — update fc
// then waited for nothing of its own but the program-order wait, so the waitsFor checks and the
// dependency of update fc failed; the golden lists guard the data-parallel plans.
Deno.test("dependencies: a sharded update waits for its backward; data-parallel plans are unchanged", () => {
  const plan = hybridPlan(GROUPS);
  const index = (label: string) => labels(plan).indexOf(label);
  assert.deepEqual(dependenciesOf(plan, index("update fc")), [index("backward fc")]);
  assert.deepEqual(dependenciesOf(plan, index("backward conv")), [index("forward"), index("backward fc")]);
  assert.deepEqual(dependenciesOf(plan, index("reduce conv")), [index("update fc"), index("backward conv")]);
  // Lane order and data say everything: no program-order waits were needed.
  assert.ok(plan.actions.every((s) => s.waitsFor === undefined), JSON.stringify(plan.actions));
  // The same actions without `sharded`: update fc has no reduce to wait for.
  assert.deepEqual(dependenciesOf({ ...plan, sharded: undefined }, index("update fc")), []);
  // Before hybrid plans existed these were the data-parallel plans' dependencies (recorded from HEAD).
  const deps = (p: Plan) => p.actions.map((_, i) => dependenciesOf(p, i));
  assert.deepEqual(deps(sequentialPlan(GROUPS)), [[], [0], [0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [
    6,
    7,
  ]]);
  assert.deepEqual(deps(overlapPlan(GROUPS)), [[], [0], [1], [2], [3], [0, 1], [4, 5], [6], [7]]);
  assert.deepEqual(
    deps(bucketedPlan(["fc8", "fc7", "conv"])),
    [[], [0], [1], [2], [3], [0, 1], [4, 5], [6], [7], [0, 5], [8, 9], [10], [11]],
  );
});

// Mutations tried, each made this test fail: the lanes not exempting sharded updates from "only
// device 0 updates" (device 1's comm lane lost #2 update fc); the devices column ignoring `sharded`
// (no "+ all-gathers"); the data-parallel output changing (the golden overlap text, recorded from
// HEAD before hybrid plans existed).
Deno.test("explain: a hybrid plan shows its all-gathers, reduce-scatters and local updates", () => {
  const text = explain(hybridPlan(GROUPS), { devices: 2, mode: "master" });
  const rows = text.split("\n");
  const row = (i: number) => rows.find((r) => r.startsWith(`#${i} `))!;
  assert.match(row(0), /^#0 +forward +compute +0\.\.1 \+ all-gathers +-$/);
  assert.match(row(1), /^#1 +backward fc +compute +0\.\.1 \+ reduce-scatter +#0 forward$/);
  assert.match(row(2), /^#2 +update fc +comm +0\.\.1, own 1\/2 each +#1 backward fc$/);
  assert.match(row(4), /^#4 +reduce conv +comm +1 -> 0 /);
  assert.ok(text.includes("model-parallel actions (sharded: fc; data-parallel: conv):\n"));
  assert.ok(
    text.includes(
      "  #0 forward: each device runs conv on its own b samples; the body output is all-gathered",
    ),
  );
  assert.ok(text.includes("the slices are all-gathered (by columns) before the next layer, the logits too"));
  assert.ok(
    text.includes("  #1 backward fc: each layer's weight and bias gradients stay with the device owning"),
  );
  assert.ok(text.includes("its partial input gradient for all 2·b samples is reduce-scattered"));
  assert.ok(text.includes("the rows of its own samples, which feed #3 backward conv"));
  assert.ok(text.includes(
    "  #2 update fc: local: every device updates its own 1/2 slice with its own optimizer state, on the comm lane, alongside #3 backward conv; nothing is reduced or broadcast",
  ));
  // Every device runs the sharded update; only device 0 the data-parallel one (master mode).
  assert.ok(text.includes(
    "  device 1\n    compute | #0 forward -> #1 backward fc -> #3 backward conv\n" +
      "    comm    | #2 update fc -> #4 reduce conv -> #6 broadcast conv\n",
  ));
  assert.ok(!text.includes("notes:") && !text.includes("problems:"));
  // Data-parallel plans read exactly as before.
  assert.equal(
    explain(overlapPlan(GROUPS), { devices: 3, mode: "master" }),
    'schedule "overlap": 9 actions, 3 devices, master mode (reduce on device 0, update there, broadcast)\ngroups in backward order: fc, conv\n\naction  what            lane     devices    waits for\n#0      forward         compute  0..2       -\n#1      backward fc     compute  0..2       #0 forward\n#2      reduce fc       comm     1..2 -> 0  #1 backward fc\n#3      update fc       comm     0          #2 reduce fc\n#4      broadcast fc    comm     0 -> 1..2  #3 update fc\n#5      backward conv   compute  0..2       #0 forward, #1 backward fc\n#6      reduce conv     comm     1..2 -> 0  #4 broadcast fc, #5 backward conv\n#7      update conv     comm     0          #6 reduce conv\n#8      broadcast conv  comm     0 -> 1..2  #7 update conv\n\nlanes (actions in the order each lane runs them):\n  device 0\n    compute | #0 forward -> #1 backward fc -> #5 backward conv\n    comm    | #2 reduce fc -> #3 update fc -> #4 broadcast fc -> #6 reduce conv -> #7 update conv -> #8 broadcast conv\n  device 1\n    compute | #0 forward -> #1 backward fc -> #5 backward conv\n    comm    | #2 reduce fc -> #4 broadcast fc -> #6 reduce conv -> #8 broadcast conv\n  device 2\n    compute | #0 forward -> #1 backward fc -> #5 backward conv\n    comm    | #2 reduce fc -> #4 broadcast fc -> #6 reduce conv -> #8 broadcast conv\n',
  );
  // A broken hybrid plan is explained too, its problem listed.
  const broken = explain(
    parseSchedule(`shard fc; forward; backward fc; reduce fc; update fc`, { groups: GROUPS }),
    {
      devices: 2,
      mode: "allreduce",
    },
  );
  assert.ok(
    broken.includes('problems:\n  schedule "schedule" line 1, column 33: fc is sharded (model-parallel)'),
    broken,
  );
});
