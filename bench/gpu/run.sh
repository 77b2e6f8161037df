#!/usr/bin/env bash
# Runs the GPU benchmark on a machine with a GPU and only Node.js and npm: installs the pinned Deno
# from npm, then prints one JSON object (GEMM GFLOP/s up to 4096³, AlexNet 227×227 batch-128
# training step on one and two WebGPU devices). Pass --smoke for a tiny run on a software adapter.
set -euo pipefail
cd "$(dirname "$0")/../.."
npm ci --no-audit --no-fund >&2
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
./node_modules/.bin/deno run -A bench/gpu/gpu_report.ts "$@"
