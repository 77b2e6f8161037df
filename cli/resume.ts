/**
 * What `--resume` continues with. A checkpoint carries the run's settings (data, batch, lr,
 * epochs or steps); a resumed run takes each of them from the checkpoint unless the command line
 * gives it, so a plain `--resume` trains on exactly as the straight run would, and an explicit flag
 * takes effect from the resumed step and is said in one line ("overriding the checkpoint's lr 0.02
 * with 0.001").
 *
 * @module
 */

import { loadSafetensors, type SafetensorsFile } from "../engine/io/mod.ts";
import type { MpiTransport } from "../schedule/mpi/mod.ts";
import { parseTrainArgs, type TrainArgs } from "./args.ts";
import { CliError } from "./errors.ts";

/** The settings a checkpoint of the train command records (its `extra` and optimizer metadata). */
export interface CheckpointSettings {
  /** `--data` of the run that saved it. */
  data?: string;
  /** Its global batch. */
  batch?: number;
  /** Its base learning rate (from the optimizer's policy). */
  lr?: number;
  /** Its `--epochs`, when given. */
  epochs?: number;
  /** Its `--steps`, when given. */
  steps?: number;
}

/** The flags whose value a resumed run takes from its checkpoint unless given. */
const CARRIED = ["data", "batch", "lr", "epochs", "steps"] as const;

/** What a checkpoint says of its run, from its metadata (missing fields stay undefined). */
export function checkpointSettings(metadata: Record<string, string>): CheckpointSettings {
  const json = (text: string | undefined) => {
    try {
      return text === undefined ? undefined : JSON.parse(text);
    } catch {
      return undefined; // loadCheckpoint reports a malformed field with the rest
    }
  };
  const extra = json(metadata.extra) ?? {};
  const lr = json(metadata.optimizer)?.hyper?.lr?.baseLr;
  const number = (v: unknown) => typeof v === "number" && Number.isFinite(v) ? v : undefined;
  return {
    data: typeof extra.data === "string" ? extra.data : undefined,
    batch: number(extra.batch),
    lr: number(lr),
    epochs: number(extra.epochs),
    steps: number(extra.steps),
  };
}

/**
 * The arguments a run resumed from a checkpoint with `settings` uses: `argv` plus every carried
 * setting the command line does not give (epochs and steps only when it gives neither), validated
 * as one command line; and a line for each explicit flag that changes what the checkpoint's run
 * did; and the file as read, on rank 0, to check and load without reading it again. Under MPI rank 0
 * reads the file and every rank gets its settings.
 */
export async function resumeArguments(
  argv: readonly string[],
  args: TrainArgs,
  transport: MpiTransport | undefined,
): Promise<{ args: TrainArgs; settings: CheckpointSettings; notes: string[]; file?: SafetensorsFile }> {
  const path = args.resume!;
  const file = !transport || transport.rank === 0 ? await loadSafetensors(path) : undefined;
  const settings = transport
    ? await transport.broadcastJson(
      file ? checkpointSettings(file.metadata) : null,
      0,
      { deadline: performance.now() + 600_000 },
      "broadcast the checkpoint's settings",
    ) as CheckpointSettings
    : checkpointSettings(file!.metadata);
  const given = new Set(args.given);
  const lengthGiven = given.has("epochs") || given.has("steps");
  const carried: string[] = [];
  for (const flag of CARRIED) {
    const value = settings[flag];
    if (value === undefined || given.has(flag)) continue;
    if ((flag === "epochs" || flag === "steps") && lengthGiven) continue;
    carried.push(`--${flag}`, String(value));
  }
  let resumed: TrainArgs;
  try {
    resumed = parseTrainArgs([...argv, ...carried]);
  } catch (error) {
    if (!(error instanceof CliError)) throw error;
    throw new CliError(
      `with the settings of ${path} (${carried.join(" ")}): ${error.message}`,
      error.exitCode,
    );
  }
  const notes: string[] = [];
  const changed = (flag: "data" | "batch" | "lr" | "epochs") =>
    given.has(flag) && settings[flag] !== undefined && settings[flag] !== resumed[flag];
  if (changed("lr")) notes.push(`overriding the checkpoint's lr ${settings.lr} with ${resumed.lr}`);
  if (changed("batch")) {
    notes.push(
      `batch ${resumed.batch} instead of the checkpoint's ${settings.batch}: an epoch, and the lr's halving period, now count the new batch's steps`,
    );
  }
  if (changed("data")) notes.push(`data ${resumed.data} instead of the checkpoint's ${settings.data}`);
  if (changed("epochs")) {
    notes.push(`--epochs ${resumed.epochs} instead of the checkpoint's ${settings.epochs}`);
  }
  return { args: resumed, settings, notes, file };
}
