#include "gguf/gguf_reader.h"

#include <ggml.h>
#include <gguf.h>
#include <sys/stat.h>
#include <unistd.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

namespace spillway::gguf {
namespace {

std::string Models() {
  const char* m = std::getenv("SPILLWAY_MODELS");
  return m ? m : "build/models";
}

std::vector<uint8_t> Header(const std::string& path, size_t* file_size) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  *file_size = static_cast<size_t>(f.tellg());
  f.seekg(0);
  std::vector<uint8_t> all(*file_size);
  f.read(reinterpret_cast<char*>(all.data()), static_cast<std::streamsize>(all.size()));
  return all;
}

TEST(GgufReaderTest, ReadsTheTinyModel) {
  auto m = ReadGgufFile(Models() + "/tiny-chat.gguf");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->version, 3u);
  EXPECT_EQ(m->architecture(), "llama");
  EXPECT_EQ(*m->ArchUint("block_count"), 2u);
  EXPECT_EQ(*m->ArchUint("embedding_length"), 64u);
  EXPECT_EQ(*m->ArchUint("attention.head_count"), 4u);
  EXPECT_EQ(*m->ArchUint("attention.head_count_kv"), 2u);
  EXPECT_EQ(*m->ArchUint("context_length"), 2048u);
  EXPECT_EQ(m->kv.at("tokenizer.ggml.tokens").array_len, 32000u);
  ASSERT_EQ(m->tensors.size(), 21u);  // 2 layers x 9, token_embd, output_norm, untied output
  int layered = 0;
  for (const auto& t : m->tensors) layered += t.layer >= 0;
  EXPECT_EQ(layered, 18);
  // Tensor bytes account for the whole data section (up to alignment padding).
  EXPECT_LE(m->data_offset + m->TotalTensorBytes(), m->file_size);
  EXPECT_GT(m->data_offset + m->TotalTensorBytes() + 20 * 32, m->file_size);
}

// One part of a split model: `names` as small f32 tensors.
void WriteSplitPart(const std::string& path, uint16_t no, uint16_t count, const std::vector<std::string>& names) {
  ggml_init_params ip{size_t{1} << 20, nullptr, /*no_alloc=*/false};
  ggml_context* ctx = ggml_init(ip);
  gguf_context* g = gguf_init_empty();
  gguf_set_val_str(g, "general.architecture", "llama");
  gguf_set_val_u16(g, "split.no", no);
  gguf_set_val_u16(g, "split.count", count);
  for (const auto& name : names) {
    ggml_tensor* t = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 32, 4);
    ggml_set_name(t, name.c_str());
    std::memset(t->data, 0, ggml_nbytes(t));
    gguf_add_tensor(g, t);
  }
  ASSERT_TRUE(gguf_write_to_file(g, path.c_str(), /*only_meta=*/false));
  gguf_free(g);
  ggml_free(ctx);
}

// A split model's first part brings every part's tensors (llama.cpp loads
// them all from it): only its own were counted, and a model split in two was
// estimated at half its weights.
TEST(GgufReaderTest, ASplitModelsFirstPartBringsEveryPartsTensors) {
  const std::string prefix = "/tmp/sw-split-" + std::to_string(::getpid());
  const std::string first = prefix + "-00001-of-00002.gguf", second = prefix + "-00002-of-00002.gguf";
  WriteSplitPart(first, 0, 2, {"token_embd.weight", "blk.0.attn_q.weight"});
  WriteSplitPart(second, 1, 2, {"blk.1.attn_q.weight", "output.weight"});
  auto m = ReadGgufFile(first);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->tensors.size(), 4u);
  EXPECT_EQ(m->TotalTensorBytes(), 4u * 32 * 4 * 4);
  EXPECT_EQ(m->tensors.back().name, "output.weight");
  EXPECT_EQ(m->tensors[2].layer, 1);
  // A part that is not the part its name says (a link to the first, a
  // part of another download) is refused: its tensors were counted too.
  std::remove(second.c_str());
  ASSERT_EQ(::symlink(first.c_str(), second.c_str()), 0);
  auto twice = ReadGgufFile(first);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("says it is part 1 of 2"), std::string::npos) << twice.status().message();
  std::remove(second.c_str());
  auto missing = ReadGgufFile(first);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("part 2 of 2"), std::string::npos) << missing.status().message();
  const std::string renamed = prefix + "-first.gguf";  // not a name the other parts can be found by
  std::rename(first.c_str(), renamed.c_str());
  auto unnamed = ReadGgufFile(renamed);
  ASSERT_FALSE(unnamed.ok());
  EXPECT_NE(unnamed.status().message().find("-00001-of-00002.gguf"), std::string::npos) << unnamed.status().message();
  std::remove(renamed.c_str());
}

