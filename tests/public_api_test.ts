/**
 * The public API: a root a newcomer can hold, subpath entries for the rest, no internals on show,
 * no two names that differ only by letter case, and every entry documented.
 *
 * Everything is read from `deno doc` (run with `Deno.execPath()`), so the test sees what JSR will:
 * type exports count as names, and re-exports resolve to their declarations.
 *
 * Mutations tried, each of which made this file fail:
 * - `export * from "./schedule/mod.ts";` at the root: 103 root names (> 80).
 * - `export { sequentialPlan as sequential } from "./schedule/mod.ts";` at the root: `sequential` and
 *   `Sequential` differ only by case, and `sequential` returns a `Plan`, not a `Sequential`.
 * - An `"./ops": "./engine/ops/mod.ts"` subpath: `relu`/`ReLU`, `linear`/`Linear`, … (ops are
 *   reached as `ops.relu` instead).
 * - `export { MpiError, MpiLibrary } from "./library.ts";` in `schedule/mpi/mod.ts`: a leaked
 *   internal (and doc lint then wants `MpiSymbols`, `MpiHandles` public too).
 * - `export { fromStorage } from "./creation.ts";` in `engine/mod.ts`: a leaked internal.
 * - Deleting the `@example` of `schedule/mpi/mod.ts`: an undocumented entry.
 * - Dropping `@internal` from `Tensor.node`: `deno doc --lint` fails (`GradNode` is private).
 * - Dropping `"schedule/"` from the publish include list: entries that would not be published.
 *
 * @module
 */

import assert from "node:assert/strict";

const ROOT = new URL("../", import.meta.url);

interface DenoJson {
  exports: Record<string, string>;
  publish: { include: string[] };
}

const config: DenoJson = JSON.parse(await Deno.readTextFile(new URL("deno.json", ROOT)));
const entries = Object.entries(config.exports);

/** Names the issue found leaking from the root: MPI's FFI tables and low-level helpers. */
const LEAKED_INTERNALS = [
  "MPI_FUNCTIONS",
  "MpiLibrary",
  "MpiSymbols",
  "MpiHandles",
  "MpiRequest",
  "waitUntil",
  "transfer",
  "streamOf",
  "philox4x32",
  "fromStorage",
  "GradNode",
];

/**
 * Where a leaked internal may still be public, and why. `MpiRequest` is what six of
 * `MpiTransport`'s public collectives return (`allreduceSum(...).wait()`): whoever holds the
 * transport needs its type. It stays off the root.
 */
const NEEDED_BY_USERS: Record<string, string> = { MpiRequest: "./mpi" };

/** Format constants and helpers that belong to their own files only. */
const FILE_INTERNALS = [
  "MAX_HEADER_BYTES",
  "MAX_HEADER_DEPTH",
  "MAX_METADATA_JSON_DEPTH",
  "jsonDepthProblem",
  "dtypeOfTensor",
  "MAX_CAFFEMODEL_BYTES",
  "MAX_CAFFEMODEL_DEPTH",
  "MAX_PROTOTXT_DEPTH",
  "IDX_IMAGES_MAGIC",
  "IDX_LABELS_MAGIC",
  "CIFAR10_RECORD_BYTES",
  "DATA_STREAMS",
  "RESIDUAL_PREFIX",
  "DEVICE_COST",
  "MPI_LIBRARY_CANDIDATES",
  "MPI_THREAD_FUNNELED",
  "editDistance",
];

// deno-lint-ignore no-explicit-any
type Json = any;

interface Exported {
  name: string;
  kind: string;
  /** `file:line` of the declaration, to tell one symbol re-exported twice from two symbols. */
  where: string;
  declaration: Json;
}

async function deno(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
    args,
    cwd: ROOT,
    stdout: "piped",
    stderr: "piped",
    env: { NO_COLOR: "1" },
  }).output();
  return { code, stdout: new TextDecoder().decode(stdout), stderr: new TextDecoder().decode(stderr) };
}

