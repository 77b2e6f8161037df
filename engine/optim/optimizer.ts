/**
 * The optimizer base: parameters, groups, per-parameter state, the iteration counter and
 * checkpointable state. SGD and Adam only supply the elementwise update of one parameter.
 *
 * ## The iteration counter and per-group steps
 *
 * `iteration` counts finished training iterations (Caffe's `iter_`); every update made during an
 * iteration uses the learning rate of that iteration, `learningRate(policy, iteration)`.
 *
 * - `step(group)` updates the parameters of one group and marks the group done for the current
 *   iteration; it does not advance the counter, so the next group stepped in the same iteration uses
 *   the same rate. Stepping a group twice in one iteration throws (it would apply the gradient twice).
 * - `step()` updates every group not yet done in this iteration, then ends the iteration.
 * - `finishIteration()` ends the iteration: `iteration += 1` and no group is done any more.
 *
 * So `step("fc"); step("conv"); finishIteration()`, `step("fc"); step()` and `step()` all leave
 * bit-identical parameters and state: each parameter's update reads only its own values, gradient
 * and state plus the shared rate (invariant 2 of the data-parallel notes).
 *
 * Parameters whose `.grad` is `null` are skipped, as in PyTorch: no value, state or update count
 * changes (so frozen or unused parameters cost nothing).
 *
 * It stays one file although long: it is the one base class, and its checks, undo copies and
 * checkpoint state all guard the same private per-parameter state that `step` updates; SGD and Adam
 * (`sgd.ts`, `adam.ts`) and the state's encoding (`state_codec.ts`) live apart.
 *
 * @module
 */

import { formatShape, TandemError, ValueError } from "../errors.ts";
import type { ParameterEntry } from "../nn/parameter.ts";
import { noGrad, tidy, untrackFromScopes } from "../context.ts";
import { allocateTensor, Tensor } from "../tensor.ts";
import { checkLrPolicy, learningRate, type LrPolicy } from "./lr_policy.ts";

/** What every optimizer's hyper-parameters share: its kind and its learning-rate policy. */
export interface HyperBase {
  /** Which optimizer the hyper-parameters (and state) belong to, e.g. `"sgd"`. */
  readonly kind: string;
  /** The learning-rate policy. */
  readonly lr: LrPolicy;
  /** L2 weight decay added to the gradient (`weightDecay × decayMult × w`), Caffe's `weight_decay`. */
  readonly weightDecay: number;
}

/**
 * Everything needed to resume an optimizer bit-exactly; plain data plus tensors, ready for a
 * checkpoint.
 *
 * @example
 * ```ts
 * import type { OptimizerState } from "./optimizer.ts";
 * function slots(state: OptimizerState) {
 *   return [...state.perParameter].map(([name, s]) => `${name}: ${Object.keys(s).join(", ")}`);
 * }
 * ```
 */
export interface OptimizerState<H extends HyperBase = HyperBase> {
  /** Finished training iterations (selects the learning rate). */
  iteration: number;
  /** Hyper-parameters, JSON-serialisable. */
  hyper: H;
  /** Updates applied to each parameter so far (Adam's bias-correction step), by name. */
  updates: Record<string, number>;
  /**
   * State tensors of each parameter by name, e.g. `{ history }` for SGD or `{ m, v }` for Adam. From
   * `state()` these are the optimizer's live tensors: read them, do not dispose or modify them.
   */
  perParameter: Map<string, Record<string, Tensor>>;
}

/**
 * {@link OptimizerState} with the tensors optional: what {@link Optimizer.checkState} can check
 * before any tensor exists (e.g. from a checkpoint's metadata).
 *
 * @example
 * ```ts
 * import type { OptimizerStateInfo } from "./optimizer.ts";
 * const info: OptimizerStateInfo = {
 *   iteration: 10,
 *   hyper: { kind: "sgd", lr: { policy: "fixed", baseLr: 0.1 }, weightDecay: 0 },
 *   updates: { w: 10 },
 * };
 * ```
 */
export type OptimizerStateInfo<H extends HyperBase = HyperBase> =
  & Omit<OptimizerState<H>, "perParameter">
  & Partial<Pick<OptimizerState<H>, "perParameter">>;