// A large file that is not GGUF at all (a safetensors or zip file given by
// mistake) is refused on its first read, for what it is: it was read again
// up to 64 MiB and blamed on a header too long ("bad magic at byte 4 (a
// header may take 64 MiB at most...)").
TEST(GgufReaderTest, ALargeFileThatIsNotGgufIsRefusedForWhatItIs) {
  const std::string path = ::testing::TempDir() + "sw-not-gguf-" + std::to_string(::getpid()) + ".gguf";
  {
    std::ofstream f(path, std::ios::binary);
    f << "PK\x03\x04 not a model";
  }
  std::filesystem::resize_file(path, 100ull << 20);  // (sparse)
  auto m = ReadGgufFile(path);
  std::remove(path.c_str());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message().find("64 MiB"), std::string::npos) << m.status().message();
}

TEST(GgufReaderTest, TypeTableMatchesGgml) {
  for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
    if (ggml_type_size(static_cast<ggml_type>(t)) == 0) continue;
    const TypeInfo* ti = FindType(static_cast<uint32_t>(t));
    ASSERT_NE(ti, nullptr) << ggml_type_name(static_cast<ggml_type>(t));
    EXPECT_EQ(ti->block, static_cast<uint32_t>(ggml_blck_size(static_cast<ggml_type>(t)))) << ti->name;
    EXPECT_EQ(ti->bytes, ggml_type_size(static_cast<ggml_type>(t))) << ti->name;
  }
}

// A path that is no file (a FIFO: its open waited for a writer forever,
// `spillway models` and the gateway's admission with it) is refused at once.
TEST(GgufReaderTest, AFifoIsRefusedWithoutWaiting) {
  const std::string fifo = ::testing::TempDir() + "sw-gguf-fifo-" + std::to_string(::getpid()) + ".gguf";
  std::remove(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto m = ReadGgufFile(fifo);
  std::remove(fifo.c_str());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("is not a regular file"), std::string::npos) << m.status().message();
}

TEST(GgufReaderTest, EveryTruncationIsACleanError) {
  size_t size = 0;
  auto all = Header(Models() + "/tiny-chat.gguf", &size);
  auto full = ParseGguf(all.data(), all.size(), size);
  ASSERT_TRUE(full.ok());
  const size_t header = static_cast<size_t>(full->data_offset);
  for (size_t n = 0; n < header; n += (n < 4096 ? 1 : 97)) {
    auto m = ParseGguf(all.data(), n, size);
    // A prefix that ends exactly after the tensor table (before padding) may parse.
    if (m.ok()) {
      EXPECT_GE(n, header - 32);
    } else {
      EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
    }
  }
  // The header claims tensors beyond a truncated file.
  EXPECT_FALSE(ParseGguf(all.data(), header, header + 100).ok());
}

// Writes a little-endian value into a byte vector.
template <typename T>
void Put(std::vector<uint8_t>& v, T x) {
  const auto* p = reinterpret_cast<const uint8_t*>(&x);
  v.insert(v.end(), p, p + sizeof x);
}
void PutStr(std::vector<uint8_t>& v, const std::string& s) {
  Put<uint64_t>(v, s.size());
  v.insert(v.end(), s.begin(), s.end());
}
std::vector<uint8_t> Start(uint64_t n_tensors, uint64_t n_kv) {
  std::vector<uint8_t> v = {'G', 'G', 'U', 'F'};
  Put<uint32_t>(v, 3);
  Put<uint64_t>(v, n_tensors);
  Put<uint64_t>(v, n_kv);
  return v;
}

