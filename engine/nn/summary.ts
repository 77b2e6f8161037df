/**
 * A per-layer summary of a network — output shape, parameters, FLOPs, group — and the conv/FC
 * split that decides whether overlapping gradient exchange pays off.
 *
 * @module
 */

import { GeometryError } from "../../backends/geometry.ts";
import { ShapeError } from "../errors.ts";
import type { LayerDescription, Module } from "./module.ts";
import { Network } from "./network.ts";

/** One leaf layer of the summary (a graph's layers in node order, each on its own bottoms). */
export interface SummaryRow {
  /** Dotted path, e.g. `conv2`. */
  name: string;
  /** Layer type, e.g. `Conv2d`. */
  kind: string;
  /** Output shape with the batch axis. */
  outputShape: number[];
  /** Scalar parameters of this layer. */
  parameters: number;
  /** Forward FLOPs per sample. */
  flops: number;
  /**
   * Group of the layer's parameters; a parameter-free layer joins the group of the nearest
   * parametrised layer before it (or after it, at the start), so pooling after a convolution counts
   * as convolution work.
   */
  group: string;
}

/** Totals of one group. */
export interface GroupTotals {
  /** Scalar parameters. */
  parameters: number;
  /** Forward FLOPs per sample. */
  flops: number;
}

/** The whole summary. */
export interface NetworkSummary {
  /** One row per leaf layer, input to output. */
  rows: SummaryRow[];
  /** Scalar parameters of the whole network. */
  parameters: number;
  /** Forward FLOPs per sample of the whole network. */
  flops: number;
  /** Per group, in the order groups first appear. */
  groups: Record<string, GroupTotals>;
}

function leaves(module: Module): Module[] {
  const children = module.children();
  return children.length === 0 ? [module] : children.flatMap(([, child]) => leaves(child));
}

/**
 * Summarises `model` for a per-sample input shape (batch of 1).
 *
 * @example
 * ```ts
 * import { summarize } from "./summary.ts";
 * // const s = summarize(alexnet(), [3, 227, 227]);
 * // s.groups.fc.parameters / s.parameters → 0.962
 * ```
 */
export function summarize(model: Module, inputShape: readonly number[]): NetworkSummary {
  let shape = [1, ...inputShape];
  const rows: SummaryRow[] = [];
  // A graph's layers each read their own bottoms: described by the graph, in node order.
  const graph = model instanceof Network ? model.graph : undefined;
  const described = graph?.describe(shape).nodes;
  const layers = graph ? graph.nodes.map((n) => n.module) : leaves(model);
  for (const [index, layer] of layers.entries()) {
    let description: LayerDescription;
    try {
      description = described ? described[index] : layer.describe(shape);
    } catch (error) {
      if (error instanceof GeometryError) throw new ShapeError(`${layer.kind} ${layer.path}`, error.detail);
      throw error;
    }
    const own = layer.namedParameters();
    rows.push({
      name: layer.path,
      kind: layer.kind,
      outputShape: description.outputShape,
      parameters: own.reduce((n, p) => n + p.tensor.size, 0),
      flops: description.flops,
      group: own[0]?.group ?? "",
    });
    shape = description.outputShape;
  }
  // Parameter-free layers inherit the group of the layer before them (or after, at the start).
  let last = rows.find((r) => r.group)?.group ?? "none";
  for (const row of rows) {
    if (row.group) last = row.group;
    else row.group = last;
  }
  const groups: Record<string, GroupTotals> = {};
  for (const row of rows) {
    groups[row.group] ??= { parameters: 0, flops: 0 };
    groups[row.group].parameters += row.parameters;
    groups[row.group].flops += row.flops;
  }
  return {
    rows,
    parameters: rows.reduce((n, r) => n + r.parameters, 0),
    flops: rows.reduce((n, r) => n + r.flops, 0),
    groups,
  };
}

function thousands(n: number): string {
  return Math.round(n).toLocaleString("en-US");
}

/**
 * The summary as a fixed-width table with totals and the per-group split.
 *
 * @example
 * ```ts
 * import { formatSummary, summarize } from "./summary.ts";
 * // console.log(formatSummary(summarize(model, [1, 28, 28])));
 * ```
 */
export function formatSummary(summary: NetworkSummary): string {
  const header = ["layer", "type", "output", "params", "FLOPs", "group"];
  const body = summary.rows.map((r) => [
    r.name,
    r.kind,
    `[${r.outputShape.slice(1).join("×")}]`,
    thousands(r.parameters),
    thousands(r.flops),
    r.group,
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...body.map((row) => row[i].length)));
  const line = (cells: string[]) =>
    cells.map((c, i) => (i === 3 || i === 4 ? c.padStart(widths[i]) : c.padEnd(widths[i]))).join("  ")
      .trimEnd();
  const out = [line(header), widths.map((w) => "-".repeat(w)).join("  "), ...body.map(line)];
  out.push(
    `total: ${thousands(summary.parameters)} parameters, ${thousands(summary.flops)} FLOPs per sample`,
  );
  for (const [group, totals] of Object.entries(summary.groups)) {
    const p = (100 * totals.parameters) / (summary.parameters || 1);
    const f = (100 * totals.flops) / (summary.flops || 1);
    out.push(
      `  ${group}: ${thousands(totals.parameters)} parameters (${p.toFixed(1)}%), ${
        thousands(totals.flops)
      } FLOPs (${f.toFixed(1)}%)`,
    );
  }
  return out.join("\n");
}
