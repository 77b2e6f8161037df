/**
 * Tape-based reverse-mode autograd.
 *
 * Every op that sees an input requiring gradients records a {@link GradNode}. Node ids grow with
 * creation, and an op's inputs always exist before it, so visiting nodes in decreasing id order is
 * a valid reverse topological order that depends only on the program, never on timing. That fixed
 * order is what makes a backward pass split into segments ({@link BackwardPass.runUntil}, then
 * {@link BackwardPass.runToEnd}) perform exactly the same kernels on the same values as one
 * uninterrupted pass: the schedule runtime relies on it to hand the FC gradients to communication
 * before the conv gradients are computed.
 *
 * @module
 */

import type { Storage } from "../backends/backend.ts";
import { DisposedError, formatShape, ShapeError } from "./errors.ts";
import { isGradientRecording, noGrad, tidy, untrackFromScopes } from "./context.ts";
import type { Tensor } from "./tensor.ts";

/** Computes the gradients of an op's inputs from the gradient of its output (`null`: no gradient). */
export type BackwardFn = (gradOutput: Tensor) => readonly (Tensor | null)[];

let nextNodeId = 0;

/** One recorded op: its inputs, the tensors it saved for backward, and its gradient function. */
export class GradNode {
  /** Creation order; backward visits nodes from the highest id down. */
  readonly id: number = nextNodeId++;
  /** Holders: the output's user handle plus every node that consumes the output. */
  refs = 1;
  #saved: Tensor[];
  #backward: BackwardFn | null;

  /** Records one op; takes holds on the saved tensors and on the inputs' nodes. */
  constructor(
    /** Op name, for messages. */
    readonly op: string,
    /** The op's tensor inputs, in the order its backward returns their gradients. */
    readonly inputs: readonly Tensor[],
    /** The tensor the op produced. */
    readonly output: Tensor,
    saved: Tensor[],
    backward: BackwardFn,
  ) {
    this.#saved = saved;
    this.#backward = backward;
    for (const tensor of saved) tensor.retainForBackward();
    for (const input of inputs) if (input.node) input.node.refs++;
  }

  /** True once the saved tensors were released (after a backward pass through it). */
  get isFreed(): boolean {
    return this.#backward === null;
  }

  /** Runs the op's gradient function. */
  runBackward(gradOutput: Tensor): readonly (Tensor | null)[] {
    if (!this.#backward) {
      throw new DisposedError(
        `backward through ${this.op} a second time: its saved tensors were freed; pass { retainGraph: true } the first time`,
      );
    }
    return this.#backward(gradOutput);
  }

  /** Releases the tensors saved for backward. */
  freeSaved(): void {
    if (!this.#backward) return;
    this.#backward = null;
    const saved = this.#saved;
    this.#saved = [];
    for (const tensor of saved) tensor.releaseForBackward();
  }
}

/** Drops one hold on a node; the last one frees its saved tensors and its inputs' nodes in turn. */
export function releaseNode(node: GradNode): void {
  const pending = [node];
  while (pending.length > 0) {
    const current = pending.pop()!;
    if (--current.refs > 0) continue;
    current.freeSaved();
    for (const input of current.inputs) if (input.node) pending.push(input.node);
  }
}

/**
 * Records `output = op(inputs)` for autograd when gradients are being recorded and some input
 * requires them. `saved` lists the tensors `backward` reads; they outlive `tidy` scopes until the
 * graph is freed.
 *
 * @example
 * ```ts
 * // inside an op implementation:
 * // recordOp("exp", [x], y, [y], (dy) => [mul(dy, y)]);
 * ```
 */
export function recordOp(
  op: string,
  inputs: readonly Tensor[],
  output: Tensor,
  saved: Tensor[],
  backward: BackwardFn,
): void {
  if (!isGradientRecording() || !inputs.some((t) => t.requiresGrad)) return;
  output.requiresGrad = true;
  output.node = new GradNode(op, inputs, output, saved, backward);
}

/** Options for {@link Tensor.backward} and {@link backwardPass}. */
export interface BackwardOptions {
  /** Gradient of the root; defaults to 1 (the root must then have one element). */
  gradOutput?: Tensor;
  /** Keep saved tensors so the same graph can be differentiated again. */
  retainGraph?: boolean;
  /**
   * Return gradients for exactly these tensors instead of accumulating `.grad` on every leaf
   * (used by `valueAndGrad`).
   */
  wrt?: readonly Tensor[];
  /** Called as soon as a leaf's gradient is final, in the order they become final. */
  onGradientReady?: (leaf: Tensor, gradient: Tensor) => void;
}

/**
 * A backward pass that can run in segments.
 *
 * @example
 * ```ts
 * import { backwardPass } from "./autograd.ts";
 * // const pass = backwardPass(loss);
 * // pass.runUntil(fcParameters);   // FC gradients are final here: ship them
 * // pass.runToEnd();               // then the conv gradients
 * ```
 */
export class BackwardPass {
  readonly #order: GradNode[];
  #next = 0;
  readonly #gradients = new Map<Tensor, Tensor>();
  /** Per leaf: consumer slots not yet processed. */
  readonly #pendingUses = new Map<Tensor, number>();
  readonly #finalized = new Map<Tensor, Tensor | null>();
  readonly #options: BackwardOptions;
  readonly #wrt: Set<Tensor> | undefined;

