#!/bin/bash
# The test command: installs what is missing, builds, runs every test that needs no GPU, and
# prints "N passed, N failed, N skipped" counted per test case (from bazel-testlogs/**/test.xml),
# with the layering rules of tools/check_layering.py.
# Extra arguments go to `bazel test` (e.g. --config=asan, or a target pattern instead of //...).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
targets=("$@")
# Flags alone (e.g. --config=asan) still test everything: //... unless a target pattern is given.
pattern=0
for arg in "${targets[@]}"; do [[ "$arg" == -* ]] || pattern=1; done
((pattern)) || targets+=(//...)
# Count only this run's results: the test logs directory outlives clones at the same path and
# renamed targets (removing the bazel-testlogs link would leave it).
flags=()
for arg in "${targets[@]}"; do [[ "$arg" == -* ]] && flags+=("$arg"); done
testlogs="$(bazel info "${flags[@]}" bazel-testlogs 2>/dev/null || bazel info bazel-testlogs 2>/dev/null || true)"
[ -n "$testlogs" ] && rm -rf "$testlogs"
rc=0
bazel test "${targets[@]}" || rc=$?
# The layering rules of docs/design.md, counted as test cases with the others.
layering="$(mktemp -d)"
trap 'rm -rf "$layering"' EXIT
python3 tools/check_layering.py --xml "$layering/test.xml" || rc=1
python3 tools/count_tests.py bazel-testlogs "$layering"
exit $rc
