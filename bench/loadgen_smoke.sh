#!/usr/bin/env bash
# The load generator against a real coordinator and a real Redis, briefly (CI): it must finish
# with its checks passed (exit 0). Usage: loadgen_smoke.sh TRAINCOORD LOADGEN
set -euo pipefail
traincoord="$1"
loadgen="$2"
dir="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

"$traincoord" serve --in-memory --listen 127.0.0.1:0 > "$dir/serve.out" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  grep -q "listening on" "$dir/serve.out" && break
  sleep 0.1
done
url="$(grep -o 'http://127.0.0.1:[0-9]*' "$dir/serve.out")"
"$loadgen" traincoord --url "$url" --workers 64 --seconds 1 --warmup 0.3 --train-batches 2000 \
  --server-pid "${pids[0]}"
# Several jobs per request ("jobs": N, "completions"), with training time and heartbeats.
"$loadgen" traincoord --url "$url" --workers 16 --seconds 1.5 --warmup 0.3 --train-batches 500 \
  --jobs-per-request 3 --job-ms 5 --lease-timeout 1.5
# Heartbeats: every interval (as before issue 22), and only when needed on jobs longer than the
# interval (0.5 s here), so that a worker heartbeats while it trains and keeps its lease.
"$loadgen" traincoord --url "$url" --workers 16 --seconds 1 --warmup 0.3 --train-batches 500 \
  --job-ms 5 --lease-timeout 1.5 --heartbeats timer
"$loadgen" traincoord --url "$url" --workers 16 --seconds 2 --warmup 0.3 --train-batches 500 \
  --job-ms 1000 --lease-timeout 1.5 --heartbeats needed

if command -v redis-server > /dev/null; then
  port="$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no --dir "$dir" \
    > "$dir/redis.out" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    grep -q "Ready to accept" "$dir/redis.out" && break
    sleep 0.1
  done
  "$loadgen" redis --port "$port" --workers 8 --seconds 1 --warmup 0.3
  "$loadgen" redis --port "$port" --workers 8 --seconds 1 --warmup 0.3 --jobs-per-request 3
fi
