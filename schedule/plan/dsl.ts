/**
 * The text form of a schedule. A schedule is a list of actions separated by `;` or newlines, with `#`
 * starting a comment that runs to the end of the line:
 *
 * ```text
 * schedule overlap            # optional header naming the plan; must be the first statement
 * groups fc, conv             # optional: the groups in backward order (output side first)
 * forward
 * backward fc; reduce fc; update fc; broadcast fc
 * backward conv; reduce conv; update conv; broadcast conv
 * ```
 *
 * Statements:
 * - `schedule NAME` — names the plan (else `options.name`, else the file's base name, else `schedule`).
 * - `groups G1, G2, …` — declares the groups in backward order; when `options.groups` is also given
 *   (taken from the model) the two must agree, so a schedule written for another model fails early.
 * - `shard G1, G2, …` — declares model-parallel groups (a hybrid plan, `Plan.sharded`): each device
 *   holds 1/N of every layer's output units of these groups and their optimizer state, while the
 *   other groups stay data-parallel. Groups as in the actions below, but `all` is not allowed: they
 *   must be a prefix of the groups in backward order (the output side, e.g. `fc`) and leave at least
 *   one group unsharded. At most once, before the first action (after the `schedule` and `groups`
 *   headers). A sharded group is never reduced or broadcast, and its `update` follows its
 *   `backward` (validation checks both). Example, the `hybrid` built-in:
 *   `shard fc; forward; backward fc; update fc; backward conv; reduce conv; update conv; broadcast conv`.
 * - `forward` — the forward pass (no group).
 * - `backward|reduce|update|broadcast TARGETS` — TARGETS is `all` or one or more groups separated by
 *   commas or spaces. `all` and lists expand into one action per group, `all` in backward order, so
 *   `reduce all` with groups fc, conv is `reduce fc; reduce conv`.
 *
 * Order: actions on one lane run in the order written. A communication action (reduce, update,
 * broadcast) also waits for every compute action written before it, so `backward all; reduce all`
 * reduces only after the whole backward; a compute action waits only for its data, never for
 * communication written before it, so `update fc; backward conv` run side by side (see
 * `withProgramOrder` in plan.ts).
 *
 * Names are letters, digits, `_`, `.` and `-`; `all` is reserved. Every action records the line and
 * column of its keyword (actions expanded from one statement share them), which validation quotes.
 * Parsing checks syntax and names only; pass `mode` (or call `validatePlan`) to check the order.
 *
 * @module
 */

import { editDistance, ValueError } from "../../engine/errors.ts";
import { ScheduleError } from "./errors.ts";
import {
  type ActionKind,
  actionLabel,
  laneOf,
  type Plan,
  type PlanAction,
  type ReductionMode,
  withProgramOrder,
} from "./plan.ts";
import { shardingProblem, validatePlan } from "./validate.ts";

/**
 * Options of {@link parseSchedule}, {@link loadSchedule} and the {@link schedule} tag.
 *
 * @example
 * ```ts
 * import { type ParseOptions, parseSchedule } from "./dsl.ts";
 * const options: ParseOptions = { groups: ["fc", "conv"], fileName: "fast.sched", mode: "master" };
 * parseSchedule("forward; backward all; reduce all; update all; broadcast all", options);
 * ```
 */
export interface ParseOptions {
  /**
   * The model's parameter groups in backward order (output side first), e.g. `["fc", "conv"]`. When
   * absent, the text must declare them with a `groups` statement.
   */
  readonly groups?: readonly string[];
  /** The plan's name when the text has no `schedule NAME` header. */
  readonly name?: string;
  /** The file the text came from; error messages name it. */
  readonly fileName?: string;
  /** When given, the parsed plan is also validated for this reduction mode (see `validatePlan`). */
  readonly mode?: ReductionMode;
}

const ACTION_KINDS: readonly ActionKind[] = ["forward", "backward", "reduce", "update", "broadcast"];
const KEYWORDS = [...ACTION_KINDS, "schedule", "groups", "shard"];
const NAME = /^[A-Za-z0-9_][A-Za-z0-9_.-]*$/;

interface Token {
  /** The token's text; `,` for a comma. */
  readonly text: string;
  /** 1-based column. */
  readonly column: number;
}

