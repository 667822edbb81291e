#!/bin/bash
# The GPU tests, the GPU benches of record and the CLI on CUDA, in one call on a one-GPU machine: at most 8
# minutes of steps (40 + 190 + 60 + 190 s limits; a step that SIGTERM does not end is killed 10 s later) and
# about 15 s of set-up, so one device call with a 540 s limit holds it.
# Run from the project root. The machine needs torch and transformers; trl, datasets, dill, multiprocess,
# math-verify, latex2sympy2_extended and antlr4-python3-runtime may travel as wheels in .whl/ (about 2 MB):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 -d .whl \
#     trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 math-verify==0.9.0 \
#     latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
# Each step has its own time limit and writes its log to $OUT (default /tmp/gpu-check).
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1  # the machine reaches no network
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/env.txt"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ||
    echo "!!! pip could not install .whl/ (a wheel for another Python?): steps 1 and 3-4 will fail"
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' | tee -a "$OUT/env.txt"
python3 -c 'import trl, datasets, math_verify; print("trl", trl.__version__)' 2>&1 | tail -1 | tee -a "$OUT/env.txt" | grep -q "^trl " ||
  echo "!!! no trl, datasets or math-verify here (.whl/ did not travel): steps 1, 3 and 4 will fail; step 2 needs none"
step() {
  local name=$1 limit=$2
  shift 2
  echo "=== $name (limit ${limit} s)"
  local start=$SECONDS
  timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "=== $name rc=$? in $((SECONDS - start)) s"
  grep -v "it/s\]\|Warning\|warn" "$OUT/$name.log" | tail -"${TAIL:-25}"
}
# 1. The tests that need a GPU, first: the only check on the device of the code written since the last call
#    (the real varlen kernel against SDPA through the wrapper, shared prompts included; the waits for the
#    device a packed call adds; auto keeping packed on the real kernel, whose live check is against SDPA), by node id (the CPU ones run in CI); TESTS= skips them,
#    TESTS=tests/test_varlen.py runs the whole file.
GPU_TESTS="tests/test_varlen.py::test_the_real_kernel_matches_sdpa_on_a_packed_row_in_bf16
  tests/test_varlen.py::test_on_a_gpu_packing_adds_one_wait_for_the_device_to_the_models_own
  tests/test_varlen.py::test_on_a_gpu_auto_keeps_the_real_kernel_which_passes_the_live_check_against_sdpa"
[ -n "${TESTS-$GPU_TESTS}" ] && step tests "${LIMIT_TESTS:-40}" python3 -m pytest -q -p no:cacheprovider \
  ${TESTS-$GPU_TESTS}
# 2. The training side alone (torch and transformers only), the bench of record: ROUND_MODES (default padded,
#    packed-balanced, the trainer's default path, and packed-shared, each group's prompt run once; the
#    bench's own default adds packed-varlen, packed-sdpa and trim), 2 rounds of new lengths and 1 repeat
#    each; no round is begun after ROUND_BUDGET seconds, and what that skips is printed (the step limit
#    stops the rounds, and a mode that fails ends alone: what ran is still summarised). PROFILE=1 adds the
#    per-phase profiles (new lengths against the same round again) of PROFILE_MODES (default: every mode
#    run), one file a mode under $OUT/profile (packed-flex compiles for minutes).
step gpu_round "${LIMIT_ROUND:-190}" python3 bench/gpu_round.py --budget_s "${ROUND_BUDGET:-160}" \
  --rounds "${ROUNDS:-2}" --modes "${ROUND_MODES:-padded,packed-balanced,packed-shared}" \
  ${PROFILE:+--profile "$OUT/profile"} ${PROFILE_MODES:+--profile_modes "$PROFILE_MODES"}
# 3. The command line on CUDA in bf16, the default path (auto: packed on CUDA), generation and evaluation
#    included.
[ "${SMOKE:-1}" = 1 ] && TAIL=12 step smoke "${LIMIT_SMOKE:-60}" python3 -m prompt_aug.train --config recipes/smoke/tiny_cpu.yaml \
  --use_cpu false --bf16 true --output_dir /tmp/gpu-check-smoke
# 4. The trainer's padding paths at the paper's shapes, two rounds each, the first warming up: off (TRL's
#    padded calls), packed (what trim_padding: auto picks on CUDA; varlen attention and token-balanced
#    micro-batches where they apply, the log says which) and packed-shared (packing_share_prompts: whether
#    it should be on by default). TRAINER_PATHS=padded,trim,packed adds trim (raise LIMIT_TRAINER). Each
#    path prints its rounds' seconds as it ends, so the log keeps them if the limit stops the step.
step trainer_paths "${LIMIT_TRAINER:-190}" python3 bench/padding.py --device cuda --shape paper \
  --paths "${TRAINER_PATHS:-padded,packed,packed-shared}"
grep -h "padding-free passes\|packed attention" "$OUT"/*.log | sort | uniq -c
# with TORCH_LOGS=recompiles: flex_attention's recompilations per step
grep -c "Recompiling" "$OUT"/*.log || true