/** The values an update needs besides tensors. */
export interface UpdateContext {
  /** Learning rate of this parameter: the policy's rate at this iteration × `lrMult`. */
  rate: number;
  /** Weight decay of this parameter: `weightDecay × decayMult`. */
  decay: number;
  /** 1-based count of updates of this parameter, including this one. */
  count: number;
}

/** Options of {@link Optimizer.step}. */
export interface StepOptions {
  /**
   * Keep a copy of what this update overwrites (the group's parameters and state, on their own
   * backend) until the iteration ends, so {@link Optimizer.undoIteration} can put it back.
   */
  undoable?: boolean;
  /**
   * Update only elements `[start, end)` of the group — its parameters laid end to end in this
   * optimizer's order — as soon as that part's gradients are final (a chunk off the network); the
   * group is done once every element has been updated, each exactly once. Updates are elementwise,
   * so any split gives the bits of one whole update. Needs a backend with `view` (CPU).
   */
  range?: { start: number; end: number };
}

/**
 * Base class of the optimizers: owns the parameter list, per-parameter state tensors, the
 * iteration counter and group bookkeeping; subclasses implement {@link Optimizer.update}.
 *
 * @example
 * ```ts
 * import { SGD } from "./sgd.ts";
 * import type { Optimizer } from "./optimizer.ts";
 * function trainStep(optimizer: Optimizer, backward: () => void) {
 *   optimizer.zeroGrad();
 *   backward();
 *   optimizer.step();
 * }
 * ```
 */
export abstract class Optimizer<H extends HyperBase = HyperBase> {
  /** The parameters this optimizer updates, in the order given. */
  readonly parameters: readonly ParameterEntry[];
  #hyper: H;
  #iteration = 0;
  #slots = new Map<string, Record<string, Tensor>>();
  #updates = new Map<string, number>();
  #groups: string[] = [];
  #groupsDone = new Set<string>();
  /** What undoable `step(group)` calls of this iteration overwrote, for {@link Optimizer.undoIteration}. */
  #undo: { target: Tensor; copy: Tensor; view: boolean }[] = [];
  #undoCounts = new Map<string, number>();
  /** Per parameter updated this iteration: whether its updates found every new value finite. */
  #checkedFinite = new Map<string, boolean>();
  /**
   * Undo copies kept from one iteration to the next, by backend and length: every iteration makes
   * the same ones, and a fresh multi-hundred-megabyte buffer costs its page faults each time (real
   * AlexNet's FC group: about 0.4 s a step on 2 cores). Freed by {@link Optimizer.dispose}.
   */
  #spares = new Map<unknown, Map<number, Tensor[]>>();
  /** Per group stepped in part this iteration: the element ranges updated so far. */
  #partsDone = new Map<string, { start: number; end: number }[]>();
  /** Per parameter stepped in part this iteration: elements updated so far. */
  #elementsDone = new Map<string, number>();
  #disposed = false;

