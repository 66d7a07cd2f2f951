#!/usr/bin/env bash
# Runs the shell blocks of docs/HA.md's "Try it on one machine" as printed (three etcd members
# and two coordinators on loopback, the leader killed, the standby taking over), in a temp dir;
# every process it started is killed by its PID on the way out, also when it fails.
# Usage: ha_docs.sh SOURCE_DIR TRAINCOORD_BINARY
set -euo pipefail
src="$1"
bin="$2"
work="$(mktemp -d /tmp/traincoord-ha-docs-XXXXXX)"
cleanup() {
  if [ -f "$work/ha-demo/pids" ]; then
    while read -r pid; do kill -9 "$pid" 2>/dev/null || true; done < "$work/ha-demo/pids"
  fi
  rm -rf "$work"
}
trap cleanup EXIT
ln -s "$src/examples" "$work/examples"
mkdir -p "$work/bin"
ln -s "$bin" "$work/bin/traincoord"
# The ```bash blocks between the section's heading and the next one.
awk '/^## Try it on one machine/{on=1; next} /^## /{on=0} on && /^```bash/{b=1; next} on && b && /^```/{b=0; next} on && b' \
  "$src/docs/HA.md" > "$work/snippet.sh"
test -s "$work/snippet.sh" || { echo "no snippet found in docs/HA.md"; exit 1; }
cd "$work"
# (Into a file, not "$(...)": the etcd members the snippet starts in the background inherit its
# output, and a command substitution would wait for them to close it, so a snippet that fails
# before it stops them would hang here instead of failing.)
PATH="$work/bin:$PATH" timeout 90 bash -euo pipefail snippet.sh > out.txt 2>&1 || {
  echo "the snippet of docs/HA.md failed:"; cat out.txt; tail -n 5 ha-demo/*.log; exit 1; }
out="$(cat out.txt)"
echo "$out"
grep -q '"code":"not_leader"' <<< "$out" || { echo "the standby did not answer not_leader"; exit 1; }
grep -q '"role":"standby"' <<< "$out" || { echo "GET /v1/coordinator on b did not say standby"; exit 1; }
grep -q 'coordinators:' <<< "$out" || { echo "status printed no coordinators"; exit 1; }
grep -q 'took run example over' ha-demo/b.log || { echo "b did not take over"; exit 1; }
echo "docs/HA.md snippet ran as printed"