  /** Prepares a pass from `root` (nothing runs until `runUntil` or `runToEnd`). */
  constructor(root: Tensor, options: BackwardOptions = {}) {
    this.#options = options;
    this.#wrt = options.wrt ? new Set(options.wrt) : undefined;
    if (!root.requiresGrad) {
      throw new ShapeError("backward", `the root ${formatShape(root.shape)} does not require gradients`);
    }
    const seed = options.gradOutput ? copyOf(options.gradOutput) : seedGradient(root);
    untrackFromScopes(seed);
    if (options.gradOutput && options.gradOutput.shape.join() !== root.shape.join()) {
      throw new ShapeError(
        "backward",
        `gradOutput ${formatShape(options.gradOutput.shape)} does not match the root ${
          formatShape(root.shape)
        }`,
      );
    }
    this.#order = collectNodes(root);
    for (const node of this.#order) {
      for (const input of node.inputs) {
        if (isLeaf(input) && this.#wants(input)) {
          this.#pendingUses.set(input, (this.#pendingUses.get(input) ?? 0) + 1);
        }
      }
    }
    if (root.node) {
      this.#gradients.set(root, seed);
    } else if (this.#wants(root)) {
      this.#finalize(root, seed);
    }
  }

  /** True once every node has been processed. */
  get done(): boolean {
    return this.#next >= this.#order.length;
  }

