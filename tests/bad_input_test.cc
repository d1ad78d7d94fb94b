// One table of bad inputs, run against every store a client can reach the shard through: the
// gRPC service in each wire form (protobuf Push/Pull; PushPull frames; those frames with their
// payloads in the worker's shared-memory segment, by the socket's call and posted in the
// segment's channel) and the in-process store of centralized mode. Each store must refuse each case
// with the same status code, count it under the same reason, and leave the parameters as they were.
// The shard validates its own input (Shard::CheckPush, CheckPull): a store that stopped handing it
// the request, or that refused on its own without counting, fails here.
//
// A case is written once, as a store's caller makes it (common::PushBatch / PullBatch plus the
// worker's identity and clock); the wire requests are derived from it the way a client cuts
// them (server/rpc/service.h). Cases the in-process store cannot express at all (a header
// field it always fills correctly, bytes it never encodes) are marked wire-only.
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/config/config.h"
#include "common/parameter_store.h"
#include "common/rpc/frame_testing.h"
#include "common/status_macros.h"
#include "common/status_matchers.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/in_process_store.h"
#include "server/rpc/service.h"
#include "server/rpc/shared_worker_testing.h"
#include "server/shard.h"

namespace ps::server {
namespace {

using ::ps::common::IsOk;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// One server; dense "w": 10 values in blocks of 4; sparse "emb": dim 3. Two worker slots,
// SSP with staleness 1 (so that a pull's clock is checked).
constexpr char kConfig[] = R"pb(
  cluster { num_servers: 1 num_workers: 2 dense_block_floats: 4 num_virtual_shards: 64 }
  tables {
    name: "w" kind: TABLE_KIND_DENSE shape: 10
    initializer { kind: UNIFORM low: -1 high: 1 }
    optimizer { kind: ADAM }
  }
  tables {
    name: "emb" kind: TABLE_KIND_SPARSE dim: 3
    initializer { kind: CONSTANT value: 0.25 }
    optimizer { kind: ADAGRAD }
  }
  training { staleness: 1 }
)pb";

// A request as a store's caller makes it.
struct Request {
  bool pull = false;
  struct Dense {
    std::string table;
    std::vector<float> values;  // a push's values; a pull's buffer size
  };
  struct Rows {
    std::string table;
    std::vector<uint64_t> keys;
    std::vector<float> values;  // a push's rows; a pull's buffer size
  };
  std::vector<Dense> dense;
  std::vector<Rows> sparse;
  int32_t worker_id = 0;
  uint64_t incarnation = 1;
  int64_t clock = 1;
  bool is_delta = false;
};

struct Case {
  std::string name;
  Request request;
  absl::StatusCode code;
  std::string reason;  // what the shard counts it under (Stats.rejected)
  // Changes to the derived wire request that no in-process call can make (nullptr: none).
  std::function<void(RequestHeader*, google::protobuf::RepeatedPtrField<TableValues>*)> wire;
  // A push accepted before the case (e.g. a newer incarnation of the worker).
  std::function<void(Request*)> before;
};

// gtest names a failing case by this, not by its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

Request::Dense DensePush(std::vector<float> values) { return {"w", std::move(values)}; }
Request::Rows RowsPush(std::vector<uint64_t> keys, size_t n, float value = 0.5f) {
  return {"emb", std::move(keys), std::vector<float>(n, value)};
}
std::vector<float> Filled(size_t n, float value, size_t at = 0, float bad = 0.5f) {
  std::vector<float> v(n, value);
  if (at < n) v[at] = bad;
  return v;
}

Request GoodPush() {
  Request r;
  r.dense.push_back(DensePush(std::vector<float>(10, 0.5f)));
  r.sparse.push_back(RowsPush({1, 2, 3}, 9));
  return r;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  auto add = [&](std::string name, Request r, absl::StatusCode code, std::string reason) {
    cases.push_back(Case{std::move(name), std::move(r), code, std::move(reason), nullptr, nullptr});
    return &cases.back();
  };
  using C = absl::StatusCode;
  {
    Request r = GoodPush();
    r.dense.push_back({"nope", std::vector<float>(4, 0.5f)});
    add("push_unknown_dense_table", r, C::kNotFound, "unknown_table");
    r = GoodPush();
    r.sparse.push_back({"nope", {1}, std::vector<float>(3, 0.5f)});
    add("push_unknown_sparse_table", r, C::kNotFound, "unknown_table");
  }
  {
    Request r;
    r.pull = true;
    r.dense.push_back({"nope", std::vector<float>(10)});
    add("pull_unknown_table", r, C::kNotFound, "unknown_table");
  }
  {
    Request r = GoodPush();
    r.sparse.push_back({"w", {1, 2}, std::vector<float>(6, 0.5f)});
    add("push_dense_table_by_keys", r, C::kInvalidArgument, "wrong_kind");
    r = GoodPush();
    r.dense.push_back({"emb", std::vector<float>(3, 0.5f)});
    add("push_sparse_table_by_blocks", r, C::kInvalidArgument, "wrong_kind");
    Request p;
    p.pull = true;
    p.sparse.push_back({"w", {1}, std::vector<float>(3)});
    add("pull_dense_table_by_keys", p, C::kInvalidArgument, "wrong_kind");
    p = Request();
    p.pull = true;
    p.dense.push_back({"emb", std::vector<float>(3)});
    add("pull_sparse_table_by_blocks", p, C::kInvalidArgument, "wrong_kind");
  }
  {
    Request r = GoodPush();
    r.dense[0].values.resize(9);
    add("push_dense_wrong_size", r, C::kInvalidArgument, "bad_size");
    r = GoodPush();
    r.sparse[0].values.resize(6);
    add("push_sparse_fewer_rows", r, C::kInvalidArgument, "bad_size");
    r = GoodPush();
    r.sparse[0].values.resize(12, 0.5f);
    add("push_sparse_wider_rows", r, C::kInvalidArgument, "bad_size");
  }
  for (float bad : {kNaN, kInf, -kInf}) {
    Request r = GoodPush();
    r.dense[0].values = Filled(10, 0.5f, 7, bad);
    add(absl::StrCat("push_dense_", bad), r, C::kInvalidArgument, "nonfinite");
    r = GoodPush();
    r.sparse[0].values = Filled(9, 0.5f, 4, bad);
    add(absl::StrCat("push_rows_", bad), r, C::kInvalidArgument, "nonfinite");
    r = GoodPush();
    r.is_delta = true;
    r.sparse[0].values = Filled(9, 0.5f, 0, bad);
    add(absl::StrCat("push_delta_", bad), r, C::kInvalidArgument, "nonfinite");
  }
  {
    Request r = GoodPush();
    r.worker_id = -1;
    add("push_without_worker_slot", r, C::kInvalidArgument, "bad_worker");
    r.worker_id = 2;
    add("push_worker_outside_job", r, C::kInvalidArgument, "bad_worker");
    Request p;
    p.pull = true;
    p.worker_id = 1000;
    add("pull_worker_outside_job", p, C::kInvalidArgument, "bad_worker");
    r = GoodPush();
    r.clock = -5;
    add("push_negative_clock", r, C::kInvalidArgument, "bad_clock");
    // Past 2^62 (the workers refuse a server's answer holding one): kept, it was checkpointed
    // and failed every later start of that worker, and it switched off clock_ahead for all.
    r.clock = common::kMaxClock + 1;
    add("push_clock_past_2_62", r, C::kInvalidArgument, "bad_clock");
    p.worker_id = 0;
    p.clock = std::numeric_limits<int64_t>::min();
    add("pull_negative_clock", p, C::kInvalidArgument, "bad_clock");
    p.clock = 1000000;
    add("pull_clock_no_push_let_through", p, C::kInvalidArgument, "clock_ahead");
  }
  {
    Case* c = add("push_older_incarnation", GoodPush(), C::kFailedPrecondition, "stale_incarnation");
    c->before = [](Request* r) { r->incarnation = 5; };
  }
  // Wire only: the in-process store fills the header and encodes payloads itself.
  using Tables = google::protobuf::RepeatedPtrField<TableValues>;
  add("push_layout_mismatch", GoodPush(), C::kFailedPrecondition, "layout_mismatch")->wire =
      [](RequestHeader* h, Tables*) { h->set_layout_fingerprint(12345); };
  Request pull_w;
  pull_w.pull = true;
  pull_w.dense.push_back({"w", std::vector<float>(10)});
  add("pull_layout_mismatch", pull_w, C::kFailedPrecondition, "layout_mismatch")->wire =
      [](RequestHeader* h, Tables*) { h->set_layout_fingerprint(12345); };
  add("push_negative_done_clock", GoodPush(), C::kInvalidArgument, "bad_clock")->wire =
      [](RequestHeader* h, Tables*) { h->set_done_clock(-1); };
  add("pull_negative_done_clock", pull_w, C::kInvalidArgument, "bad_clock")->wire =
      [](RequestHeader* h, Tables*) { h->set_done_clock(std::numeric_limits<int64_t>::min()); };
  add("push_done_clock_past_2_62", GoodPush(), C::kInvalidArgument, "bad_clock")->wire =
      [](RequestHeader* h, Tables*) { h->set_done_clock(common::kMaxClock + 1); };
  add("push_sequence_zero", GoodPush(), C::kInvalidArgument, "bad_sequence")->wire =
      [](RequestHeader* h, Tables*) { h->set_sequence(0); };
  add("push_incarnation_far_ahead", GoodPush(), C::kInvalidArgument, "bad_sequence")->wire =
      [](RequestHeader* h, Tables*) { h->set_worker_incarnation(UINT64_MAX); };
  add("push_block_out_of_range", GoodPush(), C::kInvalidArgument, "bad_block")->wire =
      [](RequestHeader*, Tables* t) { t->Mutable(0)->mutable_blocks(1)->set_block_id(17); };
  add("push_block_size_not_whole_values", GoodPush(), C::kInvalidArgument, "bad_size")->wire =
      [](RequestHeader*, Tables* t) { t->Mutable(0)->mutable_blocks(0)->set_values("abcde"); };
  add("push_short_block", GoodPush(), C::kInvalidArgument, "bad_size")->wire =
      [](RequestHeader*, Tables* t) {
        t->Mutable(0)->mutable_blocks(2)->mutable_values()->resize(4);
      };
  add("push_bad_encoding", GoodPush(), C::kInvalidArgument, "bad_encoding")->wire =
      [](RequestHeader*, Tables* t) { t->Mutable(1)->set_encoding(static_cast<Encoding>(42)); };
  add("push_bf16_nonfinite", GoodPush(), C::kInvalidArgument, "nonfinite")->wire =
      [](RequestHeader*, Tables* t) {
        t->Mutable(1)->set_encoding(ENCODING_BF16);
        common::EncodeFloats(Filled(9, 0.5f, 2, kInf), ENCODING_BF16,
                             t->Mutable(1)->mutable_rows());
      };
  return cases;
}

// One store with a fresh shard of kConfig.
class Store {
 public:
  virtual ~Store() = default;
  // Sends `request`; the status it answered with.
  virtual absl::Status Send(const Request& request, const Case& c) = 0;
  // Whether Send's status carries the reason the shard counted a refusal under (the server's
  // own statuses do; an answer read from a channel, as one read from a socket, has the code
  // and message only).
  virtual bool ReasonInStatus() const { return true; }

