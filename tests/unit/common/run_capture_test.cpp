#include "common/run_capture.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <string>

namespace spillway {
namespace {

using Clock = std::chrono::steady_clock;

StatusOr<Captured> Sh(const std::string& script, const RunOptions& options = {}) {
  return RunCapture({"/bin/sh", "-c", script}, options);
}

TEST(RunCaptureTest, StdoutAndTheEndOfStderr) {
  auto r = Sh("echo out; i=0; while [ $i -lt 2000 ]; do echo 'a line of about fifty bytes for the log, no more' >&2; "
              "i=$((i+1)); done; echo END >&2; exit 3");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->out, "out\n");
  EXPECT_EQ(r->exit_code, 3);
  EXPECT_LE(r->err.size(), 64u << 10);
  EXPECT_GT(r->err.size(), 60u << 10);
  EXPECT_EQ(r->err.substr(r->err.size() - 4), "END\n");
}

// A program that hangs is killed at its deadline, whether it keeps its
// stdout open or closed it.
TEST(RunCaptureTest, AProgramPastItsDeadlineIsKilled) {
  RunOptions o;
  o.timeout_ms = 300;
  for (const char* script : {"sleep 30", "exec >&-; sleep 30"}) {
    const auto t0 = Clock::now();
    auto r = Sh(script, o);
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
    ASSERT_FALSE(r.ok()) << script;
    EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().ToString();
    EXPECT_NE(r.status().message().find("0.3 s"), std::string::npos) << r.status().message();
    EXPECT_LT(took, 5000) << script;
  }
  // Within its deadline: its answer.
  o.timeout_ms = 10000;
  auto quick = Sh("echo fine", o);
  ASSERT_TRUE(quick.ok());
  EXPECT_EQ(quick->out, "fine\n");
}

TEST(RunCaptureTest, EndlessOutputIsCut) {
  RunOptions o;
  o.max_out = 1 << 20;
  auto r = Sh("yes", o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
}

// The caller's descriptors (a gateway's sockets and journal) and its secrets
// do not reach the program.
TEST(RunCaptureTest, TheProgramGetsNoDescriptorOrSecretOfTheCaller) {
  const int fd = ::open("/dev/null", O_RDONLY);  // (no O_CLOEXEC)
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::dup2(fd, 77), 77);
  ::setenv("SPILLWAY_API_KEYS", "a-secret-key", 1);
  RunOptions o;
  o.env = HelperEnvironment();
  auto r = Sh("ls /proc/self/fd; echo; env", o);
  ::close(77);
  ::close(fd);
  ::unsetenv("SPILLWAY_API_KEYS");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->out.find("\n77\n"), std::string::npos) << r->out;
  EXPECT_EQ(r->out.find("a-secret-key"), std::string::npos) << r->out;
  EXPECT_NE(r->out.find("PATH="), std::string::npos) << r->out;
  // Not found: said so.
  auto missing = RunCapture({"/nonexistent/program"});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace spillway
