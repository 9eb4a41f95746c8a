#include "gguf/gguf_reader.h"

#include <algorithm>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string_view>

namespace spillway::gguf {

namespace {

constexpr TypeInfo kTypes[] = {
    {0, 1, 4, "f32"},        {1, 1, 2, "f16"},         {2, 32, 18, "q4_0"},      {3, 32, 20, "q4_1"},
    {6, 32, 22, "q5_0"},     {7, 32, 24, "q5_1"},      {8, 32, 34, "q8_0"},      {9, 32, 36, "q8_1"},
    {10, 256, 84, "q2_K"},   {11, 256, 110, "q3_K"},   {12, 256, 144, "q4_K"},   {13, 256, 176, "q5_K"},
    {14, 256, 210, "q6_K"},  {15, 256, 292, "q8_K"},   {16, 256, 66, "iq2_xxs"}, {17, 256, 74, "iq2_xs"},
    {18, 256, 98, "iq3_xxs"}, {19, 256, 50, "iq1_s"},  {20, 32, 18, "iq4_nl"},   {21, 256, 110, "iq3_s"},
    {22, 256, 82, "iq2_s"},  {23, 256, 136, "iq4_xs"}, {24, 1, 1, "i8"},         {25, 1, 2, "i16"},
    {26, 1, 4, "i32"},       {27, 1, 8, "i64"},        {28, 1, 8, "f64"},        {29, 256, 56, "iq1_m"},
    {30, 1, 2, "bf16"},      {34, 256, 54, "tq1_0"},   {35, 256, 66, "tq2_0"},   {39, 32, 17, "mxfp4"},
    {40, 64, 36, "nvfp4"},   {41, 128, 18, "q1_0"},    {42, 64, 18, "q2_0"},
};

enum GgufType : uint32_t { kU8, kI8, kU16, kI16, kU32, kI32, kF32, kBool, kString, kArray, kU64, kI64, kF64, kCount };

bool MulOverflow(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

// Status::reason of a parse that ran out of the bytes it was given.
constexpr char kShort[] = "gguf_short";

class Cursor {
 public:
  Cursor(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  size_t pos() const { return pos_; }
  size_t left() const { return n_ - pos_; }

  Status Fail(const std::string& what) const {
    return Status::InvalidArgument("GGUF: " + what + " at byte " + std::to_string(pos_));
  }
  // Past the bytes given: a file read in part may have more (kShort).
  Status Short(const std::string& what) const {
    Status st = Fail(what);
    st.WithReason(kShort);
    return st;
  }
  template <typename T>
  Status Read(T* out) {
    if (left() < sizeof(T)) return Short("truncated file");
    std::memcpy(out, d_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }
  Status ReadString(std::string* out, uint64_t max) {
    uint64_t len = 0;
    SPILLWAY_RETURN_IF_ERROR(Read(&len));
    if (len > max) return Fail("string of " + std::to_string(len) + " bytes exceeds the limit");
    if (len > left()) return Short("string runs past the end of the file");
    out->assign(reinterpret_cast<const char*>(d_ + pos_), len);
    pos_ += len;
    return Status::Ok();
  }
  // Numeric array entries kept so far in the file (Value::numbers).
  uint64_t kept_numbers = 0;
  Status Skip(uint64_t n) {
    if (n > left()) return Short("value runs past the end of the file");
    pos_ += n;
    return Status::Ok();
  }

 private:
  const uint8_t* d_;
  size_t n_;
  size_t pos_ = 0;
};

uint64_t ScalarSize(uint32_t t) {
  switch (t) {
    case kU8: case kI8: case kBool: return 1;
    case kU16: case kI16: return 2;
    case kU32: case kI32: case kF32: return 4;
    case kU64: case kI64: case kF64: return 8;
    default: return 0;
  }
}

Status ReadScalar(Cursor& c, uint32_t t, Value* v) {
  switch (t) {
    case kU8: { uint8_t x = 0; SPILLWAY_RETURN_IF_ERROR(c.Read(&x)); v->kind = Value::Kind::kUint; v->u = x; break; }
    case kI8: { int8_t x = 0; SPILLWAY_RETURN_IF_ERROR(c.Read(&x)); v->kind = Value::Kind::kInt; v->i = x; break; }
    case kU16: { uint16_t x = 0; SPILLWAY_RETURN_IF_ERROR(c.Read(&x)); v->kind = Value::Kind::kUint; v->u = x; break; }
    case kI16: { int16_t x = 0; SPILLWAY_RETURN_IF_ERROR(c.Read(&x)); v->kind = Value::Kind::kInt; v->i = x; break; }
    case kU32: { uint32_t x = 0; SPILLWAY_RETURN_IF_ERROR(c.Read(&x)); v->kind = Value::Kind::kUint; v->u = x; break; }
    case kI32: { int32_t x = 0; SPILLWAY_RETURN_IF_ERROR(c.Read(&x)); v->kind = Value::Kind::kInt; v->i = x; break; }
    case kU64: { uint64_t x = 0; SPILLWAY_RETURN_IF_ERROR(c.Read(&x)); v->kind = Value::Kind::kUint; v->u = x; break; }
    case kI64: { int64_t x = 0; SPILLWAY_RETURN_IF_ERROR(c.Read(&x)); v->kind = Value::Kind::kInt; v->i = x; break; }
    case kF32: { float x = 0; SPILLWAY_RETURN_IF_ERROR(c.Read(&x)); v->kind = Value::Kind::kFloat; v->f = x; break; }
    case kF64: { double x = 0; SPILLWAY_RETURN_IF_ERROR(c.Read(&x)); v->kind = Value::Kind::kFloat; v->f = x; break; }
    case kBool: {
      uint8_t x = 0;
      SPILLWAY_RETURN_IF_ERROR(c.Read(&x));
      if (x > 1) return c.Fail("boolean value " + std::to_string(x));
      v->kind = Value::Kind::kBool;
      v->b = x != 0;
      break;
    }
    default: return c.Fail("unknown value type " + std::to_string(t));
  }
  return Status::Ok();
}

Status ReadValue(Cursor& c, uint32_t t, const ReaderLimits& lim, Value* v) {
  if (t == kString) {
    v->kind = Value::Kind::kString;
    return c.ReadString(&v->s, lim.max_string);
  }
  if (t != kArray) return ReadScalar(c, t, v);
  uint32_t et = 0;
  uint64_t n = 0;
  SPILLWAY_RETURN_IF_ERROR(c.Read(&et));
  SPILLWAY_RETURN_IF_ERROR(c.Read(&n));
  if (et == kArray) return c.Fail("nested arrays are not supported");
  if (et >= kCount) return c.Fail("unknown array element type " + std::to_string(et));
  if (n > lim.max_array) return c.Fail("array of " + std::to_string(n) + " elements exceeds the limit");
  v->kind = Value::Kind::kArray;
  v->array_type = et;
  v->array_len = n;
  if (et == kString) {
    // Each string needs at least its 8-byte length: reject impossible counts before looping.
    uint64_t min_bytes = 0;
    if (MulOverflow(n, 8, &min_bytes) || min_bytes > c.left()) return c.Short("string array runs past the end");
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t len = 0;
      SPILLWAY_RETURN_IF_ERROR(c.Read(&len));
      if (len > lim.max_string) return c.Fail("string of " + std::to_string(len) + " bytes exceeds the limit");
      SPILLWAY_RETURN_IF_ERROR(c.Skip(len));
    }
    return Status::Ok();
  }
  const uint64_t es = ScalarSize(et);
  uint64_t total = 0;
  if (MulOverflow(n, es, &total) || total > c.left()) return c.Short("array runs past the end of the file");
  if (n <= 4096 && c.kept_numbers + n <= (1u << 20)) {  // (each 8 bytes: 8 MiB at most, however many keys)
    c.kept_numbers += n;
    v->numbers.reserve(n);
    for (uint64_t i = 0; i < n; ++i) {
      Value x;
      SPILLWAY_RETURN_IF_ERROR(ReadScalar(c, et, &x));
      v->numbers.push_back(x.kind == Value::Kind::kUint  ? static_cast<double>(x.u)
                           : x.kind == Value::Kind::kInt ? static_cast<double>(x.i)
                           : x.kind == Value::Kind::kBool ? (x.b ? 1.0 : 0.0)
                                                          : x.f);
    }
    return Status::Ok();
  }
  return c.Skip(total);
}

int LayerOf(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  size_t i = 4;
  int n = 0;
  if (i >= name.size() || name[i] < '0' || name[i] > '9') return -1;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9' && n < 100000) n = n * 10 + (name[i++] - '0');
  return i < name.size() && name[i] == '.' ? n : -1;
}

}  // namespace

const TypeInfo* FindType(uint32_t t) {
  for (const auto& ti : kTypes) {
    if (ti.id == t) return &ti;
  }
  return nullptr;
}

std::optional<std::string> Metadata::String(const std::string& key) const {
  auto it = kv.find(key);
  if (it == kv.end() || it->second.kind != Value::Kind::kString) return std::nullopt;
  return it->second.s;
}

std::optional<uint64_t> Metadata::Uint(const std::string& key) const {
  auto it = kv.find(key);
  if (it == kv.end()) return std::nullopt;
  if (it->second.kind == Value::Kind::kUint) return it->second.u;
  if (it->second.kind == Value::Kind::kInt && it->second.i >= 0) return static_cast<uint64_t>(it->second.i);
  return std::nullopt;
}

std::optional<double> Metadata::Float(const std::string& key) const {
  auto it = kv.find(key);
  if (it == kv.end()) return std::nullopt;
  if (it->second.kind == Value::Kind::kFloat) return it->second.f;
  if (auto u = Uint(key)) return static_cast<double>(*u);
  return std::nullopt;
}

std::string Metadata::architecture() const { return String("general.architecture").value_or(""); }

std::optional<uint64_t> Metadata::ArchUint(const std::string& suffix) const {
  return Uint(architecture() + "." + suffix);
}

uint64_t Metadata::TotalTensorBytes() const {
  uint64_t total = 0;
  for (const auto& t : tensors) total += t.bytes;
  return total;
}

StatusOr<Metadata> ParseGguf(const uint8_t* data, size_t size, uint64_t file_size, const ReaderLimits& lim) {
  Cursor c(data, size);
  Metadata m;
  m.file_size = file_size;
  char magic[4] = {};
  SPILLWAY_RETURN_IF_ERROR(c.Read(&magic));
  if (std::memcmp(magic, "GGUF", 4) != 0) return c.Fail("not a GGUF file (bad magic)");
  SPILLWAY_RETURN_IF_ERROR(c.Read(&m.version));
  if (m.version != 2 && m.version != 3) return c.Fail("unsupported GGUF version " + std::to_string(m.version));
  uint64_t n_tensors = 0, n_kv = 0;
  SPILLWAY_RETURN_IF_ERROR(c.Read(&n_tensors));
  SPILLWAY_RETURN_IF_ERROR(c.Read(&n_kv));
  if (n_kv > lim.max_kv) return c.Fail(std::to_string(n_kv) + " metadata entries exceed the limit");
  if (n_tensors > lim.max_tensors) return c.Fail(std::to_string(n_tensors) + " tensors exceed the limit");
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key;
    SPILLWAY_RETURN_IF_ERROR(c.ReadString(&key, 65536));
    uint32_t t = 0;
    SPILLWAY_RETURN_IF_ERROR(c.Read(&t));
    if (t >= kCount) return c.Fail("unknown value type " + std::to_string(t) + " for '" + key + "'");
    Value v;
    SPILLWAY_RETURN_IF_ERROR(ReadValue(c, t, lim, &v));
    if (!m.kv.emplace(key, std::move(v)).second) return c.Fail("duplicate key '" + key + "'");
  }
  if (auto a = m.Uint("general.alignment")) {
    if (*a == 0 || *a > (1u << 16) || (*a & (*a - 1))) {
      return c.Fail("alignment " + std::to_string(*a) + " is not a power of two of at most 65536");
    }
    m.alignment = static_cast<uint32_t>(*a);
  }
  // Each tensor description takes at least 8 (name) + 4 (dims) + 4 (type) + 8 (offset) bytes.
  uint64_t min_bytes = 0;
  if (MulOverflow(n_tensors, 24, &min_bytes) || min_bytes > c.left()) return c.Short("tensor table runs past the end");
  m.tensors.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    SPILLWAY_RETURN_IF_ERROR(c.ReadString(&t.name, 1024));
    uint32_t n_dims = 0;
    SPILLWAY_RETURN_IF_ERROR(c.Read(&n_dims));
    if (n_dims == 0 || n_dims > 4) return c.Fail("tensor '" + t.name + "' has " + std::to_string(n_dims) + " dimensions");
    uint64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t ne = 0;
      SPILLWAY_RETURN_IF_ERROR(c.Read(&ne));
      if (ne == 0 || ne > (1ull << 40)) return c.Fail("tensor '" + t.name + "' has a dimension of " + std::to_string(ne));
      if (MulOverflow(elements, ne, &elements)) return c.Fail("tensor '" + t.name + "' is too large");
      t.dims.push_back(ne);
    }
    SPILLWAY_RETURN_IF_ERROR(c.Read(&t.type));
    const TypeInfo* ti = FindType(t.type);
    if (!ti) return c.Fail("tensor '" + t.name + "' has unknown type " + std::to_string(t.type));
    if (t.dims[0] % ti->block != 0) return c.Fail("tensor '" + t.name + "' rows are not whole blocks of " + ti->name);
    if (MulOverflow(elements / ti->block, ti->bytes, &t.bytes)) return c.Fail("tensor '" + t.name + "' is too large");
    SPILLWAY_RETURN_IF_ERROR(c.Read(&t.offset));
    if (t.offset % m.alignment) return c.Fail("tensor '" + t.name + "' is not aligned");
    t.layer = LayerOf(t.name);
    m.tensors.push_back(std::move(t));
  }
  m.data_offset = (c.pos() + m.alignment - 1) / m.alignment * m.alignment;
  // As llama.cpp's reader (gguf.cpp) requires: each name once, and the
  // tensors packed in order, each at the padded end of the one before (a
  // file of 1000 tensors all at offset 0 passed for 10 GB of weights).
  std::set<std::string_view> names;
  uint64_t expected = 0;
  for (const auto& t : m.tensors) {
    if (!names.insert(t.name).second) return Status::InvalidArgument("GGUF: tensor '" + t.name + "' appears twice");
    if (t.offset != expected) {
      return Status::InvalidArgument("GGUF: tensor '" + t.name + "' is at offset " + std::to_string(t.offset) +
                                     " of the data, where the tensors before it end at " + std::to_string(expected));
    }
    const uint64_t padded = (t.bytes + m.alignment - 1) / m.alignment * m.alignment;
    if (padded < t.bytes || __builtin_add_overflow(expected, padded, &expected)) {
      return Status::InvalidArgument("GGUF: tensor '" + t.name + "' is too large");
    }
  }
  for (const auto& t : m.tensors) {
    uint64_t end = 0;
    if (__builtin_add_overflow(m.data_offset, t.offset, &end) || __builtin_add_overflow(end, t.bytes, &end) ||
        end > file_size) {
      return Status::InvalidArgument("GGUF: tensor '" + t.name + "' lies beyond the end of the file (" +
                                     std::to_string(file_size) + " bytes)");
    }
  }
  return m;
}

