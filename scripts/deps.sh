#!/usr/bin/env bash
# Installs the Debian packages Spillway builds with, only those missing.
#   scripts/deps.sh          what make build and make test (and bench, pgo, chaos, fuzz) need: the build's,
#                            the tests' and the benchmarks'
#   scripts/deps.sh --app    what make run and make install need: the build's only
set -euo pipefail
PKGS=(build-essential cmake ninja-build git ca-certificates pkg-config ccache
      libboost-dev nlohmann-json3-dev libtomlplusplus-dev libcli11-dev libspdlog-dev libfmt-dev
      libssl-dev libsqlite3-dev zlib1g-dev
      lld)  # links the gateway with its hot functions laid out together (cmake/hot-functions.txt)
TEST_PKGS=(libgtest-dev libgmock-dev libbenchmark-dev
      clang libclang-rt-14-dev  # the fuzz targets (tests/fuzz/run.sh): clang's libFuzzer
      nginx  # bench/gateway_overhead's yardstick proxy: it starts its own nginx, never the system's service
      valgrind  # bench/gateway_instructions counts each proxy's instructions under callgrind
      chromium)  # the dashboard's browser test (tests/browser), headless over the DevTools protocol
case "${1:-}" in
  "") PKGS+=("${TEST_PKGS[@]}") tests=1 ;;
  --app) tests=0 ;;
  *) echo "usage: scripts/deps.sh [--app]" >&2; exit 2 ;;
esac
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm fetches the pinned llama.cpp source package; any npm on PATH will do.
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "[deps] installing: ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The official OpenAI and Ollama clients the client tests run against the gateway (pinned by the lock file).
clients="$(dirname "$0")/../tests/clients"
if [ "$tests" = 1 ] && { [ ! -d "$clients/node_modules/openai" ] || [ ! -d "$clients/node_modules/ollama" ]; }; then
  echo "[deps] installing the openai and ollama npm clients for tests/clients" >&2
  (cd "$clients" && npm ci --no-audit --no-fund --silent)
fi
