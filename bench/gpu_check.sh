#!/bin/bash
# The GPU benches of record and the CLI on CUDA, in one call on a one-GPU machine (about 8 minutes on an H200).
# Run from the project root. The machine needs torch and transformers; trl, datasets, dill, multiprocess,
# math-verify, latex2sympy2_extended and antlr4-python3-runtime may travel as wheels in .whl/ (about 2 MB):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 -d .whl \
#     trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 math-verify==0.9.0 \
#     latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
# Each step has its own time limit and writes its log to $OUT (default /tmp/gpu-check).
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/env.txt"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
python3 -c 'import torch, transformers, trl; print("torch", torch.__version__, "transformers", transformers.__version__, "trl", trl.__version__)' | tee -a "$OUT/env.txt"
step() {
  local name=$1 limit=$2
  shift 2
  echo "=== $name (limit ${limit} s)"
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "=== $name rc=$? in $((SECONDS - start)) s"
  grep -v "it/s\]\|Warning\|warn" "$OUT/$name.log" | tail -"${TAIL:-25}"
}
# 1. The trainer's three padding paths (off = TRL's padded calls, trim, packed = the default) at the paper's
#    shapes: two rounds each, the first warming up.
step trainer_paths "${LIMIT_TRAINER:-210}" python3 bench/padding.py --device cuda --shape paper \
  --paths "${TRAINER_PATHS:-padded,trim,packed}"
# 2. The training side alone (torch and transformers only): padded, packed with SDPA, trim, packed with flex.
step gpu_round "${LIMIT_ROUND:-270}" python3 bench/gpu_round.py \
  --modes "${ROUND_MODES:-padded,packed-sdpa,trim,packed-flex}" --rounds "${ROUNDS:-3}"
# 3. The command line on CUDA in bf16, the default path (packed), evaluation included.
[ "${SMOKE:-1}" = 1 ] && TAIL=12 step smoke "${LIMIT_SMOKE:-70}" python3 -m prompt_aug.train --config recipes/smoke/tiny_cpu.yaml \
  --use_cpu false --bf16 true --output_dir /tmp/gpu-check-smoke
grep -h "padding-free passes" "$OUT"/*.log | sort | uniq -c
grep -c "Recompiling" "$OUT"/*.log  # with TORCH_LOGS=recompiles: flex_attention's recompilations per step