  Shard& shard() { return *shard_; }
  // Every parameter of the shard (all of "w", rows 1..4 of "emb") and its update count.
  std::string State() {
    InProcessStoreOptions options;
    options.worker_id = -1;  // a reader: no worker state
    auto reader = InProcessParameterStore::Create({shard_.get()}, options);
    CHECK(reader.ok());
    std::vector<float> w(10), rows(12);
    const std::vector<uint64_t> keys = {1, 2, 3, 4};
    common::PullBatch batch;
    batch.dense.push_back({"w", absl::MakeSpan(w)});
    batch.sparse.push_back({"emb", keys, absl::MakeSpan(rows)});
    CHECK((*reader)->Pull(batch, {}).ok());
    std::string state;
    for (float v : w) absl::StrAppend(&state, v, ",");
    for (float v : rows) absl::StrAppend(&state, v, ",");
    return absl::StrCat(state, "/", shard_->updates_applied());
  }
  uint64_t Rejected(const std::string& reason) {
    StatsResponse stats;
    shard_->FillStats(&stats);
    auto it = stats.rejected().find(reason);
    return it == stats.rejected().end() ? 0 : it->second;
  }

 protected:
  Store() {
    auto config = common::ParseJobConfigText(kConfig, "test");
    CHECK(config.ok()) << config.status();
    auto shard = Shard::Create(*config, ShardOptions{});
    CHECK(shard.ok()) << shard.status();
    shard_ = *std::move(shard);
  }
  std::unique_ptr<Shard> shard_;
};

class InProcess final : public Store {
 public:
  absl::Status Send(const Request& r, const Case&) override {
    InProcessStoreOptions options;
    options.worker_id = r.worker_id;
    options.worker_incarnation = r.incarnation;
    options.pull_timeout = absl::Seconds(5);
    ASSIGN_OR_RETURN(auto store, InProcessParameterStore::Create({shard_.get()}, options));
    std::vector<std::vector<float>> buffers;
    buffers.reserve(r.dense.size() + r.sparse.size());
    if (r.pull) {
      common::PullBatch batch;
      for (const auto& d : r.dense) {
        batch.dense.push_back({d.table, absl::MakeSpan(buffers.emplace_back(d.values.size()))});
      }
      for (const auto& s : r.sparse) {
        batch.sparse.push_back(
            {s.table, s.keys, absl::MakeSpan(buffers.emplace_back(s.values.size()))});
      }
      return store->Pull(batch, {r.clock});
    }
    common::PushBatch batch;
    for (const auto& d : r.dense) batch.dense.push_back({d.table, d.values});
    for (const auto& s : r.sparse) batch.sparse.push_back({s.table, s.keys, s.values});
    return store->Push(batch, {r.clock, r.is_delta});
  }
};

// The gRPC service without sockets, in one wire form.
enum class Form { kMessages, kFrames, kSegment, kChannel };

class Service final : public Store {
 public:
  explicit Service(Form form) : frames_(form != Form::kMessages), form_(form) {
    ServiceOptions options;
    options.max_shared_bytes_per_worker = kTestSegmentBytes;
    service_ = std::make_unique<ParameterServerService>(shard_.get(), options, ServiceHooks{});
    if (form == Form::kMessages || form == Form::kFrames) return;
    // Both workers of the job (incarnation 1, as requests are unless a case says otherwise)
    // take a segment first, as a worker's first call asks for one.
    for (int32_t worker = 0; worker < 2; ++worker) {
      RequestHeader header;
      header.set_worker_id(worker);
      header.set_worker_incarnation(1);
      header.set_layout_fingerprint(shard_->partitioner().layout_fingerprint());
      absl::StatusOr<OpenedSegment> opened = OpenSegment(*service_, header);
      CHECK(opened.ok()) << opened.status();
      CHECK(form != Form::kChannel || opened->channel != nullptr) << "no channel offered";
      segments_.push_back(*std::move(opened));
    }
  }

