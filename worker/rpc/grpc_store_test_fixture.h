// The fake server and fixture of GrpcParameterStore's tests: a fake ParameterServer on an
// in-process channel (no sockets).
#ifndef PS_WORKER_RPC_GRPC_STORE_TEST_FIXTURE_H_
#define PS_WORKER_RPC_GRPC_STORE_TEST_FIXTURE_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/config/config.h"
#include "common/rpc/frame.h"
#include "common/rpc/frame_testing.h"
#include "common/rpc/grpc_status.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"
#include "proto/ps.grpc.pb.h"
#include "worker/rpc/grpc_async_calls.h"
#include "worker/rpc/grpc_store.h"

namespace ps::worker {

// Starts a gRPC server in this process serving `service`, and a store of `config` whose
// `servers` servers all reach it through in-process channels.
inline void StartInProcess(grpc::Service* service, int servers, const JobConfig& config,
                           const GrpcStoreOptions& options, std::unique_ptr<grpc::Server>* server,
                           std::unique_ptr<GrpcParameterStore>* store) {
  grpc::ServerBuilder builder;
  builder.RegisterService(service);
  *server = builder.BuildAndStart();
  ASSERT_NE(*server, nullptr);
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int s = 0; s < servers; ++s) {
    channels.push_back((*server)->InProcessChannel(grpc::ChannelArguments()));
  }
  auto made = GrpcParameterStore::CreateWithChannels(config, options, std::move(channels));
  ASSERT_TRUE(made.ok()) << made.status();
  *store = std::move(*made);
}

