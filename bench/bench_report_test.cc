#include "bench/bench_report.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::bench {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(FormatBytes, UsesWholeBinaryUnitsWhenExact) {
  EXPECT_EQ(FormatBytes(4096), "4KB");
  EXPECT_EQ(FormatBytes(1 << 20), "1MB");
  EXPECT_EQ(FormatBytes(64u << 20), "64MB");
  EXPECT_EQ(FormatBytes(100), "100B");
  EXPECT_EQ(FormatBytes(3 << 19), "1.5MB");
}

TEST(ToJsonLine, WritesNullWhenThereIsNoTcpRatio) {
  BenchRow row;
  row.mode = "grpc";
  row.op = "push";
  row.payload = "4KB";
  row.payload_bytes = 4096;
  row.calls_per_second = 1000;
  const std::string json = ToJsonLine(row);
  EXPECT_THAT(json, HasSubstr("\"vs_tcp\":null"));
  EXPECT_THAT(json, HasSubstr("\"payload_bytes\":4096"));
  EXPECT_EQ(json.front(), '{');
  EXPECT_EQ(json.back(), '}');
  row.vs_tcp = 0.5;
  EXPECT_THAT(ToJsonLine(row), HasSubstr("\"vs_tcp\":0.5"));
}

TEST(FormatTable, PrintsHeaderAndTheTcpRatio) {
  BenchRow row;
  row.mode = "grpc";
  row.op = "pull";
  row.payload = "1MB";
  row.calls = 10;
  row.calls_per_second = 500;
  row.mb_per_second = 500;
  row.vs_tcp = 0.62;
  const std::string table = FormatTable({row});
  EXPECT_THAT(table, HasSubstr("calls/s"));
  EXPECT_THAT(table, HasSubstr("vs raw TCP"));
  EXPECT_THAT(table, HasSubstr("0.62"));
  EXPECT_THAT(table, Not(HasSubstr("retries")));
}

TEST(FormatTable, ShowsTheSpillColumnsOnlyWhenSet) {
  BenchRow row;
  row.mode = "spill";
  row.op = "zipf_pull";
  row.payload = "1k keys";
  row.calls = 10;
  row.calls_per_second = 500;
  EXPECT_THAT(FormatTable({row}), Not(HasSubstr("hits")));
  EXPECT_THAT(ToJsonLine(row), Not(HasSubstr("hit_ratio")));
  row.in_memory = 0.05;
  row.hit_ratio = 0.612;
  EXPECT_THAT(FormatTable({row}), HasSubstr("61.2%"));
  EXPECT_THAT(FormatTable({row}), HasSubstr("5.0%"));
  EXPECT_THAT(ToJsonLine(row), HasSubstr("\"in_memory\":0.05,\"hit_ratio\":0.612"));
}

}  // namespace
}  // namespace ps::bench