/** Splits one statement into names and commas, rejecting any other character where it stands. */
function tokenize(
  statement: string,
  offset: number,
  fail: (reason: string, column: number) => never,
): Token[] {
  const tokens: Token[] = [];
  let i = 0;
  while (i < statement.length) {
    const c = statement[i];
    if (c === " " || c === "\t" || c === "\r") {
      i++;
    } else if (c === ",") {
      tokens.push({ text: ",", column: offset + i + 1 });
      i++;
    } else if (/[A-Za-z0-9_]/.test(c)) {
      let j = i + 1;
      while (j < statement.length && /[A-Za-z0-9_.-]/.test(statement[j])) j++;
      tokens.push({ text: statement.slice(i, j), column: offset + i + 1 });
      i = j;
    } else {
      fail(`unexpected character ${JSON.stringify(c)}`, offset + i + 1);
    }
  }
  return tokens;
}

function suggestion(word: string, candidates: readonly string[]): string {
  let best: string | undefined;
  // Allow one edit per three letters (at least one), and never replace the whole word.
  let bestDistance = Math.min(Math.max(1, Math.floor(word.length / 3)), word.length - 1) + 1;
  for (const candidate of candidates) {
    const d = editDistance(word.toLowerCase(), candidate.toLowerCase());
    if (d < bestDistance) [best, bestDistance] = [candidate, d];
  }
  return best === undefined ? "" : ` (did you mean ${JSON.stringify(best)}?)`;
}

/**
 * Checks a group list handed in by code; such mistakes are the caller's, not the schedule text's.
 *
 * @example
 * ```ts
 * import { checkGroupNames } from "./dsl.ts";
 * checkGroupNames(["fc", "conv"], "myFunction"); // fine
 * // checkGroupNames(["fc", "all"], "myFunction") throws ValueError: "all" is reserved
 * ```
 */
export function checkGroupNames(groups: readonly string[], where: string): void {
  if (groups.length === 0) throw new ValueError(where, "groups must not be empty");
  const seen = new Set<string>();
  for (const group of groups) {
    if (typeof group !== "string" || !NAME.test(group)) {
      throw new ValueError(where, `group ${JSON.stringify(group)} is not a name (letters, digits, _ . -)`);
    }
    if (group === "all") throw new ValueError(where, `"all" is reserved and cannot name a group`);
    if (seen.has(group)) throw new ValueError(where, `group ${JSON.stringify(group)} is listed twice`);
    seen.add(group);
  }
}

function baseName(fileName: string): string {
  const file = fileName.slice(Math.max(fileName.lastIndexOf("/"), fileName.lastIndexOf("\\")) + 1);
  const dot = file.lastIndexOf(".");
  return dot > 0 ? file.slice(0, dot) : file;
}

/**
 * Parses schedule text into a {@link Plan}. Syntax errors, unknown keywords and unknown groups throw
 * a {@link ScheduleError} with the line and column; with `options.mode` the plan is also validated.
 *
 * @example
 * ```ts
 * import { parseSchedule } from "./dsl.ts";
 * const plan = parseSchedule(
 *   "forward; backward fc; reduce fc; update fc; backward conv; reduce conv; update conv; broadcast all",
 *   { groups: ["fc", "conv"], name: "overlap" },
 * );
 * console.log(plan.actions.length); // 9
 * ```
 */
