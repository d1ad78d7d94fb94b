// The fixture of the tests of what a client can make a GrpcServer hold (overload_test.cc,
// service_queue_test.cc): a server of a test job whose service has one pool thread, calls
// sent with the callback API, and a bare HTTP/2 peer (RawConnection) that sends what a gRPC
// client would not, such as calls whose answers it never takes. Test-only.
#ifndef PS_SERVER_RPC_OVERLOAD_TEST_FIXTURE_H_
#define PS_SERVER_RPC_OVERLOAD_TEST_FIXTURE_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/codec.h"
#include "common/config/config.h"
#include "common/metrics/metrics.h"
#include "common/rpc/grpc_status.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/rpc/grpc_server.h"
#include "server/rpc/service.h"

namespace ps::server {

// Values of "w": a push of all of them is a request of about 4.8 MB, over the 4 MB from
// which requests are served on the pool.
inline constexpr int kFloats = 1200000;

// One call sent with the callback API; `done` is notified with its status.
template <class Request, class Response>
struct Pending {
  grpc::ClientContext context;
  Request request;
  Response response;
  grpc::Status status;
  absl::Notification done;
};
using PendingPush = Pending<PushRequest, PushResponse>;
using PendingPull = Pending<PullRequest, PullResponse>;

// ---- A bare HTTP/2 peer ------------------------------------------------------------------

// A bare HTTP/2 connection (h2c, prior knowledge) to the test's server: what a peer that
// does not go through a gRPC client can send.
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    timeval timeout{30, 0};  // a safety net against a hung test, not an assertion
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawConnection() { Close(); }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  bool connected() const { return connected_; }

