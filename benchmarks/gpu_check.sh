#!/usr/bin/env bash
# One check of chapter 9's Triton kernel and chapter 11's trainer on one CUDA GPU (issue 32),
# printed as Markdown tables, in under 7 minutes on an H100 (Triton's compilation and tuning
# included). Whoever has a GPU at hand runs it and commits its output as a record
# (benchmarks/records/, with the card, date and versions it prints).
#
#   bash benchmarks/gpu_check.sh                     # from the repository root
#   OUT=results NANOGPT_DIR=gpu_carry/nanoGPT bash benchmarks/gpu_check.sh
#
# Environment (all optional):
#   OUT           a folder: the whole output is also written to $OUT/gpu_check.md
#   DATA          the text both trainers train on (default gpu_carry/data/tinyshakespeare.txt)
#   NANOGPT_DIR   a checkout of karpathy/nanoGPT (train.py, model.py, configurator.py,
#                 config/train_shakespeare_char.py): its train.py runs the same baby GPT on
#                 DATA, prepared here as its data/shakespeare_char/prepare.py would (offline)
#   ITERS         trainer iterations per run (default 200)
#   PYTHON        the interpreter (default python); it needs torch with CUDA, triton, numpy,
#                 and pytest for the tests (tqdm is stood in for when it is missing)
#   GPU_CHECK_BUDGET  seconds for everything (default 400): each section gets what is left,
#                 keeping a reserve for the sections after it, and is cut by `timeout`
#
# Sections: (a) date, card, versions, CPU; (b) tests/test_triton_attention.py compiled (no
# interpreter), in 4 processes; (c) the kernel (both backwards) against SDPA's
# FlashAttention-2, cuDNN and memory-efficient backends, forced one by one; (d) the host time
# per call, and the host cost of a training step against nanoGPT's (benchmarks/host_cost.py);
# (e) the training step against nanoGPT's model with the same biases, the trainer (--impl
# sdpa, --impl triton) and nanoGPT's train.py (a checkout in NANOGPT_DIR, else its loop as
# benchmarks/nanogpt_train.py writes it). A section that fails prints its error and the
# script goes on.
set -u
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python}
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET  # compiled kernels, never the interpreter
export PYTHONUNBUFFERED=1  # what a section printed survives its timeout
DATA=${DATA:-gpu_carry/data/tinyshakespeare.txt}
ITERS=${ITERS:-200}
BUDGET=${GPU_CHECK_BUDGET:-400}
START=$SECONDS
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# Triton's compiled kernels, shared by every section (a fresh folder: compile times included)
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$TMP/triton-cache}
REPORT=/dev/null
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT" && REPORT="$OUT/gpu_check.md" && : > "$REPORT"
fi

say() { printf '%s\n' "$*" | tee -a "$REPORT"; }

# section TITLE CAP RESERVE FORMAT COMMAND...: run COMMAND for at most CAP seconds, and never
# into the RESERVE seconds kept for the sections after it; FORMAT md (tables) or text (fenced)
section() {
  local title=$1 cap=$2 reserve=$3 format=$4
  shift 4
  local left=$((BUDGET - (SECONDS - START) - reserve))
  local limit=$((cap < left ? cap : left))
  say ""
  say "## $title"
  say ""
  if [ "$limit" -lt 10 ]; then
    say "(skipped: ${BUDGET} s budget spent, $((SECONDS - START)) s so far)"
    return
  fi
  local t0=$SECONDS
  [ "$format" = text ] && say '```'
  if declare -F "$1" > /dev/null; then  # a function of this script: run by a child bash
    timeout --kill-after=10 "$limit" bash -c '"$@"' _ "$@" 2>&1 | tee -a "$REPORT"
  else
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$REPORT"
  fi
  local rc=${PIPESTATUS[0]}
  [ "$format" = text ] && say '```'
  local note=""
  [ "$rc" = 124 ] && note=", CUT by timeout after $limit s"
  [ "$rc" != 0 ] && [ "$rc" != 124 ] && note=", FAILED"
  say ""
  say "_(section: exit code $rc$note; $((SECONDS - t0)) s; $((SECONDS - START)) s in all)_"
}