namespace {

StatusOr<Metadata> ReadOneGgufFile(const std::string& path, const ReaderLimits& limits) {
  // (A FIFO's open waited for a writer forever: the gateway's admission
  // too, for a split model's later part.)
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec)) {
    return Status::InvalidArgument(path + " is not a regular file");
  }
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) return Status::NotFound("cannot open " + path);
  const uint64_t size = static_cast<uint64_t>(f.tellg());
  // The header is read in growing parts, 1 MiB first (a model's header is
  // its vocabulary: a few MiB at most), up to 64 MiB: reading 64 MiB of
  // weights for every look at a model (each start, each /api/show) cost
  // tens of milliseconds and the page cache's room.
  constexpr uint64_t kMaxHeader = 64ull << 20;
  std::vector<uint8_t> buf;
  for (uint64_t want = std::min<uint64_t>(size, 1 << 20);; want = std::min<uint64_t>({size, want * 4, kMaxHeader})) {
    const uint64_t had = buf.size();
    buf.resize(want);
    f.clear();
    f.seekg(static_cast<std::streamoff>(had));
    if (!f.read(reinterpret_cast<char*>(buf.data() + had), static_cast<std::streamsize>(want - had))) {
      return Status::Unavailable("cannot read " + path);
    }
    auto m = ParseGguf(buf.data(), buf.size(), size, limits);
    if (m.ok()) return m;
    // Only a parse that ran out of what was read reads more: its header may
    // go on past it. Any other error (not GGUF at all, a safetensors file
    // given by mistake) stands at once, and is not blamed on the header's size.
    const bool short_read = m.status().reason() == kShort;
    if (short_read && want < std::min(size, kMaxHeader)) continue;
    std::string why = path + ": " + m.status().message();
    if (short_read && want < size) why += " (a header may take 64 MiB at most; this one runs past it, or is damaged)";
    return Status::InvalidArgument(why);
  }
}