  /**
   * Checks the parameters, validates `hyper` with {@link Optimizer.checkHyper} and allocates zeroed
   * state slots named `slotNames` for every parameter, on the parameter's backend.
   */
  protected constructor(
    parameters: readonly ParameterEntry[],
    hyper: H,
    readonly slotNames: readonly string[],
  ) {
    const op = this.constructor.name;
    if (!Array.isArray(parameters) || parameters.length === 0) {
      throw new ValueError(op, "got an empty parameter list");
    }
    const tensors = new Set<Tensor>();
    for (const p of parameters) {
      if (typeof p.name !== "string" || p.name === "") throw new ValueError(op, "a parameter has no name");
      if (this.#slots.has(p.name)) throw new ValueError(op, `parameter name "${p.name}" appears twice`);
      if (tensors.has(p.tensor)) {
        throw new ValueError(op, `parameter "${p.name}" shares its tensor with another entry`);
      }
      if (p.tensor.dtype !== "float32") {
        throw new ValueError(op, `parameter "${p.name}" is ${p.tensor.dtype}; only float32 can be trained`);
      }
      if (typeof p.group !== "string" || p.group === "") {
        throw new ValueError(op, `parameter "${p.name}" has no group`);
      }
      for (const [field, value] of [["lrMult", p.lrMult], ["decayMult", p.decayMult]] as const) {
        if (!Number.isFinite(value) || value < 0) {
          throw new ValueError(op, `parameter "${p.name}": ${field} must be finite and ≥ 0, got ${value}`);
        }
      }
      tensors.add(p.tensor);
      if (!this.#groups.includes(p.group)) this.#groups.push(p.group);
      this.#slots.set(p.name, {});
      this.#updates.set(p.name, 0);
    }
    this.parameters = Object.freeze([...parameters]);
    this.#hyper = this.checkHyper(hyper);
    for (const p of parameters) {
      const slots = this.#slots.get(p.name)!;
      for (const slot of slotNames) {
        const t = allocateTensor(p.tensor.backend, p.tensor.shape);
        // State outlives any tidy scope the optimizer happens to be built in.
        untrackFromScopes(t);
        slots[slot] = t;
      }
    }
  }

  /**
   * Validates hyper-parameters and returns a normalised copy; throws `ValueError` naming the field.
   * Used on construction and by {@link Optimizer.loadState}.
   */
  protected abstract checkHyper(hyper: H): H;

  /**
   * Updates `param` in place (with `assign`) from `grad`, its state `slots` and `context`. Runs under
   * `noGrad` inside a `tidy` scope, so intermediates need no cleanup; must use tensor ops only.
   * Returns true where the update itself found every new value of `param` finite (a backend's fused
   * pass; see {@link Optimizer.checkedFinite}), false where it found one that is not, nothing where
   * it did not look.
   */
  protected abstract update(
    param: Tensor,
    grad: Tensor,
    slots: Readonly<Record<string, Tensor>>,
    context: UpdateContext,
  ): boolean | void;

  /**
   * {@link Optimizer.update}, also writing the values it overwrites into `saved` — `param`'s, then
   * each slot's in `slots`' order — for the undo. This default copies them first; an optimizer whose
   * backend writes them in the update's own pass over memory overrides it.
   */
  protected updateSaving(
    param: Tensor,
    grad: Tensor,
    slots: Readonly<Record<string, Tensor>>,
    context: UpdateContext,
    saved: readonly Tensor[],
  ): boolean | void {
    [param, ...Object.values(slots)].forEach((target, i) => saved[i].assign(target));
    return this.update(param, grad, slots, context);
  }

  /**
   * True when every update of parameter `name` in this iteration found its new values finite in its
   * own pass (SGD on the CPU backend), so a finite check need not scan them again; false otherwise,
   * including where the update did not look.
   *
   * @example
   * ```ts
   * import { SGD } from "./sgd.ts";
   * declare const optimizer: SGD;
   * optimizer.step("fc");
   * const scan = optimizer.parameters.filter((p) => !optimizer.checkedFinite(p.name));
   * ```
   */
  checkedFinite(name: string): boolean {
    return this.#checkedFinite.get(name) === true;
  }

  /** Records what one update of `name` found (see {@link Optimizer.checkedFinite}). */
  #noteFinite(name: string, finite: boolean | void): void {
    this.#checkedFinite.set(name, finite === true && this.#checkedFinite.get(name) !== false);
  }

  /** The live hyper-parameters, for subclasses' updates (no copy, unlike {@link Optimizer.hyper}). */
  protected get settings(): Readonly<H> {
    return this.#hyper;
  }

  /** The optimizer's kind, as stored in its state (`"sgd"`, `"adam"`). */
  get kind(): string {
    return this.#hyper.kind;
  }

  /** A copy of the hyper-parameters. */
  get hyper(): H {
    return structuredClone(this.#hyper);
  }

  /**
   * Replaces the learning-rate policy (as setting PyTorch's `param_group["lr"]`), from the next
   * update on; the iteration count, and so where the policy stands, is kept. How a resumed run takes
   * a new `--lr`.
   *
   * @example
   * ```ts
   * import { SGD } from "./sgd.ts";
   * declare const optimizer: SGD;
   * optimizer.setLrPolicy({ policy: "step", baseLr: 0.001, gamma: 0.5, stepSize: 125 });
   * ```
   */
  setLrPolicy(lr: number | LrPolicy): void {
    this.#checkLive("setLrPolicy");
    this.#hyper = this.checkHyper({ ...structuredClone(this.#hyper), lr: toLrPolicy(lr) });
  }

  /** Finished training iterations; the updates of the current iteration use its learning rate. */
  get iteration(): number {
    return this.#iteration;
  }

  /** The policy's learning rate for the current iteration (before each parameter's `lrMult`). */
  get learningRate(): number {
    return learningRate(this.#hyper.lr, this.#iteration);
  }

  /** The parameter groups, in order of first appearance. */
  get groups(): readonly string[] {
    return [...this.#groups];
  }

  /** Groups already updated in the current iteration by `step(group)`. */
  get groupsDone(): readonly string[] {
    return [...this.#groupsDone];
  }

  /**
   * Updates the parameters of `group` (all not yet updated this iteration when omitted; then the
   * iteration ends). Parameters without a gradient are skipped. See the module notes.
   *
   * @example
   * ```ts
   * import { SGD } from "./sgd.ts";
   * declare const optimizer: SGD;
   * optimizer.step("fc");   // as soon as the FC gradients are ready
   * optimizer.step("conv"); // later, same learning rate
   * optimizer.finishIteration();
   * ```
   */
  step(group?: string, options: StepOptions = {}): void {
    this.#checkLive("step");
    if (group === undefined) {
      this.#apply((p) => !this.#groupsDone.has(p.group), options);
      this.finishIteration();
      return;
    }
    this.#checkGroup("step", group);
    if (options.range) {
      this.#applyRange(group, options.range, options);
      return;
    }
    if (this.#groupsDone.has(group) || this.#partsDone.has(group)) {
      throw new TandemError(
        `step("${group}"): group "${group}" was already updated in iteration ${this.#iteration}; ` +
          `call finishIteration() (or step() with no group) to end the iteration first`,
      );
    }
    this.#apply((p) => p.group === group, options);
    this.#groupsDone.add(group);
  }

  /**
   * Ends the current training iteration: the counter advances (and with it the learning rate) and
   * every group may be stepped again.
   *
   * @example
   * ```ts
   * import { SGD } from "./sgd.ts";
   * declare const optimizer: SGD;
   * for (const group of optimizer.groups) optimizer.step(group);
   * optimizer.finishIteration();
   * ```
   */
  finishIteration(): void {
    this.#checkLive("finishIteration");
    this.#checkNoParts("finishIteration");
    this.#iteration++;
    this.#groupsDone.clear();
    this.#checkedFinite.clear();
    this.#dropUndo();
  }

  /**
   * Puts back every parameter and state slot that `step(group, { undoable: true })` changed in the
   * current iteration, bit for bit, with their update counts, and reopens those groups: as if the
   * iteration's undoable updates had never run. A data-parallel step that fails after applying a
   * group's update (a device died during the rest of the backward) calls this.
   *
   * @example
   * ```ts
   * import { SGD } from "./sgd.ts";
   * declare const optimizer: SGD;
   * optimizer.step("fc", { undoable: true });
   * optimizer.undoIteration(); // fc's parameters and momentum are as before
   * ```
   */
  undoIteration(): void {
    this.#checkLive("undoIteration");
    noGrad(() => {
      // Newest first, so a tensor saved twice ends with its oldest value.
      for (let i = this.#undo.length - 1; i >= 0; i--) this.#undo[i].target.assign(this.#undo[i].copy);
    });
    for (const [name, count] of this.#undoCounts) this.#updates.set(name, count);
    for (const p of this.parameters) if (this.#undoCounts.has(p.name)) this.#groupsDone.delete(p.group);
    this.#partsDone.clear();
    this.#elementsDone.clear();
    this.#checkedFinite.clear();
    this.#dropUndo();
  }

  /** Throws while a group has been updated in part only: its iteration cannot end or be saved. */
  #checkNoParts(op: string): void {
    for (const [group, parts] of this.#partsDone) {
      const done = parts.reduce((n, r) => n + r.end - r.start, 0);
      throw new TandemError(
        `${op}: group "${group}" is updated in part only (${done} of ${
          this.#groupSize(group)
        } elements) in ` +
          `iteration ${this.#iteration}; step the rest of its range first`,
      );
    }
  }

  #groupSize(group: string): number {
    return this.parameters.reduce((n, p) => n + (p.group === group ? p.tensor.size : 0), 0);
  }

  #dropUndo(): void {
    for (const { target, copy, view } of this.#undo) {
      const bySize = this.#spares.get(copy.backend) ?? new Map<number, Tensor[]>();
      this.#spares.set(copy.backend, bySize);
      const list = bySize.get(copy.size) ?? [];
      list.push(copy);
      bySize.set(copy.size, list);
      if (view) target.dispose();
    }
    this.#undo = [];
    this.#undoCounts.clear();
  }

  /**
   * Frees the gradients of `group`'s parameters (all parameters when omitted) and sets them to
   * `null`, so the next backward starts from zero.
   *
   * @example
   * ```ts
   * import { SGD } from "./sgd.ts";
   * declare const optimizer: SGD;
   * optimizer.zeroGrad("fc");
   * ```
   */
  zeroGrad(group?: string): void {
    if (group !== undefined) this.#checkGroup("zeroGrad", group);
    for (const p of this.parameters) {
      if (group !== undefined && p.group !== group) continue;
      p.tensor.grad?.dispose();
      p.tensor.grad = null;
    }
  }

  /**
   * The state to checkpoint: iteration, hyper-parameters, update counts and the live state tensors.
   * Throws in the middle of an iteration (some groups stepped, iteration not finished), where a
   * snapshot could not be resumed exactly.
   *
   * @example
   * ```ts
   * import { SGD } from "./sgd.ts";
   * declare const optimizer: SGD;
   * const { iteration, perParameter } = optimizer.state();
   * ```
   */
  state(): OptimizerState<H> {
    this.#checkLive("state");
    this.#checkNoParts("state");
    if (this.#groupsDone.size > 0) {
      throw new TandemError(
        `state: iteration ${this.#iteration} is half done (groups ${[...this.#groupsDone].join(", ")} ` +
          `updated); call finishIteration() or step() before taking a snapshot`,
      );
    }
    const perParameter = new Map<string, Record<string, Tensor>>();
    for (const [name, slots] of this.#slots) perParameter.set(name, { ...slots });
    return {
      iteration: this.#iteration,
      hyper: structuredClone(this.#hyper),
      updates: Object.fromEntries(this.#updates),
      perParameter,
    };
  }

  /**
   * Every reason `state` cannot be loaded into this optimizer (wrong kind, bad hyper-parameters,
   * iteration or update counts, missing or unexpected parameters and slots, shape, dtype or backend
   * differences); empty when it can. Without `perParameter` only the plain-data part is checked.
   *
   * @example
   * ```ts
   * import { SGD } from "./sgd.ts";
   * declare const optimizer: SGD, saved: ReturnType<SGD["state"]>;
   * for (const problem of optimizer.checkState(saved)) console.log(problem);
   * ```
   */
  checkState(state: OptimizerStateInfo): string[] {
    const problems: string[] = [];
    const kind = state?.hyper?.kind;
    if (kind !== this.#hyper.kind) {
      problems.push(`optimizer kind: state is for "${kind}", this optimizer is "${this.#hyper.kind}"`);
    } else {
      try {
        this.checkHyper(state.hyper as H);
      } catch (error) {
        problems.push(`hyper-parameters: ${(error as Error).message}`);
      }
    }
    if (!Number.isSafeInteger(state?.iteration) || state.iteration < 0) {
      problems.push(`iteration must be a non-negative integer, got ${state?.iteration}`);
    }
    for (const p of this.parameters) {
      const count = state?.updates?.[p.name];
      if (!Number.isSafeInteger(count) || count! < 0) {
        problems.push(`parameter "${p.name}": update count must be a non-negative integer, got ${count}`);
      }
    }
    for (const name of Object.keys(state?.updates ?? {})) {
      if (!this.#slots.has(name)) problems.push(`update count for unknown parameter "${name}"`);
    }
    const perParameter = state?.perParameter;
    if (perParameter === undefined) return problems;
    if (!(perParameter instanceof Map)) return [...problems, "perParameter must be a Map"];
    for (const p of this.parameters) {
      const slots = perParameter.get(p.name);
      if (!slots) {
        problems.push(`parameter "${p.name}": no optimizer state`);
        continue;
      }
      for (const slot of this.slotNames) {
        const t = slots[slot];
        const where = `parameter "${p.name}" slot "${slot}"`;
        if (!t) problems.push(`${where}: missing`);
        else if (
          t.shape.length !== p.tensor.shape.length || t.shape.some((d, i) => d !== p.tensor.shape[i])
        ) {
          problems.push(
            `${where}: shape ${formatShape(t.shape)}, parameter is ${formatShape(p.tensor.shape)}`,
          );
        } else if (t.dtype !== "float32") problems.push(`${where}: dtype ${t.dtype}, expected float32`);
        else if (t.backend !== p.tensor.backend) {
          problems.push(`${where}: on backend ${t.backend.name}, parameter is on ${p.tensor.backend.name}`);
        }
      }
      for (const slot of Object.keys(slots)) {
        if (!this.slotNames.includes(slot)) problems.push(`parameter "${p.name}": unexpected slot "${slot}"`);
      }
    }
    for (const name of perParameter.keys()) {
      if (!this.#slots.has(name)) problems.push(`state for unknown parameter "${name}"`);
    }
    return problems;
  }

  /**
   * Restores a state from {@link Optimizer.state} (possibly of another optimizer instance or a
   * checkpoint): copies the tensors into this optimizer's slots and takes over iteration, update
   * counts and hyper-parameters (as PyTorch's `load_state_dict` does), so training resumes
   * bit-exactly. Throws a `ValueError` listing every problem, changing nothing, if it does not fit.
   *
   * @example
   * ```ts
   * import { SGD } from "./sgd.ts";
   * declare const optimizer: SGD, other: SGD;
   * other.loadState(optimizer.state());
   * ```
   */
  loadState(state: OptimizerState): void {
    this.#checkLive("loadState");
    const problems = this.checkState(state);
    if (problems.length > 0) {
      throw new ValueError("loadState", `state does not fit this optimizer:\n  ${problems.join("\n  ")}`);
    }
    if (!(state.perParameter instanceof Map)) {
      throw new ValueError("loadState", "state has no perParameter tensors");
    }
    for (const [name, slots] of this.#slots) {
      const source = state.perParameter.get(name)!;
      for (const slot of this.slotNames) slots[slot].assign(source[slot]);
      this.#updates.set(name, state.updates[name]);
    }
    this.#hyper = this.checkHyper(structuredClone(state.hyper) as H);
    this.#iteration = state.iteration;
    this.#groupsDone.clear();
    this.#checkedFinite.clear();
  }

  /**
   * Frees the state tensors; the optimizer cannot be used afterwards. Parameters are untouched.
   *
   * @example
   * ```ts
   * import { SGD } from "./sgd.ts";
   * declare const optimizer: SGD;
   * optimizer.dispose();
   * ```
   */
  dispose(): void {
    if (this.#disposed) return;
    this.#dropUndo();
    for (const bySize of this.#spares.values()) {
      for (const list of bySize.values()) for (const t of list) t.dispose();
    }
    this.#spares.clear();
    this.#disposed = true;
    for (const slots of this.#slots.values()) for (const t of Object.values(slots)) t.dispose();
  }

  #checkLive(op: string): void {
    if (this.#disposed) throw new TandemError(`${op}: the optimizer was disposed`);
  }

  #checkGroup(op: string, group: string): void {
    if (!this.#groups.includes(group)) {
      throw new ValueError(
        op,
        `unknown parameter group "${group}"; known groups: ${this.#groups.join(", ")}`,
      );
    }
  }

  /** `step(group, { range })`: see {@link StepOptions.range}. */
  #applyRange(group: string, range: { start: number; end: number }, options: StepOptions): void {
    const total = this.#groupSize(group);
    const { start, end } = range;
    if (!Number.isInteger(start) || !Number.isInteger(end) || start < 0 || end <= start || end > total) {
      throw new ValueError("step", `range [${start}, ${end}) of group "${group}" must lie in [0, ${total})`);
    }
    if (this.#groupsDone.has(group)) {
      throw new TandemError(
        `step("${group}"): group "${group}" was already updated in iteration ${this.#iteration}`,
      );
    }
    const parts = this.#partsDone.get(group) ?? [];
    const clash = parts.find((r) => r.start < end && start < r.end);
    if (clash) {
      throw new TandemError(
        `step("${group}"): elements [${start}, ${end}) overlap [${clash.start}, ${clash.end}), already updated ` +
          `in iteration ${this.#iteration}`,
      );
    }
    // The parameters the range covers, and which of their elements.
    const pieces: { p: ParameterEntry; from: number; to: number }[] = [];
    let offset = 0;
    for (const p of this.parameters) {
      if (p.group !== group) continue;
      const from = Math.max(start, offset) - offset, to = Math.min(end, offset + p.tensor.size) - offset;
      if (from < to) pieces.push({ p, from, to });
      offset += p.tensor.size;
    }
    const chosen = pieces.filter(({ p }) => p.tensor.grad !== null);
    this.#checkGradients(chosen.map(({ p }) => p));
    const backend = this.parameters[0].tensor.backend;
    if (chosen.length && !backend.view) {
      throw new ValueError(
        "step",
        `updating part of a group needs a backend with views; "${backend.name}" has none`,
      );
    }
    const rate = this.learningRate;
    const views: Tensor[] = [];
    const viewOf = (t: Tensor, from: number, to: number) => {
      const v = new Tensor(t.backend, t.backend.view!(t.storage, from, to - from), [to - from]);
      // Freed by this optimizer, whatever scope the caller runs in.
      untrackFromScopes(v);
      return v;
    };
    const view = (t: Tensor, from: number, to: number) => {
      const v = viewOf(t, from, to);
      views.push(v);
      return v;
    };
    try {
      noGrad(() => {
        for (const { p, from, to } of chosen) {
          const slots = this.#slots.get(p.name)!;
          const partSlots = Object.fromEntries(Object.entries(slots).map(([k, t]) => [k, view(t, from, to)]));
          const param = view(p.tensor, from, to), grad = view(p.tensor.grad!, from, to);
          const count = this.#updates.get(p.name)! + 1;
          const context = { rate: rate * p.lrMult, decay: this.#hyper.weightDecay * p.decayMult, count };
          let finite: boolean | void = undefined;
          if (options.undoable) {
            // The undo keeps views of its own on the same elements: these die with this call.
            const targets = [p.tensor, ...Object.values(slots)].map((t) => viewOf(t, from, to));
            this.#updateKeeping(p.name, targets, true, (saved) => {
              finite = this.updateSaving(param, grad, partSlots, context, saved);
            });
          } else tidy(() => void (finite = this.update(param, grad, partSlots, context)));
          this.#noteFinite(p.name, finite);
          // The count moves once the whole parameter has been updated, as one whole update moves it.
          const done = (this.#elementsDone.get(p.name) ?? 0) + to - from;
          this.#elementsDone.set(p.name, done);
          if (done === p.tensor.size) {
            this.#elementsDone.delete(p.name);
            this.#updates.set(p.name, count);
          }
        }
      });
    } finally {
      for (const v of views) v.dispose();
    }
    parts.push({ start, end });
    if (parts.reduce((n, r) => n + r.end - r.start, 0) === total) {
      this.#partsDone.delete(group);
      this.#groupsDone.add(group);
    } else {
      this.#partsDone.set(group, parts);
    }
  }

  /**
   * Runs `update` (one parameter's, in a `tidy` scope) with copies of `targets` — what it overwrites —
   * for it to fill, and keeps them until the iteration ends, for {@link Optimizer.undoIteration}.
   * They are recorded only once the update has returned: one that throws leaves nothing to put back
   * (the backends check their operands before they write). `view`: the targets are views the undo
   * owns.
   */
  #updateKeeping(name: string, targets: Tensor[], view: boolean, update: (saved: Tensor[]) => void): void {
    const copies = targets.map((target) => {
      const spare = this.#spares.get(target.backend)?.get(target.size)?.pop();
      // A spare has the length; the shape is the target's (assign checks shapes).
      const copy = spare && spare.shape.every((d, i) => d === target.shape[i]) && spare.rank === target.rank
        ? spare
        : (spare?.dispose(), allocateTensor(target.backend, target.shape));
      untrackFromScopes(copy);
      return copy;
    });
    try {
      tidy(() => update(copies));
    } catch (error) {
      for (const copy of copies) copy.dispose();
      if (view) { for (const target of targets) target.dispose(); }
      throw error;
    }
    if (!this.#undoCounts.has(name)) this.#undoCounts.set(name, this.#updates.get(name)!);
    targets.forEach((target, i) => this.#undo.push({ target, copy: copies[i], view }));
  }

  /** Every gradient fits its parameter, checked before anything is touched. */
  #checkGradients(chosen: readonly ParameterEntry[]): void {
    for (const p of chosen) {
      const g = p.tensor.grad!;
      const shapesDiffer = g.shape.length !== p.tensor.shape.length ||
        g.shape.some((d, i) => d !== p.tensor.shape[i]);
      if (shapesDiffer || g.dtype !== "float32" || g.backend !== p.tensor.backend || g.isDisposed) {
        throw new ValueError(
          "step",
          `gradient of "${p.name}" is ${g.toString()}${g.isDisposed ? " (disposed)" : ""} on ` +
            `${g.backend.name}; parameter is ${p.tensor.toString()} on ${p.tensor.backend.name}`,
        );
      }
    }
  }

  #apply(selected: (p: ParameterEntry) => boolean, options: StepOptions): void {
    const chosen = this.parameters.filter((p) => selected(p) && p.tensor.grad !== null);
    // Check every gradient before touching anything, so a bad one cannot leave a half-updated model.
    this.#checkGradients(chosen);
    const rate = this.learningRate;
    noGrad(() => {
      for (const p of chosen) {
        const count = this.#updates.get(p.name)! + 1;
        const context = { rate: rate * p.lrMult, decay: this.#hyper.weightDecay * p.decayMult, count };
        const slots = this.#slots.get(p.name)!;
        let finite: boolean | void = undefined;
        if (options.undoable && !this.#undoCounts.has(p.name)) {
          // Copies on the parameter's own backend (a GPU copy for device-resident replicas) of
          // what the update overwrites, written in its own pass where the backend can.
          this.#updateKeeping(p.name, [p.tensor, ...Object.values(slots)], false, (saved) => {
            finite = this.updateSaving(p.tensor, p.tensor.grad!, slots, context, saved);
          });
        } else {
          // One scope per parameter keeps the peak at one parameter's temporaries.
          tidy(() => void (finite = this.update(p.tensor, p.tensor.grad!, slots, context)));
        }
        this.#noteFinite(p.name, finite);
        this.#updates.set(p.name, count);
      }
    });
  }
}

/**
 * A learning-rate argument as a policy: a plain number means `fixed`. Validates it.
 *
 * @example
 * ```ts
 * import { toLrPolicy } from "./optimizer.ts";
 * console.log(toLrPolicy(0.01)); // { policy: "fixed", baseLr: 0.01 }
 * ```
 */
export function toLrPolicy(lr: number | LrPolicy): LrPolicy {
  const policy: LrPolicy = typeof lr === "number" ? { policy: "fixed", baseLr: lr } : structuredClone(lr);
  checkLrPolicy(policy);
  return policy;
}

/**
 * Throws a `ValueError` from `op` unless `value` is a number in `[low, high)` (`[low, high]` when
 * `highInclusive`).
 *
 * @example
 * ```ts
 * import { checkRange } from "./optimizer.ts";
 * checkRange("SGD", "momentum", 0.9, 0, 1);
 * ```
 */
export function checkRange(
  op: string,
  name: string,
  value: unknown,
  low: number,
  high: number,
  highInclusive = false,
): number {
  const ok = typeof value === "number" && value >= low && (highInclusive ? value <= high : value < high);
  if (!ok) {
    const range = `[${low}, ${high}${highInclusive ? "]" : ")"}`.replace("Infinity", "∞");
    throw new ValueError(op, `${name} must be a number in ${range}, got ${String(value)}`);
  }
  return value as number;
}
