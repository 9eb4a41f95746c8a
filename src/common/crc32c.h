// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as iSCSI, ext4 and
// LevelDB compute it: the commit log's record checksum. x86-64 computes it
// with SSE 4.2's crc32 instruction (eight bytes an instruction, no table to
// bring into the cache on the request path) where the CPU has it, else a
// table a byte at a time; both give the same values (crc32c_test).
#pragma once

#include <cstddef>
#include <cstdint>

namespace spillway {

// The CRC-32C of `crc`'s data followed by `n` bytes at `data`
// (Crc32cExtend(0, ...) is the CRC of those bytes alone), so that a
// checksum can be computed in pieces.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }

namespace internal {
// The table's way, whatever the CPU (for tests: it must match the instruction's).
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t n);
// Whether Crc32cExtend uses the CPU's instruction.
bool Crc32cHardware();
}  // namespace internal

}  // namespace spillway