  absl::Status Send(const Request& r, const Case& c) override {
    RequestHeader header;
    header.set_worker_id(r.worker_id);
    header.set_worker_incarnation(r.incarnation);
    header.set_sequence(1);  // each request is a fresh client's first, as in-process
    header.set_clock(r.clock);
    header.set_layout_fingerprint(shard_->partitioner().layout_fingerprint());
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    if (r.pull) {
      PullRequest pull = PullOf(r);
      *pull.mutable_header() = header;
      if (c.wire) c.wire(pull.mutable_header(), nullptr);
      if (!frames_) {
        PullResponse response;
        return service_->HandlePull(pull, deadline, &response);
      }
      return SendFrame(r, common::FrameOf(nullptr, &pull), deadline);
    }
    PushRequest push = PushOf(r);
    *push.mutable_header() = header;
    if (c.wire) c.wire(push.mutable_header(), push.mutable_tables());
    if (!frames_) {
      PushResponse response;
      return service_->HandlePush(push, &response);
    }
    return SendFrame(r, common::FrameOf(&push, nullptr), deadline);
  }
  bool ReasonInStatus() const override { return form_ != Form::kChannel; }

 private:
  // A dense table cut into its blocks as a client cuts it; what cannot be cut (not a dense
  // table of this size) goes as block 0, as the in-process store sends it.
  PushRequest PushOf(const Request& r) {
    PushRequest push;
    push.set_is_delta(r.is_delta);
    for (const auto& d : r.dense) {
      TableValues* t = push.add_tables();
      t->set_table(d.table);
      const common::TableInfo* info = shard_->partitioner().FindTable(d.table);
      if (info == nullptr || info->kind != TABLE_KIND_DENSE || d.values.size() != info->numel) {
        DenseBlock* block = t->add_blocks();
        common::EncodeFloats(d.values, ENCODING_FLOAT32, block->mutable_values());
        continue;
      }
      for (uint32_t b = 0; b < info->num_blocks; ++b) {
        auto [begin, end] = shard_->partitioner().BlockRange(*info, b);
        DenseBlock* block = t->add_blocks();
        block->set_block_id(b);
        common::EncodeFloats(absl::MakeConstSpan(d.values).subspan(begin, end - begin),
                             ENCODING_FLOAT32, block->mutable_values());
      }
    }
    for (const auto& s : r.sparse) {
      TableValues* t = push.add_tables();
      t->set_table(s.table);
      for (uint64_t k : s.keys) t->add_keys(k);
      common::EncodeFloats(s.values, ENCODING_FLOAT32, t->mutable_rows());
    }
    return push;
  }

