// What a client can make a GrpcServer hold is capped: requests waiting for the service's pool
// (max_pool_requests, max_pool_request_bytes) and answers its peers do not take
// (max_unsent_answer_bytes), beyond which a call is refused with RESOURCE_EXHAUSTED, reason
// "server_busy", marked retryable, and changes nothing; and calls open on one connection
// (max_concurrent_streams: announced in the server's HTTP/2 SETTINGS, honoured by gRPC
// clients, and a peer that opens more streams anyway loses its connection).
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/codec.h"
#include "common/rpc/frame_testing.h"
#include "common/rpc/grpc_status.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/rpc/grpc_server.h"
#include "server/rpc/overload_test_fixture.h"
#include "server/rpc/service.h"

namespace ps::server {
namespace {

using ::ps::common::IsOk;
using ::testing::HasSubstr;

// A request that would take far more memory parsed than its size (empty repeated entries: two
// bytes each on the wire, an object each parsed) is refused before it is parsed, its reason
// "request_too_large". Found in review, 2026-12-06: gRPC parsed every Pull and Push before
// the service saw it, so 512 MiB of empty table entries cost the server about 24 GB, whoever
// sent them. Control methods take 1 MiB parsed at most.
TEST_F(OverloadTest, RequestsThatWouldTakeFarMoreParsedThanTheirSizeAreRefusedUnparsed) {
  ServiceOptions options;
  options.max_answer_bytes = 4 << 20;  // what a Pull or Push may take parsed
  Start(options, GrpcServerOptions{}, DenseJob(1, 1024, 1024));
  PullRequest pull;
  *pull.mutable_header() = Header(-1, 0, 0);
  for (int i = 0; i < 200000; ++i) pull.add_tables();  // 400 KB sent, over 20 MB parsed
  ASSERT_LT(pull.ByteSizeLong(), 1u << 20);
  grpc::ClientContext pull_context;
  PullResponse pulled;
  const grpc::Status refused = stub_->Pull(&pull_context, pull, &pulled);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("bytes parsed"));
  StatsRequest stats;
  for (int i = 0; i < 100000; ++i) {  // 300 KB of unknown fields, over 1 MiB parsed
    stats.GetReflection()->MutableUnknownFields(&stats)->AddVarint(999, 1);
  }
  grpc::ClientContext stats_context;
  StatsResponse answered;
  EXPECT_EQ(stub_->Stats(&stats_context, stats, &answered).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(Rejected("request_too_large"), 2u);
  // Bytes sent as they are to `method`: its status.
  grpc::GenericStub generic(grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                                grpc::InsecureChannelCredentials()));
  auto send = [&generic](const std::string& method, const std::string& bytes) {
    grpc::ClientContext context;
    grpc::Slice slice(bytes);
    const grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer answer;
    absl::Notification done;
    grpc::Status status;
    generic.UnaryCall(&context, "/ps.ParameterServer/" + method, grpc::StubOptions(), &request,
                      &answer, [&](grpc::Status st) {
                        status = std::move(st);
                        done.Notify();
                      });
    done.WaitForNotification();
    return status;
  };
  // Bytes that are no message: INVALID_ARGUMENT, "unparseable".
  EXPECT_EQ(send("Push", std::string("\x12\x7f", 2)).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Rejected("unparseable"), 1u);
  const std::string metrics = registry_.Render();
  EXPECT_THAT(metrics, HasSubstr("ps_rejected_requests_total{reason=\"request_too_large\"} 1\n"));
  EXPECT_THAT(metrics, HasSubstr("ps_rejected_requests_total{reason=\"unparseable\"} 1\n"));
  // A message field sent as a varint ("08 00", header = 0), 100,000 times: each is kept as
  // an unknown field, over 1 MiB parsed for 200 KB (counted as nothing at first).
  std::string headers_as_varints;
  for (int i = 0; i < 100000; ++i) headers_as_varints.append("\x08\x00", 2);
  EXPECT_EQ(send("Heartbeat", headers_as_varints).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(Rejected("request_too_large"), 3u);
  // An honest pull is served as before.
  auto honest = SendPull(stub_.get(), -1, 0);
  honest->done.WaitForNotification();
  EXPECT_TRUE(honest->status.ok()) << honest->status.error_message();
}

TEST_F(OverloadTest, LargeRequestsBeyondThePoolCapAreRefusedAndChangeNothing) {
  ServiceOptions options;
  options.max_pool_requests = 2;
  Start(options, GrpcServerOptions{}, LargeJob());
  HoldPool();
  auto first = SendPush(1, 0.125f);
  auto second = SendPush(2, 0.25f);
  service_->WaitForPoolRequestsForTest(2);

  auto over = SendPush(3, 0.5f);
  over->done.WaitForNotification();
  EXPECT_EQ(over->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(over->status.error_message(), HasSubstr("server busy"));
  EXPECT_TRUE(MarkedBusy(over->context));
  EXPECT_EQ(Rejected(kServerBusyReason), 1u);
  EXPECT_THAT(registry_.Render(),
              HasSubstr("ps_rejected_requests_total{reason=\"server_busy\"} 1\n"));
  // Nothing ran or changed: the two held pushes wait, the refused one left no trace.
  EXPECT_EQ(service_->pool_requests(), 2u);
  EXPECT_THAT(Values(), ::testing::Each(1.0f));

  Release();
  for (auto* push : {first.get(), second.get()}) {
    push->done.WaitForNotification();
    ASSERT_TRUE(push->status.ok()) << push->status.error_message();
  }
  // The refused push sent again is applied (its sequence was not taken), once.
  auto again = SendPush(3, 0.5f);
  again->done.WaitForNotification();
  ASSERT_TRUE(again->status.ok()) << again->status.error_message();
  EXPECT_FALSE(again->response.duplicate());
  EXPECT_THAT(Values(), ::testing::Each(1.0f - 0.125f - 0.25f - 0.5f));
  EXPECT_EQ(service_->pool_requests(), 0u);
}

TEST_F(OverloadTest, PoolBytesAreCappedButOneRequestAlwaysGetsIn) {
  ServiceOptions options;
  options.max_pool_request_bytes = 1;  // below any request: only the first gets in
  Start(options, GrpcServerOptions{}, LargeJob());
  HoldPool();
  auto first = SendPush(1, 0.125f);
  service_->WaitForPoolRequestsForTest(1);
  auto over = SendPush(2, 0.25f);
  over->done.WaitForNotification();
  EXPECT_EQ(over->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(MarkedBusy(over->context));
  EXPECT_EQ(Rejected(kServerBusyReason), 1u);
  Release();
  first->done.WaitForNotification();
  ASSERT_TRUE(first->status.ok()) << first->status.error_message();
  EXPECT_THAT(Values(), ::testing::Each(1.0f - 0.125f));
}

// Deterministic BSP: every push goes to the pool, however small.
TEST_F(OverloadTest, DeterministicPushesBeyondThePoolCapAreRefused) {
  ServiceOptions options;
  options.max_pool_requests = 1;
  Start(options, GrpcServerOptions{}, DenseJob(1, 4, 4, "staleness: 0 deterministic: true"));
  HoldPool();
  auto first = SendPush(1, 0.125f, 4);
  service_->WaitForPoolRequestsForTest(1);
  auto over = SendPush(2, 0.25f, 4);
  over->done.WaitForNotification();
  EXPECT_EQ(over->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(MarkedBusy(over->context));
  Release();
  first->done.WaitForNotification();
  ASSERT_TRUE(first->status.ok()) << first->status.error_message();
  EXPECT_THAT(Values(4), ::testing::Each(1.0f - 0.125f));
}

// Deterministic BSP: a push waits for its turn (here worker 0's push of the clock, which does
// not come) until its call's deadline, not the server's max_pull_wait: the worker's next
// attempt then waits in its place. Before, each attempt given up by the worker still waited on
// the server, and the third was refused for good (too_many_waiting, 2 per worker).
TEST_F(OverloadTest, ADeterministicPushWaitsForItsTurnUntilItsCallsDeadline) {
  ServiceOptions options;
  options.max_pull_wait = absl::Seconds(60);
  Start(options, GrpcServerOptions{}, DenseJob(2, 4, 4, "staleness: 0 deterministic: true"));
  auto push_of = [&](int32_t worker) {
    PushRequest push;
    *push.mutable_header() = Header(worker, 1, 1);
    auto* t = push.add_tables();
    t->set_table("w");
    auto* block = t->add_blocks();
    block->set_block_id(0);
    common::EncodeFloats(std::vector<float>(4, 0.25f), ENCODING_FLOAT32, block->mutable_values());
    return push;
  };
  const PushRequest second = push_of(1);
  grpc::ByteBuffer answer;
  for (int attempt = 0; attempt < 3; ++attempt) {
    SCOPED_TRACE(absl::StrCat("attempt ", attempt));
    const absl::Time start = absl::Now();
    absl::Status s = service_->HandlePushPull(common::FrameOf(&second, nullptr),
                                              start + absl::Milliseconds(200), &answer);
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "waited for max_pull_wait";
  }
  EXPECT_EQ(Rejected("too_many_waiting"), 0u);
  // Worker 0's push comes: worker 1's, sent again, is applied after it.
  const PushRequest first = push_of(0);
  std::thread late([&] {
    grpc::ByteBuffer a;
    EXPECT_THAT(service_->HandlePushPull(common::FrameOf(&first, nullptr),
                                         absl::Now() + absl::Seconds(60), &a),
                IsOk());
  });
  EXPECT_THAT(service_->HandlePushPull(common::FrameOf(&second, nullptr),
                                       absl::Now() + absl::Seconds(60), &answer),
              IsOk());
  late.join();
  EXPECT_THAT(Values(4), ::testing::Each(1.0f - 0.25f - 0.25f));
}

// Other refusals are not marked retryable: a pull beyond the parked-pull cap.
TEST_F(OverloadTest, TooManyWaitingPullsAreNotMarkedBusy) {
  ServiceOptions options;
  options.max_parked_pulls_per_worker = 1;
  Start(options, GrpcServerOptions{}, SmallJob());
  auto parked = SendPull(stub_.get(), 0, 1);
  while (shard_->workers().parked() != 1) absl::SleepFor(absl::Milliseconds(1));
  auto over = SendPull(stub_.get(), 0, 1);
  over->done.WaitForNotification();
  EXPECT_EQ(over->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_FALSE(MarkedBusy(over->context));
  // A call's context must outlive it: end the parked pull before its context goes.
  parked->context.TryCancel();
  parked->done.WaitForNotification();
}

// ---- Streams per connection -------------------------------------------------------------

TEST_F(OverloadTest, TheServerAnnouncesItsStreamCap) {
  GrpcServerOptions server_options;
  server_options.max_concurrent_streams = 3;
  Start(ServiceOptions{}, server_options, SmallJob());
  RawConnection c(server_->port());
  ASSERT_TRUE(c.connected());
  EXPECT_EQ(Handshake(&c, kMaxConcurrentStreams), 3u);
}

TEST_F(OverloadTest, APeerOpeningMoreStreamsThanTheCapLosesItsConnection) {
  GrpcServerOptions server_options;
  server_options.max_concurrent_streams = 3;
  Start(ServiceOptions{}, server_options, SmallJob());
  RawConnection c(server_->port());
  ASSERT_TRUE(c.connected());
  ASSERT_EQ(Handshake(&c, kMaxConcurrentStreams), 3u);
  c.SendFrame(kSettings, kAck, 0, "");  // from here on the server holds the peer to it
  // Four calls whose messages never come, then a ping. Frames are read in order: the server
  // answers the ping only if it took the fourth stream.
  for (uint32_t stream = 1; stream <= 7; stream += 2) {
    c.SendFrame(kHeaders, kEndHeaders, stream, PullHeaders());
  }
  c.SendFrame(kPing, 0, 0, std::string(8, '\x07'));
  RawConnection::Frame f;
  bool ping_answered = false;
  bool goaway = false;
  while (!ping_answered && c.Read(&f)) {
    ping_answered = f.type == kPing && (f.flags & kAck) != 0;
    goaway = goaway || f.type == kGoAway;
  }
  EXPECT_FALSE(ping_answered) << "the server took a 4th stream on one connection (cap 3)";
  // The server still serves other connections.
  auto pull = SendPull(NewStub().get(), 1, 0);
  pull->done.WaitForNotification();
  EXPECT_TRUE(pull->status.ok()) << pull->status.error_message();
  (void)goaway;  // GOAWAY or a plain close: either ends the connection
}

// A pull whose answer would be over max_answer_bytes (here block 0, 4.8 MB, named twice
// against 8 MB) is refused before anything is allocated or read, by both wire forms, and the
// push of a PushPull that carries it is not applied; the same block once is served. The
// default limit (512 MiB) refuses a pull of 960 MB in one request of a few hundred bytes.
TEST_F(OverloadTest, APullAnswerOverTheLimitIsRefusedAndChangesNothing) {
  ServiceOptions options;
  options.max_answer_bytes = 8 << 20;
  Start(options, GrpcServerOptions{}, LargeJob());
  auto pull_of = [&](int times) {
    PullRequest pull;
    *pull.mutable_header() = Header(0, 0, 0);
    auto* t = pull.add_tables();
    t->set_table("w");
    for (int i = 0; i < times; ++i) t->add_block_ids(0);
    return pull;
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  PullResponse response;
  absl::Status refused = service_->HandlePull(pull_of(2), deadline, &response);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("bytes, over the server's limit of 8388608"));
  EXPECT_EQ(Rejected("answer_too_large"), 1u);
  EXPECT_THAT(service_->HandlePull(pull_of(1), deadline, &response), IsOk());

  const PushRequest push = PushOfBlock0(Header(0, 0, 1), 0.5f);
  const PullRequest two = pull_of(2);
  grpc::ByteBuffer answer;
  refused = service_->HandlePushPull(common::FrameOf(&push, &two), deadline, &answer);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_EQ(Rejected("answer_too_large"), 2u);
  EXPECT_EQ(Values(), std::vector<float>(kFloats, 1.0f));  // the push was not applied
  const PullRequest one = pull_of(1);
  EXPECT_THAT(service_->HandlePushPull(common::FrameOf(&push, &one), deadline, &answer), IsOk());
  EXPECT_EQ(Values(), std::vector<float>(kFloats, 0.5f));  // 1 - 1 * 0.5

  ParameterServerService defaults(shard_.get(), ServiceOptions{}, ServiceHooks{});
  refused = defaults.HandlePull(pull_of(200), deadline, &response);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
}

// Found in review, 2026-12-05: the size check counted the values only, but a protobuf answer
// echoes each key (8 bytes): a sparse pull of 1-float rows whose values fit and whose
// answer did not was read whole (every row created) before gRPC refused to send it.
constexpr char kSparseJob[] = R"pb(
  cluster { num_servers: 1 num_workers: 1 }
  security { plaintext: true }
  tables {
    name: "e"
    kind: TABLE_KIND_SPARSE
    dim: 1
    optimizer { kind: SGD }
  }
)pb";

TEST_F(OverloadTest, ASparsePullWhoseEchoedKeysPassTheLimitIsRefusedAndCreatesNoRows) {
  ServiceOptions options;
  options.max_answer_bytes = 1 << 20;
  Start(options, GrpcServerOptions{}, kSparseJob);
  PullRequest pull;
  *pull.mutable_header() = Header(-1, 0, 0);
  auto* t = pull.add_tables();
  t->set_table("e");
  for (uint64_t k = 0; k < 200000; ++k) t->add_keys(k);  // values 800 KB, keys 1.6 MB more
  PullResponse response;
  const absl::Status refused =
      service_->HandlePull(pull, absl::Now() + absl::Seconds(60), &response);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_EQ(Rejected("answer_too_large"), 1u);
  StatsResponse stats;
  shard_->FillStats(&stats);
  ASSERT_EQ(stats.tables_size(), 1);
  EXPECT_EQ(stats.tables(0).rows(), 0u);
  t->mutable_keys()->Truncate(50000);  // 200 KB + 400 KB
  EXPECT_THAT(service_->HandlePull(pull, absl::Now() + absl::Seconds(60), &response), IsOk());
  EXPECT_EQ(response.tables(0).keys_size(), 50000);
}

// Found in review, 2026-12-05: a call through a shared-memory channel whose pull's values fit
// neither the segment's room nor the channel's slot had its push applied and up to
// max_answer_bytes read on the channel's thread, then its answer dropped (ABORTED). Refused
// before the push now.
TEST_F(OverloadTest, AChannelCallWhoseAnswerCannotFitIsRefusedBeforeItsPush) {
  Start(ServiceOptions{}, GrpcServerOptions{}, LargeJob());
  const PushRequest push = PushOfBlock0(Header(0, 0, 1), 0.5f);
  PullRequest pull;
  *pull.mutable_header() = Header(0, 0, 0);
  pull.add_tables()->set_table("w");
  pull.mutable_tables(0)->add_block_ids(0);  // 4.8 MB of values
  grpc::ByteBuffer frame = common::FrameOf(&push, &pull);
  grpc::ByteBuffer answer;
  absl::Notification done;
  absl::Status status;
  service_->StartPushPullForTest(
      &frame, absl::Now() + absl::Seconds(60), &answer,
      [&](absl::Status s) {
        status = std::move(s);
        done.Notify();
      },
      /*from_channel=*/true);
  done.WaitForNotification();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(status.message(), HasSubstr("send it by the socket"));
  EXPECT_EQ(Rejected("answer_too_large"), 1u);
  EXPECT_EQ(Values(), std::vector<float>(kFloats, 1.0f));  // the push was not applied
}

// A peer that takes no byte of its answers (stream windows of 0): the server holds them
// until the call ends, and while they are over max_unsent_answer_bytes new pulls are refused
// as busy (retryable) instead of piling up more.
TEST_F(OverloadTest, AnswersPeersDoNotTakeAreCapped) {
  ServiceOptions options;
  options.max_unsent_answer_bytes = 1 << 20;
  Start(options, GrpcServerOptions{}, LargeJob());
  RawConnection c(server_->port());
  ASSERT_NO_FATAL_FAILURE(PullWithoutReading(&c));

  auto refused = SendPull(stub_.get(), 0, 0);
  refused->done.WaitForNotification();
  EXPECT_EQ(refused->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused->status.error_message(), HasSubstr("answers wait for their peers"));
  EXPECT_TRUE(MarkedBusy(refused->context));
  EXPECT_EQ(Rejected(kServerBusyReason), 1u);

  // The peer goes: its call ends, the server lets go of its answer and serves pulls again.
  c.Close();
  while (service_->unsent_answer_bytes() != 0) absl::SleepFor(absl::Milliseconds(1));
  auto served = SendPull(stub_.get(), 0, 0);
  served->done.WaitForNotification();
  EXPECT_TRUE(served->status.ok()) << served->status.error_message();
}

// One connection that takes no byte of its answers holds more than its own cap: its next
// pull is refused as busy, while another connection's pulls are still served (the server-wide
// cap is far away). Without the per-connection cap the peer could hold the whole server-wide
// budget, and every other peer's pulls would be refused.
TEST_F(OverloadTest, AnswersOnePeerDoesNotTakeAreCappedForThatPeerOnly) {
  ServiceOptions options;
  options.max_unsent_answer_bytes_per_peer = 1 << 20;
  Start(options, GrpcServerOptions{}, LargeJob());
  RawConnection c(server_->port());
  ASSERT_NO_FATAL_FAILURE(PullWithoutReading(&c));
  const size_t held = service_->unsent_answer_bytes();
  // The same peer asks again: refused (counted), its answer would pile up too.
  SendRawPull(&c, 3, Header(-1, 0, 0));
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (Rejected(kServerBusyReason) == 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(Rejected(kServerBusyReason), 1u);
  EXPECT_EQ(service_->unsent_answer_bytes(), held);  // nothing more held

  // Another connection is served as usual.
  auto served = SendPull(stub_.get(), 0, 0);
  served->done.WaitForNotification();
  EXPECT_TRUE(served->status.ok()) << served->status.error_message();
  EXPECT_EQ(Rejected(kServerBusyReason), 1u);

  c.Close();
  while (service_->unsent_answer_bytes() != 0) absl::SleepFor(absl::Milliseconds(1));
}

// A gRPC client queues the calls beyond the cap: five pulls that must wait for the bound,
// on one connection whose cap is 3, with at most 3 parked per worker. Were more than 3 at
// the server at once, the others would get RESOURCE_EXHAUSTED (too_many_waiting).
TEST_F(OverloadTest, OneConnectionHasAtMostTheCapOfCallsAtTheServer) {
  GrpcServerOptions server_options;
  server_options.max_concurrent_streams = 3;
  ServiceOptions options;
  options.max_parked_pulls_per_worker = 3;
  Start(options, server_options, SmallJob());
  std::vector<std::unique_ptr<PendingPull>> pulls;
  for (int i = 0; i < 5; ++i) pulls.push_back(SendPull(stub_.get(), 0, 1));
  while (shard_->workers().parked() != 3) absl::SleepFor(absl::Milliseconds(1));
  // Both workers reach clock 1 (on another connection: this one is full).
  std::unique_ptr<ParameterServer::Stub> other = NewStub();
  for (int32_t worker : {0, 1}) {
    PushRequest request;
    *request.mutable_header() = Header(worker, 1, 1);
    auto* t = request.add_tables();
    t->set_table("w");
    auto* block = t->add_blocks();
    block->set_block_id(0);
    common::EncodeFloats(std::vector<float>(4, 0.25f), ENCODING_FLOAT32,
                         block->mutable_values());
    PushResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    grpc::Status status = other->Push(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  for (const auto& pull : pulls) {
    pull->done.WaitForNotification();
    EXPECT_TRUE(pull->status.ok()) << pull->status.error_message();
  }
  EXPECT_EQ(Rejected("too_many_waiting"), 0u);
}

}  // namespace
}  // namespace ps::server