// Numeric arrays are kept as numbers (a per-layer head count), 8 bytes
// each and 2^20 of them in a file at most: kept as whole values (112 bytes
// each, with no bound across keys) 64 MiB of small arrays took 7 GiB.
TEST(GgufReaderTest, NumericArraysAreKeptCompactlyAndWithinABound) {
  const uint64_t keys = 300, each = 4096;  // 1.2 M entries: more than are kept
  auto v = Start(0, keys);
  for (uint64_t k = 0; k < keys; ++k) {
    PutStr(v, "k" + std::to_string(k));
    Put<uint32_t>(v, 9);   // array
    Put<uint32_t>(v, 4);   // of u32
    Put<uint64_t>(v, each);
    for (uint64_t i = 0; i < each; ++i) Put<uint32_t>(v, static_cast<uint32_t>(i % 7));
  }
  auto m = ParseGguf(v.data(), v.size(), v.size());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->kv.at("k0").numbers.size(), each);
  EXPECT_EQ(m->kv.at("k0").numbers[8], 1.0);
  uint64_t kept = 0;
  for (const auto& [name, value] : m->kv) {
    EXPECT_EQ(value.array_len, each) << name;
    kept += value.numbers.size();
  }
  EXPECT_LE(kept, uint64_t{1} << 20);
  EXPECT_TRUE(m->kv.at("k299").numbers.empty()) << "past the bound: its length only";
}

// The header is read in growing parts: one longer than the first part
// (a large vocabulary) is read whole, and the weights after it are not.
TEST(GgufReaderTest, AHeaderPastTheFirstReadIsReadWhole) {
  auto v = Start(0, 2);
  PutStr(v, "general.architecture");
  Put<uint32_t>(v, 8);  // string
  PutStr(v, "llama");
  PutStr(v, "big");
  Put<uint32_t>(v, 8);
  PutStr(v, std::string(3 << 20, 'x'));  // 3 MiB: past a 1 MiB first read
  const size_t header = v.size();
  v.resize(header + (8 << 20), 0);  // "weights"
  const std::string path = ::testing::TempDir() + "/big-header.gguf";
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size()));
  }
  auto m = ReadGgufFile(path);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->kv.at("big").s.size(), 3u << 20);
  EXPECT_EQ(m->architecture(), "llama");
  std::remove(path.c_str());
}

