// GrpcParameterStore against a fake ParameterServer on an in-process channel (no sockets).
#include "worker/rpc/grpc_store.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/codec.h"
#include "common/config/config.h"
#include "common/rpc/frame.h"
#include "common/rpc/frame_testing.h"
#include "common/rpc/grpc_status.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"
#include "proto/ps.grpc.pb.h"
#include "worker/rpc/grpc_async_calls.h"
#include "worker/rpc/grpc_store_test_fixture.h"
#include "worker/rpc/push_residuals.h"

namespace ps::worker {
namespace {

// A clock a server remembers that is negative or overflows at the next step is refused (the
// worker took it as its own and sent it to every server).
TEST_F(GrpcStoreTest, AHeartbeatAnsweringAnImpossibleClockIsRefused) {
  Start(/*fail_pushes=*/0);
  for (int64_t clock : {int64_t{-1}, std::numeric_limits<int64_t>::max()}) {
    service_->AnswerHeartbeatsWithClock(clock);
    const absl::Status status = store_->ReportPosition(0, 0).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << clock << ": " << status;
    EXPECT_NE(status.message().find("remembers this worker at clock"), absl::string_view::npos)
        << status;
  }
  service_->AnswerHeartbeatsWithClock(7);
  EXPECT_EQ(store_->ReportPosition(0, 0).value_or(common::WorkerPosition{}).clock, 7);
}

// A server's answer to a heartbeat is parsed within a bound: 100,000 unknown fields (300 KB on
// the wire, several MB parsed) are refused unparsed (found in review, 2026-12-06: gRPC parsed
// any answer up to the channel's receive limit, tens of times its size in memory).
TEST_F(GrpcStoreTest, AHeartbeatAnswerTakingFarMoreParsedThanItsSizeIsRefused) {
  Start(/*fail_pushes=*/0);
  service_->AnswerHeartbeatsWithClock(5);
  service_->PadHeartbeats(100000);
  const absl::Status status = store_->ReportPosition(0, 0).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_NE(status.message().find("bytes parsed"), absl::string_view::npos) << status;
  service_->PadHeartbeats(10);  // a few: parsed as before
  EXPECT_EQ(store_->ReportPosition(0, 0).value_or(common::WorkerPosition{}).clock, 5);
}

// So is its answer to ServerInfo, which a worker asks before training: a padded answer is
// refused with the server named, and an honest one (its layout, a few unknown fields) taken.
TEST_F(GrpcStoreTest, AServerInfoAnswerTakingFarMoreParsedThanItsSizeIsRefused) {
  Start(/*fail_pushes=*/0);
  const uint64_t layout = store_->partitioner().layout_fingerprint();
  service_->AnswerServerInfo(layout, 100000);
  const absl::Status status = store_->WaitForServers(absl::Seconds(10));
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_NE(status.message().find("bytes parsed"), absl::string_view::npos) << status;
  EXPECT_NE(status.message().find("server 0"), absl::string_view::npos) << status;
  service_->AnswerServerInfo(layout, 10);
  EXPECT_TRUE(store_->WaitForServers(absl::Seconds(10)).ok());
  service_->AnswerServerInfo(layout + 1, 0);  // another layout: the configs differ
  EXPECT_EQ(store_->WaitForServers(absl::Seconds(10)).code(),
            absl::StatusCode::kFailedPrecondition);
}

// A heartbeat refused UNAVAILABLE is retried, and the position comes back. (Each attempt's
// reader lives in its call's arena, which the attempt's context holds: FanOut destroys the
// readers first.)
TEST_F(GrpcStoreTest, AHeartbeatIsRetriedAndReportsThePosition) {
  Start(/*fail_pushes=*/0);
  service_->FailHeartbeats(2);
  absl::StatusOr<common::WorkerPosition> position = store_->ReportPosition(3, 1234);
  ASSERT_TRUE(position.ok()) << position.status();
  EXPECT_EQ(position->epoch, 3u);
  EXPECT_EQ(position->offset, 1234u);
  EXPECT_EQ(service_->heartbeats(), 3);
  EXPECT_EQ(store_->stats().retries, 2u);
}

TEST(GrpcStoreOptionsTest, ANonPositiveReaskIsRefused) {
  JobConfig config;
  config.mutable_cluster()->set_num_servers(1);
  config.mutable_cluster()->add_servers("127.0.0.1:1");
  config.mutable_cluster()->set_num_workers(1);
  config.add_tables()->set_name("w");
  config.mutable_tables(0)->add_shape(8);
  ASSERT_TRUE(common::ExpandModelTables(&config).ok());
  auto channel = grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials());
  for (const absl::Duration reask : {absl::ZeroDuration(), absl::Seconds(-1)}) {
    GrpcStoreOptions options;
    options.shared_memory_reask = reask;
    const absl::Status s =
        GrpcParameterStore::CreateWithChannels(config, options, {channel}).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("shared_memory_reask"), absl::string_view::npos) << s;
  }
  EXPECT_TRUE(GrpcParameterStore::CreateWithChannels(config, GrpcStoreOptions(), {channel}).ok());
}

