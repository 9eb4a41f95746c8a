#include "common/private_files.h"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace spillway {
namespace {

namespace fs = std::filesystem;

unsigned ModeOf(const std::string& p) {
  struct stat st {};
  ::stat(p.c_str(), &st);
  return st.st_mode & 07777;
}

class PrivateFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "spillway-private-XXXXXX").string();
    root_ = mkdtemp(tmpl.data());
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  std::string root_;
};

TEST_F(PrivateFilesTest, CreatesA0700Directory) {
  const std::string d = root_ + "/a/b/state";
  ASSERT_TRUE(EnsurePrivateDir(d).ok());
  EXPECT_EQ(ModeOf(d), 0700u);
  EXPECT_TRUE(EnsurePrivateDir(d).ok());  // and accepts it again
}

TEST_F(PrivateFilesTest, RefusesADirectoryOthersMayWriteAndTightensOneTheyMayRead) {
  const std::string open = root_ + "/open";
  fs::create_directory(open);
  ::chmod(open.c_str(), 0777);
  Status st = EnsurePrivateDir(open);
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied);
  EXPECT_NE(st.message().find("0777"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(open), std::string::npos);
  const std::string readable = root_ + "/readable";
  fs::create_directory(readable);
  ::chmod(readable.c_str(), 0755);
  EXPECT_TRUE(EnsurePrivateDir(readable).ok());
  EXPECT_EQ(ModeOf(readable), 0700u);
  const std::string file = root_ + "/file";
  std::ofstream(file) << "x";
  EXPECT_FALSE(EnsurePrivateDir(file).ok());
}

TEST_F(PrivateFilesTest, WritesAtomicallyWithMode0600AndLeavesNoTemporary) {
  const std::string p = root_ + "/port";
  ASSERT_TRUE(WritePrivateFileAtomically(p, "1234\n").ok());
  std::ifstream f(p);
  std::string s;
  f >> s;
  EXPECT_EQ(s, "1234");
  EXPECT_EQ(ModeOf(p), 0600u);
  ASSERT_TRUE(WritePrivateFileAtomically(p, "5678\n").ok());
  int files = 0;
  for (const auto& e : fs::directory_iterator(root_)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);  // no temporary left behind
  // The old predictable temporary name planted as a link changes nothing.
  fs::create_symlink(root_ + "/elsewhere", p + ".tmp");
  ASSERT_TRUE(WritePrivateFileAtomically(p, "9\n").ok());
  EXPECT_FALSE(fs::exists(root_ + "/elsewhere"));
}

TEST_F(PrivateFilesTest, WritesWithTheModeGivenAndReplacesOnlyWhenAsked) {
  const std::string p = root_ + "/spillway.toml";
  const mode_t old_umask = ::umask(077);
  ASSERT_TRUE(WriteFileAtomically(p, "a\n", 0644, /*replace=*/false).ok());
  ::umask(old_umask);
  EXPECT_EQ(ModeOf(p), 0644u);  // whatever the umask: another user reads it
  const Status again = WriteFileAtomically(p, "b\n", 0644, /*replace=*/false);
  EXPECT_EQ(again.code(), StatusCode::kConflict);
  EXPECT_NE(again.message().find(p), std::string::npos);
  std::ifstream f(p);
  std::string s;
  f >> s;
  EXPECT_EQ(s, "a");
  ASSERT_TRUE(WriteFileAtomically(p, "c\n", 0644, /*replace=*/true).ok());
  std::ifstream g(p);
  g >> s;
  EXPECT_EQ(s, "c");
  int files = 0;
  for (const auto& e : fs::directory_iterator(root_)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);  // no temporary left behind, refused or not
  EXPECT_EQ(WriteFileAtomically(root_ + "/no/such/x", "d", 0644).code(), StatusCode::kUnavailable);
}

// A port or progress file is read only as the regular file it should be:
// a FIFO is refused at once (not waited on for a writer), a symbolic link is
// not followed, and a file longer than asked for is cut.
TEST_F(PrivateFilesTest, ReadsOnlyARegularFileAndNoMoreThanAsked) {
  const std::string p = root_ + "/w.port";
  std::ofstream(p) << "41234\n";
  auto read = ReadPrivateFile(p, 32);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(*read, "41234\n");
  EXPECT_EQ(*ReadPrivateFile(p, 3), "412");
  EXPECT_EQ(ReadPrivateFile(root_ + "/none", 32).status().code(), StatusCode::kNotFound);
  const std::string fifo = root_ + "/f.port";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto from_fifo = ReadPrivateFile(fifo, 32);
  EXPECT_EQ(from_fifo.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(from_fifo.status().message().find(fifo), std::string::npos) << from_fifo.status().message();
  const std::string link = root_ + "/l.port";
  ASSERT_EQ(::symlink(p.c_str(), link.c_str()), 0);
  EXPECT_FALSE(ReadPrivateFile(link, 32).ok());
}

}  // namespace
}  // namespace spillway