  void Send(const std::string& bytes) {
    ASSERT_EQ(send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  void SendFrame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload) {
    std::string f;
    f.push_back(static_cast<char>(payload.size() >> 16));
    f.push_back(static_cast<char>(payload.size() >> 8));
    f.push_back(static_cast<char>(payload.size()));
    f.push_back(static_cast<char>(type));
    f.push_back(static_cast<char>(flags));
    for (int shift = 24; shift >= 0; shift -= 8) f.push_back(static_cast<char>(stream >> shift));
    Send(f + payload);
  }

  struct Frame {
    uint8_t type = 0;
    uint8_t flags = 0;
    std::string payload;
  };
  // The next frame; false at the end of the connection (or an error).
  bool Read(Frame* frame) {
    std::string header;
    if (!ReadExactly(9, &header)) return false;
    const size_t length = (static_cast<uint8_t>(header[0]) << 16) |
                          (static_cast<uint8_t>(header[1]) << 8) | static_cast<uint8_t>(header[2]);
    frame->type = static_cast<uint8_t>(header[3]);
    frame->flags = static_cast<uint8_t>(header[4]);
    return ReadExactly(length, &frame->payload);
  }

 private:
  bool ReadExactly(size_t n, std::string* out) {
    out->resize(n);
    for (size_t got = 0; got < n;) {
      const ssize_t r = recv(fd_, out->data() + got, n - got, 0);
      if (r <= 0) return false;
      got += static_cast<size_t>(r);
    }
    return true;
  }

  int fd_ = -1;
  bool connected_ = false;
};

inline constexpr uint8_t kData = 0x0, kHeaders = 0x1, kSettings = 0x4, kPing = 0x6, kGoAway = 0x7;
inline constexpr uint8_t kAck = 0x1, kEndStream = 0x1, kEndHeaders = 0x4;
inline constexpr uint16_t kMaxConcurrentStreams = 0x3;

// Opens the connection (preface, SETTINGS with `settings`) and returns the server's
// SETTINGS value of `id` (0 when not sent).
inline uint32_t Handshake(RawConnection* c, uint16_t id, const std::string& settings = "") {
  c->Send("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
  c->SendFrame(kSettings, 0, 0, settings);
  RawConnection::Frame f;
  while (c->Read(&f)) {
    if (f.type != kSettings || (f.flags & kAck) != 0) continue;
    uint32_t value = 0;
    for (size_t i = 0; i + 6 <= f.payload.size(); i += 6) {
      const auto* p = reinterpret_cast<const uint8_t*>(f.payload.data() + i);
      if (((p[0] << 8) | p[1]) == id) {
        value = (uint32_t{p[2]} << 24) | (uint32_t{p[3]} << 16) | (uint32_t{p[4]} << 8) | p[5];
      }
    }
    return value;
  }
  return 0;
}

// HPACK: a literal header field without indexing, new name (RFC 7541 6.2.2), short strings.
inline std::string Literal(const std::string& name, const std::string& value) {
  return std::string(1, '\0') + static_cast<char>(name.size()) + name +
         static_cast<char>(value.size()) + value;
}

// The headers of a call of `method` ("/ps.ParameterServer/Pull").
inline std::string CallHeaders(const std::string& method) {
  return Literal(":method", "POST") + Literal(":scheme", "http") + Literal(":path", method) +
         Literal(":authority", "localhost") + Literal("content-type", "application/grpc") +
         Literal("te", "trailers");
}

// The headers of a Pull call (whose message, when it never comes, holds the stream open).
inline std::string PullHeaders() { return CallHeaders("/ps.ParameterServer/Pull"); }

// A whole call of `method` with the message `message` on `stream` of a bare connection (in
// one DATA frame: REQUIRES a message under 16 KB, HTTP/2's default frame size).
inline void SendRawCall(RawConnection* c, uint32_t stream, const std::string& method,
                        const std::string& message) {
  std::string grpc_message(1, '\0');  // not compressed, then the length (big-endian)
  for (int shift = 24; shift >= 0; shift -= 8) {
    grpc_message.push_back(static_cast<char>(message.size() >> shift));
  }
  c->SendFrame(kHeaders, kEndHeaders, stream, CallHeaders(method));
  c->SendFrame(kData, kEndStream, stream, grpc_message + message);
}

// A whole Pull call of block 0 of "w" with `header` on `stream` of a bare connection.
inline void SendRawPull(RawConnection* c, uint32_t stream, const RequestHeader& header) {
  PullRequest pull;
  *pull.mutable_header() = header;
  pull.add_tables()->set_table("w");
  pull.mutable_tables(0)->add_block_ids(0);
  SendRawCall(c, stream, "/ps.ParameterServer/Pull", pull.SerializeAsString());
}

// A whole PushPull call of `frame` on `stream` of a bare connection.
inline void SendRawPushPull(RawConnection* c, uint32_t stream, const grpc::ByteBuffer& frame) {
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(frame.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  SendRawCall(c, stream, "/ps.ParameterServer/PushPull", bytes);
}

// ---- The fixture -------------------------------------------------------------------------

class OverloadTest : public ::testing::Test {
 protected:
  // One server of `config_text`'s job (a table "w" of `floats` values, initial value 1,
  // SGD with rate 1), its service on one pool thread.
  void Start(ServiceOptions options, GrpcServerOptions server_options,
             const std::string& config_text) {
    auto config = common::ParseJobConfigText(config_text, "test");
    ASSERT_THAT(config.status(), ::ps::common::IsOk());
    config_ = *config;
    auto shard = Shard::Create(config_, ShardOptions{});
    ASSERT_THAT(shard.status(), ::ps::common::IsOk());
    shard_ = *std::move(shard);
    options.num_threads = 1;
    options.auth.check_identities = false;
    service_ =
        std::make_unique<ParameterServerService>(shard_.get(), options, ServiceHooks{}, &registry_);
    server_options.address = "127.0.0.1:0";
    auto server = GrpcServer::Start(server_options, config_.security(), service_.get());
    ASSERT_THAT(server.status(), ::ps::common::IsOk());
    server_ = *std::move(server);
    stub_ = NewStub();
  }

  // A stub on a connection of its own.
  std::unique_ptr<ParameterServer::Stub> NewStub() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetMaxReceiveMessageSize(-1);
    return ParameterServer::NewStub(grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", server_->port()), grpc::InsecureChannelCredentials(), args));
  }

  void TearDown() override {
    Release();  // the pool's thread, when a test held it
    if (shard_ != nullptr) shard_->workers().CloseWaiters(absl::UnavailableError("stopping"));
    server_.reset();
    service_.reset();
  }

  // Holds the service's one pool thread until TearDown or Release.
  void HoldPool() {
    service_->RunOnPoolForTest([this] { release_.WaitForNotification(); });
  }
  void Release() {
    if (!release_.HasBeenNotified()) release_.Notify();
  }

  RequestHeader Header(int32_t worker, int64_t clock, uint64_t sequence) {
    RequestHeader h;
    h.set_worker_id(worker);
    h.set_worker_incarnation(1);
    h.set_sequence(sequence);
    h.set_clock(clock);
    h.set_layout_fingerprint(shard_->partitioner().layout_fingerprint());
    return h;
  }

  // A push of gradient `g` for every value of "w" (its block 0) with `header`.
  static PushRequest PushOfBlock0(const RequestHeader& header, float g, int floats = kFloats) {
    PushRequest push;
    *push.mutable_header() = header;
    auto* t = push.add_tables();
    t->set_table("w");
    auto* block = t->add_blocks();
    block->set_block_id(0);
    common::EncodeFloats(std::vector<float>(floats, g), ENCODING_FLOAT32, block->mutable_values());
    return push;
  }
  // Sends a push of gradient `g` for every value of "w" as worker 0, not waiting for it.
  std::unique_ptr<PendingPush> SendPush(uint64_t sequence, float g, int floats = kFloats) {
    auto push = std::make_unique<PendingPush>();
    push->request = PushOfBlock0(Header(0, 0, sequence), g, floats);
    push->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    PendingPush* p = push.get();
    stub_->async()->Push(&p->context, &p->request, &p->response, [p](grpc::Status status) {
      p->status = std::move(status);
      p->done.Notify();
    });
    return push;
  }

  // Sends a pull of "w" as `worker` at `clock` on `stub`, not waiting for it.
  std::unique_ptr<PendingPull> SendPull(ParameterServer::Stub* stub, int32_t worker,
                                        int64_t clock) {
    auto pull = std::make_unique<PendingPull>();
    *pull->request.mutable_header() = Header(worker, clock, 0);
    auto* t = pull->request.add_tables();
    t->set_table("w");
    t->add_block_ids(0);
    pull->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    PendingPull* p = pull.get();
    stub->async()->Pull(&p->context, &p->request, &p->response, [p](grpc::Status status) {
      p->status = std::move(status);
      p->done.Notify();
    });
    return pull;
  }

  // The values of "w", read through the service's handler (no pool, no gRPC).
  std::vector<float> Values(int floats = kFloats) {
    PullRequest request;
    *request.mutable_header() = Header(-1, 0, 0);
    auto* t = request.add_tables();
    t->set_table("w");
    t->add_block_ids(0);
    PullResponse response;
    EXPECT_THAT(service_->HandlePull(request, absl::Now() + absl::Seconds(60), &response),
                ::ps::common::IsOk());
    std::vector<float> values(floats);
    EXPECT_THAT(common::DecodeFloats(response.tables(0).blocks(0).values(), ENCODING_FLOAT32,
                                     absl::MakeSpan(values)),
                ::ps::common::IsOk());
    return values;
  }

  uint64_t Rejected(const std::string& reason) {
    StatsResponse stats;
    shard_->FillStats(&stats);
    auto it = stats.rejected().find(reason);
    return it == stats.rejected().end() ? 0 : it->second;
  }

  static bool MarkedBusy(const grpc::ClientContext& context) {
    return context.GetServerTrailingMetadata().count(common::kServerBusyMetadata) > 0;
  }

  // A bare peer that takes no byte of its answers (stream windows of 0) pulls block 0 of "w";
  // returns once the server holds the answer.
  void PullWithoutReading(RawConnection* c) {
    ASSERT_NO_FATAL_FAILURE(OpenWithoutWindow(c));
    SendRawPull(c, 1, Header(-1, 0, 0));
    while (service_->unsent_answer_bytes() < kFloats * sizeof(float)) {
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  // Opens `c` as a peer that takes no byte of its answers (stream windows of 0).
  static void OpenWithoutWindow(RawConnection* c) {
    ASSERT_TRUE(c->connected());
    const std::string no_window("\x00\x04\x00\x00\x00\x00", 6);  // INITIAL_WINDOW_SIZE 0
    Handshake(c, kMaxConcurrentStreams, no_window);
    c->SendFrame(kSettings, kAck, 0, "");
  }

  common::metrics::Registry registry_;
  JobConfig config_;
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<ParameterServerService> service_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<ParameterServer::Stub> stub_;
  absl::Notification release_;
};

// A table of `shape` values named `name`, initial values 1, SGD at rate 1.
inline std::string DenseTableText(absl::string_view name, uint64_t shape) {
  return absl::StrCat("tables { name: '", name, "' kind: TABLE_KIND_DENSE shape: ", shape,
                      " initializer { kind: CONSTANT value: 1 }",
                      " optimizer { kind: SGD learning_rate: 1 } }\n");
}

// A plaintext job of one server and `workers` workers with `training` (e.g. "staleness: 0")
// and a dense table "w" of `shape` values in blocks of `block_floats`, then `more` tables.
inline std::string DenseJob(int workers, uint64_t block_floats, uint64_t shape,
                            absl::string_view training = "", absl::string_view more = "") {
  return absl::StrCat("cluster { num_servers: 1 num_workers: ", workers,
                      " dense_block_floats: ", block_floats, " num_virtual_shards: 8 }\n",
                      "training { ", training, " }\nsecurity { plaintext: true }\n",
                      DenseTableText("w", shape), more);
}

// An asynchronous job with one dense block of kFloats values.
inline std::string LargeJob() { return DenseJob(1, 2097152, 1200000); }

// BSP, two workers, one block "w" of 4 values.
inline std::string SmallJob() { return DenseJob(2, 4, 4, "staleness: 0"); }

}  // namespace ps::server

#endif  // PS_SERVER_RPC_OVERLOAD_TEST_FIXTURE_H_
