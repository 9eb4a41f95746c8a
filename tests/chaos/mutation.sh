#!/bin/sh
# Proves the proving suite's checks can fail: the gateway runs with a
# deliberate bug (see src/common/mutation.h) and the verdict must name it
# and fail: a stream that loses one content event ("not equivalent"),
# admission that sends long prompts where they cannot fit, and a failover
# that gives up on a request it could have moved ("failed after it started").
# Usage: mutation.sh BIN_DIR REPORT_DIR
set -u
bin=$1
report=$2
rm -rf "$report"
mkdir -p "$report"

# expect_failure NAME MUTATION SCENARIO WHAT PATTERN...: the scenario run
# with MUTATION must fail, and its verdict name one of the PATTERNs.
expect_failure() {
  name=$1 mutation=$2 scenario=$3 what=$4
  shift 4
  SPILLWAY_MUTATIONS=$mutation "$bin/spillway" chaos --seed 1 --duration 4 --baselines none --no-profiles \
    --scenario "$scenario" --report "$report/$name" >"$report/$name.txt" 2>&1
  rc=$?
  cat "$report/$name.txt"
  if [ "$rc" -eq 0 ]; then
    echo "FAIL: the proving suite passed although $what"
    exit 1
  fi
  for pattern in "$@"; do
    grep -q -e "$pattern" "$report/$name.txt" && {
      echo "chaos mutation check: $what fails the verdict (as it must)"
      return 0
    }
  done
  echo "FAIL: the verdict did not name it ($what)"
  exit 1
}

expect_failure chunk relay-drop-chunk short_prompts "every stream lost a chunk" "not equivalent"
expect_failure routing admit-unmeasured-prompt routing_before_admission \
  "admission sent long prompts where they cannot fit" "failed after it started" "routed only after a failed attempt"
expect_failure give-up failover-give-up allocation_failure \
  "failover gave up on requests it could have moved" "failed after it started"
