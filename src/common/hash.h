// SHA-256 of byte strings and files (OpenSSL EVP), as lowercase hex.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace spillway {

// `n` bytes as lowercase hex (2 * n characters), appended to `out`.
void AppendHex(std::string& out, const unsigned char* data, size_t n);

// The raw 32-byte digest of `data`.
void Sha256(std::string_view data, unsigned char (&out)[32]);
std::string Sha256Hex(std::string_view data);
// Streams the file in 1 MiB blocks; never loads it whole.
StatusOr<std::string> Sha256File(const std::string& path);

}  // namespace spillway
