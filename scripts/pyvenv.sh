#!/usr/bin/env bash
# Prints the path of a Python venv with the pinned packages the Python
# client tests need (grpcio, grpcio-tools, protobuf, cryptography from
# PyPI), creating it once and caching it:
#   CELLFLEET_PYCLIENT_VENV  venv directory (default ~/.cache/cellfleet/pyclient-venv-<hash>)
#   CELLFLEET_PYTHON         interpreter (default python3.11, else python3; 3.11 or later)
# Exit status 3 when the venv cannot be made (the reason on stderr).
set -euo pipefail

requirements=(grpcio==1.85.1 grpcio-tools==1.85.1 protobuf==7.36.2 cryptography==50.0.2)

python="${CELLFLEET_PYTHON:-}"
if [[ -z "$python" ]]; then
  if command -v python3.11 >/dev/null 2>&1; then python=python3.11; else python=python3; fi
fi
if ! command -v "$python" >/dev/null 2>&1; then
  echo "pyvenv: no Python interpreter ($python); install python3.11 or set CELLFLEET_PYTHON" >&2
  exit 3
fi

tag="$(printf '%s\n' "${requirements[@]}" "$("$python" -c 'import sys; print(sys.version_info[:2])')" | sha256sum | cut -c1-12)"
venv="${CELLFLEET_PYCLIENT_VENV:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/cellfleet/pyclient-venv-$tag}"
stamp="$venv/.cellfleet-ready"

if [[ ! -f "$stamp" ]]; then
  echo "pyvenv: creating venv $venv ($python; ${requirements[*]})" >&2
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  if ! "$python" -m venv "$venv" >&2; then
    echo "pyvenv: cannot create a venv with $python -m venv (on Debian: apt-get install python3-venv)" >&2
    exit 3
  fi
  if ! "$venv/bin/python" -m pip install --disable-pip-version-check --quiet "${requirements[@]}" >&2; then
    echo "pyvenv: cannot install ${requirements[*]} from PyPI into $venv" >&2
    rm -rf "$venv"
    exit 3
  fi
  touch "$stamp"
fi
echo "$venv"