// llama.cpp's name for part `no` (0-based) of `count` (llama_split_path).
std::string SplitSuffix(uint64_t no, uint64_t count) {
  char text[48];
  std::snprintf(text, sizeof text, "-%05llu-of-%05llu.gguf", static_cast<unsigned long long>(no + 1),
                static_cast<unsigned long long>(count));
  return text;
}

}  // namespace

StatusOr<Metadata> ReadGgufFile(const std::string& path, const ReaderLimits& limits) {
  auto first = ReadOneGgufFile(path, limits);
  if (!first.ok()) return first;
  // A split model's first part (llama.cpp loads every part from it): the
  // other parts' tensors count too. Only the first part's were counted, and
  // a 75 GB model split in two was admitted as 38 GB.
  const uint64_t count = first->Uint("split.count").value_or(1);
  if (count <= 1 || first->Uint("split.no").value_or(0) != 0) return first;
  constexpr uint64_t kMaxParts = 9999;
  if (count > kMaxParts) {
    return Status::InvalidArgument(path + ": split.count " + std::to_string(count) + " is more than " +
                                   std::to_string(kMaxParts) + " parts");
  }
  const std::string own = SplitSuffix(0, count);
  if (path.size() <= own.size() || path.compare(path.size() - own.size(), own.size(), own) != 0) {
    return Status::InvalidArgument(path + " is the first of " + std::to_string(count) +
                                   " parts of a split model but is not named <prefix>" + own +
                                   " (the name llama.cpp finds the other parts by)");
  }
  const std::string prefix = path.substr(0, path.size() - own.size());
  for (uint64_t no = 1; no < count; ++no) {
    const std::string part_path = prefix + SplitSuffix(no, count);
    auto part = ReadOneGgufFile(part_path, limits);
    if (!part.ok()) {
      return Status(part.status().code(), "part " + std::to_string(no + 1) + " of " + std::to_string(count) +
                                              " of split model " + path + ": " + part.status().message());
    }
    // Each part says which it is: a copy of (or a link to) the first, or a
    // part of another download, counted its tensors twice or wrongly, and
    // llama.cpp's loader refuses it.
    const auto part_no = part->Uint("split.no");
    const uint64_t part_count = part->Uint("split.count").value_or(1);
    if (part_no.value_or(~0ull) != no || part_count != count) {
      return Status::InvalidArgument("part " + std::to_string(no + 1) + " of " + std::to_string(count) +
                                     " of split model " + path + ": " + part_path + " says it is " +
                                     (part_no ? "part " + std::to_string(*part_no + 1) : std::string("no part")) +
                                     " of " + std::to_string(part_count));
    }
    if (first->tensors.size() + part->tensors.size() > limits.max_tensors) {
      return Status::InvalidArgument(path + ": its parts hold more than " + std::to_string(limits.max_tensors) + " tensors");
    }
    for (auto& t : part->tensors) first->tensors.push_back(std::move(t));
    first->file_size += part->file_size;
  }
  return first;
}

}  // namespace spillway::gguf
