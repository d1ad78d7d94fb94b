// Writing a small file so that a reader never sees it half written.
//
// Port files (--port_file, --metrics_port_file), the MPI rendezvous address files and the
// server's PROGRESS file are read by other processes while their writer runs: they are written
// to PATH.tmp and renamed into place, and every step's error is returned.
#ifndef PS_COMMON_STARTUP_ATOMIC_FILE_H_
#define PS_COMMON_STARTUP_ATOMIC_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ps::common {

// Replaces `path` with `contents` atomically (write PATH.tmp, then rename). Errors: those of
// the file system, as UNAVAILABLE (RESOURCE_EXHAUSTED for a full disk, PERMISSION_DENIED),
// naming the file and the reason; PATH.tmp is removed on failure.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

}  // namespace ps::common

#endif  // PS_COMMON_STARTUP_ATOMIC_FILE_H_
