#!/bin/sh
# The short form of the proving suite, for `make test`: every scenario for a
# few seconds (`spillway chaos`; competing_services for 30 s, against
# llama-swap's policy), then the baselines and the placement profiles on one
# scenario; last, a harness killed with -9 must leave no process behind.
# Fails if any scenario fails or the report is not complete. Usage: short.sh BIN_DIR REPORT_DIR
set -eu
bin=$1
report=$2
rm -rf "$report"
"$bin/spillway" chaos --seed 1 --duration 4 --baselines swap --no-profiles --report "$report/scenarios"
"$bin/spillway" chaos --seed 1 --duration 5 --scenario driver_reset --report "$report/baselines"
for f in scenarios/summary.md scenarios/report.json baselines/summary.md baselines/report.json; do
  test -s "$report/$f" || { echo "missing $report/$f"; exit 1; }
done
for s in short_prompts driver_reset gateway_restart agent_tool_calls; do
  for kind in latency memory queue; do
    grep -q "</svg>" "$report/scenarios/$s-$kind.svg" || { echo "missing plot $s-$kind.svg"; exit 1; }
  done
  test -s "$report/scenarios/$s.json" || { echo "missing records $s.json"; exit 1; }
done
grep -q "Device memory by service (stacked)" "$report/scenarios/competing_services-memory.svg" ||
  { echo "no stacked memory chart for competing_services"; exit 1; }
grep -q "| competing_services *| swap-all" "$report/scenarios/summary.md" || { echo "no swap-all baseline in the report"; exit 1; }
# swap-all swaps when another service is asked for, about once a second here; two loads undoing each other made
# hundreds of swaps in a run (each service that loads serves what waits for it first).
swaps=$(awk -F'|' '/^\| competing_services *\| swap-all/ && $10 ~ /\(/ { split($10, e, " "); print e[1] }' "$report/scenarios/summary.md")
[ "${swaps:-0}" -gt 0 ] && [ "$swaps" -lt 150 ] || { echo "swap-all made ${swaps:-no} swaps in 30 s: thrashing?"; exit 1; }
grep -q "plain-proxy" "$report/baselines/summary.md" || { echo "no plain-proxy baseline in the report"; exit 1; }
grep -q "llama-server" "$report/baselines/summary.md" || { echo "no llama-server baseline in the report"; exit 1; }
grep -q "| resident" "$report/baselines/summary.md" || { echo "no placement profiles in the report"; exit 1; }
# A harness killed with -9 (or Ctrl-C) takes its gateway, and through it the workers, with it.
work="$report/killed-work"
"$bin/spillway" chaos --seed 1 --duration 30 --scenario short_prompts --baselines none --no-profiles \
  --work-dir "$work" --report "$report/killed" >"$report/killed.log" 2>&1 &
harness=$!
port_file() { ls "$work"/spillway-chaos-*/spillway-short_prompts/port 2>/dev/null | head -1; }  # (its scratch directory)
for _ in $(seq 1 300); do [ -s "$(port_file)" ] && break; sleep 0.1; done
test -s "$(port_file)" || { echo "the killed harness's gateway never started"; kill -9 $harness; exit 1; }
kill -9 $harness
wait $harness 2>/dev/null || true
for _ in $(seq 1 100); do pgrep -f "$work" >/dev/null || break; sleep 0.1; done
if pgrep -af "$work"; then echo "processes outlived the killed harness (above)"; pkill -9 -f "$work"; exit 1; fi
echo "chaos short form: every scenario passed; report in $report"
