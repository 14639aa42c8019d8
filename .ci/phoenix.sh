#!/usr/bin/env bash
# Build (idempotently) a separate venv with Arize Phoenix, the trace backend of the tracing
# tier (tests/gateway/test_tracing_phoenix.py): an LLM-app trace store that takes OTLP and
# answers its own REST API. Phoenix pins other versions of packages the gateway's venv has
# (cachetools, tenacity), so it lives apart; the tests run it as a server process.
#
# Usage: .ci/phoenix.sh   (prints the venv's `phoenix` executable on its last line)
set -euo pipefail
VENV="${HERMES_PHOENIX_VENV:-${HOME}/.cache/hermes-phoenix/venv}"
STAMP="$VENV/.hermes-phoenix-ok"
if [ ! -f "$STAMP" ]; then
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q arize-phoenix
  "$VENV/bin/phoenix" --help >/dev/null
  touch "$STAMP"
fi
export HERMES_PHOENIX="$VENV/bin/phoenix"
echo "$HERMES_PHOENIX"
