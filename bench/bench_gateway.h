// What the gateway benchmarks share: a real `spillway serve` started with a
// generated config on port 0 (as tests/integration/gateway_process does for
// the tests, without the test helpers), the port of one of its workers, and
// percentiles.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace spillway::bench {

using Clock = std::chrono::steady_clock;

double Pct(std::vector<double> v, double p);  // p in [0, 1]; 0 for no samples
double Us(Clock::time_point a, Clock::time_point b);

struct GatewayRun {
  pid_t pid = -1;
  uint16_t port = 0;  // 0: it did not become ready (its log says why)
  std::string dir;    // config, port file, log and state directory
};

// `args` run under setpriv --pdeathsig TERM (same pid, exec'ed), so that a
// benchmark that is killed or cut off (`| head`) leaves no gateway or nginx
// running to skew the next measurement; `args` as they are without setpriv.
std::vector<std::string> DiesWithBench(std::vector<std::string> args);

// A config of one chat service of `model` on the CPU, one slot (the worker
// does nothing but the benchmark's requests), the journal at FULL or NORMAL.
std::string OneChatOnCpu(const std::string& model, bool full_journal);

// Starts `<bin_dir>/spillway serve` with `config_toml` in a fresh temporary
// directory named after `tag`, and waits for /readyz (every worker loaded).
// The workers take $SPILLWAY_WORKER_SECRET from this process's environment.
// `wrap`: a command the gateway runs under (valgrind), its workers not.
GatewayRun StartGateway(const std::string& bin_dir, const std::string& config_toml, const std::string& tag,
                        std::chrono::seconds timeout = std::chrono::seconds(120),
                        const std::vector<std::string>& wrap = {});
// SIGTERM (the gateway stops its workers), waited for; SIGKILL after 30 s.
// Removes the directory unless `keep_dir`.
void StopGateway(GatewayRun& g, bool keep_dir = false);

// The port of the first placement of `service`, from /v1/status; 0 if none.
uint16_t WorkerPort(uint16_t gateway_port, const std::string& service);

// CPU time the process `pid` has run, all its threads together, and with
// `children` those of its direct children too (nginx's worker under its
// master), in nanoseconds (schedstat: finer than the clock ticks of /proc/PID/stat).
double CpuNs(pid_t pid, bool children = false);

// The bare Asio proxy (bare_proxy.cpp, beside the running benchmark) in
// front of `worker`, under `wrap` if any: its pid and port, or {-1, 0} when
// it cannot start.
std::pair<pid_t, uint16_t> StartBareProxy(uint16_t worker, const std::vector<std::string>& wrap = {});

// A TCP port on 127.0.0.1 that was free a moment ago (for servers that cannot take port 0).
uint16_t FreePort();

}  // namespace spillway::bench