// A busy server's refusal changed nothing at the server: the store sends the same push (same
// sequence) again, within its retries.
TEST_F(GrpcStoreTest, ABusyServersRefusalIsRetried) {
  Start(/*fail_pushes=*/2, FastRetries(), grpc::StatusCode::RESOURCE_EXHAUSTED, /*busy=*/true);
  ASSERT_TRUE(PushOnce(1).ok());
  const std::vector<PushRequest> pushes = service_->pushes();
  ASSERT_EQ(pushes.size(), 3u);
  EXPECT_EQ(pushes[1].SerializeAsString(), pushes[0].SerializeAsString());
  EXPECT_EQ(pushes[2].SerializeAsString(), pushes[0].SerializeAsString());
  EXPECT_EQ(store_->stats().retries, 2u);
}

TEST_F(GrpcStoreTest, BusyRetriesAreBounded) {
  GrpcStoreOptions options = FastRetries();
  options.max_retries = 3;
  Start(/*fail_pushes=*/100, options, grpc::StatusCode::RESOURCE_EXHAUSTED, /*busy=*/true);
  const absl::Status status = PushOnce(1);
  EXPECT_TRUE(absl::IsResourceExhausted(status)) << status;
  EXPECT_EQ(service_->pushes().size(), 4u);
}

// Once the process is asked to stop (GrpcStoreOptions::give_up_retries), an attempt that
// would be retried returns its error instead: servers that are gone do not hold the process
// for every retry. Heartbeats (FanOut) the same.
TEST_F(GrpcStoreTest, NoRetryOnceAskedToGiveUp) {
  GrpcStoreOptions options = FastRetries();
  std::atomic<bool> stopping{false};
  options.give_up_retries = [&stopping] { return stopping.load(); };
  Start(/*fail_pushes=*/100, options);
  ASSERT_FALSE(PushOnce(1).ok());  // 21 attempts: retried as usual before
  const size_t before = service_->pushes().size();
  EXPECT_EQ(before, 21u);
  stopping = true;
  const absl::Status status = PushOnce(2);
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_EQ(service_->pushes().size(), before + 1);  // one attempt
  service_->FailHeartbeats(100);
  EXPECT_TRUE(absl::IsUnavailable(store_->Finish())) << "a heartbeat retried after the stop";
  EXPECT_EQ(service_->heartbeats(), 1);
}

// Without the busy mark RESOURCE_EXHAUSTED says the request cannot be served (too large,
// too many waiting pulls): returned at once.
TEST_F(GrpcStoreTest, OtherResourceExhaustedIsNotRetried) {
  Start(/*fail_pushes=*/1, FastRetries(), grpc::StatusCode::RESOURCE_EXHAUSTED, /*busy=*/false);
  const absl::Status status = PushOnce(1);
  EXPECT_TRUE(absl::IsResourceExhausted(status)) << status;
  EXPECT_EQ(service_->pushes().size(), 1u);
  EXPECT_EQ(store_->stats().retries, 0u);
}