  PullRequest PullOf(const Request& r) {
    PullRequest pull;
    for (const auto& d : r.dense) {
      TablePullRequest* t = pull.add_tables();
      t->set_table(d.table);
      const common::TableInfo* info = shard_->partitioner().FindTable(d.table);
      const uint32_t blocks =
          info != nullptr && info->kind == TABLE_KIND_DENSE ? info->num_blocks : 1;
      for (uint32_t b = 0; b < blocks; ++b) t->add_block_ids(b);
    }
    for (const auto& s : r.sparse) {
      TablePullRequest* t = pull.add_tables();
      t->set_table(s.table);
      for (uint64_t k : s.keys) t->add_keys(k);
    }
    return pull;
  }

  // `frame` as this form sends it: the payload in the segment of the request's worker, the
  // frame by the socket's call or through the segment's channel. A worker with no segment
  // (outside the job, another incarnation) sends it as a plain frame, as it would.
  absl::Status SendFrame(const Request& r, const grpc::ByteBuffer& frame, absl::Time deadline) {
    grpc::ByteBuffer answer;
    if (r.worker_id < 0 || static_cast<size_t>(r.worker_id) >= segments_.size() ||
        r.incarnation != 1) {
      return service_->HandlePushPull(frame, deadline, &answer);
    }
    OpenedSegment& mine = segments_[r.worker_id];
    ASSIGN_OR_RETURN(grpc::ByteBuffer moved, PayloadIntoSegment(*mine.segment, frame));
    const uint64_t shared_before = service_->data_path_counters().calls_shared.load();
    absl::Status status = form_ == Form::kChannel
                              ? PostInChannel(*mine.channel, moved, deadline, &answer)
                              : service_->HandlePushPull(moved, deadline, &answer);
    // The channel's calls are counted as such: a frame that went another way would not be.
    if (form_ == Form::kChannel) {
      EXPECT_EQ(service_->data_path_counters().calls_shared.load(), shared_before + 1);
    }
    return status;
  }