// Records every push it receives (the PushPull frames the store sends, as the PushRequest
// each stands for) and answers the first `fail_pushes` with `code` (marked as a busy
// server's refusal when `busy`). With Hold(n) it keeps its answers back until n calls have
// arrived (then answers them all); with AnswerGarbage() it answers bytes that are no frame,
// with Answer(frame) that frame.
class RecordingServer final
    : public ParameterServer::WithRawCallbackMethod_PushPull<ParameterServer::CallbackService> {
 public:
  RecordingServer(int fail_pushes, grpc::StatusCode code, bool busy)
      : code_(code), busy_(busy), fail_pushes_(fail_pushes) {}

  grpc::ServerUnaryReactor* PushPull(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::StatusOr<PushRequest> push = common::PushOfFrame(*request);
    EXPECT_TRUE(push.ok()) << push.status();
    PushPullRequest header;
    common::FrameReader reader;
    EXPECT_TRUE(common::FrameReader::Open(*request, size_t{1} << 20, &header, &reader).ok());
    absl::MutexLock lock(&mu_);
    pushes_.push_back(push.ok() ? *push : PushRequest());
    asks_.push_back(header.want_shared_bytes());
    ask_boot_ids_.push_back(header.want_shared_boot_id());
    declines_.push_back(header.declined_shared_id());
    shared_.push_back(header.has_shared());
    if (fail_pushes_ > 0) {
      --fail_pushes_;
      if (busy_) context->AddTrailingMetadata(common::kServerBusyMetadata, "1");
      reactor->Finish(grpc::Status(code_, "dropped for the test"));
      return reactor;
    }
    if (garbage_) {
      grpc::Slice bytes(std::string("no frame"));
      *response = grpc::ByteBuffer(&bytes, 1);
    } else if (answer_.has_value()) {
      *response = *answer_;
    } else {
      *response = common::FrameBuilder(PushPullResponse()).Build();
    }
    held_.push_back({reactor, context});
    if (held_.size() >= hold_) ReleaseLocked();
    return reactor;
  }

  // Answers the first `fail_heartbeats` heartbeats with UNAVAILABLE, the others with the
  // position they report.
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const HeartbeatRequest* request,
                                      HeartbeatResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::MutexLock lock(&mu_);
    ++heartbeats_;
    if (fail_heartbeats_ > 0) {
      --fail_heartbeats_;
      reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "dropped for the test"));
      return reactor;
    }
    response->set_epoch(request->epoch());
    response->set_data_offset(request->data_offset());
    response->set_clock(heartbeat_clock_);
    for (int i = 0; i < heartbeat_padding_; ++i) {
      response->GetReflection()->MutableUnknownFields(response)->AddVarint(999, 1);
    }
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  // Answers ServerInfo as server 0 of layout `fingerprint`, with `padding` unknown fields more
  // (three bytes each on the wire).
  grpc::ServerUnaryReactor* ServerInfo(grpc::CallbackServerContext* context,
                                       const ServerInfoRequest*,
                                       ServerInfoResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::MutexLock lock(&mu_);
    response->set_server_index(0);
    response->set_layout_fingerprint(info_fingerprint_);
    for (int i = 0; i < info_padding_; ++i) {
      response->GetReflection()->MutableUnknownFields(response)->AddVarint(999, 1);
    }
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  void AnswerServerInfo(uint64_t fingerprint, int padding) {
    absl::MutexLock lock(&mu_);
    info_fingerprint_ = fingerprint;
    info_padding_ = padding;
  }
  // The clock heartbeats answer (0 until set).
  void AnswerHeartbeatsWithClock(int64_t clock) {
    absl::MutexLock lock(&mu_);
    heartbeat_clock_ = clock;
  }
  // Answers the next `n` pushes with the code given at construction.
  void FailPushes(int n) {
    absl::MutexLock lock(&mu_);
    fail_pushes_ = n;
  }
  // Heartbeats are answered with `n` unknown fields more (three bytes each on the wire).
  void PadHeartbeats(int n) {
    absl::MutexLock lock(&mu_);
    heartbeat_padding_ = n;
  }
  void FailHeartbeats(int n) {
    absl::MutexLock lock(&mu_);
    fail_heartbeats_ = n;
  }
  int heartbeats() {
    absl::MutexLock lock(&mu_);
    return heartbeats_;
  }

  void Hold(size_t n) {
    absl::MutexLock lock(&mu_);
    hold_ = n;
  }
  // Answers every call held back.
  void Release() {
    absl::MutexLock lock(&mu_);
    ReleaseLocked();
  }
  // Finishes the calls held back whose clients gave up on them (a deadline, a cancel), and
  // returns how many it finished. Until then a held call keeps its request, whose payload
  // slices (in-process: no socket in between) are the client's own memory.
  int FinishCancelled() {
    absl::MutexLock lock(&mu_);
    int finished = 0;
    for (size_t i = 0; i < held_.size();) {
      if (!held_[i].second->IsCancelled()) {
        ++i;
        continue;
      }
      finished_cancelled_.fetch_add(1);  // before the request goes
      held_[i].first->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "given up"));
      held_.erase(held_.begin() + i);
      ++finished;
    }
    return finished;
  }
  // Whether a held call's client gave up on it.
  bool AnyHeldCancelled() {
    absl::MutexLock lock(&mu_);
    for (auto [r, context] : held_) {
      if (context->IsCancelled()) return true;
    }
    return false;
  }
  // Calls FinishCancelled finished (or is finishing).
  int finished_cancelled() const { return finished_cancelled_.load(); }
  void AnswerGarbage() {
    absl::MutexLock lock(&mu_);
    garbage_ = true;
  }
  void Answer(grpc::ByteBuffer frame) {
    absl::MutexLock lock(&mu_);
    answer_ = std::move(frame);
  }

  std::vector<PushRequest> pushes() {
    absl::MutexLock lock(&mu_);
    return pushes_;
  }
  // Per call received: the shared memory it asked for (PushPullRequest.want_shared_bytes),
  // the boot id it asked with, the segment it declined (0: none), whether it named a segment.
  std::vector<uint64_t> asks() {
    absl::MutexLock lock(&mu_);
    return asks_;
  }
  std::vector<std::string> ask_boot_ids() {
    absl::MutexLock lock(&mu_);
    return ask_boot_ids_;
  }
  std::vector<uint64_t> declines() {
    absl::MutexLock lock(&mu_);
    return declines_;
  }
  std::vector<bool> shared() {
    absl::MutexLock lock(&mu_);
    return shared_;
  }

 private:
  const grpc::StatusCode code_;
  const bool busy_;
  absl::Mutex mu_;
  int64_t heartbeat_clock_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_pushes_ ABSL_GUARDED_BY(mu_);
  int fail_heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  int heartbeat_padding_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t info_fingerprint_ ABSL_GUARDED_BY(mu_) = 0;
  int info_padding_ ABSL_GUARDED_BY(mu_) = 0;
  int heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<PushRequest> pushes_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> asks_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> ask_boot_ids_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> declines_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> shared_ ABSL_GUARDED_BY(mu_);
  size_t hold_ ABSL_GUARDED_BY(mu_) = 0;
  bool garbage_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int> finished_cancelled_{0};
  std::optional<grpc::ByteBuffer> answer_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<grpc::ServerUnaryReactor*, grpc::CallbackServerContext*>> held_
      ABSL_GUARDED_BY(mu_);

  void ReleaseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto [r, context] : held_) r->Finish(grpc::Status::OK);
    held_.clear();
  }
};

