#!/usr/bin/env bash
# The example FM (examples/causal_fm.py) through every step, by configuration alone, from a
# checkout of this repository:
#   1. the offline transfer report of the built-in FM and this one, on the same seeds
#      (runs/tr_two_fms/transfer.json);
#   2. the demo with this FM: training, the FM workers, the KNN rebuilds and serving over
#      HTTP through the replay window (runs/demo_causal/replay.json).
# SEEDS (default 5) and PORT (default 8123) may be set in the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"  # so that `examples` imports, Ray's workers too
solaris report transfer --dataset synthetic --seeds "${SEEDS:-5}" \
    --compare-fm configs/example-causal-fm.yaml --out runs/tr_two_fms
solaris demo --config configs/example-causal-fm.yaml --out runs/demo_causal --port "${PORT:-8123}"