TEST_F(GrpcStoreTest, RetriedPushResendsIdenticalBytes) {
  Start(/*fail_pushes=*/1);
  ASSERT_TRUE(PushOnce(1).ok());
  std::vector<PushRequest> pushes = service_->pushes();
  ASSERT_EQ(pushes.size(), 2u);  // the failed attempt and its retry
  EXPECT_EQ(pushes[0].SerializeAsString(), pushes[1].SerializeAsString());
  EXPECT_EQ(store_->stats().retries, 1u);
}

TEST_F(GrpcStoreTest, ResidualIsAddedOncePerPushNotPerAttempt) {
  Start(/*fail_pushes=*/2);
  ASSERT_TRUE(PushOnce(1).ok());  // three attempts
  ASSERT_TRUE(PushOnce(2).ok());  // one attempt
  std::vector<PushRequest> pushes = service_->pushes();
  ASSERT_EQ(pushes.size(), 4u);

  // What two pushes through error feedback must send.
  PushResiduals reference;
  std::string dense[2], sparse[2];
  for (int step = 0; step < 2; ++step) {
    reference.AppendDense("w", 8, 0, dense_grad_, ENCODING_BF16, &dense[step]);
    for (size_t i = 0; i < keys_.size(); ++i) {
      reference.AppendSparseRow("emb", keys_[i],
                                absl::MakeConstSpan(sparse_grad_).subspan(2 * i, 2),
                                ENCODING_BF16, &sparse[step]);
    }
  }
  ASSERT_NE(dense[0], dense[1]);  // the residual changed the second push
  for (int attempt = 0; attempt < 4; ++attempt) {
    const int step = attempt < 3 ? 0 : 1;
    const PushRequest& p = pushes[attempt];
    ASSERT_EQ(p.tables_size(), 2) << attempt;
    EXPECT_EQ(p.tables(0).blocks(0).values(), dense[step]) << attempt;
    EXPECT_EQ(p.tables(1).rows(), sparse[step]) << attempt;
  }
}

TEST_F(GrpcStoreTest, ErrorFeedbackCanBeTurnedOff) {
  Start(/*fail_pushes=*/0);
  store_.reset();
  JobConfig config = Config(/*sparse=*/false);
  config.mutable_tables(0)->set_wire_error_feedback(false);
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  channels.push_back(server_->InProcessChannel(grpc::ChannelArguments()));
  auto store = GrpcParameterStore::CreateWithChannels(config, GrpcStoreOptions(), std::move(channels));
  ASSERT_TRUE(store.ok()) << store.status();
  common::PushBatch batch;
  batch.dense.push_back({"w", dense_grad_});
  ASSERT_TRUE((*store)->Push(batch, common::PushOptions{1, false}).ok());
  ASSERT_TRUE((*store)->Push(batch, common::PushOptions{2, false}).ok());
  std::vector<PushRequest> pushes = service_->pushes();
  ASSERT_EQ(pushes.size(), 2u);
  std::string nearest;
  common::EncodeFloats(dense_grad_, ENCODING_BF16, &nearest);
  EXPECT_EQ(pushes[0].tables(0).blocks(0).values(), nearest);
  EXPECT_EQ(pushes[1].tables(0).blocks(0).values(), nearest);
}


// What `n` pushes of dense_grad_ / sparse_grad_ through error feedback send, in order.
std::vector<std::pair<std::string, std::string>> ExpectedEncodings(
    int n, const std::vector<float>& dense, const std::vector<uint64_t>& keys,
    const std::vector<float>& sparse) {
  PushResiduals reference;
  std::vector<std::pair<std::string, std::string>> out(n);
  for (auto& [d, sp] : out) {
    reference.AppendDense("w", 8, 0, dense, ENCODING_BF16, &d);
    for (size_t i = 0; i < keys.size(); ++i) {
      reference.AppendSparseRow("emb", keys[i], absl::MakeConstSpan(sparse).subspan(2 * i, 2),
                                ENCODING_BF16, &sp);
    }
  }
  return out;
}

