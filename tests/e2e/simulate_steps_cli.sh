#!/usr/bin/env bash
# End-to-end: `traincoord simulate --steps` as a user runs it, and the example of
# docs/SIMULATE.md ("Step mode") run as printed, its output compared line for line.
# Usage: simulate_steps_cli.sh SOURCE_DIR (TRAINCOORD names the binary).
set -euo pipefail
src=$1
bin=${TRAINCOORD:?set TRAINCOORD to the traincoord binary}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# The documented example: the fenced block that starts with "$ traincoord simulate --steps".
/usr/bin/python3 - "$src/docs/SIMULATE.md" "$tmp" <<'PY'
import sys
text = open(sys.argv[1]).read().split("\n")
start = next(i for i, l in enumerate(text) if l.startswith("$ traincoord simulate --steps"))
end = next(i for i in range(start + 1, len(text)) if text[i].startswith("```"))
open(sys.argv[2] + "/command", "w").write(text[start][len("$ traincoord "):] + "\n")
open(sys.argv[2] + "/expected", "w").write("\n".join(text[start + 1:end]) + "\n")
PY
read -r -a args <"$tmp/command"
(cd "$src" && "$bin" "${args[@]}") >"$tmp/got"
diff -u "$tmp/expected" "$tmp/got" || fail "docs/SIMULATE.md's step-mode example prints otherwise now"

# A lengths file: fewer samples than ranks is one step, every sample once.
printf '3.2\n1.5 # short\n\n7\n' >"$tmp/lengths.txt"
"$bin" simulate --steps --ranks 4 --lengths "$tmp/lengths.txt" --batch-budget 100 >"$tmp/few.txt"
grep -q '^step mode: 3 samples' "$tmp/few.txt" || fail "no header for the lengths file"
grep -Eq '^ +0 +1 .* yes ' "$tmp/few.txt" || fail "not one step, exactly once: $(cat "$tmp/few.txt")"

# Bad input: exit 2, naming what was wrong.
expect_usage() {  # expect_usage TEXT ARGS...
  local text=$1
  shift
  set +e
  "$bin" "$@" 2>"$tmp/err.txt" >/dev/null
  local status=$?
  set -e
  [ "$status" = 2 ] || fail "$* exited $status"
  grep -q -- "$text" "$tmp/err.txt" || fail "$*: the error does not say '$text': $(cat "$tmp/err.txt")"
}
printf '1\nabc\n' >"$tmp/bad.txt"
expect_usage "bad.txt:2" simulate --steps --lengths "$tmp/bad.txt" --batch-budget 10
expect_usage "--lengths FILE or --synthetic-lengths N" simulate --steps --batch-budget 10
expect_usage "--batch-budget" simulate --steps --synthetic-lengths 100
expect_usage "--cost 1,2" simulate --steps --synthetic-lengths 100 --batch-budget 10 --cost 1,2
expect_usage "--slow-rank 9" simulate --steps --synthetic-lengths 100 --batch-budget 10 --slow-rank 9
expect_usage "add --steps" simulate --synthetic-lengths 100 --batch-budget 10
expect_usage "leave out --config" simulate --steps --config x.toml --synthetic-lengths 9
echo "simulate --steps CLI: all checks passed"
