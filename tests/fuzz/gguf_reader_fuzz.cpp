// libFuzzer target for the GGUF metadata reader:
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Isrc \
//     tests/fuzz/gguf_reader_fuzz.cpp src/gguf/gguf_reader.cpp src/common/status.cpp -o gguf_fuzz
//   ./gguf_fuzz -max_total_time=60 build/models/   (seed corpus: the generated models' headers)
#include <cstddef>
#include <cstdint>

#include "gguf/gguf_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto m = spillway::gguf::ParseGguf(data, size, size);
  if (m.ok()) (void)m->TotalTensorBytes();
  return 0;
}