  const bool frames_;
  const Form form_;
  std::unique_ptr<ParameterServerService> service_;
  std::vector<OpenedSegment> segments_;  // workers 0 and 1's, in the segment forms
};

class BadInputTest : public ::testing::TestWithParam<Case> {};

TEST_P(BadInputTest, EveryStoreRefusesWithTheSameCodeAndChangesNothing) {
  const Case& c = GetParam();
  std::vector<std::pair<std::string, std::unique_ptr<Store>>> stores;
  stores.emplace_back("grpc Push/Pull", std::make_unique<Service>(Form::kMessages));
  stores.emplace_back("grpc PushPull frames", std::make_unique<Service>(Form::kFrames));
  stores.emplace_back("frames, payload in the segment", std::make_unique<Service>(Form::kSegment));
  stores.emplace_back("frames in the segment's channel", std::make_unique<Service>(Form::kChannel));
  if (!c.wire) stores.emplace_back("in-process", std::make_unique<InProcess>());
  for (auto& [name, store] : stores) {
    SCOPED_TRACE(name);
    if (c.before) {
      Request earlier = GoodPush();
      c.before(&earlier);
      ASSERT_THAT(store->Send(earlier, Case{}), IsOk());
    }
    const std::string before = store->State();
    const uint64_t counted = store->Rejected(c.reason);
    const absl::Status status = store->Send(c.request, c);
    EXPECT_EQ(status.code(), c.code) << status;
    if (store->ReasonInStatus()) EXPECT_EQ(RejectionReason(status), c.reason) << status;
    EXPECT_EQ(store->Rejected(c.reason), counted + 1) << "not counted under " << c.reason;
    EXPECT_EQ(store->State(), before) << "a refused request changed the parameters";
  }
}

// The good requests the cases are made from are accepted by every store.
TEST(BadInputTest, TheGoodRequestIsAcceptedEverywhere) {
  std::vector<std::unique_ptr<Store>> stores;
  for (Form form : {Form::kMessages, Form::kFrames, Form::kSegment, Form::kChannel}) {
    stores.push_back(std::make_unique<Service>(form));
  }
  stores.push_back(std::make_unique<InProcess>());
  for (auto& store : stores) {
    const std::string before = store->State();
    ASSERT_THAT(store->Send(GoodPush(), Case{}), IsOk());
    EXPECT_NE(store->State(), before);
    Request pull;
    pull.pull = true;
    pull.dense.push_back({"w", std::vector<float>(10)});
    pull.sparse.push_back({"emb", {1, 2}, std::vector<float>(6)});
    EXPECT_THAT(store->Send(pull, Case{}), IsOk());
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, BadInputTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string name = info.param.name;
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace ps::server
