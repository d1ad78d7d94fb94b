// HTTP/2 flow control on the data path: a large message goes out whole without waiting for the
// receiver. The worker's store talks to a real GrpcServer on 127.0.0.1 through a proxy in this
// test; once the connection is warm, the proxy holds back everything the receiving side sends
// (its WINDOW_UPDATEs included) and counts what the sending side still manages to send. If
// either end's connection window were stuck at HTTP/2's initial 64 KB (as it is in gRPC 1.51
// with the bandwidth-delay probe off: common/rpc/credentials.cc), a 1 MB push or pull would
// stop after about 64 KB until the held-back window update arrived, a round trip and two
// wake-ups per large message.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/config/config.h"
#include "common/status_matchers.h"
#include "gtest/gtest.h"
#include "server/rpc/grpc_server.h"
#include "server/rpc/service.h"
#include "server/shard.h"
#include "worker/rpc/grpc_store.h"

namespace ps {
namespace {

using ::ps::common::IsOk;

constexpr size_t kFloats = 262144;  // 1 MB: one block on the one server
constexpr uint64_t kBytes = kFloats * sizeof(float);
// Far more than a control frame, far less than HTTP/2's initial 64 KB window.
constexpr uint64_t kHoldAfterBytes = 4096;

// A TCP proxy on 127.0.0.1 port 0 to one upstream port. Each direction can be held: what
// arrives for it is kept, not forwarded, until it is released. HoldRepliesToNext(d) holds the
// direction against d once kHoldAfterBytes more have arrived in direction d: the start of the
// next message, not a control frame (a PING or WINDOW_UPDATE of 13-17 bytes) that either end
// may send at any time. Held on such a frame, the pull test once held back the worker's
// request itself, and the server never answered. Counts the bytes forwarded in each direction.
class HoldingProxy {
 public:
  enum Direction { kToServer = 0, kToClient = 1 };

  explicit HoldingProxy(int upstream_port) : upstream_port_(upstream_port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = Loopback(0);
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(listen_fd_, 8), 0);
    socklen_t len = sizeof(addr);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }

  ~HoldingProxy() {
    stop_ = true;
    accept_thread_.join();
    for (std::thread& t : pumps_) t.join();
    close(listen_fd_);
    for (int fd : fds_) close(fd);
  }

  int port() const { return port_; }
  uint64_t forwarded(Direction d) const { return forwarded_[d].load(); }
  static Direction Against(Direction d) { return d == kToServer ? kToClient : kToServer; }
  void HoldRepliesToNext(Direction d) {
    since_armed_[d] = 0;
    armed_[d] = true;
  }
  void Release(Direction d) { held_[d] = false; }

 private:
  static sockaddr_in Loopback(int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return addr;
  }

  void AcceptLoop() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const int client = accept(listen_fd_, nullptr, nullptr);
      if (client < 0) continue;
      const int server = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr = Loopback(upstream_port_);
      if (connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        close(client);
        close(server);
        continue;
      }
      fds_.push_back(client);
      fds_.push_back(server);
      pumps_.emplace_back([this, client, server] { Pump(client, server, kToServer); });
      pumps_.emplace_back([this, client, server] { Pump(server, client, kToClient); });
    }
  }

  // Copies from -> to until either end closes or the proxy stops; while the direction is
  // held, keeps what it reads.
  void Pump(int from, int to, Direction d) {
    std::string kept;
    std::vector<char> buffer(1 << 20);
    bool open = true;
    while (!stop_ && (open || !kept.empty())) {
      if (!held_[d] && !kept.empty()) {
        if (!WriteAll(to, kept.data(), kept.size())) return;
        forwarded_[d] += kept.size();
        kept.clear();
      }
      if (!open) {  // the source is done: wait for the release of what is kept
        absl::SleepFor(absl::Milliseconds(1));
        continue;
      }
      pollfd p{from, POLLIN, 0};
      if (poll(&p, 1, 5) <= 0) continue;
      const ssize_t n = read(from, buffer.data(), buffer.size());
      if (n <= 0) {
        open = false;
        if (kept.empty()) break;
        continue;
      }
      if (armed_[d] && (since_armed_[d] += n) >= kHoldAfterBytes) {
        armed_[d] = false;
        held_[Against(d)] = true;
      }
      if (held_[d]) {
        kept.append(buffer.data(), n);
      } else {
        if (!WriteAll(to, buffer.data(), n)) return;
        forwarded_[d] += n;
      }
    }
    shutdown(to, SHUT_WR);
  }

  static bool WriteAll(int fd, const char* data, size_t size) {
    while (size > 0) {
      // No SIGPIPE when the far end has gone (at teardown): the pump just stops.
      const ssize_t n = send(fd, data, size, MSG_NOSIGNAL);
      if (n <= 0) return false;
      data += n;
      size -= n;
    }
    return true;
  }

  const int upstream_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> held_[2] = {false, false};
  std::atomic<bool> armed_[2] = {false, false};
  std::atomic<uint64_t> since_armed_[2] = {0, 0};  // bytes in direction d since it was armed
  std::atomic<uint64_t> forwarded_[2] = {0, 0};
  std::thread accept_thread_;
  std::vector<std::thread> pumps_;  // written only by the accept thread, joined after it
  std::vector<int> fds_;            // likewise
};

class FlowWindowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto config = common::ParseJobConfigText(absl::StrCat(R"pb(
      cluster { num_servers: 1 num_workers: 1 dense_block_floats: )pb", kFloats, R"pb( }
      tables { name: "w" kind: TABLE_KIND_DENSE shape: )pb", kFloats, R"pb(
               initializer { kind: ZEROS } optimizer { kind: SGD learning_rate: 0.001 } }
      security { plaintext: true }
    )pb"), "test");
    ASSERT_THAT(config.status(), IsOk());
    config_ = *config;
    auto shard = server::Shard::Create(config_, server::ShardOptions{});
    ASSERT_THAT(shard.status(), IsOk());
    shard_ = *std::move(shard);
    server::ServiceOptions service_options;
    service_options.auth.check_identities = false;  // plaintext
    service_ = std::make_unique<server::ParameterServerService>(shard_.get(), service_options,
                                                                server::ServiceHooks{});
    server::GrpcServerOptions server_options;
    server_options.address = "127.0.0.1:0";
    auto server = server::GrpcServer::Start(server_options, config_.security(), service_.get());
    ASSERT_THAT(server.status(), IsOk());
    server_ = *std::move(server);
    proxy_ = std::make_unique<HoldingProxy>(server_->port());
    config_.mutable_cluster()->add_servers(absl::StrCat("127.0.0.1:", proxy_->port()));
    worker::GrpcStoreOptions options;
    options.deadline = absl::Seconds(30);
    options.max_retries = 0;
    auto store = worker::GrpcParameterStore::Create(config_, options);
    ASSERT_THAT(store.status(), IsOk());
    store_ = *std::move(store);
    // Warm the connection up both ways: the probe sizes each end's window from what it has
    // received.
    for (int i = 0; i < 20; ++i) {
      ASSERT_THAT(Push(), IsOk());
      ASSERT_THAT(Pull(), IsOk());
    }
  }

  void TearDown() override {
    store_.reset();
    proxy_.reset();
    server_.reset();
    service_.reset();
  }

  absl::Status Push() {
    common::PushBatch batch;
    batch.dense.push_back({"w", gradient_});
    return store_->Push(batch, common::PushOptions{++clock_, false});
  }

  absl::Status Pull() {
    common::PullBatch batch;
    batch.dense.push_back({"w", absl::MakeSpan(parameters_)});
    return store_->Pull(batch, common::PullOptions{});
  }

  // Runs `call`, whose large message flows in direction `d`, while the proxy holds back
  // everything the receiver sends once that message starts; returns the bytes that went in
  // direction `d` during the hold (at most 10 s), then releases the hold.
  uint64_t SentWhileTheReceiverIsHeldBack(HoldingProxy::Direction d,
                                          const std::function<absl::Status()>& call,
                                          absl::Status* status) {
    const uint64_t before = proxy_->forwarded(d);
    proxy_->HoldRepliesToNext(d);
    std::thread caller([&] { *status = call(); });
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (proxy_->forwarded(d) - before < kBytes && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    const uint64_t sent = proxy_->forwarded(d) - before;
    proxy_->Release(HoldingProxy::Against(d));
    caller.join();
    return sent;
  }

  JobConfig config_;
  std::unique_ptr<server::Shard> shard_;
  std::unique_ptr<server::ParameterServerService> service_;
  std::unique_ptr<server::GrpcServer> server_;
  std::unique_ptr<HoldingProxy> proxy_;
  std::unique_ptr<worker::GrpcParameterStore> store_;
  std::vector<float> gradient_ = std::vector<float>(kFloats, 1e-3f);
  std::vector<float> parameters_ = std::vector<float>(kFloats);
  int64_t clock_ = 0;
};

TEST_F(FlowWindowTest, APushGoesOutWholeBeforeTheServerSaysAnything) {
  absl::Status status;
  const uint64_t sent =
      SentWhileTheReceiverIsHeldBack(HoldingProxy::kToServer, [this] { return Push(); }, &status);
  EXPECT_GE(sent, kBytes) << "the worker stopped sending its 1 MB push after " << sent
                          << " bytes, waiting for the server's window update";
  EXPECT_THAT(status, IsOk());
}

TEST_F(FlowWindowTest, APullAnswerGoesOutWholeBeforeTheWorkerSaysAnything) {
  absl::Status status;
  const uint64_t sent =
      SentWhileTheReceiverIsHeldBack(HoldingProxy::kToClient, [this] { return Pull(); }, &status);
  EXPECT_GE(sent, kBytes) << "the server stopped sending its 1 MB answer after " << sent
                          << " bytes, waiting for the worker's window update";
  EXPECT_THAT(status, IsOk());
}

}  // namespace
}  // namespace ps