# (b) the test file in 4 processes (Triton compiles on the CPU, one kernel at a time per
# process; 4 processes compile 4 at a time), test ids dealt round-robin
run_tests() {
  "$PY" -m pytest tests/test_triton_attention.py --collect-only -q -p no:cacheprovider \
    | grep '::' > "$TMP/ids" || { echo "pytest could not collect the tests"; return 1; }
  split -n r/4 "$TMP/ids" "$TMP/ids."
  local part pids=()
  for part in "$TMP"/ids.??; do
    mapfile -t ids < "$part"
    "$PY" -m pytest -q -p no:cacheprovider -o addopts="" -rfE "${ids[@]}" > "$part.log" 2>&1 &
    pids+=($!)
  done
  local rc=0 pid
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  for part in "$TMP"/ids.??; do
    echo "--- process $(basename "$part"): $(grep -c . "$part") tests"
    grep -v '^[.sFExX]*\( *\[ *[0-9]*%\]\)\?$' "$part.log" | tail -n 40
  done
  return $rc
}

# tqdm only draws the trainer's progress bar: a stand-in where it is not installed
if ! "$PY" -c "import tqdm" 2>/dev/null; then
  mkdir -p "$TMP/shim/tqdm"
  cat > "$TMP/shim/tqdm/__init__.py" <<'EOF'
class tqdm:  # gpu_check.sh's stand-in: iterates, draws nothing
    def __init__(self, iterable=None, *args, **kwargs):
        self.iterable = iterable
    def __iter__(self):
        return iter(self.iterable)
    def set_postfix(self, *args, **kwargs):
        pass
    def update(self, n=1):
        pass
    def close(self):
        pass
EOF
  echo "from tqdm import tqdm" > "$TMP/shim/tqdm/auto.py"
  export PYTHONPATH="$PYTHONPATH:$TMP/shim"
fi

# (e) the course's trainer on chapter 11's gpu preset: ms/iter from its metrics file
run_trainer() {
  [ -f "$DATA" ] || { echo "no text at DATA=$DATA"; return 1; }
  "$PY" -m course_attn.train --preset gpu --data "$DATA" --impl "$1" --max-iters "$ITERS" \
    --eval-interval "$ITERS" --eval-iters 5 --samples 0 --quiet \
    --metrics-out "$TMP/trainer-$1.json" > "$TMP/trainer-$1.log" 2>&1
  local rc=$?
  tail -n 4 "$TMP/trainer-$1.log"
  [ "$rc" = 0 ] || return $rc
  "$PY" benchmarks/gpu/check.py trainer-ms "$TMP/trainer-$1.json" > "$TMP/ms-$1"
  echo "trainer --impl $1: $(cat "$TMP/ms-$1") ms/iter"
}

