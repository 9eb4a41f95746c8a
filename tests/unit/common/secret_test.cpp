#include "common/secret.h"

#include <gtest/gtest.h>

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

TEST(SecretTest, SecretEqualsComparesWholeValues) {
  EXPECT_TRUE(SecretEquals("sk-abc", "sk-abc"));
  EXPECT_FALSE(SecretEquals("sk-abd", "sk-abc"));
  EXPECT_FALSE(SecretEquals("sk-ab", "sk-abc"));
  EXPECT_FALSE(SecretEquals("sk-abcd", "sk-abc"));
  EXPECT_FALSE(SecretEquals("", "sk-abc"));
}

}  // namespace
}  // namespace spillway
