#!/bin/bash
# Runs a fast subset of the tests under AddressSanitizer (+ LeakSanitizer) or ThreadSanitizer:
#
#   bash tools/sanitize.sh asan|tsan [TARGET...]
#
# Default targets: the unit tests of common/, server/ (storage and rpc included) and worker/,
# plus tests/server_e2e_test, tests/consistency_test, tests/data_path_test and
# tests/overlapped_steps_test (tsan: without the tests named below; data_path_test and
# overlapped_steps_test reach their services over sockets under TSan, not by gRPC's in-process
# channel).
# The build uses .bazelrc's
# --config=asan / --config=tsan (gcc, dbg) in a separate Bazel output base (one per workspace,
# under ~/.cache/ps-sanitize-bazel/), so the main build's cache is never thrown away; asan and
# tsan share that output base with distinct output directories (--platform_suffix), so
# switching between them rebuilds nothing. --symlink_prefix=/ leaves the workspace's
# bazel-bin/bazel-testlogs links alone.
#
# Prints "sanitize <mode>: N passed, N failed, N skipped" (per test case) and exits non-zero if
# any test failed, a sanitizer report included (each sanitizer makes the test exit non-zero).
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-}"
case "$mode" in
  asan | tsan) shift ;;
  *) echo "usage: bash tools/sanitize.sh asan|tsan [TARGET...]" >&2; exit 2 ;;
