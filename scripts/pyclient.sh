#!/usr/bin/env bash
# Runs the Python reference client (scripts/pyclient.py) against a Cellfleet
# node. It proves a client in another language can sign and send commands
# using only proto/ and the signing rule written in
# proto/cellfleet/v1/envelope.proto: the stubs are generated here from the
# .proto files with grpcio-tools, nothing is shared with the Rust code.
#
# The venv is created once and cached (pinned versions from PyPI):
#   CELLFLEET_PYCLIENT_VENV  venv directory (default ~/.cache/cellfleet/pyclient-venv-<hash>)
#   CELLFLEET_PYTHON         interpreter (default python3.11, else python3)
# Usage: scripts/pyclient.sh [pyclient.py arguments...]   (see --help)
# Exit status: the client's; 3 when the venv cannot be made.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
requirements=(grpcio==1.85.1 grpcio-tools==1.85.1 cryptography==50.0.2)

python="${CELLFLEET_PYTHON:-}"
if [[ -z "$python" ]]; then
  if command -v python3.11 >/dev/null 2>&1; then python=python3.11; else python=python3; fi
fi
if ! command -v "$python" >/dev/null 2>&1; then
  echo "pyclient: no Python interpreter ($python); install python3.11 or set CELLFLEET_PYTHON" >&2
  exit 3
fi

tag="$(printf '%s\n' "${requirements[@]}" "$("$python" -c 'import sys; print(sys.version_info[:2])')" | sha256sum | cut -c1-12)"
venv="${CELLFLEET_PYCLIENT_VENV:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/cellfleet/pyclient-venv-$tag}"
stamp="$venv/.cellfleet-ready"

if [[ ! -f "$stamp" ]]; then
  echo "pyclient: creating venv $venv ($python; ${requirements[*]})" >&2
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  if ! "$python" -m venv "$venv" >&2; then
    echo "pyclient: cannot create a venv with $python -m venv (on Debian: apt-get install python3-venv)" >&2
    exit 3
  fi
  if ! "$venv/bin/python" -m pip install --disable-pip-version-check --quiet "${requirements[@]}" >&2; then
    echo "pyclient: cannot install ${requirements[*]} from PyPI into $venv" >&2
    rm -rf "$venv"
    exit 3
  fi
  touch "$stamp"
fi

generated="$(mktemp -d)"
trap 'rm -rf "$generated"' EXIT
(cd "$root/proto" && "$venv/bin/python" -m grpc_tools.protoc -I . \
  --python_out="$generated" --grpc_python_out="$generated" cellfleet/v1/*.proto)

PYTHONPATH="$generated" exec "$venv/bin/python" "$here/pyclient.py" "$@"
