// A GGUF metadata reader that needs no model load and no llama.cpp: header,
// key/value pairs and tensor descriptions, for memory estimates.
//
// Hostile input is expected (a downloaded file, a crafted header): every
// count, length, type and dimension is checked against the bytes actually
// present before anything is allocated, sizes are computed with overflow
// checks, and any violation is a kInvalidArgument naming the offset. Nothing
// is read from the tensor data section.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/status.h"

namespace spillway::gguf {

// ggml tensor types: block size and bytes per block (a table checked against
// ggml's own in the tests).
struct TypeInfo {
  uint32_t id;
  uint32_t block;
  uint32_t bytes;
  const char* name;
};
const TypeInfo* FindType(uint32_t ggml_type);

struct TensorInfo {
  std::string name;
  uint32_t type = 0;
  std::vector<uint64_t> dims;  // ne[0..n)
  uint64_t offset = 0;         // within the data section
  uint64_t bytes = 0;          // from type and dims
  int layer = -1;              // N of "blk.N.", -1 for the rest
};

// A metadata value: scalars, a string, or an array (strings kept only when short).
struct Value {
  enum class Kind { kInt, kUint, kFloat, kBool, kString, kArray } kind = Kind::kInt;
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  bool b = false;
  std::string s;
  uint32_t array_type = 0;
  uint64_t array_len = 0;
  // A numeric array's entries (integers exactly up to 2^53), for arrays of
  // up to 4096 entries and 2^20 entries in the whole file; string arrays,
  // and arrays past those bounds, are not kept (array_len still says how long).
  std::vector<double> numbers;
};

struct Metadata {
  uint32_t version = 0;
  uint64_t file_size = 0;
  uint64_t data_offset = 0;
  uint32_t alignment = 32;
  std::map<std::string, Value> kv;
  std::vector<TensorInfo> tensors;

  std::optional<std::string> String(const std::string& key) const;
  std::optional<uint64_t> Uint(const std::string& key) const;  // any integer type, non-negative
  std::optional<double> Float(const std::string& key) const;
  // The "<architecture>.<suffix>" value, e.g. Arch("block_count").
  std::optional<uint64_t> ArchUint(const std::string& suffix) const;
  std::string architecture() const;
  // An embedding model: <arch>.pooling_type is set and not none (0,
  // LLAMA_POOLING_TYPE_NONE), as the worker decides (worker/model.cpp).
  bool PoolsEmbeddings() const { return ArchUint("pooling_type").value_or(0) != 0; }
  uint64_t TotalTensorBytes() const;
};

struct ReaderLimits {
  uint64_t max_kv = 1 << 16;
  uint64_t max_tensors = 1 << 20;
  uint64_t max_string = 16 << 20;
  uint64_t max_array = 1ull << 28;
};

StatusOr<Metadata> ParseGguf(const uint8_t* data, size_t size, uint64_t file_size, const ReaderLimits& limits = {});
// Reads only the metadata of a file (at most 64 MiB of header), never its
// weights. The first part of a split model (split.count > 1, named
// <prefix>-00001-of-0000N.gguf as llama.cpp names them) brings every part's
// tensors, and their sizes in file_size; a part that is missing or damaged is
// an error naming it.
StatusOr<Metadata> ReadGgufFile(const std::string& path, const ReaderLimits& limits = {});

}  // namespace spillway::gguf
