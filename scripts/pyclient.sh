#!/usr/bin/env bash
# Runs the Python reference client (scripts/pyclient.py) against a Cellfleet
# node. It proves a client in another language can sign and send commands
# using only proto/ and the signing rule written in
# proto/cellfleet/v1/envelope.proto: the stubs are generated here from the
# .proto files with grpcio-tools, nothing is shared with the Rust code.
#
# The venv is scripts/pyvenv.sh's (created once and cached, pinned versions
# from PyPI; CELLFLEET_PYCLIENT_VENV and CELLFLEET_PYTHON choose it).
# Usage: scripts/pyclient.sh [pyclient.py arguments...]   (see --help)
# Exit status: the client's; 3 when the venv cannot be made.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
venv="$(bash "$here/pyvenv.sh")" || exit 3

generated="$(mktemp -d)"
trap 'rm -rf "$generated"' EXIT
(cd "$root/proto" && "$venv/bin/python" -m grpc_tools.protoc -I . \
  --python_out="$generated" --grpc_python_out="$generated" cellfleet/v1/*.proto)

PYTHONPATH="$generated" exec "$venv/bin/python" "$here/pyclient.py" "$@"
