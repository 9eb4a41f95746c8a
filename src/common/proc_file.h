// Reading small files whose contents can vanish under the reader: /proc/<pid>/*.
//
// A /proc file opened while its process lived fails its read with ESRCH once
// the process is reaped. std::istreambuf_iterator lets that read error escape
// as std::ios_base::failure, which ended the chaos harness's sampler (and could
// end the gateway's supervisor) with std::terminate. These report it instead.
#pragma once

#include <optional>
#include <string>

namespace spillway {

// Everything from `fd`'s position to its end (read() until 0, EINTR retried);
// nullopt on a read error. Does not close `fd`.
std::optional<std::string> ReadAll(int fd);

// Opens `path` read-only, reads it whole, closes it; nullopt when it cannot be
// opened or read, errno saying why (ENOENT: no such process; ESRCH: reaped
// meanwhile; EACCES, EMFILE: it may well be there).
std::optional<std::string> ReadSmallFile(const std::string& path);

}  // namespace spillway
