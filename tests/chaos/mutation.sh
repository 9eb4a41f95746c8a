#!/bin/sh
# Proves the proving suite's token equivalence can fail: the gateway runs
# with a deliberate bug (a stream loses one content event, see
# src/common/mutation.h) and the verdict must say "not equivalent" and fail.
# Usage: mutation.sh BIN_DIR REPORT_DIR
set -u
bin=$1
report=$2
rm -rf "$report"
mkdir -p "$report"
SPILLWAY_MUTATIONS=relay-drop-chunk "$bin/spillway" chaos --seed 1 --duration 4 --baselines none --no-profiles \
  --scenario short_prompts --report "$report" >"$report/out.txt" 2>&1
rc=$?
cat "$report/out.txt"
if [ "$rc" -eq 0 ]; then
  echo "FAIL: the proving suite passed although every stream lost a chunk"
  exit 1
fi
grep -q "not equivalent" "$report/out.txt" || { echo "FAIL: the verdict did not name the non-equivalent outputs"; exit 1; }
echo "chaos mutation check: a stream that loses one chunk fails the verdict (as it must)"
