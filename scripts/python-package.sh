#!/usr/bin/env bash
# The Python package (clients/python): checks its committed stubs are what
# grpcio-tools generates from proto/ now, installs it with pip into a
# scratch directory, and runs its tests (clients/python/tests) against the
# cluster named by CELLFLEET_CONFIG and CELLFLEET_TEST_NODES (see
# crates/cellfleet/tests/python_package.rs, which starts one).
#   --regenerate   rewrite the committed stubs from proto/ and stop
#   --stubs-only   only check the stubs
# Exit status: 0 passed; 1 a check failed; 3 no Python venv could be made.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
package="$root/clients/python"
venv="$(bash "$here/pyvenv.sh")" || exit 3
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

generate() {
  mkdir -p "$1"
  (cd "$root/proto" && "$venv/bin/python" -m grpc_tools.protoc -I . \
    --python_out="$1" --grpc_python_out="$1" \
    cellfleet/v1/admin.proto cellfleet/v1/client.proto cellfleet/v1/envelope.proto cellfleet/v1/errors.proto)
  # Messages-only files get no service stubs.
  rm -f "$1/cellfleet/v1/envelope_pb2_grpc.py" "$1/cellfleet/v1/errors_pb2_grpc.py"
}

if [[ "${1:-}" == "--regenerate" ]]; then
  generate "$scratch/gen"
  cp "$scratch/gen/cellfleet/v1/"*.py "$package/cellfleet/v1/"
  echo "python-package: stubs regenerated in clients/python/cellfleet/v1"
  exit 0
fi

generate "$scratch/gen"
for file in "$scratch/gen/cellfleet/v1/"*.py; do
  name="$(basename "$file")"
  if ! cmp -s "$file" "$package/cellfleet/v1/$name"; then
    echo "python-package: clients/python/cellfleet/v1/$name is not what proto/ generates; run scripts/python-package.sh --regenerate" >&2
    exit 1
  fi
done
echo "python-package: stubs are current"
[[ "${1:-}" == "--stubs-only" ]] && exit 0

# Built from a copy, so the build leaves nothing in the source tree.
mkdir -p "$scratch/src"
cp -r "$package/pyproject.toml" "$package/README.md" "$package/cellfleet" "$scratch/src/"
"$venv/bin/python" -m pip install --disable-pip-version-check --quiet --no-deps \
  --no-build-isolation --target "$scratch/site" "$scratch/src" >&2
cd "$package/tests"
PYTHONPATH="$scratch/site:$package/tests" PYTHONDONTWRITEBYTECODE=1 \
  "$venv/bin/python" -m unittest -v test_cluster test_kill