  /**
   * Runs backward just far enough that the gradients of `targets` are final (each target's last
   * consumer has been processed), then stops. Targets outside the graph are final at once.
   */
  runUntil(targets: Iterable<Tensor>): void {
    const waiting = [...targets].filter((t) => (this.#pendingUses.get(t) ?? 0) > 0);
    while (waiting.some((t) => (this.#pendingUses.get(t) ?? 0) > 0)) this.#step();
  }

  /** Runs the remaining nodes. */
  runToEnd(): void {
    while (!this.done) this.#step();
  }

  /** Gradients of the `wrt` tensors (those that received none map to `null`). */
  results(): Map<Tensor, Tensor | null> {
    return this.#finalized;
  }

  #wants(leaf: Tensor): boolean {
    return this.#wrt ? this.#wrt.has(leaf) : leaf.requiresGrad;
  }

  #step(): void {
    const node = this.#order[this.#next++];
    const gradOutput = this.#gradients.get(node.output);
    this.#gradients.delete(node.output);
    if (gradOutput) {
      // Each gradient function runs in its own scope: its temporaries are freed, and the gradients
      // it returns belong to the pass (not to whatever tidy scope the caller runs segments in).
      const inputGradients = tidy(() => noGrad(() => node.runBackward(gradOutput)));
      for (const gradient of inputGradients) if (gradient) untrackFromScopes(gradient);
      // Gradient functions may pass gradOutput straight through, even to two inputs (add); each
      // input must own its gradient because accumulation disposes what it consumes.
      const owned = new Set<Tensor>();
      node.inputs.forEach((input, i) => {
        let gradient = inputGradients[i] ?? null;
        if (!gradient) return;
        if (owned.has(gradient)) {
          gradient = copyOf(gradient);
          untrackFromScopes(gradient);
        }
        owned.add(gradient);
        this.#accumulate(node, input, gradient);
      });
      if (!owned.has(gradOutput)) gradOutput.dispose();
    }
    if (!this.#options.retainGraph) node.freeSaved();
    for (const input of node.inputs) {
      if (!isLeaf(input) || !this.#pendingUses.has(input)) continue;
      const left = this.#pendingUses.get(input)! - 1;
      this.#pendingUses.set(input, left);
      if (left === 0) {
        const gradient = this.#gradients.get(input) ?? null;
        this.#gradients.delete(input);
        this.#finalize(input, gradient);
      }
    }
  }

  #accumulate(node: GradNode, input: Tensor, gradient: Tensor): void {
    if (gradient.shape.join() !== input.shape.join()) {
      throw new ShapeError(
        `backward of ${node.op}`,
        `gradient ${formatShape(gradient.shape)} does not match its input ${formatShape(input.shape)}`,
      );
    }
    if (isLeaf(input) && !this.#wants(input)) {
      gradient.dispose();
      return;
    }
    const previous = this.#gradients.get(input);
    const total = previous ? addInto(previous, gradient) : gradient;
    untrackFromScopes(total);
    this.#gradients.set(input, total);
  }

  #finalize(leaf: Tensor, gradient: Tensor | null): void {
    if (this.#wrt) {
      if (gradient) untrackFromScopes(gradient);
      this.#finalized.set(leaf, gradient);
    } else if (gradient) {
      const total = leaf.grad ? addInto(leaf.grad, gradient) : gradient;
      untrackFromScopes(total);
      leaf.grad = total;
      this.#finalized.set(leaf, total);
    }
    if (gradient) this.#options.onGradientReady?.(leaf, this.#finalized.get(leaf)!);
  }
}

/**
 * Starts a backward pass from `root` that the caller drives segment by segment.
 *
 * @example
 * ```ts
 * import { backwardPass } from "./autograd.ts";
 * // const pass = backwardPass(loss);
 * // pass.runUntil(model.parameters("fc"));
 * // pass.runToEnd();
 * ```
 */
export function backwardPass(root: Tensor, options: BackwardOptions = {}): BackwardPass {
  return new BackwardPass(root, options);
}

/**
 * Wraps a scalar function of tensors so that calling it returns the value and the gradients with
 * respect to every argument, without touching any `.grad` field.
 *
 * @example
 * ```ts
 * import { ops, tensor, valueAndGrad } from "../mod.ts";
 * const f = valueAndGrad((x) => ops.sum(ops.mul(x, x)));
 * const { value, grads } = f(tensor([1, 2]));
 * console.log(await value.item(), await grads[0].data()); // 5, [2, 4]
 * ```
 */
export function valueAndGrad<Args extends Tensor[]>(
  fn: (...args: Args) => Tensor,
): (...args: Args) => { value: Tensor; grads: Tensor[] } {
  return (...args: Args) => {
    const previous = args.map((a) => a.requiresGrad);
    for (const a of args) a.requiresGrad = true;
    try {
      const value = fn(...args);
      const pass = new BackwardPass(value, { wrt: args });
      pass.runToEnd();
      const grads = args.map((a) => pass.results().get(a) ?? zerosLikeOn(value, a));
      return { value, grads };
    } finally {
      args.forEach((a, i) => (a.requiresGrad = previous[i]));
    }
  };
}

function isLeaf(t: Tensor): boolean {
  return t.node === null;
}

function seedGradient(root: Tensor): Tensor {
  if (root.size !== 1) {
    throw new ShapeError(
      "backward",
      `the root has shape ${formatShape(root.shape)}; backward() without gradOutput needs a single element`,
    );
  }
  const storage = root.backend.allocate(1, "float32");
  root.backend.fill(storage, 1);
  return root.withStorage(storage, root.shape);
}

function zerosLikeOn(anchor: Tensor, like: Tensor): Tensor {
  const zeros = anchor.withStorage(anchor.backend.allocate(like.size, "float32"), like.shape);
  untrackFromScopes(zeros);
  return zeros;
}

/** A private copy, so the pass can dispose it freely. */
function copyOf(t: Tensor): Tensor {
  const out = t.backend.allocate(t.size, t.dtype);
  const dense = { offset: 0, strides: [1] };
  t.backend.copyStrided(t.storage, dense, out, dense, [t.size]);
  return t.withStorage(out, t.shape);
}

/** `a + b` into a new tensor; disposes both operands (they are private to the pass). */
function addInto(a: Tensor, b: Tensor): Tensor {
  const out: Storage = a.backend.allocate(a.size, "float32");
  const dense = { offset: 0, strides: [1] };
  a.backend.binary("add", a.storage, dense, b.storage, dense, out, [a.size]);
  const sum = a.withStorage(out, a.shape);
  a.dispose();
  b.dispose();
  return sum;
}

/** Every node reachable from `root`, ordered from the highest id (processed first) down. */
function collectNodes(root: Tensor): GradNode[] {
  const seen = new Set<GradNode>();
  const stack: GradNode[] = root.node ? [root.node] : [];
  while (stack.length > 0) {
    const node = stack.pop()!;
    if (seen.has(node)) continue;
    if (node.isFreed) {
      throw new DisposedError(
        `backward through ${node.op}: the graph was already freed by an earlier backward; pass { retainGraph: true }`,
      );
    }
    seen.add(node);
    for (const input of node.inputs) if (input.node && input.requiresGrad) stack.push(input.node);
  }
  return [...seen].sort((a, b) => b.id - a.id);
}
