#include "common/json_log.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <thread>

#include "common/thread_name.h"

namespace spillway {

namespace {

std::atomic<bool> g_on{false};
std::thread g_thread;
int g_original[2] = {-1, -1};  // stdout, stderr as they were
int g_read[2] = {-1, -1};      // the pipes' read ends

std::string IsoTime(int64_t ms) {
  const std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  const size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%03dZ", static_cast<int>(ms % 1000));
  return buf;
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void WriteAll(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n <= 0) return;  // nothing sensible to do when the log itself cannot be written
    done += static_cast<size_t>(n);
  }
}

// Reads both pipes until both are closed; each complete line goes out as JSON.
void Pump() {
  NameThisThread("sw-json-log");
  std::string pending[2];
  bool open[2] = {true, true};
  const char* names[2] = {"stdout", "stderr"};
  while (open[0] || open[1]) {
    pollfd fds[2] = {{g_read[0], POLLIN, 0}, {g_read[1], POLLIN, 0}};
    for (int i = 0; i < 2; ++i) {
      if (!open[i]) fds[i].fd = -1;
    }
    if (::poll(fds, 2, -1) < 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (!open[i] || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[8192];
      const ssize_t n = ::read(g_read[i], buf, sizeof buf);
      if (n <= 0) {
        open[i] = false;
        if (!pending[i].empty()) WriteAll(g_original[i], JsonLogLine(pending[i], names[i], NowMs()) + "\n");
        continue;
      }
      pending[i].append(buf, static_cast<size_t>(n));
      size_t nl;
      while ((nl = pending[i].find('\n')) != std::string::npos) {
        const std::string line = pending[i].substr(0, nl);
        pending[i].erase(0, nl + 1);
        if (!line.empty()) WriteAll(g_original[i], JsonLogLine(line, names[i], NowMs()) + "\n");
      }
    }
  }
}

}  // namespace

bool JsonLogs() { return g_on.load(); }

void LogEvent(std::string_view event, const std::string& fields_json, const std::string& text) {
  if (!JsonLogs()) {
    std::fprintf(stderr, "%s\n", text.c_str());
    return;
  }
  nlohmann::json j = nlohmann::json::parse(fields_json, nullptr, false);
  if (!j.is_object()) j = nlohmann::json::object();
  j["event"] = event;
  j["msg"] = text;
  // One write, so that concurrent lines do not interleave in the pipe.
  const std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::fputs(line.c_str(), stderr);
}

std::string JsonLogLine(std::string_view line, std::string_view stream, int64_t time_ms) {
  nlohmann::json j;
  if (!line.empty() && line.front() == '{') j = nlohmann::json::parse(line, nullptr, false);
  if (!j.is_object()) {
    j = {{"stream", stream}, {"msg", line}};
  }
  if (!j.contains("time")) j["time"] = IsoTime(time_ms);
  // "time" first, for people who read the raw lines too.
  nlohmann::ordered_json out = {{"time", j["time"]}};
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() != "time") out[it.key()] = it.value();
  }
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Status StartJsonLogs() {
  if (g_on) return Status::Ok();
  std::fflush(stdout);
  std::fflush(stderr);
  for (int i = 0; i < 2; ++i) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return Status::Internal("--log-format json: cannot make a pipe");
    g_original[i] = ::fcntl(i + 1, F_DUPFD_CLOEXEC, 3);
    if (g_original[i] < 0 || ::dup2(p[1], i + 1) < 0) return Status::Internal("--log-format json: cannot redirect the output");
    ::close(p[1]);
    g_read[i] = p[0];
  }
  // Lines, not blocks: each reaches the pipe as soon as it is printed.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  g_thread = std::thread(Pump);
  g_on = true;
  return Status::Ok();
}

void StopJsonLogs() {
  if (!g_on.exchange(false)) return;
  std::fflush(stdout);
  std::fflush(stderr);
  // Closing the pipes' write ends (by restoring the descriptors) ends the pump.
  for (int i = 0; i < 2; ++i) ::dup2(g_original[i], i + 1);
  g_thread.join();
  for (int i = 0; i < 2; ++i) {
    ::close(g_original[i]);
    ::close(g_read[i]);
  }
}

}  // namespace spillway
