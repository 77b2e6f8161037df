/**
 * Every file a run will write, checked before step 1: a bad `--checkpoint`, `--trace` or `--report`
 * path must cost a second, not the run. Resolution and probing are `checkOutputPath`'s
 * (engine/io/atomic.ts), the one place that knows how output files are written; this module names the
 * flags, adds the numbered snapshots and refuses two outputs that are one file.
 *
 * @module
 */

import { basename, dirname, join } from "node:path";
import { checkOutputPath, OutputPathError, type OutputTarget } from "../engine/io/mod.ts";
import type { TrainArgs } from "./args.ts";
import { CliError } from "./errors.ts";
import { snapshotPath, snapshotStep } from "./snapshots.ts";

/** One output and the flag that asked for it. */
interface Output {
  flag: string;
  path: string;
}

/** The absolute, link-free name of a file or new file, to tell whether two outputs are one. */
async function identity(target: OutputTarget): Promise<string> {
  if (target.kind === "file") return await Deno.realPath(target.path);
  return join(await Deno.realPath(dirname(target.path)), basename(target.path));
}

async function check(output: Output): Promise<OutputTarget> {
  try {
    return await checkOutputPath(output.path);
  } catch (error) {
    if (error instanceof OutputPathError) throw new CliError(`${output.flag} ${error.message}`);
    throw error;
  }
}

/**
 * Checks every output path of `args` without creating or touching any of them: each one resolves to
 * a file or device that can be written (see `checkOutputPath`), no two name the same file, and with
 * `--keep` the numbered snapshots can be made beside `--checkpoint` and are not already directories.
 * Throws a {@link CliError} (exit status 2) of one line naming the flag, the path, what was found and
 * what was expected.
 *
 * @example
 * ```ts ignore
 * import { checkOutputs } from "./outputs.ts";
 * await checkOutputs(parseTrainArgs(["--checkpoint", "runs/run.safetensors"]));
 * ```
 */
export async function checkOutputs(args: TrainArgs): Promise<void> {
  const outputs: Output[] = [];
  if (args.checkpoint !== undefined) outputs.push({ flag: "--checkpoint", path: args.checkpoint });
  if (args.trace !== undefined) outputs.push({ flag: "--trace", path: args.trace });
  if (args.report !== undefined) outputs.push({ flag: "--report", path: args.report });
  const owners = new Map<string, Output>();
  for (const output of outputs) {
    const target = await check(output);
    // Several outputs may share a device (--trace /dev/null --report /dev/null); never a file.
    if (target.kind === "device") continue;
    const id = await identity(target);
    const other = owners.get(id);
    if (other) {
      throw new CliError(
        `${output.flag} ${output.path} is the same file as ${other.flag} ${other.path}; give each output its own file`,
      );
    }
    owners.set(id, output);
  }
  // Nor may an output be a file the run reads (continuing a checkpoint in place is the exception).
  const inputs = [["--resume", args.resume], ["--model", args.model], ["--schedule", args.schedule]] as const;
  for (const [flag, path] of inputs) {
    if (path === undefined) continue;
    const real = await Deno.realPath(path).catch(() => undefined); // a built-in name, or missing
    const owner = real === undefined ? undefined : owners.get(real);
    if (owner && !(flag === "--resume" && owner.flag === "--checkpoint")) {
      throw new CliError(
        `${owner.flag} ${owner.path} is the same file as ${flag} ${path}, which the run reads; give the output its own file`,
      );
    }
  }
  if (args.checkpoint === undefined || args.keep === undefined || args.checkpointEvery === undefined) return;
  // The numbered snapshots share one directory: probing the first probes them all.
  const first = snapshotPath(args.checkpoint, args.checkpointEvery);
  await check({ flag: `--keep ${args.keep}: snapshot`, path: first });
  const directory = dirname(first);
  for await (const entry of Deno.readDir(directory)) {
    if (entry.isDirectory && snapshotStep(args.checkpoint, entry.name) !== undefined) {
      throw new CliError(
        `--keep ${args.keep}: snapshot ${
          join(directory, entry.name)
        } is a directory; expected a file or nothing (numbered snapshots of --checkpoint ${args.checkpoint} go there)`,
      );
    }
  }
  // Rotation deletes numbered snapshots: no other output may be one.
  const real = await Deno.realPath(directory);
  for (const [id, owner] of owners) {
    if (
      owner.flag !== "--checkpoint" && dirname(id) === real &&
      snapshotStep(args.checkpoint, basename(id)) !== undefined
    ) {
      throw new CliError(
        `${owner.flag} ${owner.path} is named like a numbered snapshot of --checkpoint ${args.checkpoint}; give it another name`,
      );
    }
  }
}
