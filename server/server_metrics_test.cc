// The scrape-time server families: from a Stats snapshot, and from a real shard and service
// after pushes and refusals.
#include "server/server_metrics.h"

#include <memory>
#include <string>
#include <vector>

#include "common/codec.h"
#include "common/config/config.h"
#include "common/metrics/testing.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rpc/service.h"
#include "server/shard.h"

namespace ps::server {
namespace {

using ::ps::common::IsOk;
using ::ps::common::metrics::testing::ParsedText;
using ::ps::common::metrics::testing::ParseText;
using ::testing::HasSubstr;
using ::testing::Not;

ParsedText Scrape(const common::metrics::Registry& registry) {
  auto parsed = ParseText(registry.Render());
  EXPECT_THAT(parsed.status(), IsOk()) << registry.Render();
  return parsed.ok() ? *parsed : ParsedText{};
}

TEST(ServerMetrics, ExportsAStatsSnapshot) {
  StatsResponse stats;
  stats.set_server_index(1);
  stats.set_server_incarnation(1234567);
  stats.set_pulls(10);
  stats.set_pushes(7);
  stats.set_updates_applied(70);
  stats.set_duplicate_pushes(2);
  (*stats.mutable_rejected())["nonfinite_values"] = 5;
  TableStats* t = stats.add_tables();
  t->set_name("emb");
  t->set_kind(TABLE_KIND_SPARSE);
  t->set_rows(100);
  t->set_rows_in_memory(40);
  t->set_bytes(4096);
  t->set_updates_applied(7);
  for (int w = 0; w < 3; ++w) {
    WorkerClock* c = stats.add_worker_clocks();
    c->set_worker_id(w);
    c->set_clock(10 + w);
    c->set_live(w < 2);
  }
  stats.set_last_checkpoint_id(3);
  stats.set_last_checkpoint_age_s(12.5);
  stats.set_checkpoints_written(3);
  stats.set_checkpoints_failed(1);
  stats.set_storage_bytes(1 << 20);
  stats.set_push_check_s(0.25);
  stats.set_push_apply_s(1.5);
  stats.set_pull_read_s(0.75);
  common::metrics::Registry registry;
  auto handle = RegisterServerStats(
      &registry, [&](StatsResponse* out) { *out = stats; }, /*checkpoints=*/true);
  const ParsedText m = Scrape(registry);
  EXPECT_EQ(m.Get("ps_server_info", {{"server_index", "1"}, {"incarnation", "1234567"}}), 1);
  EXPECT_EQ(m.Get("ps_server_pulls_total"), 10);
  EXPECT_EQ(m.Get("ps_server_updates_applied_total"), 70);
  EXPECT_EQ(m.Get("ps_server_push_duplicates_total"), 2);
  EXPECT_EQ(m.Get("ps_server_nonfinite_values_total"), 5);
  EXPECT_EQ(m.Get("ps_server_table_rows", {{"table", "emb"}, {"kind", "sparse"}}), 100);
  EXPECT_EQ(m.Get("ps_server_table_rows_in_memory", {{"table", "emb"}}), 40);
  EXPECT_EQ(m.Get("ps_server_table_bytes", {{"table", "emb"}}), 4096);
  EXPECT_EQ(m.Get("ps_server_worker_clock", {{"worker", "2"}}), 12);
  // The fastest live worker is 1 (clock 11); worker 2 is not live.
  EXPECT_EQ(m.Get("ps_server_worker_staleness", {{"worker", "0"}}), 1);
  EXPECT_EQ(m.Get("ps_server_worker_staleness", {{"worker", "1"}}), 0);
  EXPECT_EQ(m.Get("ps_server_worker_live", {{"worker", "2"}}), 0);
  EXPECT_EQ(m.Get("ps_server_last_checkpoint_age_seconds"), 12.5);
  EXPECT_EQ(m.Get("ps_server_checkpoints_written_total"), 3);
  EXPECT_EQ(m.Get("ps_server_checkpoints_failed_total"), 1);
  EXPECT_EQ(m.Get("ps_server_rocksdb_size_bytes"), 1 << 20);
  EXPECT_EQ(m.types.at("ps_server_updates_applied_total"), "counter");
  EXPECT_EQ(m.Get("ps_server_data_path_seconds_total", {{"phase", "push_check"}}), 0.25);
  EXPECT_EQ(m.Get("ps_server_data_path_seconds_total", {{"phase", "push_apply"}}), 1.5);
  EXPECT_EQ(m.Get("ps_server_data_path_seconds_total", {{"phase", "pull_read"}}), 0.75);
  EXPECT_EQ(m.types.at("ps_server_data_path_seconds_total"), "counter");
}

TEST(ServerMetrics, NoCheckpointFamiliesWithoutADataDir) {
  common::metrics::Registry registry;
  auto handle = RegisterServerStats(
      &registry, [](StatsResponse*) {}, /*checkpoints=*/false);
  const std::string text = registry.Render();
  EXPECT_THAT(text, Not(HasSubstr("ps_server_last_checkpoint")));
  EXPECT_THAT(text, Not(HasSubstr("ps_server_checkpoints_written_total")));
  EXPECT_THAT(text, Not(HasSubstr("ps_server_rocksdb_size_bytes")));
  EXPECT_THAT(text, HasSubstr("ps_server_updates_applied_total 0\n"));
}

// Pushes through the service: latency and bytes count, and refusals are labelled with their
// code and reason.
class ServiceMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto config =
        common::ParseJobConfigText(R"pb(
                                     cluster { num_servers: 1 num_workers: 1 dense_block_floats: 4 }
                                     tables {
                                       name: "w"
                                       kind: TABLE_KIND_DENSE
                                       shape: 8
                                       optimizer { kind: SGD }
                                     }
                                   )pb",
                                   "test");
    ASSERT_THAT(config.status(), IsOk());
    auto shard = Shard::Create(*config, ShardOptions{});
    ASSERT_THAT(shard.status(), IsOk());
    shard_ = *std::move(shard);
    service_ = std::make_unique<ParameterServerService>(shard_.get(), ServiceOptions{},
                                                        ServiceHooks{}, &registry_);
    stats_ = RegisterServerStats(
        &registry_, [this](StatsResponse* out) { shard_->FillStats(out); }, false);
  }

  PushRequest Push(uint64_t sequence, float value) {
    PushRequest request;
    RequestHeader* h = request.mutable_header();
    h->set_worker_id(0);
    h->set_worker_incarnation(1);
    h->set_sequence(sequence);
    h->set_clock(sequence);
    h->set_layout_fingerprint(shard_->partitioner().layout_fingerprint());
    TableValues* t = request.add_tables();
    t->set_table("w");
    for (uint32_t b = 0; b < 2; ++b) {
      DenseBlock* block = t->add_blocks();
      block->set_block_id(b);
      common::EncodeFloats(std::vector<float>(4, value), ENCODING_FLOAT32, block->mutable_values());
    }
    return request;
  }

  common::metrics::Registry registry_;
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<ParameterServerService> service_;
  common::metrics::CollectorHandle stats_;
};

