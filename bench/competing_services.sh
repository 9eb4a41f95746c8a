#!/usr/bin/env bash
# The mixed workload of `spillway chaos --scenario competing_services` (a
# pinned chat, batch embeddings, an on-demand interactive service on a device
# too small for all three) under Spillway and under llama-swap's policy
# (swap-all: one service loaded at a time, no priorities, no CPU paths), in
# one run: chat's p95 alone and under batch pressure, total goodput, and the
# ratios Spillway / swap-all. Goal: better on both.
#   bench/competing_services.sh [BUILD_DIR]     (DURATION seconds, SEED override the defaults)
set -euo pipefail
BUILD=${1:-build}
report=$(mktemp -d)
trap 'rm -rf "$report"' EXIT
"$BUILD/bin/spillway" chaos --scenario competing_services --baselines swap --no-profiles --seed "${SEED:-1}" \
  --duration "${DURATION:-40}" --report "$report" --json >"$report/out.json" || true  # the verdict is printed below
python3 - "$report/out.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
rows = [x for x in r["spillway"] + r["baselines"] if x["name"] == "competing_services"]
by = {x["target"]: x["verdict"] for x in rows}
for t, v in by.items():
    print(f"{t:10s} chat p95 alone {v['interactive_p95_alone_ms']:7.0f} ms  under batch {v['interactive_p95_pressure_ms']:7.0f} ms"
          f"  goodput {v['goodput_per_min']:6.1f}/min  success {100 * v['success_rate']:5.1f} %  lost {v['lost']}"
          f"  evictions {v['evictions']}  verdict {'PASS' if v['passed'] else 'FAIL'}")
    for f in v["failures"]:
        print(f"           {f}")
s, w = by.get("spillway"), by.get("swap-all")
if s and w and w["interactive_p95_pressure_ms"] > 0 and w["goodput_per_min"] > 0:
    p95 = s["interactive_p95_pressure_ms"] / w["interactive_p95_pressure_ms"]
    good = s["goodput_per_min"] / w["goodput_per_min"]
    print(f"spillway / swap-all: chat p95 under batch {p95:.2f}x (goal < 1), goodput {good:.2f}x (goal > 1): "
          f"{'better on both' if p95 < 1 and good > 1 else 'NOT better on both'}")
PY
