#!/bin/bash
# The GPU tests, the GPU benches of record and the CLI on CUDA, in one call on a one-GPU machine. Each step
# has its own time limit (40 + 180 + 90 + 150 s; a step that SIGTERM does not end is killed 5 s later), cut
# where needed so that every step has ended by DEADLINE (470 s from the start; a step left under 15 s is not
# run, and fails); the set-up's commands are time-boxed too (20 + 30 + 45 s, and 20 more where the versions
# check runs out; about 30 s in practice). By the H100's times the steps take about 25 + 150 + 50 + 125 s,
# so one device call with a 540 s limit holds it, and DEADLINE keeps the last lines inside that limit even
# where every step runs long.
#
# How to run it. The machine has torch and transformers and reaches no network; trl, datasets, dill,
# multiprocess, math-verify, latex2sympy2_extended and antlr4-python3-runtime travel as wheels in .whl/
# (about 2 MB; git-ignored, so it reaches the machine only when the call carries it):
#   1. Here, in the project root:
#        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#          --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#          -d .whl trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 math-verify==0.9.0 \
#          latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
#   2. One device call: command `OUT=$OUT bash bench/gpu_check.sh`, carry [".whl"], timeout_s 540.
# Without .whl/ the output's first line says so (with !!!); without trl, steps 1, 3 and 4 are skipped and
# step 2, the bench of record (torch, transformers and accelerate only), runs alone; where .whl/ was carried
# and trl still does not import, that counts as failed.
#
# Each step writes its log to $OUT (default /tmp/gpu-check). The script writes at most 7 files there,
# whatever the variables below say: env.txt (the machine, the versions, what went wrong in the set-up),
# summary.txt (each step's result as the step ends, so that it survives a kill of the whole call),
# tests.log, gpu_round.log, smoke.log, trainer_paths.log and, with PROFILE=1, profile.txt (every profiled
# mode in one file); a device call brings back 8 at most. The last line gives each step's exit status and
# what failed (summary.txt ends with it too); the script itself exits 0.
OUT=${OUT:-/tmp/gpu-check}
DEADLINE=${DEADLINE:-470}
mkdir -p "$OUT"
rm -f "$OUT"/{tests,gpu_round,smoke,trainer_paths}.log "$OUT"/{profile,summary}.txt # a local rerun's files
: >"$OUT/env.txt"
note() { echo "$*" | tee -a "$OUT/env.txt"; }
record() { echo "$*" >>"$OUT/summary.txt"; }
results=() failed=()
wheels=0
if compgen -G ".whl/*.whl" >/dev/null; then
  wheels=1
else
  note '!!! NO .whl/: the call did not carry [".whl"] (see the header); unless trl is here, only step 2 runs'
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 # the machine reaches no network
timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$OUT/env.txt"
smi=${PIPESTATUS[0]}
[ "$smi" = 0 ] || note "!!! nvidia-smi failed or hung (rc=$smi): the GPU may not be usable"
note "$(python3 -V 2>&1)"
export PYTHONPATH=$PWD
if [ "$wheels" = 1 ]; then
  timeout 30 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || note "!!! pip could not install .whl/ (rc=$?; wheels for another Python, or it hung?)"
  export PYTHONPATH=/tmp/site:$PWD
