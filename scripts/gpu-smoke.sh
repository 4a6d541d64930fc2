#!/usr/bin/env bash
# The GPU lane (docs/real-sglang.md): the demo sources through the whole graph against a real SGLang
# server with a small Qwen3-family reasoning model, then one JSON line (python -m eagle3_dagster.app.smoke).
#
#   EAGLE3_GPU_MODEL_PATH=/models/Qwen3-0.6B bash scripts/gpu-smoke.sh      (or: make gpu-smoke)
#
# Without a CUDA GPU it does nothing and exits 0 after one line saying what it would do.
# Settings (environment): EAGLE3_GPU_MODEL_PATH (required on a GPU machine: a local folder with the
# model's config.json, weights and tokenizer; nothing is downloaded from a hub), SGLANG_VERSION (0.5.23),
# GPU_VENV (.gpu-venv: sglang's own venv, never the project's), GPU_SMOKE_WORK (.gpu-smoke: data dir,
# Dagster home, logs; emptied first), GPU_SMOKE_PORT (30100), GPU_SMOKE_BUDGET_S (600: every step shares
# it), NVIDIA_SMI (nvidia-smi), EAGLE3_GPU_DRAFT_MODEL_PATH (optional: a local EAGLE-3 draft model folder;
# the server then speculates with SGLang's --speculative-* flags, GPU_SMOKE_SPEC_ARGS (default
# "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"), and the JSON
# line fails unless every generation carries the drafter's spec_* figures: docs/drafter.md).
set -euo pipefail

# The steps, in order; docs/real-sglang.md lists the same (tests/test_gpu_smoke.py compares them).
STEPS=(
  "check the machine: nvidia-smi lists a CUDA GPU and EAGLE3_GPU_MODEL_PATH is a local model folder"
  "install sglang==\$SGLANG_VERSION into its own venv (\$GPU_VENV) and check torch.cuda.is_available() there"
  "start python -m sglang.launch_server --model-path \$EAGLE3_GPU_MODEL_PATH (with a draft model: --speculative-algorithm EAGLE3 --speculative-draft-model-path \$EAGLE3_GPU_DRAFT_MODEL_PATH) on 127.0.0.1 and wait for /health_generate"
  "run eagle3 demo (the demo sources through the whole graph) with EAGLE3_SGLANG_URL set to it and EAGLE3_MODEL=qwen3"
  "print one JSON line: python -m eagle3_dagster.app.smoke on the demo's data dir (with a draft model: --expect-drafter, every generation carries its spec_* figures)"
  "stop the server"
)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SGLANG_VERSION="${SGLANG_VERSION:-0.5.23}"
GPU_VENV="${GPU_VENV:-$ROOT/.gpu-venv}"
WORK="${GPU_SMOKE_WORK:-$ROOT/.gpu-smoke}"
PORT="${GPU_SMOKE_PORT:-30100}"
BUDGET_S="${GPU_SMOKE_BUDGET_S:-600}"
NVIDIA_SMI="${NVIDIA_SMI:-nvidia-smi}"
PROJECT_PY="${PROJECT_PY:-$ROOT/.venv/bin/python}"

say() { echo "[gpu-smoke] $*" >&2; }
die() { echo "[gpu-smoke] FAILED: $*" >&2; exit 1; }
# seconds left of the budget (GPU_SMOKE_BUDGET_S) for the next command; over it, the script fails
left() { echo $((BUDGET_S - SECONDS)); }
check_budget() { [ "$(left)" -gt 0 ] || die "over the ${BUDGET_S}s budget (GPU_SMOKE_BUDGET_S) in: $*"; }
step() { say "step $1/${#STEPS[@]}: ${STEPS[$(($1 - 1))]}"; }

# --- no CUDA GPU: one line, exit 0
if ! gpus="$("$NVIDIA_SMI" -L 2>/dev/null)" || ! grep -q "^GPU " <<<"$gpus"; then
  plan=""
  for i in "${!STEPS[@]}"; do plan+=" $((i + 1))) ${STEPS[$i]};"; done
  echo "gpu-smoke: no CUDA GPU here ($NVIDIA_SMI -L lists none): nothing done. On a CUDA machine it would:${plan%;} (needs EAGLE3_GPU_MODEL_PATH)."
  exit 0
fi