TEST_F(GrpcStoreTest, AsyncCallsKeepEightPushesInFlightFromOneThread) {
  Start(/*fail_pushes=*/0);
  // No answer comes before the 8th call arrives: one call at a time would never end.
  service_->Hold(8);
  std::unique_ptr<GrpcParameterStore::AsyncCalls> calls = store_->NewAsyncCalls();
  std::set<uint64_t> started;
  for (int i = 0; i < 8; ++i) {
    auto id = StartPush(calls.get(), i + 1);
    ASSERT_TRUE(id.ok()) << id.status();
    started.insert(*id);
  }
  EXPECT_EQ(calls->pending(), 8u);
  std::set<uint64_t> ended;
  for (int i = 0; i < 8; ++i) {
    auto done = calls->Next();
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_TRUE(done->status.ok()) << done->status;
    EXPECT_TRUE(ended.insert(done->id).second) << "call " << done->id << " ended twice";
  }
  EXPECT_EQ(ended, started);
  EXPECT_EQ(calls->Next().status().code(), absl::StatusCode::kFailedPrecondition);
  // Sequences 1..8 in order of start; error feedback moved in that order too.
  std::vector<PushRequest> pushes = service_->pushes();
  ASSERT_EQ(pushes.size(), 8u);
  std::sort(pushes.begin(), pushes.end(), [](const PushRequest& a, const PushRequest& b) {
    return a.header().sequence() < b.header().sequence();
  });
  const auto expected = ExpectedEncodings(8, dense_grad_, keys_, sparse_grad_);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(pushes[i].header().sequence(), static_cast<uint64_t>(i + 1));
    EXPECT_EQ(pushes[i].header().clock(), i + 1);
    EXPECT_EQ(pushes[i].tables(0).blocks(0).values(), expected[i].first) << i;
    EXPECT_EQ(pushes[i].tables(1).rows(), expected[i].second) << i;
  }
}

// rpc.parallel_copy_bytes and rpc.lend_push_buffers reach the store's options (off unless
// set).
TEST(JobStoreOptionsTest, CopyAndLendSettingsReachTheStore) {
  JobConfig job;
  EXPECT_EQ(JobStoreOptions(job, 0, 1).parallel_copy_bytes, 0u);
  EXPECT_FALSE(JobStoreOptions(job, 0, 1).lend_push_buffers);
  job.mutable_rpc()->set_parallel_copy_bytes(262144);
  job.mutable_rpc()->set_lend_push_buffers(true);
  EXPECT_EQ(JobStoreOptions(job, 0, 1).parallel_copy_bytes, 262144u);
  EXPECT_TRUE(JobStoreOptions(job, 0, 1).lend_push_buffers);
}

// rpc.busy_poll_us reaches the store, and its calls wait for answers by polling: with a
// spin longer than any answer takes, each of 8 pushes ends while polling, and with none
// every wait sleeps.
TEST_F(GrpcStoreTest, CallsPollForTheirAnswersWhenTheJobSaysSo) {
  JobConfig job;
  EXPECT_EQ(JobStoreOptions(job, 0, 1).busy_poll, absl::Microseconds(2000));  // the default
  job.mutable_rpc()->set_busy_poll_us(0);
  EXPECT_EQ(JobStoreOptions(job, 0, 1).busy_poll, absl::ZeroDuration());
  for (absl::Duration spin : {absl::Seconds(30), absl::ZeroDuration()}) {
    GrpcStoreOptions options = FastRetries();
    options.busy_poll = spin;
    Start(/*fail_pushes=*/0, options);
    std::unique_ptr<GrpcParameterStore::AsyncCalls> calls = store_->NewAsyncCalls();
    for (int i = 0; i < 8; ++i) {
      auto id = StartPush(calls.get(), i + 1);
      ASSERT_TRUE(id.ok()) << id.status();
      ASSERT_TRUE(calls->Wait(*id).ok());
    }
    const common::BusyPollStats& stats = calls->poll_stats();
    if (spin > absl::ZeroDuration()) {
      // Each wait polled until its answer came (or, on a loaded machine, slept after a
      // contended stretch); none ran out of its 30 s.
      EXPECT_GT(stats.polls, 0u);
      EXPECT_EQ(stats.waits_blocked, stats.waits_backed_off);
      EXPECT_GT(stats.events_polled, 0u);
    } else {
      EXPECT_EQ(stats.polls, 0u);
      EXPECT_EQ(stats.events_polled, 0u);
      EXPECT_GT(stats.waits_blocked, 0u);
    }
    calls.reset();
    TearDown();
    store_.reset();
    service_.reset();
    server_.reset();
  }
}

