#!/bin/bash
# The test command: installs what is missing, builds, runs every test that needs no GPU, and
# prints "N passed, N failed, N skipped" counted per test case (from bazel-testlogs/**/test.xml).
# Extra arguments go to `bazel test` (e.g. --config=asan, or a target pattern instead of //...).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
targets=("$@")
((${#targets[@]})) || targets=(//...)
rm -rf bazel-testlogs/ 2>/dev/null || true
rc=0
bazel test "${targets[@]}" || rc=$?
python3 tools/count_tests.py bazel-testlogs
exit $rc
