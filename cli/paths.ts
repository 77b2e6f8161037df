/**
 * Where the paths a user types point, and where outputs nobody named go.
 *
 * `deno task train` runs in the directory of deno.json, not where the user typed the command; it
 * exports that directory as `INIT_CWD` (as npm scripts do). So a relative path on the command line
 * resolves against `INIT_CWD` when it is set, else against the process's working directory: the
 * file lands where the user expects whether they ran `deno task train` from a subdirectory or
 * `deno run cli/train.ts` directly. Every path flag goes through {@link resolveUserPath} once, in
 * `parseTrainArgs`; nothing else in the CLI resolves a path.
 *
 * @module
 */

import { isAbsolute, join, resolve, sep } from "node:path";

/** The directory of deno.json: where `deno task` runs its commands. */
const PROJECT_ROOT = resolve(new URL("..", import.meta.url).pathname);

/**
 * The directory relative paths resolve from: `INIT_CWD` when set and non-empty and the process runs
 * where `deno task` puts it (the project's root), else the working directory. A process started
 * elsewhere (a test's child with its own `cwd`, a script) inherits a stale `INIT_CWD` from the task
 * that launched its parent; its own working directory is what the user meant then.
 *
 * @example
 * ```ts
 * import { userDirectory } from "./paths.ts";
 * console.log(userDirectory("/home/me/project/sub")); // /home/me/project/sub, under deno task
 * ```
 */
export function userDirectory(
  initCwd: string | undefined = Deno.env.get("INIT_CWD"),
  cwd: string = Deno.cwd(),
): string {
  const set = initCwd !== undefined && initCwd.trim() !== "";
  return set && resolve(cwd) === PROJECT_ROOT ? resolve(initCwd) : cwd;
}

/**
 * `path` as the process must open it: absolute paths unchanged; relative ones joined to `base`
 * (default {@link userDirectory}). When `base` is the working directory the path is returned exactly
 * as typed, so messages show it as the user wrote it.
 *
 * @example
 * ```ts
 * import { resolveUserPath } from "./paths.ts";
 * console.log(resolveUserPath("run.safetensors", "/tmp/elsewhere")); // /tmp/elsewhere/run.safetensors
 * ```
 */
export function resolveUserPath(path: string, base: string = userDirectory()): string {
  if (isAbsolute(path) || resolve(base) === Deno.cwd()) return path;
  return join(base, path);
}

/**
 * `text` with every absolute path under `base` written relative to it again, so that a message about
 * a path the user typed relative (and {@link resolveUserPath} made absolute) shows it as typed.
 * Unchanged when `base` is the working directory (nothing was rewritten then).
 *
 * @example
 * ```ts
 * import { showUserPaths } from "./paths.ts";
 * showUserPaths("--trace /tmp/sub/t.json: no such directory", "/tmp/sub"); // "--trace t.json: …"
 * ```
 */
export function showUserPaths(text: string, base: string = userDirectory()): string {
  const root = resolve(base);
  if (root === Deno.cwd() || root === sep) return text;
  return text.replaceAll(root + sep, "");
}

/** The folder (under the user's directory, git-ignored in this repository) for outputs nobody named. */
export const DEFAULT_OUTPUT_FOLDER = "runs";

/**
 * Where an output nobody named (Ctrl-C's checkpoint without `--checkpoint`) goes: `name` in
 * {@link DEFAULT_OUTPUT_FOLDER} under `base`, the folder created on demand, so stray files never
 * litter the user's directory or the repository.
 *
 * @example
 * ```ts ignore
 * import { defaultOutputPath } from "./paths.ts";
 * const path = await defaultOutputPath("tandem-interrupted.safetensors"); // runs/tandem-interrupted.safetensors
 * ```
 */
export async function defaultOutputPath(name: string, base: string = userDirectory()): Promise<string> {
  const folder = resolveUserPath(DEFAULT_OUTPUT_FOLDER, base);
  await Deno.mkdir(folder, { recursive: true });
  return join(folder, name);
}