class GrpcStoreTest : public ::testing::Test {
 protected:
  void Start(int fail_pushes, GrpcStoreOptions options = FastRetries(),
             grpc::StatusCode code = grpc::StatusCode::UNAVAILABLE, bool busy = false) {
    service_ = std::make_unique<RecordingServer>(fail_pushes, code, busy);
    StartInProcess(service_.get(), 1, Config(/*sparse=*/true), options, &server_, &store_);
  }

  void TearDown() override {
    store_.reset();
    if (service_ != nullptr) {
      service_->Hold(0);
      service_->Release();
    }
    if (server_ != nullptr) server_->Shutdown();
  }

  // One server (in-process), one worker, dense "w" of 8 values and, with `sparse`, sparse
  // "emb" of dim 2, both sent as bf16.
  static JobConfig Config(bool sparse) {
    JobConfig config;
    config.mutable_cluster()->set_num_servers(1);
    config.mutable_cluster()->add_servers("in-process");
    config.mutable_cluster()->set_num_workers(1);
    TableConfig* dense = config.add_tables();
    dense->set_name("w");
    dense->add_shape(8);
    dense->set_wire_encoding(ENCODING_BF16);
    if (sparse) {
      TableConfig* emb = config.add_tables();
      emb->set_name("emb");
      emb->set_kind(TABLE_KIND_SPARSE);
      emb->set_dim(2);
      emb->set_wire_encoding(ENCODING_BF16);
    }
    EXPECT_TRUE(common::ExpandModelTables(&config).ok());
    return config;
  }

  static GrpcStoreOptions FastRetries() {
    GrpcStoreOptions options;
    options.initial_backoff = absl::Milliseconds(1);
    options.max_backoff = absl::Milliseconds(1);
    options.deadline = absl::Seconds(30);
    return options;
  }

  absl::StatusOr<GrpcParameterStore::AsyncCalls::CallId> StartPush(
      GrpcParameterStore::AsyncCalls* calls, int64_t clock) {
    common::PushBatch batch;
    batch.dense.push_back({"w", dense_grad_});
    batch.sparse.push_back({"emb", keys_, sparse_grad_});
    return calls->StartPush(batch, common::PushOptions{clock, false});
  }

  absl::Status PushOnce(int64_t clock) {
    common::PushBatch batch;
    batch.dense.push_back({"w", dense_grad_});
    batch.sparse.push_back({"emb", keys_, sparse_grad_});
    return store_->Push(batch, common::PushOptions{clock, false});
  }

  // Until stopped, finishes the server's held calls as their clients give up on them (as a
  // real server's transport lets go of a cancelled call's bytes).
  class Reaper {
   public:
    explicit Reaper(RecordingServer* service)
        : thread_([this, service] {
            while (!stop_.HasBeenNotified()) {
              service->FinishCancelled();
              stop_.WaitForNotificationWithTimeout(absl::Milliseconds(1));
            }
          }) {}
    ~Reaper() {
      stop_.Notify();
      thread_.join();
    }

   private:
    absl::Notification stop_;
    std::thread thread_;
  };

  const std::vector<float> dense_grad_ = {1.0013f, 3e-3f, -2.718f, 7.77e-4f,
                                          1.37f,   0.1f,  -5e-5f,  42.42f};
  const std::vector<uint64_t> keys_ = {5, 9};
  const std::vector<float> sparse_grad_ = {1.0013f, -3e-3f, 0.777f, 1e-4f};
  std::unique_ptr<RecordingServer> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<GrpcParameterStore> store_;
};

}  // namespace ps::worker

#endif  // PS_WORKER_RPC_GRPC_STORE_TEST_FIXTURE_H_
