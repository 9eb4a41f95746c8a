#include "common/secret.h"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <set>

namespace spillway {
namespace {

TEST(SecretTest, RandomHexIsHexOfTheRightLengthAndDoesNotRepeat) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string h = RandomHex(12);
    ASSERT_EQ(h.size(), 24u);
    EXPECT_EQ(h.find_first_not_of("0123456789abcdef"), std::string::npos);
    EXPECT_TRUE(seen.insert(h).second);
  }
}

// Draws larger than the per-thread store hands out (32 bytes), appended after what a string holds.
TEST(SecretTest, AppendRandomHexAppendsAnyLength) {
  std::string id = "req_";
  AppendRandomHex(id, 40);
  ASSERT_EQ(id.size(), 4u + 80u);
  EXPECT_EQ(id.rfind("req_", 0), 0u);
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef", 4), std::string::npos);
  EXPECT_NE(id.substr(4 + 64, 16), id.substr(4, 16)) << "its bytes do not repeat";
  EXPECT_EQ(RandomHex(0), "");
  EXPECT_EQ(RandomHex(100).size(), 200u);
}

// Small draws share a per-thread store: a forked child (which inherits it)
// must not hand out the bytes its parent hands out next.
TEST(SecretTest, AForkedChildDoesNotRepeatItsParentsDraws) {
  (void)RandomHex(12);  // the store is filled, and has bytes left
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string h = RandomHex(12);
    _exit(::write(fds[1], h.data(), h.size()) == static_cast<ssize_t>(h.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  const std::string mine = RandomHex(12);
  char buf[24];
  ssize_t got = 0;
  while (got < 24) {
    const ssize_t n = ::read(fds[0], buf + got, sizeof buf - got);
    if (n <= 0) break;
    got += n;
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_EQ(got, 24);
  EXPECT_NE(std::string(buf, 24), mine);
}

TEST(SecretTest, SecretEqualsComparesWholeValues) {
  EXPECT_TRUE(SecretEquals("sk-abc", "sk-abc"));
  EXPECT_FALSE(SecretEquals("sk-abd", "sk-abc"));
  EXPECT_FALSE(SecretEquals("sk-ab", "sk-abc"));
  EXPECT_FALSE(SecretEquals("sk-abcd", "sk-abc"));
  EXPECT_FALSE(SecretEquals("", "sk-abc"));
}

}  // namespace
}  // namespace spillway
