#!/bin/sh
# Proves the proving suite's checks can fail: the gateway runs with a
# deliberate bug (see src/common/mutation.h) and the verdict must name it
# and fail: a stream that loses one content event ("not equivalent"), and
# admission that sends long prompts where they cannot fit.
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
# The same for routing: admission that takes every prompt for one token
# sends long prompts where they cannot fit instead of routing them first.
SPILLWAY_MUTATIONS=admit-unmeasured-prompt "$bin/spillway" chaos --seed 1 --duration 4 --baselines none --no-profiles \
  --scenario routing_before_admission --report "$report/routing" >"$report/routing.txt" 2>&1
rc=$?
cat "$report/routing.txt"
if [ "$rc" -eq 0 ]; then
  echo "FAIL: the proving suite passed although admission never routed a long prompt"
  exit 1
fi
grep -q -e "instead of being routed" -e "routed only after a failed attempt" "$report/routing.txt" ||
  { echo "FAIL: the verdict did not name the requests tried where they could not fit"; exit 1; }
echo "chaos mutation check: long prompts sent where they cannot fit fail the verdict (as they must)"
