#!/usr/bin/env bash
# The CUDA paths on one GPU, offline, in one go (the figures in docs/benchmarks.md "GPU path"):
#   0. python bench/gpu.py (decode tok/s against the HBM roofline, the fused update's MFU)
#   1. the main command, distributed: torchrun on 1 rank = process group (gloo + NCCL) and FSDP2,
#      configs/math_3agent.py with a random-weight model of Qwen2.5-1.5B's shape, TorchEngine
#   2. the same config without torchrun (no FSDP) with rollout.compile (the decode step in CUDA graphs)
#   3. the first run resumed from its step-1 checkpoint for one more step (FSDP2 checkpoint load)
# Each step runs under its own time limit and the next runs whatever the last did; logs go to $LOGS.
#
#   bash bench/gpu_check.sh <tokenizer dir> [logs dir]     # e.g. ~/.cache/troupe/<a converted model>
# Sizes are cut to fit minutes (random weights never stop early: every turn runs to its max_tokens);
# STEP_LIMIT / BENCH_LIMIT (seconds), SHAPE (default qwen2.5-1.5b), MODEL_DIR, RUNS (the runs' dirs) and
# BENCH_ARGS (bench/gpu.py's arguments, e.g. "--models qwen2.5-1.5b") override; BENCH_LIMIT=0 skips gpu.py.
# The machine needs requirements.txt's pure-Python packages beside its CUDA torch and transformers: on a
# machine without network, `pip download --no-deps` tyro, docstring_parser, typeguard, math-verify,
# latex2sympy2_extended and antlr4-python3-runtime (tyro and math-verify as requirements.txt pins them) elsewhere, carry the
# wheels, and `pip install --no-deps --target DIR` them with PYTHONPATH=DIR (without tyro train.py stops).
set -u
TOK=${1:?a local model directory with tokenizer files}
LOGS=${2:-runs/gpu_check}
SHAPE=${SHAPE:-qwen2.5-1.5b}
STEP_LIMIT=${STEP_LIMIT:-170}
BENCH_LIMIT=${BENCH_LIMIT:-150}
MODEL=${MODEL_DIR:-/tmp/troupe_random_$SHAPE}
RUNS=${RUNS:-$LOGS}  # the runs' output dirs
mkdir -p "$LOGS" "$RUNS"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."

python - <<'EOF' 2>&1 | tee "$LOGS/env.log"
import torch, transformers
print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.version.cuda,
      torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")
EOF
[ -f "$MODEL/model.safetensors" ] || python bench/random_model.py "$SHAPE" --tokenizer "$TOK" --out "$MODEL" 2>&1 | tee -a "$LOGS/env.log"

SMALL=(--model.spec "$MODEL" --rollout.engine torch --rollout.no-progress --trainer.logger console --trainer.total-epochs None
       --trainer.test-freq 2 --trainer.save-freq 2
       --data.train-files data/arith_train.jsonl --data.val-files data/arith_val.jsonl
       --data.batch-size 8 --data.val-size 16 --rollout.num-chains 4 --data.max-refinement-iterations 1
       --roles.0.max-tokens 96 --roles.1.max-tokens 64 --roles.2.max-tokens 96 --algo.mini-batch-size 32)

run() {  # name, limit, command...
  local name=$1 limit=$2
  shift 2
  echo "== $name: $*" | tee "$LOGS/$name.log"
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" >>"$LOGS/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $((SECONDS - t0)) s" | tee -a "$LOGS/$name.log"
  tail -n 30 "$LOGS/$name.log" | cut -c1-260
}

[ "$BENCH_LIMIT" = 0 ] || run gpu_bench "$BENCH_LIMIT" python bench/gpu.py ${BENCH_ARGS:-}  # BENCH_LIMIT=0 skips it
FSDP=(torchrun --nproc_per_node 1 --master_port 29571 train.py --config configs/math_3agent.py "${SMALL[@]}"
      --trainer.output-dir "$RUNS/run_fsdp" --trainer.save-freq 1 --trainer.no-val-before-train --trainer.test-freq 100)
# one step, then a resume: two FSDP steps, each with its end-of-run val only (with a step-0 val and 125 s, the
# H100 of 11-27 was stopped before the checkpoint was written; without it: 102 s and 108 s, on the 0.5B shape)
run fsdp_nccl "$STEP_LIMIT" "${FSDP[@]}" --trainer.total-steps 1
run compile "$STEP_LIMIT" python train.py --config configs/math_3agent.py "${SMALL[@]}" --trainer.total-steps 2 \
    --rollout.compile --trainer.output-dir "$RUNS/run_compile"
run fsdp_resume "$STEP_LIMIT" "${FSDP[@]}" --trainer.total-steps 2   # resumes the first run's step-1 checkpoint
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>/dev/null | tee -a "$LOGS/env.log"
