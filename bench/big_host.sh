#!/usr/bin/env bash
# What only a large host shows, as one script: players x trainers scaling on its CPU cores, then Pong with
# 12 players and the trainer on its GPU.
#
#     bash bench/big_host.sh OUTDIR [PONG_MINUTES] [SCALING_BUDGET_S]
#
# Writes OUTDIR/scaling.jsonl (bench/scaling.py --throughput: LunarLander-v3 DQN, players 1,2,4,8 x trainers
# 1,2,4, trainers on the CPU), OUTDIR/pong-12players.jsonl (bench/atari_learn.py, the defaults, 12 players of
# 8 games), their printed output, the host's facts and the GPU's utilization every 5 s of the Pong run.
# Print the tables again with `--report` of either script.
# A host without the project's packages (a GPU box with its own Python and torch): download the wheels of
# gymnasium, farama-notifications, ale-py, Box2D and redis for its Python elsewhere (pip download --no-deps
# --python-version X.Y --platform manylinux...), then there: pip install --no-index --no-deps --target DIR
# WHEELS/*.whl && PYTHONPATH=DIR:$PWD bash bench/big_host.sh OUT.
set -u
out=${1:?usage: bash bench/big_host.sh OUTDIR [PONG_MINUTES] [SCALING_BUDGET_S]}
minutes=${2:-10}
budget=${3:-15}
py=${PYTHON:-python3}
mkdir -p "$out"
{
    nproc
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    $py -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
} >"$out/host.txt" 2>&1
cat "$out/host.txt"

(nvidia-smi dmon -s u -d 5 >"$out/gpu.txt" 2>&1 &)
$py bench/atari_learn.py --systems tinyverse --players 12 --minutes "$minutes" --thresholds=-15,0,10,18 \
    --label "12 players, GPU trainer" --out "$out/pong-12players.jsonl" 2>&1 | tee "$out/pong.txt"
pkill -f "nvidia-smi dmon" || true

TINYVERSE_DEVICE=cpu $py bench/scaling.py --players 1,2,4,8 --trainers 1,2,4 --budget-s "$budget" --throughput \
    --json "$out/scaling.jsonl" 2>&1 | tee "$out/scaling.txt"