# (e) nanoGPT's train.py, same baby GPT (its config/train_shakespeare_char.py), eager
run_nanogpt() {
  [ -f "$DATA" ] || { echo "no text at DATA=$DATA"; return 1; }
  if [ -z "${NANOGPT_DIR:-}" ] || [ ! -f "$NANOGPT_DIR/train.py" ] \
      || [ ! -f "$NANOGPT_DIR/model.py" ]; then
    # no checkout: its train.py loop and model written out (benchmarks/nanogpt_train.py)
    echo "no NANOGPT_DIR: nanoGPT's train.py loop as benchmarks/nanogpt_train.py writes it"
    "$PY" benchmarks/gpu/check.py nanogpt-loop "$DATA" "$ITERS" > "$TMP/nanogpt-loop.log" 2>&1
    local rc=$?
    tail -n 2 "$TMP/nanogpt-loop.log"
    [ "$rc" = 0 ] || return $rc
    tail -n 1 "$TMP/nanogpt-loop.log" > "$TMP/ms-nanogpt"
    echo "nanoGPT's loop: $(cat "$TMP/ms-nanogpt") ms/iter (mean, synchronised at both ends)"
    return 0
  fi
  "$PY" benchmarks/gpu/check.py nanogpt-data "$DATA" "$NANOGPT_DIR/data/shakespeare_char" \
    || return 1
  # evaluation only at iteration 0 (eval_interval past the end), so no checkpoint is written
  (cd "$NANOGPT_DIR" && "$PY" train.py config/train_shakespeare_char.py --compile=False \
    --max_iters="$ITERS" --eval_iters=5 --eval_interval=$((ITERS + 1)) \
    --out_dir="$TMP/nanogpt-out") > "$TMP/nanogpt.log" 2>&1
  local rc=$?
  tail -n 4 "$TMP/nanogpt.log"
  [ "$rc" = 0 ] || return $rc
  "$PY" benchmarks/gpu/check.py nanogpt-ms "$TMP/nanogpt.log" > "$TMP/ms-nanogpt"
  echo "nanoGPT train.py: $(cat "$TMP/ms-nanogpt") ms/iter (median of its logged iterations)"
}

summary() {
  local sdpa triton nano
  # a run cut by its timeout leaves an empty file: nan, not a crash of the summary
  sdpa=$( [ -s "$TMP/ms-sdpa" ] && cat "$TMP/ms-sdpa" || echo nan)
  triton=$( [ -s "$TMP/ms-triton" ] && cat "$TMP/ms-triton" || echo nan)
  nano=$( [ -s "$TMP/ms-nanogpt" ] && cat "$TMP/ms-nanogpt" || echo nan)
  "$PY" - "$sdpa" "$triton" "$nano" "$ITERS" <<'EOF'
import sys
sdpa, triton, nano = (float(x) for x in sys.argv[1:4])
print(f"| trainer, {sys.argv[4]} iterations, gpu preset, eager | ms/iter |\n|---|---|")
for name, value in (("course --impl sdpa", sdpa), ("course --impl triton", triton),
                    ("nanoGPT train.py (compile=False)", nano)):
    print(f"| {name} | {value:.2f} |")
print(f"\ntriton / sdpa: {triton / sdpa:.2f}x (goal <= 1.15); "
      f"sdpa / nanoGPT: {sdpa / nano:.2f}x (goal <= 1)")
EOF
}

export PY TMP DATA ITERS
export -f run_tests run_trainer run_nanogpt summary
say "# GPU check of course_attn (benchmarks/gpu_check.sh)"
# caps, and reserves: the least each later section needs (kernel 60 s, host 10, calls 10,
# host cost 10, step 40, each trainer 25, nanoGPT 25, summary 10)
section "(a) date, card, versions, CPU" 30 0 md "$PY" benchmarks/gpu/check.py env
section "(b) tests/test_triton_attention.py, compiled kernels" 150 215 text run_tests
section "(c) the Triton kernel against SDPA's backends" 150 155 md \
  "$PY" benchmarks/gpu/check.py kernel
section "(d) host time per call" 30 145 text \
  "$PY" benchmarks/attention_triton.py --host-only --device cuda --dtype bfloat16
section "(d) wall time per small call" 20 135 md "$PY" benchmarks/gpu/check.py calls
section "(d) host cost of a training step (this machine's CPU)" 60 95 text \
  "$PY" benchmarks/host_cost.py --steps 100
section "(e) the training step against nanoGPT's model (gpu preset sizes, no biases)" 60 85 md \
  "$PY" benchmarks/gpu/check.py step false
section "(e) the trainer, --impl sdpa" 40 60 text run_trainer sdpa
section "(e) the trainer, --impl triton" 50 35 text run_trainer triton
section "(e) nanoGPT's train.py" 40 10 text run_nanogpt
section "(e) trainer summary" 15 0 md summary
say ""
say "_total: $((SECONDS - START)) s_"
