#!/usr/bin/env bash
# End-to-end: `traincoord simulate` as a user runs it. Usage: simulate_cli.sh SOURCE_DIR
# (TRAINCOORD names the binary).
set -euo pipefail
src=$1
bin=${TRAINCOORD:?set TRAINCOORD to the traincoord binary}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# The shipped example runs and reports its plan and result.
"$bin" simulate --config "$src/examples/runs/example.toml" --workers 4 >"$tmp/out.txt"
grep -q '^plan: batches_per_job 4' "$tmp/out.txt" || fail "no plan line"
grep -q '^result: ' "$tmp/out.txt" || fail "no result line"

# A losses table drives the dev losses; the window rule stops on the rise.
cat >"$tmp/run.toml" <<'TOML'
name = "cli"
[data]
train_batches = 8
dev_batches = 2
order = "sequential"
[schedule]
epochs = 10
[early_stop]
rule = "window"
window = 2
mean_threshold = 0.0
std_threshold = 0.0
TOML
printf 'dev 0 1.0\ndev 1 0.8\ndev 2 0.9\n' >"$tmp/losses.txt"
"$bin" simulate --config "$tmp/run.toml" --workers 3 --losses "$tmp/losses.txt" --json \
  --order random --seed 5 >"$tmp/trace.json"
/usr/bin/python3 - "$tmp/trace.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
assert t["result"]["state"] == "early_stopped", t["result"]
assert t["result"]["stopped_at_epoch"] == 2, t["result"]
assert t["result"]["best_epoch"] == 1, t["result"]
train = [h for h in t["handouts"] if h["set"] == "train"]
assert len(train) == 3 * 8, len(train)
for epoch in range(3):
    got = sorted(b for h in train if h["epoch"] == epoch for b in h["batches"])
    assert got == list(range(8)), (epoch, got)
PY

# A bad config is refused with the field named, and exit status 2.
printf 'name = "x"\n[data]\ntrain_batches = 0\n' >"$tmp/bad.toml"
set +e
"$bin" simulate --config "$tmp/bad.toml" 2>"$tmp/err.txt"
status=$?
set -e
[ "$status" = 2 ] || fail "bad config exited $status"
grep -q 'data.train_batches' "$tmp/err.txt" || fail "the error does not name the field"

# A missing option is a usage error.
if "$bin" simulate 2>/dev/null; then fail "simulate without --config succeeded"; fi
echo "simulate CLI: all checks passed"
