// CRC-32C: the published check values, and the CPU's instruction against the
// table's way on every length and alignment a record may have.
#include "common/crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace spillway {
namespace {

uint32_t Of(const std::string& s) { return Crc32c(s.data(), s.size()); }

// RFC 3720 (iSCSI), appendix B.4, and the catalogue's check value.
TEST(Crc32cTest, GivesThePublishedValues) {
  EXPECT_EQ(Of("123456789"), 0xE3069283u);
  EXPECT_EQ(Of(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Of(std::string(32, '\xff')), 0x62A8AB43u);
  std::string up, down;
  for (int i = 0; i < 32; ++i) {
    up.push_back(static_cast<char>(i));
    down.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(Of(up), 0x46DD794Eu);
  EXPECT_EQ(Of(down), 0x113FDB5Cu);
  EXPECT_EQ(Of(""), 0u);
  for (const std::string s : {"123456789", "a", ""}) {
    EXPECT_EQ(internal::Crc32cPortable(0, s.data(), s.size()), Of(s)) << s;
  }
}

TEST(Crc32cTest, TheInstructionAndTheTableAgreeOnEveryLengthAndAlignment) {
  std::mt19937 rng(7);
  std::vector<unsigned char> buf(4096 + 16);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (size_t offset = 0; offset < 16; ++offset) {
    for (size_t n : {0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 63, 64, 65, 255, 1000, 4096}) {
      EXPECT_EQ(Crc32cExtend(0, buf.data() + offset, n), internal::Crc32cPortable(0, buf.data() + offset, n))
          << "offset " << offset << " length " << n;
    }
  }
}

TEST(Crc32cTest, ComputedInPiecesItIsTheWholesChecksum) {
  const std::string s = "a record's payload, then its generation, checksummed in two steps";
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    const uint32_t first = Crc32c(s.data(), cut);
    EXPECT_EQ(Crc32cExtend(first, s.data() + cut, s.size() - cut), Of(s)) << cut;
    EXPECT_EQ(internal::Crc32cPortable(internal::Crc32cPortable(0, s.data(), cut), s.data() + cut, s.size() - cut),
              Of(s));
  }
}

TEST(Crc32cTest, SaysWhetherTheCpuComputesIt) {
#if defined(__x86_64__)
  EXPECT_EQ(internal::Crc32cHardware(), __builtin_cpu_supports("sse4.2") != 0);
#else
  EXPECT_FALSE(internal::Crc32cHardware());
#endif
}

}  // namespace
}  // namespace spillway
