#!/usr/bin/env bash
# The web console's browser test: drives /ui/ of a real `cellfleet dev`
# cluster in headless Chromium with playwright-core (pinned by
# scripts/console/package-lock.json), kills a node and watches the page
# follow. Screenshots go to $ARTIFACTS (default target/console-screenshots).
#
#   scripts/console-test.sh                 # builds cellfleet (debug) and runs it
#   CELLFLEET_BIN=path scripts/console-test.sh
#   scripts/console-test.sh --install-only  # installs playwright-core, checks Chromium
#
# Chromium is Debian's (`apt-get install chromium`; CHROMIUM=path for
# another); Node comes from scripts/node.sh. Exits 3 when something is not
# installed, before any cluster starts, naming what is missing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${CELLFLEET_CONSOLE_TEST_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cellfleet-console-test}
mkdir -p "$work"
exec 8>"$work.lock"
flock 8
cp "$root/scripts/console/package.json" "$root/scripts/console/package-lock.json" \
  "$root/scripts/console/console.test.mjs" "$work/"
node_bin=$(bash "$root/scripts/node.sh")
export PATH="$node_bin:$PATH"
missing() { echo "console browser test: cannot run: $1" >&2; exit 3; }
chromium=${CHROMIUM:-$(command -v chromium || true)}
[ -n "$chromium" ] && [ -x "$chromium" ] ||
  missing "no Chromium (apt-get install chromium, or CHROMIUM=/path/to/chromium)"
pushd "$work" >/dev/null
if [ ! -d node_modules/playwright-core ] ||
   ! cmp -s package-lock.json node_modules/.cellfleet-installed-lock; then
  rm -f node_modules/.cellfleet-installed-lock
  npm ci --no-audit --no-fund --loglevel=error >npm-ci.log 2>&1 ||
    missing "npm ci failed with node $(node --version), npm $(npm --version):
$(cat npm-ci.log)"
  cp package-lock.json node_modules/.cellfleet-installed-lock
fi
flock -u 8
popd >/dev/null
if [ "${1:-}" = --install-only ]; then
  echo "console browser test installed: $("$chromium" --version 2>/dev/null | head -1), playwright-core $(node -p "require('$work/node_modules/playwright-core/package.json').version"), node $(node --version)"
  exit 0
fi
if [ -z "${CELLFLEET_BIN:-}" ]; then
  cargo build --quiet -p cellfleet --manifest-path "$root/Cargo.toml"
  target=$(cargo metadata --format-version 1 --no-deps --manifest-path "$root/Cargo.toml" \
    | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
  CELLFLEET_BIN="$target/debug/cellfleet"
fi
export CELLFLEET_BIN CHROMIUM="$chromium"
export ARTIFACTS=${ARTIFACTS:-$root/target/console-screenshots}
cd "$work"
exec node console.test.mjs
