/**
 * `deno task train`: data-parallel training from the command line. Without options it trains the
 * AlexNet-like default on the embedded MNIST digits on two CPU device handles under the `overlap`
 * schedule and reports held-out accuracy; `--help` lists everything else.
 *
 * Every problem a user can cause (bad flags, data that does not fit the model, a checkpoint of
 * another model, a malformed schedule file, diverging training) ends as a clear message on stderr
 * and a non-zero exit status, never a stack trace.
 *
 * A run goes through phases, one module each: the command line is read and checked here;
 * `train/setup.ts` builds the data, model, plan and trainer, refusing the remaining bad inputs before
 * any device starts; `train/training_loop.ts` steps; `train/finish.ts` ends the run (evaluation,
 * files, summary).
 *
 * @module
 */

import { formatSummary, summarize } from "../mod.ts";
import { detectMpiLaunch, MpiTransport } from "../schedule/mpi/mod.ts";
import { parseLink } from "../schedule/runtime/mod.ts";
import { helpText, parseTrainArgs, type TrainArgs } from "./args.ts";
import { CliError, describeError, EXIT_FAILURE, EXIT_USAGE } from "./errors.ts";
import { finishRun } from "./train/finish.ts";
import { buildLocal, chooseModelForData } from "./model.ts";
import { checkOutputs } from "./outputs.ts";
import { showUserPaths } from "./paths.ts";
import { resumeArguments } from "./resume.ts";
import { announceRun, loadStartingPoint, type RunRequest, startRun } from "./train/setup.ts";
import { trainSteps } from "./train/training_loop.ts";

export { INTERRUPTED_CHECKPOINT } from "./train/finish.ts";

/** Refuses an input file that is missing, not a file, or unreadable, naming `--flag`. */
async function checkReadable(flag: string, path: string): Promise<void> {
  let file: Deno.FsFile | undefined;
  try {
    if (!(await Deno.stat(path)).isFile) throw new CliError(`--${flag} ${path}: not a file`, EXIT_FAILURE);
    file = await Deno.open(path, { read: true });
  } catch (error) {
    if (error instanceof CliError) throw error;
    const why = error instanceof Deno.errors.NotFound
      ? "no such file"
      : error instanceof Deno.errors.PermissionDenied
      ? "permission denied"
      : (error as Error).message;
    throw new CliError(`--${flag} ${path}: cannot read it (${why})`, EXIT_FAILURE);
  } finally {
    file?.close();
  }
}

/**
 * Reads what the command line `parsed` (from `argv`) asks for and checks it before any work: the
 * `--resume` and `--weights` files are readable, a resumed run's arguments, every output path, the
 * model for the data. Says `parsed`'s warnings first; joins the MPI job under `--transport mpi`.
 */
async function readRequest(argv: readonly string[], parsed: TrainArgs, root: boolean): Promise<RunRequest> {
  if (root) { for (const warning of parsed.warnings) console.error(`tandem train: warning: ${warning}`); }
  // Only rank 0 reads the checkpoint (other hosts need not have it); a missing one fails before any work.
  if (parsed.resume !== undefined && root) await checkReadable("resume", parsed.resume);
  if (parsed.weights !== undefined && root) await checkReadable("weights", parsed.weights);
  const transport = parsed.transport === "mpi" ? MpiTransport.init() : undefined;
  // A resumed run continues with its checkpoint's settings, except the flags given here.
  const { args, notes: resumeNotes, file: resumeFile } = parsed.resume
    ? await resumeArguments(argv, parsed, transport)
    : { args: parsed, notes: [], file: undefined };
  // Before any expensive work: a bad output path costs a second, not the run. Rank 0 writes them all.
  if (root && args.steps !== 0) await checkOutputs(args);
  // With --json, stdout carries exactly one JSON object; everything for people goes to stderr.
  const say = !root
    ? () => {}
    : args.json
    ? (line: string) => console.error(showUserPaths(line))
    : (line: string) => console.log(showUserPaths(line));
  const link = args.link ? parseLink(args.link) : undefined;
  const { choice, images } = await chooseModelForData(args);
  return { args, root, say, transport, link, resumeNotes, resumeFile, choice, images };
}

/** `--steps 0`: says the model's summary (parameters, FLOPs, groups) and trains nothing. */
async function describeModel({ args, root, say, choice }: RunRequest): Promise<number> {
  const network = await buildLocal(choice.spec());
  const summary = summarize(network, network.inputShape);
  say(`${choice.name}: input ${network.inputShape.join("×")}, ${network.classes} classes`);
  say(formatSummary(summary));
  if (args.json && root) {
    console.log(JSON.stringify({
      model: choice.name,
      parameters: summary.parameters,
      flops: summary.flops,
      groups: summary.groups,
      step: 0,
    }));
  }
  network.dispose();
  return 0;
}

/**
 * Runs the command line `argv` and returns the exit status. Errors a user can cause are thrown as
 * `CliError`/`TandemError` for the caller to print.
 *
 * @example
 * ```ts ignore
 * import { runTrain } from "./train.ts";
 * Deno.exit(await runTrain(["--data", "synthetic", "--model", "lenet", "--steps", "4", "--batch", "8"]));
 * ```
 */
export async function runTrain(argv: readonly string[]): Promise<number> {
  const parsed = parseTrainArgs(argv);
  // Under MPI every rank runs this same command; rank 0 speaks and writes files for all of them.
  const root = parsed.transport === "local" || detectMpiLaunch()?.rank === 0;
  if (parsed.help) {
    if (root) console.log(helpText());
    return 0;
  }
  const request = await readRequest(argv, parsed, root);
  if (request.args.steps === 0) return await describeModel(request);
  // The remaining bad inputs (data, devices, plan, batch, checkpoint, weights) are refused in
  // here, before any device starts.
  const run = await startRun(request);
  try {
    await loadStartingPoint(run);
    announceRun(run);
    return await finishRun(run, await trainSteps(run));
  } finally {
    await run.trainer.close();
    run.local.dispose();
  }
}

if (import.meta.main) {
  let code: number;
  try {
    code = await runTrain(Deno.args);
  } catch (error) {
    const mpi = MpiTransport.current;
    const rank = mpi?.rank ?? detectMpiLaunch()?.rank ?? 0;
    // Under mpirun every rank parses the same command line, so a usage error is said once, by rank
    // 0; anything else may be this rank's alone (a file missing on its host, its device failing).
    const usage = error instanceof CliError && error.exitCode === EXIT_USAGE;
    const speak = rank === 0 || !usage;
    const prefix = rank === 0 ? "tandem train" : `tandem train (MPI rank ${rank})`;
    const known = describeError(error);
    if (known) {
      if (speak) console.error(`${prefix}: ${known.message}`);
      code = known.exitCode;
    } else {
      console.error(`${prefix}: unexpected error (a bug; please report it):`, error);
      code = EXIT_FAILURE;
    }
    // The other ranks may be waiting in a collective for this one: end the whole job now.
    if (mpi) mpi.abort(code);
  }
  MpiTransport.current?.finalize();
  // Exit explicitly: device Workers or a pending timer must not keep a finished run alive.
  Deno.exit(code);
}
