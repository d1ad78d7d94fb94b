// Starting this program again, in the same process, with one more environment variable: for
// settings a library reads only when it loads (OpenBLAS's OPENBLAS_CORETYPE, kernels/
// blas_core.h). Called first in a main, before flags are parsed and before any thread of ours.
#ifndef PS_COMMON_STARTUP_RESTART_H_
#define PS_COMMON_STARTUP_RESTART_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ps::common {

// Sets `name`=`value` in the environment and executes this program's file again with `argv`
// (main's, unchanged): the same pid, open files, signal mask and ignored signals; its threads
// end. Returns only on failure, changing nothing that matters (the variable may be set):
//  - FAILED_PRECONDITION: `argv` is empty, or the program was started through the dynamic
//    loader (`ld.so PROGRAM`: this file is then the loader's);
//  - the exec's or setenv's error otherwise.
// The program runs again under its own name (the file's path, not /proc/self/exe, which would
// rename the process "exe" in ps, top and pkill), or from /proc/self/exe when its file was
// deleted or replaced since it started.
absl::Status RestartWithEnvironment(char** argv, const char* name, absl::string_view value);

}  // namespace ps::common

#endif  // PS_COMMON_STARTUP_RESTART_H_