TEST(GgufReaderTest, HostileHeadersAreRejectedWithoutAllocating) {
  struct Case {
    std::vector<uint8_t> bytes;
    const char* fragment;
  };
  std::vector<Case> cases;
  cases.push_back({{'G', 'G', 'M', 'L', 3, 0, 0, 0}, "bad magic"});
  {
    auto v = Start(0, 0);
    v[4] = 99;
    cases.push_back({v, "version"});
  }
  cases.push_back({Start(0, ~0ull), "metadata entries exceed"});
  cases.push_back({Start(~0ull >> 1, 0), "tensors exceed"});
  cases.push_back({Start(1000, 0), "tensor table runs past"});
  {
    auto v = Start(0, 1);
    Put<uint64_t>(v, ~0ull);  // key length
    cases.push_back({v, "exceeds the limit"});
  }
  {
    auto v = Start(0, 1);
    PutStr(v, "k");
    Put<uint32_t>(v, 77);
    cases.push_back({v, "unknown value type"});
  }
  {
    auto v = Start(0, 1);
    PutStr(v, "k");
    Put<uint32_t>(v, 9);   // array
    Put<uint32_t>(v, 9);   // of arrays
    Put<uint64_t>(v, 1);
    cases.push_back({v, "nested arrays"});
  }
  {
    auto v = Start(0, 1);
    PutStr(v, "k");
    Put<uint32_t>(v, 9);
    Put<uint32_t>(v, 8);              // of strings
    Put<uint64_t>(v, 1ull << 27);     // far more than the file holds
    cases.push_back({v, "string array runs past"});
  }
  {
    auto v = Start(0, 1);
    PutStr(v, "k");
    Put<uint32_t>(v, 9);
    Put<uint32_t>(v, 10);             // u64
    Put<uint64_t>(v, 1ull << 61);     // n * 8 overflows
    cases.push_back({v, "exceeds the limit"});
  }
  {
    auto v = Start(0, 2);
    PutStr(v, "k");
    Put<uint32_t>(v, 4);
    Put<uint32_t>(v, 1);
    PutStr(v, "k");
    Put<uint32_t>(v, 4);
    Put<uint32_t>(v, 2);
    cases.push_back({v, "duplicate key"});
  }
  {
    auto v = Start(0, 1);
    PutStr(v, "k");
    Put<uint32_t>(v, 7);
    Put<uint8_t>(v, 5);
    cases.push_back({v, "boolean"});
  }
  auto tensor = [](uint32_t n_dims, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
    auto v = Start(1, 0);
    PutStr(v, "blk.0.w");
    Put<uint32_t>(v, n_dims);
    for (auto d : dims) Put<uint64_t>(v, d);
    Put<uint32_t>(v, type);
    Put<uint64_t>(v, offset);
    v.resize(v.size() + 64, 0);
    return v;
  };
  cases.push_back({tensor(5, {1, 1, 1, 1, 1}, 0, 0), "dimensions"});
  cases.push_back({tensor(2, {1ull << 40, 1ull << 40}, 0, 0), "too large"});
  cases.push_back({tensor(1, {0}, 0, 0), "dimension of 0"});
  cases.push_back({tensor(1, {64}, 4, 0), "unknown type"});
  cases.push_back({tensor(1, {33}, 2, 0), "whole blocks"});
  cases.push_back({tensor(1, {64}, 0, 3), "not aligned"});
  cases.push_back({tensor(1, {64}, 0, 1ull << 62), "where the tensors before it end at 0"});
  // Two tensors: the same name twice, or not packed in order (llama.cpp refuses both).
  auto two = [](const char* second_name, uint64_t second_offset) {
    auto v = Start(2, 0);
    for (const auto& [name, offset] : {std::pair<std::string, uint64_t>{"a", 0}, {second_name, second_offset}}) {
      PutStr(v, name);
      Put<uint32_t>(v, 1);
      Put<uint64_t>(v, 8);  // 8 f32: 32 bytes
      Put<uint32_t>(v, 0);
      Put<uint64_t>(v, offset);
    }
    v.resize(v.size() + 128, 0);
    return v;
  };
  cases.push_back({two("a", 32), "appears twice"});
  cases.push_back({two("b", 0), "where the tensors before it end at 32"});
  cases.push_back({tensor(1, {1 << 20}, 0, 0), "beyond the end"});
  for (const auto& c : cases) {
    auto m = ParseGguf(c.bytes.data(), c.bytes.size(), c.bytes.size());
    ASSERT_FALSE(m.ok()) << c.fragment;
    EXPECT_NE(m.status().message().find(c.fragment), std::string::npos) << c.fragment << ": " << m.status().message();
  }
}

// Seeded mutation fuzzing of a real header inside the test suite (the
// libFuzzer target in tests/fuzz/ explores further): flipped bytes, random
// runs and boundary integers never crash or hang the reader.
TEST(GgufReaderTest, MutatedHeadersNeverCrash) {
  size_t size = 0;
  auto all = Header(Models() + "/tiny-chat.gguf", &size);
  auto full = ParseGguf(all.data(), all.size(), size);
  ASSERT_TRUE(full.ok());
  const size_t header = static_cast<size_t>(full->data_offset);
  std::vector<uint8_t> base(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(header));
  std::mt19937_64 rng(12345);
  int rejected = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    auto v = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % v.size();
      switch (rng() % 4) {
        case 0: v[pos] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
        case 1: v[pos] = static_cast<uint8_t>(rng()); break;
        case 2: {
          const uint64_t boundary[] = {0, 1, 0xff, 0xffffffffull, ~0ull, 1ull << 63, 1ull << 32};
          const uint64_t x = boundary[rng() % 7];
          for (size_t k = 0; k < 8 && pos + k < v.size(); ++k) v[pos + k] = static_cast<uint8_t>(x >> (8 * k));
          break;
        }
        default: v.resize(pos); break;
      }
      if (v.empty()) break;
    }
    auto m = ParseGguf(v.data(), v.size(), size);
    rejected += !m.ok();
  }
  EXPECT_GT(rejected, 1000);
}

}  // namespace
}  // namespace spillway::gguf