fi
# One Python for every version: torch's cold import takes seconds (and warms the disk cache for the steps).
versions=$(timeout 45 python3 -c '
import torch, transformers
print("torch", torch.__version__, "transformers", transformers.__version__)
try:
    import datasets, math_verify, trl
except ImportError as error:
    print("no trl stack:", error)
else:
    print("trl", trl.__version__, "datasets", datasets.__version__)
' 2>&1)
versions_rc=$?
note "${versions:-no versions: the check printed nothing (rc=$versions_rc)}"
have_trl=0
if grep -q "^trl " <<<"$versions"; then
  have_trl=1
elif [ "$versions_rc" = 124 ] && timeout 20 python3 -c '
import importlib.util, sys
sys.exit(any(importlib.util.find_spec(name) is None for name in ("trl", "datasets", "math_verify")))
'; then # a slow cold import, not a missing package: the steps that need trl still run
  have_trl=1
  note "!!! the versions check ran past 45 s (a cold start?); trl, datasets and math-verify are installed"
else
  note "!!! no trl, datasets or math-verify here: steps 1, 3 and 4 are skipped; step 2 needs none"
  if [ "$wheels" = 1 ]; then # carried, yet not importable: the set-up failed, and the summary says so
    failed+=("no trl (pip failed?)")
    record "!!! no trl (pip failed?): steps 1, 3 and 4 are skipped"
  fi
fi
step() {
  local name=$1 limit=$2 start=$SECONDS rc result flagged left
  shift 2
  left=$((DEADLINE - SECONDS - 5)) # 5: the kill's grace after SIGTERM
  if [ "$left" -lt 15 ]; then
    echo "=== $name not run: $SECONDS s spent, DEADLINE $DEADLINE s"
    results+=("$name not run (DEADLINE)")
    failed+=("$name (not run: DEADLINE)")
    record "$name not run: $SECONDS s spent, DEADLINE $DEADLINE s"
    return
  fi
  if [ "$limit" -gt "$left" ]; then
    echo "!!! $name: limit cut from $limit s to $left s, to end by DEADLINE $DEADLINE s" | tee -a "$OUT/summary.txt"
    limit=$left
  fi
  echo "=== $name (limit ${limit} s)"
  record "$name started at $SECONDS s (limit $limit s)"
  timeout -k 5 "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  echo "=== $name rc=$rc in $((SECONDS - start)) s"
  grep -v "it/s\]\|Warning:\|warnings.warn(" "$OUT/$name.log" | tail -"${TAIL:-25}"
  if [ "$rc" = 124 ]; then
    result="$name rc=$rc (time limit)"
  elif [ "$rc" = 137 ]; then
    result="$name rc=$rc (killed: the time limit's kill, or out of memory)"
  else
    result="$name rc=$rc"
  fi
  results+=("$result")
  # A bench goes on past a mode that fails or a packed path that falls back (to trim, to SDPA, to a dense
  # mask, to prompts run per row), and exits 0; a GPU test that skips (no CUDA, no varlen kernel) checked
  # nothing: each counts as failed, naming its log's first such line. The fallbacks' phrases are those of
  # prompt_aug.padding's and prompt_aug.varlen's log lines, matched anywhere in a line (smoke.log's lines
  # start with the time).
  flagged=$(grep -m1 -e ": failed (" -e "^!!!" -e "^packed[^ ]* done (trim path" -e "^SKIPPED" \
    -e "back to sdpa" -e "not varlen" -e "prompts not shared" -e "trim, not packed" "$OUT/$name.log")
  if [ "$rc" != 0 ]; then
    failed+=("$name")
  elif [ -n "$flagged" ]; then
    failed+=("$name (${flagged:0:120})")
  fi
  record "$result in $((SECONDS - start)) s${flagged:+; flagged: ${flagged:0:200}}"
}
skip() {
  echo "=== $1 skipped ($2)"
  results+=("$1 skipped ($2)")
  record "$1 skipped ($2)"
}
# 1. The tests that need a GPU, first: the only check on the device of the code written since the last call
#    (the real varlen kernel against SDPA through the wrapper, shared prompts included; the waits for the
#    device a packed call adds; auto keeping packed on the real kernel, whose live check is against SDPA),
#    by node id (the CPU ones run in CI); TESTS= skips them, TESTS=tests/test_varlen.py runs the whole file.
GPU_TESTS="tests/test_varlen.py::test_the_real_kernel_matches_sdpa_on_a_packed_row_in_bf16
  tests/test_varlen.py::test_on_a_gpu_packing_adds_one_wait_for_the_device_to_the_models_own
  tests/test_varlen.py::test_on_a_gpu_auto_keeps_the_real_kernel_which_passes_the_live_check_against_sdpa"
if [ -z "${TESTS-$GPU_TESTS}" ]; then
  skip tests "TESTS is empty"
elif [ "$have_trl" = 0 ]; then
  skip tests "no trl"
else
  step tests "${LIMIT_TESTS:-40}" python3 -m pytest -q -rs -p no:cacheprovider ${TESTS-$GPU_TESTS}
fi
# 2. The training side alone (torch, transformers and accelerate only), the bench of record: ROUND_MODES
#    (default padded, packed-balanced, the trainer's default path, and packed-shared, each group's prompt run
#    once; the bench's own default adds packed-varlen, packed-sdpa and trim), 2 rounds of new lengths and 1
#    repeat each; no round is begun after ROUND_BUDGET seconds from the bench's imports, and what that skips
#    is printed, with !!! (the step limit stops the rounds, and a mode that fails ends alone: what ran is
#    still summarised). PROFILE=1 adds the per-phase profiles (new lengths, then the same round again) of
#    PROFILE_MODES (default: every mode run), all in $OUT/profile.txt (packed-flex compiles for minutes).
profile=()
[ "${PROFILE:-0}" = 1 ] && profile=(--profile "$OUT" ${PROFILE_MODES:+--profile_modes "$PROFILE_MODES"})
step gpu_round "${LIMIT_ROUND:-180}" python3 bench/gpu_round.py --budget_s "${ROUND_BUDGET:-155}" \
  --rounds "${ROUNDS:-2}" --modes "${ROUND_MODES:-padded,packed-balanced,packed-shared}" "${profile[@]}"
# 3. The command line on CUDA in bf16, the default path (auto: packed on CUDA), generation included, into a
#    new folder each time (a folder that holds a run is refused).
if [ "${SMOKE:-1}" != 1 ]; then
  skip smoke "SMOKE=${SMOKE}"
elif [ "$have_trl" = 0 ]; then
  skip smoke "no trl"
else
  TAIL=12 step smoke "${LIMIT_SMOKE:-90}" python3 -m prompt_aug.train --config recipes/smoke/tiny_cpu.yaml \
    --use_cpu false --bf16 true --output_dir "$(mktemp -d /tmp/gpu-check-smoke.XXXXXX)"
fi
# 4. The trainer's padding paths at the paper's shapes, two rounds each, the first warming up: off (TRL's
#    padded calls), packed (what trim_padding: auto picks on CUDA; varlen attention and token-balanced
#    micro-batches where they apply) and packed-shared (packing_share_prompts: whether it should be on by
#    default). TRAINER_PATHS=padded,trim,packed adds trim (raise LIMIT_TRAINER). Each path prints its rounds'
#    seconds as it ends, with the attention it ran and whether prompts were shared (and a !!! line where a
#    packed path timed a fallback), so the log keeps them if the limit stops the step.
if [ "$have_trl" = 0 ]; then
  skip trainer_paths "no trl"
else
  step trainer_paths "${LIMIT_TRAINER:-150}" python3 bench/padding.py --device cuda --shape paper \
    --paths "${TRAINER_PATHS:-padded,packed,packed-shared}"
fi
grep -h "padding-free passes\|packed attention" "$OUT"/*.log 2>/dev/null | sort | uniq -c
files=$(find "$OUT" -type f | wc -l)
[ "$files" -le 8 ] || echo "!!! $files files under $OUT: a device call brings back 8 at most"
summary=$(printf '; %s' "${results[@]}")
[ "$wheels" = 1 ] || summary="$summary; !!! no .whl/"
fails=none
[ "${#failed[@]}" = 0 ] || fails=$(printf '; %s' "${failed[@]}") fails=${fails#; }
echo "=== steps: ${summary#; } | failed: $fails" | tee -a "$OUT/summary.txt"