TEST_F(ServiceMetricsTest, PushesCountAndRefusalsCarryTheirReason) {
  PushResponse response;
  ASSERT_THAT(service_->HandlePush(Push(1, 0.5f), &response), IsOk());
  ASSERT_THAT(service_->HandlePush(Push(2, 0.5f), &response), IsOk());
  ASSERT_THAT(service_->HandlePush(Push(2, 0.5f), &response), IsOk());  // a duplicate
  EXPECT_FALSE(service_->HandlePush(Push(3, std::nanf("")), &response).ok());
  PushRequest unknown = Push(4, 0.5f);
  unknown.mutable_tables(0)->set_table("nope");
  EXPECT_FALSE(service_->HandlePush(unknown, &response).ok());
  PushRequest stale = Push(5, 0.5f);
  stale.mutable_header()->set_worker_incarnation(0);
  EXPECT_FALSE(service_->HandlePush(stale, &response).ok());

  const ParsedText m = Scrape(registry_);
  EXPECT_EQ(m.Get("ps_server_push_latency_seconds_count"), 6);
  EXPECT_EQ(m.Get("ps_server_requests_total", {{"method", "push"}, {"code", "OK"}}), 3);
  EXPECT_EQ(m.Get("ps_server_requests_refused_total",
                  {{"method", "push"}, {"code", "INVALID_ARGUMENT"}, {"reason", "nonfinite"}}),
            1);
  EXPECT_EQ(m.Get("ps_server_requests_refused_total",
                  {{"method", "push"}, {"code", "NOT_FOUND"}, {"reason", "unknown_table"}}),
            1);
  EXPECT_EQ(
      m.Get("ps_server_requests_refused_total",
            {{"method", "push"}, {"code", "FAILED_PRECONDITION"}, {"reason", "stale_incarnation"}}),
      1);
  EXPECT_EQ(m.Sum("ps_server_requests_total", {{"method", "push"}}), 6);
  EXPECT_GT(m.Get("ps_server_request_bytes_total", {{"method", "push"}}).value_or(0), 6 * 32);
  EXPECT_EQ(m.Get("ps_server_updates_applied_total"), 2);
  EXPECT_EQ(m.Get("ps_server_push_duplicates_total"), 1);
  EXPECT_EQ(m.Get("ps_server_nonfinite_values_total"), 4);  // the first block's
  EXPECT_EQ(m.Get("ps_server_worker_clock", {{"worker", "0"}}), 2);
}

TEST_F(ServiceMetricsTest, PullsCountTheirWaitAndBytes) {
  PullRequest request;
  RequestHeader* h = request.mutable_header();
  h->set_worker_id(0);
  h->set_worker_incarnation(1);
  h->set_layout_fingerprint(shard_->partitioner().layout_fingerprint());
  TablePullRequest* t = request.add_tables();
  t->set_table("w");
  t->add_block_ids(0);
  t->add_block_ids(1);
  PullResponse response;
  ASSERT_THAT(service_->HandlePull(request, absl::Now() + absl::Seconds(5), &response), IsOk());
  const ParsedText m = Scrape(registry_);
  EXPECT_EQ(m.Get("ps_server_pull_latency_seconds_count"), 1);
  EXPECT_EQ(m.Get("ps_server_pull_wait_seconds_count"), 1);
  EXPECT_EQ(m.Get("ps_server_response_bytes_total", {{"method", "pull"}}), response.ByteSizeLong());
  EXPECT_EQ(m.Get("ps_server_pulls_total"), 1);
}

}  // namespace
}  // namespace ps::server
