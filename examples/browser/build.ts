/**
 * Bundles Tandem for browsers with esbuild: `dist/tandem.js` (the whole library, ESM) and
 * `dist/main.js` (the training page's script, library included), both beside `index.html`.
 *
 * Run: `npx deno task bundle` (or `npx deno run -A examples/browser/build.ts`).
 *
 * @module
 */

import * as esbuild from "esbuild";

const here = new URL(".", import.meta.url);
const root = new URL("../../", import.meta.url);

/** Where {@link bundle} writes the browser bundles. */
export const DIST_DIR: URL = new URL("dist/", here);

/** What one {@link bundle} run produced. */
export interface BundleResult {
  /** Absolute paths of the files written, with their sizes in bytes. */
  outputs: { path: string; bytes: number }[];
  /** esbuild warnings, formatted, for the caller to show. */
  warnings: string[];
}

/**
 * Builds `dist/tandem.js` and `dist/main.js`.
 *
 * `node:*` and `npm:*` specifiers are marked external: the npm dataset loaders reach them only
 * through dynamic imports inside functions the page never calls, so the browser never fetches
 * them, and bundling them would fail (they do not exist outside Deno/Node).
 *
 * @example
 * ```ts
 * import { bundle } from "./build.ts";
 * // const { outputs } = await bundle();
 * ```
 */
export async function bundle(): Promise<BundleResult> {
  await Deno.mkdir(DIST_DIR, { recursive: true });
  const common: esbuild.BuildOptions = {
    bundle: true,
    format: "esm",
    platform: "browser",
    target: "es2022",
    sourcemap: true,
    metafile: true,
    logLevel: "silent",
    external: ["node:*", "npm:*"],
    absWorkingDir: decodeURIComponent(root.pathname),
  };
  const builds = [
    { entry: "mod.ts", out: "tandem.js" },
    { entry: "examples/browser/main.ts", out: "main.js" },
  ];
  const outputs: BundleResult["outputs"] = [];
  const warnings: string[] = [];
  try {
    for (const { entry, out } of builds) {
      const result = await esbuild.build({
        ...common,
        entryPoints: [entry],
        outfile: decodeURIComponent(new URL(out, DIST_DIR).pathname),
      });
      warnings.push(...await esbuild.formatMessages(result.warnings, { kind: "warning", color: false }));
      for (const [path, info] of Object.entries(result.metafile!.outputs)) {
        outputs.push({ path, bytes: info.bytes });
      }
    }
  } finally {
    // esbuild keeps a child process alive otherwise, which keeps Deno (and a test) from exiting.
    await esbuild.stop();
  }
  return { outputs, warnings };
}

if (import.meta.main) {
  const started = performance.now();
  const { outputs, warnings } = await bundle();
  for (const warning of warnings) console.warn(warning);
  for (const { path, bytes } of outputs) console.log(`${path}  ${(bytes / 1024).toFixed(0)} KiB`);
  console.log(`bundled in ${((performance.now() - started) / 1000).toFixed(1)} s`);
}