TEST_F(GrpcStoreTest, AsyncCallsRetryABusyServersRefusal) {
  Start(/*fail_pushes=*/2, FastRetries(), grpc::StatusCode::RESOURCE_EXHAUSTED, /*busy=*/true);
  std::unique_ptr<GrpcParameterStore::AsyncCalls> calls = store_->NewAsyncCalls();
  auto id = StartPush(calls.get(), 1);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_TRUE(calls->Wait(*id).ok());
  const std::vector<PushRequest> pushes = service_->pushes();
  ASSERT_EQ(pushes.size(), 3u);
  EXPECT_EQ(pushes[2].SerializeAsString(), pushes[0].SerializeAsString());
}

TEST_F(GrpcStoreTest, AsyncRetryKeepsItsSequenceAndLaterPushesWaitWithinTheLead) {
  GrpcStoreOptions options = FastRetries();
  options.max_sequence_lead = 3;
  Start(/*fail_pushes=*/1, options);
  std::unique_ptr<GrpcParameterStore::AsyncCalls> calls = store_->NewAsyncCalls();
  constexpr int kPushes = 12;
  for (int i = 0; i < kPushes; ++i) {
    ASSERT_TRUE(StartPush(calls.get(), i + 1).ok());
    if (calls->pending() == 6) {  // a window of 6, wider than the lead
      auto done = calls->Next();
      ASSERT_TRUE(done.ok() && done->status.ok());
    }
  }
  while (calls->pending() > 0) {
    auto done = calls->Next();
    ASSERT_TRUE(done.ok() && done->status.ok());
  }
  std::vector<PushRequest> pushes = service_->pushes();
  ASSERT_EQ(pushes.size(), kPushes + 1u);  // one lost and resent
  const uint64_t lost = pushes[0].header().sequence();
  size_t resent = 0;
  std::multiset<uint64_t> seen;
  for (size_t i = 0; i < pushes.size(); ++i) {
    const uint64_t q = pushes[i].header().sequence();
    seen.insert(q);
    if (i > 0 && q == lost) {
      resent = i;
      EXPECT_EQ(pushes[i].SerializeAsString(), pushes[0].SerializeAsString());
    }
  }
  ASSERT_GT(resent, 0u);
  for (uint64_t q = 1; q <= kPushes; ++q) EXPECT_EQ(seen.count(q), q == lost ? 2u : 1u) << q;
  // No push 3 or more sequences past the lost one left before the retry arrived.
  for (size_t i = 0; i < resent; ++i) EXPECT_LT(pushes[i].header().sequence(), lost + 3) << i;
  EXPECT_EQ(store_->stats().retries, 1u);
}

