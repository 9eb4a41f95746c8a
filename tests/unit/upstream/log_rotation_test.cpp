#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "upstream/log_rotation.h"

namespace spillway::upstream {
namespace {

namespace fs = std::filesystem;

std::string Read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(LogRotationTest, ALargeLogIsCopiedAsideAndTheWriterGoesOnAtItsStart) {
  const fs::path dir = fs::temp_directory_path() / ("spillway-logrot-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string log = (dir / "chat.0.log").string();
  // The worker's descriptor: opened once, appending.
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "0123456789\n", 11), 11);
  EXPECT_TRUE(RotateIfLarger(log, 20).ok());  // small enough: untouched
  EXPECT_EQ(Read(log), "0123456789\n");
  EXPECT_FALSE(fs::exists(log + ".1"));
  ASSERT_EQ(::write(fd, "abcdefghij\n", 11), 11);
  EXPECT_TRUE(RotateIfLarger(log, 20).ok());
  EXPECT_EQ(Read(log + ".1"), "0123456789\nabcdefghij\n");
  EXPECT_EQ(fs::status(log + ".1").permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(fs::file_size(log), 0u);
  ASSERT_EQ(::write(fd, "after\n", 6), 6);
  EXPECT_EQ(Read(log), "after\n") << "the writer goes on at the start, no hole";
  ::close(fd);
  EXPECT_TRUE(RotateIfLarger((dir / "missing.log").string(), 1).ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace spillway::upstream
