#!/usr/bin/env bash
# The GPU check as one command on a lent GPU machine (torch and transformers already
# there, no network): versions, then benchmarks/gpu.py with its captures written where
# the suite reads them from (OUT/captures, to copy into tests/data/captures).
# Usage: OUT=folder bash benchmarks/gpu_run.sh [budget seconds, default 420]
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
nvidia-smi -L || true
python3 -c "import torch, transformers, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'python', sys.version.split()[0])"
python3 benchmarks/gpu.py --out "$OUT/gpu" --record "$OUT/captures" --budget-s "${1:-420}" --tests-timeout-s 150
status=$?
ls -la "$OUT/captures" "$OUT/gpu"
exit $status
