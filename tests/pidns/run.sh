#!/usr/bin/env bash
# Runs the tests of what a gateway leaves and finds after a crash (process
# groups, sessions, adoption of a previous gateway's workers and of what an
# external server's wrapper left running) inside a fresh pid namespace with
# its own /proc, as in a container or a CI sandbox whose session leader is
# outside the namespace: there a process's session and group can read as 0
# (getsid, /proc/<pid>/stat), which a check that passes in a login shell
# may rely on without anyone seeing it.
#
#   tests/pidns/run.sh BUILD
#
# Exit 77 (ctest: skipped) where no pid namespace can be made (unshare(1)
# missing, or not permitted to this user).
set -euo pipefail
BUILD=$(realpath "${1:?usage: run.sh BUILD}")
if ! command -v unshare >/dev/null || ! unshare --pid --fork --mount-proc true 2>/dev/null; then
  echo "pidns_test: no pid namespace can be made here (unshare --pid --fork --mount-proc); skipped"
  exit 77
fi
# The namespace's first process is the test binary: when it ends, whatever
# its tests left in the namespace is killed with it.
unshare --pid --fork --mount-proc "$BUILD/tests/upstream_test"
unshare --pid --fork --mount-proc "$BUILD/tests/external_integration_test" \
  --gtest_filter='ExternalTest.AServerSpillwayStartedEndsWithAGatewayKilledWithoutWarning:ExternalTest.WhatAWrapperLeftRunningIsStoppedByTheNextGateway:ExternalTest.AWrappedServersMemoryIsMeasuredWithItsGroup'
unshare --pid --fork --mount-proc "$BUILD/tests/gateway_integration_test" --gtest_filter='WorkerAdoptionTest.*'