step 1
[ -n "${EAGLE3_GPU_MODEL_PATH:-}" ] || die "EAGLE3_GPU_MODEL_PATH is not set: point it at a local folder of a small Qwen3-family reasoning model (e.g. Qwen3-0.6B or Qwen3-1.7B: config.json, *.safetensors, tokenizer files)"
[ -f "$EAGLE3_GPU_MODEL_PATH/config.json" ] || die "EAGLE3_GPU_MODEL_PATH=$EAGLE3_GPU_MODEL_PATH has no config.json: not a model folder"
[ -f "$EAGLE3_GPU_MODEL_PATH/tokenizer_config.json" ] || die "EAGLE3_GPU_MODEL_PATH=$EAGLE3_GPU_MODEL_PATH has no tokenizer_config.json: the pipeline tokenizes with the model's own tokenizer"
if [ -n "${EAGLE3_GPU_DRAFT_MODEL_PATH:-}" ]; then
  [ -f "$EAGLE3_GPU_DRAFT_MODEL_PATH/config.json" ] || die "EAGLE3_GPU_DRAFT_MODEL_PATH=$EAGLE3_GPU_DRAFT_MODEL_PATH has no config.json: not a draft model folder"
fi
command -v curl >/dev/null || die "curl is missing (it polls the server's /health_generate)"
[ -x "$PROJECT_PY" ] || die "$PROJECT_PY is missing: run \`make install\` first (the pipeline runs from the project's venv)"
say "GPU: $(head -1 <<<"$gpus")"

step 2
[ -x "$GPU_VENV/bin/python" ] || python3 -m venv "$GPU_VENV"
check_budget "the sglang install"
timeout "$(left)" "$GPU_VENV/bin/python" -m pip install -q --disable-pip-version-check "sglang==$SGLANG_VERSION" >&2 \
  || die "pip install sglang==$SGLANG_VERSION into $GPU_VENV failed"
"$GPU_VENV/bin/python" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'torch.cuda.is_available() is False in $GPU_VENV (torch ' + torch.__version__ + ')')" \
  || die "no CUDA through torch in $GPU_VENV"

step 3
rm -rf "$WORK" && mkdir -p "$WORK"
spec_args=()
smoke_args=()
if [ -n "${EAGLE3_GPU_DRAFT_MODEL_PATH:-}" ]; then
  read -r -a extra <<<"${GPU_SMOKE_SPEC_ARGS:---speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4}"
  spec_args=(--speculative-algorithm EAGLE3 --speculative-draft-model-path "$EAGLE3_GPU_DRAFT_MODEL_PATH" "${extra[@]}")
  smoke_args=(--expect-drafter)
  say "speculative decoding: ${spec_args[*]}"
fi
"$GPU_VENV/bin/python" -m sglang.launch_server --model-path "$EAGLE3_GPU_MODEL_PATH" --host 127.0.0.1 --port "$PORT" \
  --mem-fraction-static 0.8 ${spec_args[@]+"${spec_args[@]}"} >"$WORK/sglang.log" 2>&1 &
server=$!
stop_server() { kill "$server" 2>/dev/null && wait "$server" 2>/dev/null || true; }
trap stop_server EXIT
url="http://127.0.0.1:$PORT"
until curl -sf -m 5 "$url/health_generate" >/dev/null; do
  kill -0 "$server" 2>/dev/null || { tail -30 "$WORK/sglang.log" >&2; die "the SGLang server exited (log: $WORK/sglang.log)"; }
  check_budget "the wait for the SGLang server (log: $WORK/sglang.log)"
  sleep 2
done
say "SGLang up at $url after ${SECONDS}s: $(curl -s -m 5 "$url/server_info" | head -c 200)"

step 4
demo_rc=0
check_budget "the demo"
env DAGSTER_HOME="$WORK/home" EAGLE3_DATA_DIR="$WORK/data" EAGLE3_SGLANG_URL="$url" EAGLE3_MODEL=qwen3 \
  EAGLE3_TOKENIZER="$EAGLE3_GPU_MODEL_PATH" HF_HUB_OFFLINE=1 \
  timeout "$(left)" "$PROJECT_PY" -m eagle3_dagster.app.cli demo >"$WORK/demo.log" 2>&1 || demo_rc=$?
say "eagle3 demo exited $demo_rc after ${SECONDS}s (log: $WORK/demo.log)"

step 5
smoke_rc=0
EAGLE3_MODEL=qwen3 EAGLE3_TOKENIZER="$EAGLE3_GPU_MODEL_PATH" HF_HUB_OFFLINE=1 \
  "$PROJECT_PY" -m eagle3_dagster.app.smoke "$WORK/data" ${smoke_args[@]+"${smoke_args[@]}"} || smoke_rc=$?
[ "$smoke_rc" -eq 0 ] || say "the draft model's spec_* figures did not arrive on every generation (see failed_gates)"

step 6
stop_server
trap - EXIT
say "done in ${SECONDS}s"
if [ "$demo_rc" -ne 0 ]; then exit "$demo_rc"; fi
exit "$smoke_rc"  # 3: a draft model was given and its figures did not arrive
