// GrpcParameterStore's pull frames against a fake ParameterServer that answers pulls, on
// in-process channels (no sockets): where each answered entry's values land.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/config/config.h"
#include "common/parameter_store.h"
#include "common/partitioner.h"
#include "common/rpc/frame.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"
#include "proto/ps.grpc.pb.h"
#include "worker/rpc/grpc_async_calls.h"
#include "worker/rpc/grpc_store.h"
#include "worker/rpc/grpc_store_test_fixture.h"

namespace ps::worker {
namespace {

// The value a server holds at element i of dense table "w", and at column d of sparse row `key`.
float DenseValue(uint64_t i) { return static_cast<float>(i) + 0.25f; }
float SparseValue(uint64_t key, uint32_t d) { return static_cast<float>(key * 10 + d); }

// Answers every pull entry of a frame, each on its own and in its order as a real server
// does (a table named twice is answered twice), with DenseValue and SparseValue in float32.
// Thread-safe (stateless after construction).
class PullServer final
    : public ParameterServer::WithRawCallbackMethod_PushPull<ParameterServer::CallbackService> {
 public:
  explicit PullServer(common::Partitioner partitioner) : partitioner_(std::move(partitioner)) {}

  grpc::ServerUnaryReactor* PushPull(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    PushPullRequest header;
    common::FrameReader reader;
    EXPECT_TRUE(common::FrameReader::Open(*request, size_t{1} << 20, &header, &reader).ok());
    PushPullResponse answer;
    std::vector<float> payload;
    for (const TablePullRequest& tr : header.pull()) {
      const common::TableInfo* t = partitioner_.FindTable(tr.table());
      EXPECT_NE(t, nullptr) << tr.table();
      EXPECT_EQ(tr.encoding(), ENCODING_FLOAT32);
      TableValues* tv = answer.mutable_pull()->add_tables();
      tv->set_table(tr.table());
      tv->set_encoding(tr.encoding());
      for (uint32_t b : tr.block_ids()) {
        auto [begin, end] = partitioner_.BlockRange(*t, b);
        for (uint64_t i = begin; i < end; ++i) payload.push_back(DenseValue(i));
        DenseBlock* block = tv->add_blocks();
        block->set_block_id(b);
        block->set_payload_bytes((end - begin) * sizeof(float));
      }
      for (uint64_t key : tr.keys()) {
        for (uint32_t d = 0; d < t->dim; ++d) payload.push_back(SparseValue(key, d));
      }
      tv->set_rows_bytes(uint64_t{static_cast<uint64_t>(tr.keys_size())} * t->dim * sizeof(float));
    }
    common::FrameBuilder frame(answer);
    frame.AddSlice(grpc::Slice(payload.data(), payload.size() * sizeof(float)));
    *response = frame.Build();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  const common::Partitioner partitioner_;
};

class GrpcStoreFramesTest : public ::testing::Test {
 protected:
  // Two servers (in-process), dense "w" of 32 values in 8 blocks of 4 and sparse "emb" of dim
  // 2, both sent as float32.
  void Start(GrpcStoreOptions options = GrpcStoreOptions()) {
    JobConfig config;
    config.mutable_cluster()->set_num_servers(2);
    config.mutable_cluster()->add_servers("in-process-0");
    config.mutable_cluster()->add_servers("in-process-1");
    config.mutable_cluster()->set_num_workers(1);
    config.mutable_cluster()->set_dense_block_floats(4);
    TableConfig* dense = config.add_tables();
    dense->set_name("w");
    dense->add_shape(kDenseSize);
    dense->set_wire_encoding(ENCODING_FLOAT32);
    TableConfig* emb = config.add_tables();
    emb->set_name("emb");
    emb->set_kind(TABLE_KIND_SPARSE);
    emb->set_dim(kDim);
    emb->set_wire_encoding(ENCODING_FLOAT32);
    ASSERT_TRUE(common::ExpandModelTables(&config).ok());
    absl::StatusOr<common::Partitioner> partitioner = common::Partitioner::Create(config);
    ASSERT_TRUE(partitioner.ok()) << partitioner.status();
    service_ = std::make_unique<PullServer>(*partitioner);
    // Both servers' channels reach the one fake: it answers whatever any frame asks.
    StartInProcess(service_.get(), 2, config, options, &server_, &store_);
  }

  void TearDown() override {
    store_.reset();
    if (server_ != nullptr) server_->Shutdown();
  }

  static std::vector<float> NaNs(size_t n) {
    return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
  }
  // `out` holds "w" whole.
  static void ExpectDense(const std::vector<float>& out, const std::string& which) {
    ASSERT_EQ(out.size(), kDenseSize);
    for (size_t i = 0; i < out.size(); ++i) {
      EXPECT_EQ(out[i], DenseValue(i)) << which << " buffer, element " << i;
    }
  }
  // `out` holds the rows of `keys`, in their order.
  static void ExpectRows(const std::vector<uint64_t>& keys, const std::vector<float>& out,
                         const std::string& which) {
    ASSERT_EQ(out.size(), keys.size() * kDim);
    for (size_t j = 0; j < keys.size(); ++j) {
      for (uint32_t d = 0; d < kDim; ++d) {
        EXPECT_EQ(out[j * kDim + d], SparseValue(keys[j], d))
            << which << " buffer, key " << keys[j] << " at " << j << ", column " << d;
      }
    }
  }

  static constexpr size_t kDenseSize = 32;
  static constexpr uint32_t kDim = 2;
  // Keys on both servers, a key repeated within a batch entry, and a key in both entries.
  const std::vector<uint64_t> first_keys_ = {1, 2, 3, 1, 8, 13};
  const std::vector<uint64_t> second_keys_ = {4, 2, 9, 4};
  std::unique_ptr<PullServer> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<GrpcParameterStore> store_;
};

// A batch may name a dense table twice: each entry's buffer gets the whole table, as
// InProcessParameterStore fills both (before, the second entry took both answers and the
// first buffer was never written, the call still OK).
TEST_F(GrpcStoreFramesTest, ADenseTableNamedTwiceFillsBothBuffers) {
  Start();
  std::vector<float> first = NaNs(kDenseSize), second = NaNs(kDenseSize);
  common::PullBatch batch;
  batch.dense.push_back({"w", absl::MakeSpan(first)});
  batch.dense.push_back({"w", absl::MakeSpan(second)});
  ASSERT_TRUE(store_->Pull(batch, common::PullOptions()).ok());
  ExpectDense(first, "first");
  ExpectDense(second, "second");
}

// The same when each server's part comes in pieces (GrpcStoreOptions::pull_piece_bytes),
// which moves the two entries' blocks to frames of their own: the first piece keeps the
// first entry's first blocks and the sparse entry after them, and drops the second entry.
TEST_F(GrpcStoreFramesTest, ADenseTableNamedTwiceFillsBothBuffersInPieces) {
  GrpcStoreOptions options;
  options.pull_piece_bytes = 32;  // each server's 2 x 4 blocks of 16 bytes in 4 pieces
  Start(options);
  std::vector<float> first = NaNs(kDenseSize), second = NaNs(kDenseSize);
  std::vector<float> rows = NaNs(first_keys_.size() * kDim);
  common::PullBatch batch;
  batch.dense.push_back({"w", absl::MakeSpan(first)});
  batch.dense.push_back({"w", absl::MakeSpan(second)});
  batch.sparse.push_back({"emb", first_keys_, absl::MakeSpan(rows)});
  const absl::Status status = store_->Pull(batch, common::PullOptions());
  ASSERT_TRUE(status.ok()) << status;
  ExpectDense(first, "first");
  ExpectDense(second, "second");
  ExpectRows(first_keys_, rows, "sparse");
}

// A batch may name a sparse table twice, with keys of their own: each entry's buffer gets the
// rows of its keys, repeats included (before, the answer to the first entry was read with the
// second's keys: INTERNAL blaming the server, or OK with the first buffer unwritten).
TEST_F(GrpcStoreFramesTest, ASparseTableNamedTwiceFillsBothBuffers) {
  Start();
  std::vector<float> first = NaNs(first_keys_.size() * kDim);
  std::vector<float> second = NaNs(second_keys_.size() * kDim);
  common::PullBatch batch;
  batch.sparse.push_back({"emb", first_keys_, absl::MakeSpan(first)});
  batch.sparse.push_back({"emb", second_keys_, absl::MakeSpan(second)});
  const absl::Status status = store_->Pull(batch, common::PullOptions());
  ASSERT_TRUE(status.ok()) << status;
  ExpectRows(first_keys_, first, "first");
  ExpectRows(second_keys_, second, "second");
}

// Asynchronous calls (which pull from a copy of the batch) fill every entry's buffer too.
TEST_F(GrpcStoreFramesTest, AnAsyncPullNamingTablesTwiceFillsEveryBuffer) {
  Start();
  std::vector<float> dense_first = NaNs(kDenseSize), dense_second = NaNs(kDenseSize);
  std::vector<float> first = NaNs(first_keys_.size() * kDim);
  std::vector<float> second = NaNs(second_keys_.size() * kDim);
  common::PullBatch batch;
  batch.sparse.push_back({"emb", first_keys_, absl::MakeSpan(first)});
  batch.dense.push_back({"w", absl::MakeSpan(dense_first)});
  batch.sparse.push_back({"emb", second_keys_, absl::MakeSpan(second)});
  batch.dense.push_back({"w", absl::MakeSpan(dense_second)});
  std::unique_ptr<GrpcParameterStore::AsyncCalls> calls = store_->NewAsyncCalls();
  absl::StatusOr<GrpcParameterStore::AsyncCalls::CallId> id =
      calls->StartPull(batch, common::PullOptions());
  ASSERT_TRUE(id.ok()) << id.status();
  const absl::Status status = calls->Wait(*id);
  ASSERT_TRUE(status.ok()) << status;
  ExpectDense(dense_first, "first dense");
  ExpectDense(dense_second, "second dense");
  ExpectRows(first_keys_, first, "first sparse");
  ExpectRows(second_keys_, second, "second sparse");
}

}  // namespace
}  // namespace ps::worker