/** `deno doc --json` of every entry at once, as subpath → module doc and exported names. */
async function documentEntries(): Promise<Map<string, { moduleDoc: Json; names: Exported[] }>> {
  const run = await deno(["doc", "--json", ...entries.map(([, path]) => path)]);
  assert.equal(run.code, 0, `deno doc --json failed:\n${run.stderr}`);
  const nodes: Record<string, Json> = JSON.parse(run.stdout).nodes;
  // A symbol exported by several entries is documented once; the others hold a `reference` to it.
  const at = (location: Json) => `${location.filename}:${location.line}`;
  const declarations = new Map<string, Json>();
  for (const node of Object.values(nodes)) {
    for (const s of node.symbols) {
      for (const d of s.declarations) if (d.kind !== "reference") declarations.set(at(d.location), d);
    }
  }
  const bySubpath = new Map<string, { moduleDoc: Json; names: Exported[] }>();
  for (const [subpath, path] of entries) {
    const url = new URL(path, ROOT).href;
    assert.ok(nodes[url], `${subpath} (${path}) is not in deno doc's output`);
    const names: Exported[] = nodes[url].symbols.map((s: Json) => {
      const first = s.declarations[0];
      const where = first.kind === "reference" ? at(first.def.target) : at(first.location);
      const declaration = first.kind === "reference" ? declarations.get(where) : first;
      assert.ok(declaration, `${subpath}: cannot resolve ${s.name} (${where})`);
      return { name: s.name, kind: declaration.kind, where, declaration };
    });
    bySubpath.set(subpath, { moduleDoc: nodes[url].module_doc, names });
  }
  return bySubpath;
}

const documented = await documentEntries();
const rootNames = documented.get(".")!.names.map((e) => e.name);

/** Type names a return type mentions (through unions, arrays, promises, object literals). */
function mentionedTypes(type: Json, out = new Set<string>()): Set<string> {
  if (type === null || typeof type !== "object") return out;
  if (type.kind === "typeRef" && type.value?.typeName) out.add(type.value.typeName);
  for (const value of Object.values(type)) {
    if (Array.isArray(value)) value.forEach((v) => mentionedTypes(v, out));
    else if (typeof value === "object") mentionedTypes(value, out);
  }
  return out;
}

Deno.test("public API: the root exports at most 80 names, types included", () => {
  assert.ok(rootNames.length <= 80, `the root exports ${rootNames.length} names:\n${rootNames.join(" ")}`);
});

Deno.test("public API: the leaked internals are off the root and off every subpath entry", () => {
  for (const [subpath, { names }] of documented) {
    const exported = new Set(names.map((e) => e.name));
    for (const name of LEAKED_INTERNALS) {
      if (NEEDED_BY_USERS[name] === subpath) continue;
      assert.ok(!exported.has(name), `${subpath} exports the internal ${name}`);
    }
    for (const name of FILE_INTERNALS) {
      assert.ok(!exported.has(name), `${subpath} exports the file-internal ${name}`);
    }
  }
  for (const [name, subpath] of Object.entries(NEEDED_BY_USERS)) {
    assert.ok(!rootNames.includes(name), `${name} is at the root`);
    assert.ok(documented.get(subpath), `${name}'s entry ${subpath} is not in deno.json`);
  }
});

