#include "common/proc_file.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace spillway {
namespace {

// A child that waits to be killed; the caller reaps it.
pid_t SleepingChild() {
  const pid_t pid = fork();
  if (pid == 0) {
    pause();
    _exit(0);
  }
  return pid;
}

TEST(ProcFileTest, ReadsAFileWhole) {
  const auto path = std::filesystem::temp_directory_path() / ("spillway-proc-file-" + std::to_string(getpid()));
  const std::string text(10000, 'x');  // more than one read's buffer
  std::ofstream(path) << text;
  EXPECT_EQ(ReadSmallFile(path.string()), text);
  std::filesystem::remove(path);
  EXPECT_EQ(ReadSmallFile(path.string()), std::nullopt);
}

// The chaos harness died of this in CI: /proc/<pid>/stat opened while the
// process lived, read after it was reaped, fails with ESRCH, and
// std::istreambuf_iterator turned that into an exception no one caught.
TEST(ProcFileTest, AProcFileWhoseProcessWasReapedReadsAsAbsent) {
  const pid_t pid = SleepingChild();
  ASSERT_GT(pid, 0);
  const int fd = ::open(("/proc/" + std::to_string(pid) + "/stat").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  EXPECT_EQ(ReadAll(fd), std::nullopt);
  ::close(fd);
}

}  // namespace
}  // namespace spillway
