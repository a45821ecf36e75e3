#!/usr/bin/env sh
# Creates what a Cellfleet cluster's nodes and its first client need, in
# DIR: the cluster CA and one node certificate per node (certs/), a client
# certificate (certs/client-app.*), an Ed25519 signing key for the client
# (keys/app.ed25519.pem) and the key registry the nodes load
# (keys/keys.toml). Keep certs/ca.key offline once every certificate is
# issued.
#
#   deploy/init-secrets.sh DIR NODE[=HOST,HOST...] ...
#
# Each NODE is a node id; the hosts after `=` are the DNS names or
# addresses clients and peers use to reach it (its certificate's names;
# default: the node id itself). Refuses to run when DIR/certs/ca.pem
# exists (it never replaces a CA). CELLFLEET is the binary to use (default:
# `cellfleet` on PATH).
set -eu
if [ "$#" -lt 2 ]; then
    echo "usage: $0 DIR NODE[=HOST,HOST...] ..." >&2
    exit 2
fi
cellfleet="${CELLFLEET:-cellfleet}"
dir="$1"
shift
if [ -e "$dir/certs/ca.pem" ]; then
    echo "$dir/certs/ca.pem exists: this cluster already has a CA; issue more certificates with" >&2
    echo "  $cellfleet certs issue node ID --dir $dir/certs --host HOST" >&2
    exit 1
fi
mkdir -p "$dir/certs" "$dir/keys"
"$cellfleet" certs init --dir "$dir/certs"
count=0
for spec in "$@"; do
    count=$((count + 1))
    node="${spec%%=*}"
    hosts="$node"
    case "$spec" in *=*) hosts="${spec#*=}" ;; esac
    set --
    old_ifs="$IFS"
    IFS=,
    for host in $hosts; do
        set -- "$@" --host "$host"
    done
    IFS="$old_ifs"
    "$cellfleet" certs issue node "$node" --dir "$dir/certs" "$@"
done
"$cellfleet" certs issue client app --dir "$dir/certs"
"$cellfleet" keys new app --kinds '*' --ops '*' --admin \
    --out "$dir/keys/app.ed25519.pem" --registry "$dir/keys/keys.toml"
echo "secrets for $count node(s) written to $dir (keep $dir/certs/ca.key offline)"