Deno.test("public API: no two exported names differ only by letter case, and one name is one symbol", () => {
  const byName = new Map<string, Exported & { subpath: string }>();
  for (const [subpath, { names }] of documented) {
    for (const e of names) {
      const seen = byName.get(e.name);
      if (seen) {
        assert.equal(
          e.where,
          seen.where,
          `${e.name} means two things: ${seen.subpath} exports ${seen.where}, ${subpath} exports ${e.where}`,
        );
      } else byName.set(e.name, { ...e, subpath });
    }
  }
  const byLower = new Map<string, string[]>();
  for (const name of byName.keys()) {
    byLower.set(name.toLowerCase(), [...byLower.get(name.toLowerCase()) ?? [], name]);
  }
  const collisions: string[] = [];
  for (const group of byLower.values()) {
    if (group.length < 2) continue;
    // The one allowed pairing: a function named after the type it makes (`tensor` → `Tensor`,
    // `scheduleBuilder` → `ScheduleBuilder`, `machineSize` → `MachineSize`). Anything else is two
    // concepts a reader cannot tell apart.
    const types = group.filter((n) => byName.get(n)!.kind !== "function");
    const functions = group.filter((n) => byName.get(n)!.kind === "function");
    const factory = types.length === 1 && functions.length === group.length - 1 &&
      functions.every((f) => mentionedTypes(byName.get(f)!.declaration.def.returnType).has(types[0]));
    if (!factory) {
      collisions.push(
        group.map((n) => `${n} (${byName.get(n)!.kind}, ${byName.get(n)!.subpath})`).join(" / "),
      );
    }
  }
  assert.deepEqual(collisions, [], `names that differ only by case:\n${collisions.join("\n")}`);
});

Deno.test("public API: every subpath entry resolves, is documented with an example, and doc lint is clean", async () => {
  for (const [subpath, path] of entries) {
    assert.match(path, /(^|\/)mod\.ts$/, `${subpath} should point at a mod.ts entry, not ${path}`);
    const { moduleDoc } = documented.get(subpath)!;
    assert.ok(moduleDoc?.doc?.trim(), `${subpath} (${path}) has no @module documentation`);
    assert.ok(
      (moduleDoc.tags ?? []).some((t: Json) => t.kind === "example"),
      `${subpath} (${path}) has no @example in its module documentation`,
    );
  }
  // One lint over every entry: the package's public surface is their union, so a type an entry's
  // symbols reference is public when any entry exports it (as on JSR).
  const lint = await deno(["doc", "--lint", ...entries.map(([, path]) => path)]);
  assert.equal(lint.code, 0, `deno doc --lint:\n${lint.stdout}\n${lint.stderr}`);
});

Deno.test("public API: the root is a selection of the subpath entries, never a symbol's only home", () => {
  const elsewhere = new Set(
    [...documented].filter(([subpath]) => subpath !== ".").flatMap(([, { names }]) =>
      names.map((e) => e.where)
    ),
  );
  const rootOnly = documented.get(".")!.names.filter((e) => !elsewhere.has(e.where)).map((e) => e.name);
  assert.deepEqual(rootOnly, [], `exported by the root only: ${rootOnly.join(", ")}`);
});

Deno.test("public API: the publish include list covers every entry", () => {
  for (const [subpath, path] of entries) {
    const file = path.replace(/^\.\//, "");
    const covered = config.publish.include.some((p) => p.endsWith("/") ? file.startsWith(p) : file === p);
    assert.ok(covered, `${subpath} (${path}) is outside publish.include`);
  }
});

Deno.test("public API: every name the README's examples import is exported where they import it", async () => {
  const readme = await Deno.readTextFile(new URL("README.md", ROOT));
  const blocks = [...readme.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1]);
  let checked = 0;
  for (const block of blocks) {
    for (const m of block.matchAll(/import\s+(?:type\s+)?\{([^}]*)\}\s+from\s+"@tandem\/core(\/[\w/]+)?"/g)) {
      const subpath = m[2] ? `.${m[2]}` : ".";
      const entry = documented.get(subpath);
      assert.ok(entry, `the README imports from @tandem/core${m[2] ?? ""}, which deno.json does not export`);
      const exported = new Set(entry.names.map((e) => e.name));
      for (const raw of m[1].split(",")) {
        const name = raw.trim().replace(/^type\s+/, "").split(/\s+as\s+/)[0];
        if (!name) continue;
        assert.ok(exported.has(name), `the README imports ${name} from @tandem/core${m[2] ?? ""}`);
        checked++;
      }
    }
  }
  assert.ok(checked > 0, "found no imports in the README's ts blocks");
});
