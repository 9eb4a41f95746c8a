#include "common/hash.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace spillway {
namespace {

TEST(HashTest, Sha256OfKnownVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(HashTest, FileHashEqualsStringHash) {
  const auto path = std::filesystem::temp_directory_path() / "spillway-hash-test.bin";
  std::string data(3 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131);
  { std::ofstream(path, std::ios::binary) << data; }
  auto h = Sha256File(path.string());
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(*h, Sha256Hex(data));
  std::filesystem::remove(path);
  EXPECT_EQ(Sha256File(path.string()).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace spillway