export function parseSchedule(text: string, options: ParseOptions = {}): Plan {
  if (options.groups !== undefined) checkGroupNames(options.groups, "parseSchedule");
  const lines = text.split("\n");
  const label = options.fileName ?? options.name ?? "schedule";
  let lineIndex = 0;
  const fail: (reason: string, column: number, line?: number) => never = (
    reason,
    column,
    line = lineIndex + 1,
  ) => {
    throw new ScheduleError(reason, {
      schedule: label,
      line,
      column,
      sourceLine: (lines[line - 1] ?? "").replace(/\r$/, ""),
    });
  };

  let name: string | undefined;
  let groups = options.groups;
  let declaredGroups = false;
  /** The `shard` statement's groups, in backward order; undefined until one is seen. */
  let sharded: string[] | undefined;
  const actions: PlanAction[] = [];
  let statementCount = 0;

  for (; lineIndex < lines.length; lineIndex++) {
    const raw = lines[lineIndex];
    const hash = raw.indexOf("#");
    const code = hash < 0 ? raw : raw.slice(0, hash);
    let start = 0;
    for (const piece of code.split(";")) {
      const tokens = tokenize(piece, start, fail);
      start += piece.length + 1;
      if (tokens.length === 0) continue;
      statementCount++;
      const [head, ...rest] = tokens;
      const keyword = head.text;
      if (keyword === ",") fail("a statement cannot start with a comma", head.column);

      if (keyword === "schedule") {
        if (statementCount !== 1) fail("the `schedule NAME` header must be the first statement", head.column);
        if (rest.length !== 1 || rest[0].text === ",") {
          fail(
            "`schedule` takes exactly one name, e.g. `schedule overlap`",
            (rest[1] ?? rest[0] ?? head).column,
          );
        }
        name = rest[0].text;
        continue;
      }

      if (keyword === "groups") {
        if (declaredGroups) fail("groups are declared twice", head.column);
        if (actions.length > 0) fail("`groups` must come before the first action", head.column);
        if (sharded !== undefined) fail("`groups` must come before `shard`", head.column);
        const declared = namesOf(rest, head, "groups", fail);
        for (const token of declared) {
          if (token.text === "all") fail(`"all" is reserved and cannot name a group`, token.column);
        }
        const names = declared.map((t) => t.text);
        const duplicate = declared.find((t, i) => names.indexOf(t.text) !== i);
        if (duplicate) fail(`group ${duplicate.text} is declared twice`, duplicate.column);
        if (groups !== undefined && names.join(",") !== groups.join(",")) {
          fail(
            `declared groups ${names.join(", ")} differ from the model's groups ${
              groups.join(", ")
            } (backward order, output side first)`,
            head.column,
          );
        }
        groups = names;
        declaredGroups = true;
        continue;
      }

      if (keyword === "shard") {
        if (sharded !== undefined) fail("`shard` is declared twice", head.column);
        if (actions.length > 0) fail("`shard` must come before the first action", head.column);
        if (groups === undefined) {
          fail(
            "shard names a group but no groups are known: pass options.groups or declare them first, e.g. `groups fc, conv`",
            head.column,
          );
        }
        if (rest.length === 0) fail("shard needs one or more groups, e.g. `shard fc`", head.column);
        const known: readonly string[] = groups;
        const targets = namesOf(rest, head, "shard", fail);
        for (const token of targets) {
          if (token.text === "all") {
            fail(
              "`shard all` is not allowed: at least one group must stay unsharded (data-parallel); name the output-side groups, e.g. `shard fc`",
              token.column,
            );
          }
          if (!known.includes(token.text)) {
            fail(
              `unknown group ${JSON.stringify(token.text)}${suggestion(token.text, known)}; groups are ${
                known.join(", ")
              }`,
              token.column,
            );
          }
        }
        const names = targets.map((t) => t.text);
        const problem = shardingProblem(known, names);
        if (problem !== undefined) {
          fail(problem.reason, problem.at === undefined ? head.column : targets[problem.at].column);
        }
        sharded = known.filter((g) => names.includes(g));
        continue;
      }

      if (!(ACTION_KINDS as readonly string[]).includes(keyword)) {
        fail(
          `unknown action ${JSON.stringify(keyword)}${suggestion(keyword, KEYWORDS)}; actions are ${
            ACTION_KINDS.join(", ")
          }`,
          head.column,
        );
      }
      const kind = keyword as ActionKind;
      const position = { line: lineIndex + 1, column: head.column };
      if (kind === "forward") {
        if (rest.length > 0) fail("forward takes no group", rest[0].column);
        actions.push({ kind, lane: laneOf(kind), ...position });
        continue;
      }
      if (groups === undefined) {
        fail(
          `${kind} names a group but no groups are known: pass options.groups or declare them first, e.g. \`groups fc, conv\``,
          head.column,
        );
      }
      const known: readonly string[] = groups;
      const targets = namesOf(rest, head, kind, fail);
      const all = targets.find((t) => t.text === "all");
      if (all && targets.length > 1) fail("`all` cannot be combined with other groups", all.column);
      for (const token of targets) {
        if (token.text !== "all" && !known.includes(token.text)) {
          fail(
            `unknown group ${JSON.stringify(token.text)}${suggestion(token.text, known)}; groups are ${
              known.join(", ")
            }`,
            token.column,
          );
        }
      }
      const expanded = all ? known : targets.map((t) => t.text);
      for (const group of expanded) actions.push({ kind, group, lane: laneOf(kind), ...position });
    }
  }

  if (groups === undefined) {
    lineIndex = 0;
    fail("no groups are known: pass options.groups or declare them, e.g. `groups fc, conv`", 1);
  }
  const fromFile = options.fileName === undefined ? undefined : baseName(options.fileName);
  const source = options.fileName === undefined ? { text } : { text, fileName: options.fileName };
  const plan: Plan = {
    name: name ?? options.name ?? fromFile ?? "schedule",
    groups: [...groups!],
    actions: withProgramOrder(actions, sharded),
    source,
    ...(sharded === undefined ? {} : { sharded }),
  };
  if (options.mode !== undefined) validatePlan(plan, { mode: options.mode });
  return plan;
}

