#!/usr/bin/env bash
# Build (idempotently) the separate venvs of the compatibility matrix's `compat` tier: agent
# frameworks whose openai pin conflicts with the gateway's own venv (llama-index-llms-openai
# and instructor pin older openai majors, autogen-core an older protobuf). The tests run each venv's python as a client
# subprocess (tests/compat/clients/), talking to the gateway over loopback only.
#
# Usage: .ci/compat-venvs.sh   (prints the venvs' parent directory on its last line;
#                              export it as HERMES_COMPAT_VENVS for the tests)
set -euo pipefail
ROOT="${HERMES_COMPAT_VENVS:-${HOME}/.cache/hermes-compat}"
mkdir -p "$ROOT"
build() {  # name, then the pip requirements
  local name="$1"; shift
  local venv="$ROOT/$name"
  local stamp="$venv/.hermes-compat-ok"
  local want="$*"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return; fi
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  # shellcheck disable=SC2068
  "$venv/bin/pip" install -q $@
  echo "$want" > "$stamp"
}
build llama-index "llama-index-core==0.14.25" "llama-index-llms-openai==0.8.3" \
  "llama-index-llms-openai-like==0.8.1"
build instructor "instructor==1.17.0"
# autogen-core pins protobuf~=5.29 (the gateway's venv has protobuf 7 for OpenTelemetry)
build autogen "autogen-agentchat==0.7.5" "autogen-ext[openai]==0.7.5"
echo "$ROOT"
