/**
 * Files: the safetensors format, Tandem checkpoints on top of it (parameters, optimizer state,
 * step and seed metadata, validated on load), and crash-safe output files (a temporary file,
 * flushed, then renamed over the target).
 *
 * @example
 * ```ts
 * import "../../mod.ts"; // registers the CPU backend
 * import { tensor } from "../mod.ts";
 * import { loadSafetensors, saveSafetensors } from "./mod.ts";
 *
 * const path = `${await Deno.makeTempDir()}/weights.safetensors`;
 * await saveSafetensors(path, { w: tensor([1, 2, 3]) }, { note: "hello" });
 * const { tensors, metadata } = await loadSafetensors(path);
 * console.log(tensors.get("w")!.data, metadata.note); // Float32Array [1, 2, 3] "hello"
 * ```
 *
 * @module
 */

export {
  decodeSafetensors,
  encodeSafetensors,
  type HostTensor,
  hostTensorToTensor,
  loadSafetensors,
  type SafetensorsArray,
  type SafetensorsDType,
  type SafetensorsFile,
  saveSafetensors,
  type TensorCollection,
  type TensorSource,
} from "./safetensors.ts";
export {
  type CheckpointContents,
  loadCheckpoint,
  type LoadCheckpointOptions,
  type LoadedCheckpoint,
  saveCheckpoint,
} from "./checkpoint.ts";
export { checkOutputPath, type OutputTarget, resolveOutputPath, writeFileAtomic } from "./atomic.ts";
export { CheckpointError, OutputPathError, SafetensorsError } from "./errors.ts";