/** The names after a keyword, separated by commas or spaces; rejects stray or doubled commas. */
function namesOf(
  rest: readonly Token[],
  head: Token,
  what: string,
  fail: (reason: string, column: number) => never,
): Token[] {
  const names: Token[] = [];
  let expectName = true;
  for (const token of rest) {
    if (token.text === ",") {
      if (expectName) fail(`expected a group name before ","`, token.column);
      expectName = true;
    } else {
      names.push(token);
      expectName = false;
    }
  }
  if (names.length === 0) fail(`${what} needs a group or \`all\``, head.column);
  if (expectName) fail(`a group name must follow the last ","`, rest[rest.length - 1].column);
  return names;
}

/**
 * Reads and parses a schedule file; messages name the file, and the plan is named after it unless the
 * text has a `schedule NAME` header.
 *
 * @example
 * ```ts
 * import { loadSchedule } from "./dsl.ts";
 * const path = await Deno.makeTempFile({ suffix: ".sched" });
 * await Deno.writeTextFile(path, "forward\nbackward all\nreduce all\nupdate all\nbroadcast all\n");
 * const plan = await loadSchedule(path, { groups: ["fc", "conv"], mode: "master" });
 * console.log(plan.actions.length); // 9
 * ```
 */
export async function loadSchedule(path: string, options: ParseOptions = {}): Promise<Plan> {
  const text = await Deno.readTextFile(path);
  return parseSchedule(text, { ...options, fileName: options.fileName ?? path });
}

/**
 * A template tag that parses its text with fixed options.
 *
 * @example
 * ```ts
 * import { schedule, type ScheduleTag } from "./dsl.ts";
 * const alexnet: ScheduleTag = schedule({ groups: ["fc", "conv"] });
 * const plan = alexnet`forward; backward all; reduce all; update all; broadcast all`;
 * ```
 */
export type ScheduleTag = (strings: TemplateStringsArray, ...values: unknown[]) => Plan;

/**
 * Parses a schedule written inline. Use it directly as a tag when the text declares its groups, or
 * call it with {@link ParseOptions} to get a tag; interpolated values are pasted into the text first,
 * so `backward ${group}` works and errors point into the pasted text.
 *
 * @example
 * ```ts
 * import { schedule } from "./dsl.ts";
 * const a = schedule`
 *   schedule sequential
 *   groups fc, conv
 *   forward; backward all; reduce all; update all; broadcast all
 * `;
 * const b = schedule({ groups: ["fc", "conv"], mode: "master" })`forward
 *   backward all; reduce all; update all; broadcast all`;
 * console.log(a.actions.length === b.actions.length); // true
 * ```
 */
export function schedule(strings: TemplateStringsArray, ...values: unknown[]): Plan;
/** With options first: returns a tag that parses with those options. */
export function schedule(options: ParseOptions): ScheduleTag;
export function schedule(
  first: TemplateStringsArray | ParseOptions,
  ...values: unknown[]
): Plan | ScheduleTag {
  const isTemplate = Array.isArray(first) && "raw" in first;
  if (isTemplate) return parseSchedule(joinTemplate(first as TemplateStringsArray, values));
  const options = first as ParseOptions;
  return (strings, ...inner) => parseSchedule(joinTemplate(strings, inner), options);
}

function joinTemplate(strings: TemplateStringsArray, values: readonly unknown[]): string {
  return strings.reduce((text, piece, i) => text + piece + (i < values.length ? String(values[i]) : ""), "");
}

/**
 * The canonical text of a plan: a `schedule` header, the `groups` declaration, the `shard`
 * declaration of a hybrid plan, and one action a line. Parsing it gives the same plan (positions
 * aside), so it is also a readable plan fingerprint. Text can only express program order, so extra
 * `waitsFor` entries of hand-made plans are not kept.
 *
 * @example
 * ```ts
 * import { formatPlan, parseSchedule } from "./dsl.ts";
 * const plan = parseSchedule("forward; backward all", { groups: ["fc", "conv"], name: "x" });
 * console.log(formatPlan(plan)); // "schedule x\ngroups fc, conv\nforward\nbackward fc\nbackward conv\n"
 * const hybrid = parseSchedule("shard fc; forward; backward fc; update fc", { groups: ["fc", "conv"], name: "h" });
 * console.log(formatPlan(hybrid)); // "schedule h\ngroups fc, conv\nshard fc\nforward\nbackward fc\nupdate fc\n"
 * ```
 */
export function formatPlan(plan: Plan): string {
  const header = NAME.test(plan.name) ? `schedule ${plan.name}\n` : `# ${plan.name}\n`;
  const shard = (plan.sharded ?? []).length > 0 ? `shard ${plan.sharded!.join(", ")}\n` : "";
  return `${header}groups ${plan.groups.join(", ")}\n${shard}${
    plan.actions.map((s) => `${actionLabel(s)}\n`).join("")
  }`;
}