esac
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(//common/... //server/... //worker/... //tests:server_e2e_test //tests:consistency_test
           //tests:data_threads_test //tests:data_path_test //tests:overlapped_steps_test
           //kernels:cpu_backend_test
           //kernels:backend_test //kernels:optimizer_test //kernels:flush_denormals_test)
  # Not under TSan: checkpoint_store_test checks RocksDB's own concurrency (readers during
  # retention and writes), which synchronizes inside the uninstrumented librocksdb; TSan then
  # reports, now and then, our CRC check reading a value that RocksDB's memtable handed out
  # (a false positive no narrow suppression covers). checkpoint_store_damage_test (split out
  # of it) writes and reads the same way beside RocksDB's flush threads. ASan runs both;
  # under TSan the store is still exercised by checkpointer_test and server_e2e_test.
  [ "$mode" = tsan ] && targets+=(-//server/storage:checkpoint_store_test
                                  -//server/storage:checkpoint_store_damage_test)
  # Not under TSan either: grpc_store_test talks to its fake server over gRPC's in-process
  # channel, which hands the client's serialized slices to the server's thread inside the
  # uninstrumented libgrpc; TSan reports the server parsing bytes the client wrote (a false
  # positive). The store's threading runs under TSan in server_e2e_test, over real sockets.
  [ "$mode" = tsan ] && targets+=(-//worker/rpc:grpc_store_test)
  # Nor server/rpc:parking_test: its calls are finished from the tracker's timer and from
  # cancellations, and its reactors are deleted in OnDone on gRPC's executor; gRPC hands each
  # call between its threads inside the uninstrumented libgrpc, and TSan reports gRPC's own
  # header code (CallOpSet::FinalizeResult, the call's destructor, the reactor's vtable) in
  # about half the runs. The parking logic runs under TSan in worker_tracker_test and
  # service_test.
  [ "$mode" = tsan ] && targets+=(-//server/rpc:parking_test)
  # Nor common/cluster:cluster_env_test: in the gcc TSan build (only), every lookup in the
  # google.protobuf.Struct that protobuf's JSON parser filled crashes inside protobuf's Map
  # header code (map.h TableEntryIsNonEmptyList, reading past its bucket table), with no
  # thread involved; the plain and ASan builds run the same test clean. The parser is
  # single-threaded, so TSan has nothing to check there; ASan runs it.
  [ "$mode" = tsan ] && targets+=(-//common/cluster:cluster_env_test)
fi

workspace_hash=$(pwd -P | md5sum | cut -c1-12)
output_base="${PS_SANITIZE_OUTPUT_BASE:-$HOME/.cache/ps-sanitize-bazel/$workspace_hash}"
flags=(
  "--config=$mode" "--platform_suffix=$mode" --symlink_prefix=/
  # Sanitized dbg builds run 2-10x slower than opt: give each size class 3x its default time.
  --test_timeout=180,900,2700,10800
)
scratch="$output_base/sanitize-$mode"
mkdir -p "$scratch"
if [ "$mode" = asan ]; then
  flags+=(--test_env=ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1)
else
  # Debian's Abseil is not built with TSan: tools/tsan/absl_annotations.cc tells TSan what
  # absl::Mutex & co. synchronize, linked into every binary and test (--custom_malloc adds one
  # library to each cc_binary/cc_test link).
  flags+=(--custom_malloc=//tools/tsan:absl_annotations)
  # ThreadSanitizer suppressions. Each names code outside this project and says why.
  cat >"$scratch/tsan.supp" <<'EOF'
# Uninstrumented Debian libraries whose memory TSan sees only through its interceptors
# (memcpy, memmove, memcmp, sendmsg, free), not through the synchronization they use:
# called_from_lib makes TSan ignore interceptors called from inside them. Our code's own
# accesses stay checked.
# - Abseil's deadlock detector keeps its lock graph (GraphCycles) under an internal
#   absl::base_internal::SpinLock.
called_from_lib:libabsl_graphcycles_internal.so
# - Abseil's random pool (grpcpp draws from it when it starts a call's batch) hands out its
#   per-thread generators under an internal SpinLock too; seen with two client threads.
called_from_lib:libabsl_random_internal_pool_urbg.so
# - gRPC hands slices, buffers and call state between its threads through its own atomics and
#   combiners; gpr (its allocator), upb (its message codec) and absl::Status/absl::Cord hold
#   what it passes along. Its locks are absl::Mutex (annotated above), and TSan still records
#   thread creation from an ignored library.
called_from_lib:libgrpc.so
called_from_lib:libgrpc++.so
called_from_lib:libgpr.so
called_from_lib:libupb.so
called_from_lib:libabsl_status.so
called_from_lib:libabsl_cord.so
# - absl::Cord's tree nodes (libabsl_cord_internal) are shared by reference counts in that
#   library: a large request's Cord made on gRPC's server thread and released on one of its
#   client threads showed as a race on the nodes' new/delete (server/rpc/overload_test, 2026-12-03).
called_from_lib:libabsl_cord_internal.so
# gRPC's callback tags (grpcpp headers, so instrumented) are built on the calling thread and
# run on gRPC's callback thread after a hand-off through gRPC's completion queue, which
# synchronizes inside libgrpc. race_top: only reports whose top frame is the tag itself; our
# callbacks that the tag runs stay checked.
race_top:grpc::internal::CallbackWithStatusTag::
race_top:grpc::internal::CallbackWithSuccessTag::
# And the tag's std::function itself: set by the thread that answers (the tag's Set) and tested
# and called by the callback thread, whose top frame is std::function's (race_top cannot name
# the tag). race: reports with the tag's Set in a stack, i.e. on the tag's own member; our
# callbacks' accesses are not in Set's stack (tests/overlapped_steps_test, once in a CI run,
# 2026-12-05).
race:grpc::internal::CallbackWithStatusTag::Set
race:grpc::internal::CallbackWithSuccessTag::Set
# When TSan cannot restore the writing thread's stack (its history ran out), the Set above is in
# no stack it has, and the same report comes with the reader's alone: std::function's emptiness
# check, called by the tag's Run on the callback thread, on a tag gRPC allocated (gpr_malloc).
# race_top: only reports whose top frame is that check, i.e. on a std::function's own manager
# pointer; calling it (operator(), the invoker) and what our callbacks touch stay checked
# (tests/overlapped_steps_test, once in a CI run, 2026-12-06).
race_top:std::_Function_base::_M_empty
# And the callback handler's own code (grpcpp header) reading the reactor that the handler
# thread made, e.g. its vtable to call OnDone, on the callback thread (the same hand-off;
# tests/overlapped_steps_test, 2026-12-05). race_top: our reactors' methods stay checked.
race_top:grpc::internal::CallbackUnaryHandler<
# Likewise the grpcpp readers and writers of gRPC's byte buffers, whose slices gRPC allocated
# (gpr_malloc) and handed over on another of its threads.
race_top:grpc::ProtoBufferReader::
race_top:grpc::ProtoBufferWriter::
# Likewise a call's CallOpSet (grpcpp header): the thread that answers fills it (FillOps) and
# whichever thread takes its tag off the completion queue finalizes it (FinalizeResult); with
# several server data threads (server.data_threads) or the pool answering, those differ, and
# the hand-off is inside libgrpc. race_top: reports whose top frame is the CallOpSet; race:
# reports with FinalizeResult anywhere in a stack, i.e. the ops it finishes with their own
# header code (CallOpSendInitialMetadata::FinishOp, CallOpSendMessage::FinishOp reading the
# answer's ByteBuffer that Finish wrote on the other data thread: tests/data_threads_test,
# about 1 run in 10). FinalizeResult runs no code of this project.
race_top:grpc::internal::CallOpSet<
race:grpc::internal::CallOpSet<*>::FinalizeResult
# And the grpcpp header that copies a finished call's status message out of the slice gRPC's
# transport thread filled (the copy's top frame is std::string's, so race_top cannot name it).
race:grpc::internal::CallOpClientRecvStatus::FinishOp
# And a callback call's reference count (grpcpp header): the call object is made in gRPC's
# memory (gpr_malloc) and its count initialized by the thread that starts the handler, then
# unreferenced by the callback thread that finishes the call, after a hand-off inside libgrpc
# (tests/overlapped_steps_test, two workers over sockets: once in its first 6 runs).
race_top:grpc::internal::ServerCallbackCall::
# RocksDB cannot be ignored that way: it starts its background threads and hands them work
# through pthread calls, which called_from_lib would hide as well. Its memtable is a skip list
# whose writers and readers synchronize with std::atomic operations inside the library, so
# races with a RocksDB frame in either stack are suppressed instead (history_size=7 below
# keeps the stacks of RocksDB's writes restorable, so that the pattern can match them).
race:librocksdb.so
EOF
  flags+=("--test_env=TSAN_OPTIONS=halt_on_error=1:history_size=7:suppressions=$scratch/tsan.supp")
fi

echo "sanitize $mode: ${targets[*]} (output base $output_base)"
start=$(date +%s)
testlogs=$(bazel --output_base="$output_base" --max_idle_secs=900 info "${flags[@]}" bazel-testlogs 2>/dev/null)
rm -rf "$testlogs"  # count only this run's results
rc=0
bazel --output_base="$output_base" --max_idle_secs=900 test "${flags[@]}" -- "${targets[@]}" || rc=$?
echo "sanitize $mode: took $(($(date +%s) - start)) s"
echo "sanitize $mode: $(python3 tools/count_tests.py "$testlogs")"
exit $rc
