#!/usr/bin/env bash
# First numbers on one GPU (launch/gpu_check.py), from the source tree with nothing installed:
# the GPU image's own jax (0.11.x with CUDA), flax, optax, chex, orbax and transformers, and torch
# for the transformers.generate baseline. Prints JSON lines; stops after GPU_CHECK_TIMEOUT seconds
# (default 480, the 8 minutes it is sized for), keeping the rows printed so far.
#   launch/gpu_check.sh [--shapes=qwen3-0.6b,qwen3-4b] [--slots=64,256] | tee gpu_check.jsonl
#   launch/gpu_check.sh --smoke      # the same code at toy sizes, on any backend
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec timeout "${GPU_CHECK_TIMEOUT:-480}" python -m launch.gpu_check "$@"
