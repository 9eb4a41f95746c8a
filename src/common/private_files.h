// Files that only their owner may read: the state directory (journal with
// prompts and answers, logs, port files) and the files in it.
//
// Another local user must be able neither to read them nor to plant files
// or symbolic links that the gateway would trust (a port file that points
// at a fake worker, a log that is a link to a file of the gateway's user).
#pragma once

#include <fcntl.h>

#include <cstddef>
#include <string>

#include "common/status.h"

namespace spillway {

// Creates `dir` (and missing parents) with mode 0700, or accepts an existing
// one that the effective user owns and no one else may write. One that others
// may only read is tightened to 0700 (older versions made it 0755). Another
// owner, group/other write permission or a non-directory is refused with an
// error that names the path and the fix.
Status EnsurePrivateDir(const std::string& dir);

// Writes `content` to `path` through a temporary file created exclusively
// (O_EXCL | O_NOFOLLOW, an unpredictable name) in the same directory with
// exactly `mode` (whatever the umask), then renamed over `path`, or, without
// `replace`, linked to it only if nothing is there yet (kConflict naming
// `path` when something is): a reader sees the old file or the new one,
// never a part. The temporary is removed on every failure.
Status WriteFileAtomically(const std::string& path, const std::string& content, unsigned mode, bool replace = true);

// WriteFileAtomically with mode 0600, replacing what is there.
Status WritePrivateFileAtomically(const std::string& path, const std::string& content);

// The first `max_bytes` of a regular file in the state directory (a port
// file, a load-progress file a worker writes): opened without blocking and
// never through a symbolic link, so that a FIFO or a link planted there
// (or left by a worker gone wrong) cannot stall or mislead the reader.
// kNotFound when it is not there; kUnavailable, naming the path, when it is
// not a regular file or cannot be read.
StatusOr<std::string> ReadPrivateFile(const std::string& path, size_t max_bytes);

// Flags for opening a log or data file for appending: never through a
// symbolic link, never inherited by children that did not ask for it.
inline constexpr int kPrivateAppendFlags = O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW;
inline constexpr unsigned kPrivateFileMode = 0600;

}  // namespace spillway