TEST_F(GrpcStoreTest, AsyncCallRefusesABadAnswer) {
  Start(/*fail_pushes=*/0);
  service_->AnswerGarbage();
  std::unique_ptr<GrpcParameterStore::AsyncCalls> calls = store_->NewAsyncCalls();
  auto first = StartPush(calls.get(), 1);
  auto second = StartPush(calls.get(), 2);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(calls->Wait(*second).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(calls->Wait(*first).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(calls->Wait(*first).code(), absl::StatusCode::kNotFound);  // reaped already
  EXPECT_EQ(store_->Push(common::PushBatch(), common::PushOptions{3, false}).code(),
            absl::StatusCode::kInternal);
}

// A lying server's payload lengths that add up to the payload's size only modulo 2^64 (here
// 16 bytes for the block asked for, 2^64 - 16 for the row asked for, and no payload):
// refused before anything is read (the sum wrapped around and the block was read from an
// empty payload: answer_fuzzer found it).
TEST_F(GrpcStoreTest, PayloadLengthsThatWrapAroundAreRefused) {
  Start(/*fail_pushes=*/0);
  PushPullResponse answer;
  TableValues* w = answer.mutable_pull()->add_tables();
  w->set_table("w");
  w->set_encoding(ENCODING_BF16);
  DenseBlock* block = w->add_blocks();
  block->set_block_id(0);
  block->set_payload_bytes(16);  // 8 values of 2 bytes: the honest length
  TableValues* emb = answer.mutable_pull()->add_tables();
  emb->set_table("emb");
  emb->set_encoding(ENCODING_BF16);
  emb->set_rows_bytes(~uint64_t{0} - 15);
  service_->Answer(common::FrameBuilder(answer).Build());
  std::vector<float> out(8, 7.f);
  const std::vector<uint64_t> keys = {5};
  std::vector<float> rows(2, 7.f);
  common::PullBatch batch;
  batch.dense.push_back({"w", absl::MakeSpan(out)});
  batch.sparse.push_back({"emb", keys, absl::MakeSpan(rows)});
  const absl::Status status = store_->Pull(batch, common::PullOptions{});
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_NE(status.message().find("do not add up"), absl::string_view::npos) << status;
  EXPECT_EQ(out, std::vector<float>(8, 7.f));
  EXPECT_EQ(rows, std::vector<float>(2, 7.f));
}

// A server's answer is checked against what the frame asked for, not only against its own
// lengths: an answer that leaves a table out, sends rows with a dense table's block (the
// lengths still adding up), or another encoding than asked for, is refused and the caller's
// buffers keep what they held; so is a header far larger than the request's answer needs. Before,
// the first two were OK with buffers unwritten or shifted.
TEST_F(GrpcStoreTest, AnswersThatDoNotMatchTheRequestAreRefused) {
  Start(/*fail_pushes=*/0);
  struct Case {
    const char *name, *message;
    PushPullResponse answer;
    size_t payload_bytes;
  };
  // Table "w" in `encoding`: its block 0 of `block_bytes` (none when 0), `rows_bytes` of rows.
  auto w_case = [](const char* name, size_t payload_bytes, const char* message, Encoding encoding,
                   uint64_t block_bytes, uint64_t rows_bytes) {
    Case c{name, message, {}, payload_bytes};
    TableValues* w = c.answer.mutable_pull()->add_tables();
    w->set_table("w");
    w->set_encoding(encoding);
    if (block_bytes > 0) {
      DenseBlock* block = w->add_blocks();
      block->set_block_id(0);
      block->set_payload_bytes(block_bytes);
    }
    w->set_rows_bytes(rows_bytes);
    return c;
  };
  std::vector<Case> cases = {
      Case{"no tables", "0 tables for the 1 asked for", {}, 0},
      w_case("rows with a dense block", 24, "rows of 'w' that were not asked for", ENCODING_BF16,
             16, 8),
      w_case("another encoding", 32, "was asked for", ENCODING_FLOAT32, 32, 0),
      w_case("no blocks", 0, "0 blocks of 'w' for the 1 asked for", ENCODING_BF16, 0, 0),
      // Empty entries grow about 28 times when parsed: a header far over what the request can
      // be answered with is refused before it is parsed.
      w_case("a header of 100,000 blocks", 0, "at most", ENCODING_BF16, 0, 0),
  };
  TableValues* huge = cases.back().answer.mutable_pull()->mutable_tables(0);
  for (int i = 0; i < 100000; ++i) huge->add_blocks();
  for (const Case& c : cases) {
    const std::string payload(c.payload_bytes, '\x3f');
    common::FrameBuilder frame(c.answer);
    frame.AddSlice(grpc::Slice(payload));
    service_->Answer(frame.Build());
    std::vector<float> out(8, 7.f);
    common::PullBatch batch;
    batch.dense.push_back({"w", absl::MakeSpan(out)});
    const absl::Status status = store_->Pull(batch, common::PullOptions{});
    EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << c.name << ": " << status;
    EXPECT_NE(status.message().find(c.message), absl::string_view::npos)
        << c.name << ": " << status;
    EXPECT_EQ(out, std::vector<float>(8, 7.f)) << c.name;
  }
}

TEST_F(GrpcStoreTest, AsyncCallRefusesABadBatchWithoutTakingASequence) {
  Start(/*fail_pushes=*/0);
  std::unique_ptr<GrpcParameterStore::AsyncCalls> calls = store_->NewAsyncCalls();
  common::PushBatch bad;
  bad.dense.push_back({"w", absl::MakeConstSpan(dense_grad_).subspan(1)});
  EXPECT_EQ(calls->StartPush(bad, common::PushOptions{1, false}).status().code(),
            absl::StatusCode::kInvalidArgument);
  common::PushBatch unknown;
  unknown.dense.push_back({"nope", dense_grad_});
  EXPECT_EQ(calls->StartPush(unknown, common::PushOptions{1, false}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(calls->pending(), 0u);
  auto id = StartPush(calls.get(), 1);
  ASSERT_TRUE(id.ok());
  EXPECT_TRUE(calls->Wait(*id).ok());
  ASSERT_EQ(service_->pushes().size(), 1u);
  EXPECT_EQ(service_->pushes()[0].header().sequence(), 1u);
}

TEST_F(GrpcStoreTest, AsyncCallsThatMissTheirDeadlineAreRetriedThenFail) {
  GrpcStoreOptions options = FastRetries();
  options.deadline = absl::Milliseconds(200);
  options.max_retries = 1;
  Start(/*fail_pushes=*/0, options);
  service_->Hold(1000);  // never answers in time
  Reaper reaper(service_.get());
  std::unique_ptr<GrpcParameterStore::AsyncCalls> calls = store_->NewAsyncCalls();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(StartPush(calls.get(), i + 1).ok());
  for (int i = 0; i < 3; ++i) {
    auto done = calls->Next();
    ASSERT_TRUE(done.ok());
    EXPECT_EQ(done->status.code(), absl::StatusCode::kDeadlineExceeded) << done->status;
  }
  // Each attempt that reached the server in time carried its call's sequence.
  std::multiset<uint64_t> seen;
  for (const PushRequest& p : service_->pushes()) seen.insert(p.header().sequence());
  for (uint64_t q : seen) {
    EXPECT_TRUE(q >= 1 && q <= 3) << q;
    EXPECT_LE(seen.count(q), 2u) << q;
  }
  EXPECT_EQ(store_->stats().retries, 3u);
}

TEST_F(GrpcStoreTest, DestroyingAsyncCallsCancelsTheCallsInFlight) {
  Start(/*fail_pushes=*/0);
  service_->Hold(1000);
  std::unique_ptr<GrpcParameterStore::AsyncCalls> calls = store_->NewAsyncCalls();
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(StartPush(calls.get(), i + 1).ok());
  while (service_->pushes().size() < 4) absl::SleepFor(absl::Milliseconds(1));
  {
    // Returns although no answer comes, once the server let go of the cancelled calls'
    // requests, which hold the payloads where the client's buffers do (in-process).
    Reaper reaper(service_.get());
    calls.reset();
  }
  service_->Hold(0);
  EXPECT_TRUE(PushOnce(5).ok());
}

// gRPC sends a payload from where it lies, and may hold its slices after the call ended (here
// the in-process server holds the request, whose slices are the client's own memory; over a
// socket, bytes of a cancelled call still queued for it). So a call that failed returns only
// once gRPC let go of them: the caller may reuse or free that memory as soon as it returns.
TEST_F(GrpcStoreTest, AFailedPushReturnsOnlyOnceGrpcLetGoOfItsPayload) {
  GrpcStoreOptions options = FastRetries();
  options.deadline = absl::Milliseconds(100);
  options.max_retries = 0;
  Start(/*fail_pushes=*/0, options);
  service_->Hold(1000);
  std::thread server([&] {
    // The server lets go a while after the client gave up on the call (a while, so that a
    // client that did not wait would have returned before).
    while (!service_->AnyHeldCancelled()) absl::SleepFor(absl::Milliseconds(1));
    absl::SleepFor(absl::Milliseconds(200));
    service_->FinishCancelled();
  });
  const absl::Status status = PushOnce(1);
  const int released_before_return = service_->finished_cancelled();
  server.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_EQ(released_before_return, 1);
  // A call that ended OK at its first attempt waits for nothing (the server read it all).
  service_->Hold(0);
  EXPECT_TRUE(PushOnce(2).ok());
}

}  // namespace
}  // namespace ps::worker
