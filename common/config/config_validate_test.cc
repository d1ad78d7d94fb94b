#include <string>
#include <vector>

#include "common/config/config.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"

namespace ps::common {
namespace {

using ::testing::HasSubstr;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// tables[0] is a plain dense table, tables[1] a plain sparse table; the model's tables follow.
constexpr char kValidConfig[] = R"pb(
  cluster { num_servers: 2 num_workers: 2 }
  tables {
    name: "extra/dense"
    shape: [ 10 ]
  }
  tables { name: "extra/emb" kind: TABLE_KIND_SPARSE dim: 4 }
  model {
    mlp {
      input_dim: 784
      hidden: [ 32 ]
      num_classes: 10
    }
  }
  data { format: IDX train_images: "ti.gz" train_labels: "tl.gz" }
  training { batch_size: 32 }
  security { plaintext: true }
)pb";

// The valid config, expanded, with `overrides` applied.
ps::JobConfig ValidConfigWith(const std::vector<std::string>& overrides) {
  absl::StatusOr<ps::JobConfig> config = ParseJobConfigText(kValidConfig, "valid");
  EXPECT_OK(config);
  EXPECT_OK(ExpandModelTables(&*config));
  for (const std::string& o : overrides) EXPECT_OK(ApplyOverride(o, &*config)) << o;
  return *config;
}

TEST(ValidateJobConfig, AcceptsTheValidConfig) {
  EXPECT_OK(ValidateJobConfig(ValidConfigWith({})));
}

TEST(ValidateJobConfig, AcceptsOtherValidVariants) {
  EXPECT_OK(
      ValidateJobConfig(ValidConfigWith({"security.plaintext=false", "security.ca_cert=ca.pem",
                                         "security.cert=c.pem", "security.key=k.pem"})));
  EXPECT_OK(ValidateJobConfig(ValidConfigWith({"training.prefetch=true"})));  // Async.
  EXPECT_OK(ValidateJobConfig(ValidConfigWith({"training.prefetch=true", "training.staleness=3"})));
  EXPECT_OK(ValidateJobConfig(ValidConfigWith({"data.format=LIBSVM", "data.train_file=a.svm"})));
  EXPECT_OK(ValidateJobConfig(
      ValidConfigWith({"cluster.num_servers=0", "cluster.servers=h1:1,h2:2,h3:3"})));
  EXPECT_OK(ValidateJobConfig(ValidConfigWith({"tables[0].optimizer.kind=ADAGRAD"})));
  // Watching apply threads: a second at most; negative turns them off.
  EXPECT_OK(ValidateJobConfig(ValidConfigWith({"server.apply_spin_us=1000000"})));
  EXPECT_OK(ValidateJobConfig(ValidConfigWith({"server.apply_spin_us=-1"})));
  EXPECT_OK(ValidateJobConfig(ValidConfigWith({"server.apply_threads=1024"})));
}

TEST(ValidateJobConfig, ReportsEveryProblem) {
  EXPECT_THAT(ValidateJobConfig(ValidConfigWith({"training.batch_size=0", "checkpoint.keep=0"})),
              StatusIs(kInvalid, testing::AllOf(HasSubstr("training.batch_size: must be > 0"),
                                                HasSubstr("; checkpoint.keep: must be >= 1"))));
}

TEST(ValidateJobConfig, RequiresAModelAndItsTables) {
  ps::JobConfig config = ValidConfigWith({});
  config.clear_model();
  // Tables without a model: fine for servers and tools, not for a worker.
  config.mutable_data()->set_format(ps::DataConfig::FORMAT_UNSPECIFIED);
  EXPECT_OK(ValidateJobConfig(config));
  EXPECT_THAT(CheckTrainable(config), StatusIs(kInvalid, HasSubstr("model: not set")));
  config.clear_tables();
  EXPECT_THAT(ValidateJobConfig(config), StatusIs(kInvalid, HasSubstr("model: not set")));

  absl::StatusOr<ps::JobConfig> unexpanded = ParseJobConfigText(kValidConfig, "valid");
  ASSERT_OK(unexpanded);
  EXPECT_THAT(ValidateJobConfig(*unexpanded),
              StatusIs(kInvalid, HasSubstr("model: needs table 'mlp/layer0.w'")));
}

struct ErrorCase {
  std::string name;
  std::vector<std::string> overrides;
  std::string expected;  // A substring of the error message: the field path and problem.
};

class ValidateJobConfigErrorTest : public testing::TestWithParam<ErrorCase> {};

TEST_P(ValidateJobConfigErrorTest, IsInvalidArgumentNamingTheField) {
  EXPECT_THAT(ValidateJobConfig(ValidConfigWith(GetParam().overrides)),
              StatusIs(kInvalid, HasSubstr(GetParam().expected)));
}

const ErrorCase kErrorCases[] = {
    // Tables.
    {"EmptyShape", {"tables[0].shape="}, "tables[0].shape: empty"},
    {"ZeroDimension", {"tables[0].shape=10,0"}, "tables[0].shape: dimension 1 is 0"},
    {"HugeSparseDim", {"tables[1].dim=4000000000"}, "tables[1].dim: 4000000000 is over the limit"},
    {"NegativeDimension", {"tables[0].shape=-3"}, "tables[0].shape: dimension 0 is -3"},
    {"Overflow", {"tables[0].shape=4294967296,4294967296"}, "tables[0].shape: element count"},
    {"TooManyBlocks",
     {"cluster.dense_block_floats=1", "tables[0].shape=4294967296"},
     "tables[0].shape: needs 2^32 or more blocks"},
    {"DimOnDense", {"tables[0].dim=3"}, "tables[0].dim: set on a dense table"},
    {"SparseDimZero", {"tables[1].dim=0"}, "tables[1].dim: must be > 0"},
    {"ShapeOnSparse", {"tables[1].shape=3"}, "tables[1].shape: set on a sparse table"},
    {"KindUnspecified", {"tables[0].kind=TABLE_KIND_UNSPECIFIED"}, "tables[0].kind: unspecified"},
    {"DuplicateName",
     {"tables[1].name=extra/dense"},
     "tables[1].name: 'extra/dense' duplicates tables[0]"},
    {"EmptyName", {"tables[0].name="}, "tables[0].name: empty"},
    {"BadNameCharacters", {"tables[0].name=a b"}, "tables[0].name: 'a b' has characters outside"},
    {"UniformBounds",
     {"tables[0].initializer={kind: UNIFORM low: 1 high: 0}"},
     "tables[0].initializer.high: must be > low"},
    {"GlorotOnSparse", {"tables[1].initializer.kind=GLOROT_UNIFORM"}, "tables[1].initializer.kind"},
    {"NormalStddev",
     {"tables[1].initializer={kind: NORMAL stddev: -1}"},
     "tables[1].initializer.stddev"},
    // Optimizers.
    {"LearningRateZero",
     {"tables[0].optimizer.learning_rate=0"},
     "tables[0].optimizer.learning_rate: must be > 0"},
    {"LearningRateNan",
     {"tables[0].optimizer.learning_rate=nan"},
     "tables[0].optimizer.learning_rate"},
    {"Beta1One", {"tables[0].optimizer.beta1=1"}, "tables[0].optimizer.beta1: must be in [0, 1)"},
    {"Beta2Negative", {"tables[0].optimizer.beta2=-0.1"}, "tables[0].optimizer.beta2"},
    {"MomentumOne", {"tables[1].optimizer.momentum=1"}, "tables[1].optimizer.momentum"},
    {"EpsilonZero", {"tables[0].optimizer.epsilon=0"}, "tables[0].optimizer.epsilon: must be > 0"},
    {"ClipValueNegative",
     {"tables[0].optimizer.clip_value=-1"},
     "tables[0].optimizer.clip_value: must be >= 0"},
    {"ClipNormNegative", {"tables[0].optimizer.clip_norm=-1"}, "tables[0].optimizer.clip_norm"},
    {"L1Negative", {"tables[0].optimizer.l1=-1"}, "tables[0].optimizer.l1"},
    {"WeightDecayInf",
     {"tables[0].optimizer.weight_decay=inf"},
     "tables[0].optimizer.weight_decay"},
    {"AdagradZeroAccumulator",
     {"tables[0].optimizer.kind=ADAGRAD", "tables[0].optimizer.initial_accumulator=0"},
     "tables[0].optimizer.initial_accumulator: must be > 0"},
    {"DefaultOptimizer", {"default_optimizer.learning_rate=-1"}, "default_optimizer.learning_rate"},
    // Model.
    {"MlpOneClass", {"model.mlp.num_classes=1"}, "model.mlp.num_classes: must be >= 2"},
    {"ModelTableReshaped",
     {"tables[mlp/layer0.w].shape=784,31"},
     "tables[2]: table 'mlp/layer0.w'"},
    // Cluster.
    {"NoServers", {"cluster.num_servers=0"}, "cluster: no servers"},
    {"ServerCountMismatch",
     {"cluster.num_servers=3", "cluster.servers=a:1,b:1"},
     "cluster.num_servers: 3"},
    {"EmptyServerAddress",
     {"cluster.num_servers=0", "cluster.servers=a:1,"},
     "cluster.servers[1]: empty"},
    {"NoWorkers", {"cluster.num_workers=0"}, "cluster.num_workers: must be > 0"},
    {"NoVirtualShards",
     {"cluster.num_virtual_shards=0"},
     "cluster.num_virtual_shards: must be > 0"},
    {"FewerShardsThanServers",
     {"cluster.num_virtual_shards=1"},
     "cluster.num_virtual_shards: 1 is less than the 2 servers"},
    {"ZeroBlockFloats",
     {"cluster.dense_block_floats=0"},
     "cluster.dense_block_floats: must be > 0"},
    // Data.
    {"FormatUnspecified", {"data.format=FORMAT_UNSPECIFIED"}, "data.format: unspecified"},
    {"IdxNeedsLabels", {"data.train_labels="}, "data.train_labels: required for format IDX"},
    {"IdxTestPair", {"data.test_images=x.gz"}, "data.test_labels: required"},
    {"IdxPixelScale", {"data.pixel_scale=0"}, "data.pixel_scale: must be > 0"},
    {"IdxPixelScaleTiny", {"data.pixel_scale=1e-38"}, "data.pixel_scale: so small"},
    {"LibsvmNeedsFile", {"data.format=LIBSVM"}, "data.train_file: required for format LIBSVM"},
    {"SyntheticNeedsCtr",
     {"data.format=SYNTHETIC_CTR"},
     "data.format: SYNTHETIC_CTR needs model.ctr"},
    {"SyntheticFields",
     {"data.format=SYNTHETIC_CTR", "data.synthetic.num_fields=0"},
     "data.synthetic.num_fields: must be > 0"},
    // Training, checkpoints, processes.
    {"BatchSizeZero", {"training.batch_size=0"}, "training.batch_size: must be > 0"},
    {"NegativeStaleness", {"training.staleness=-1"}, "training.staleness: must be >= 0"},
    {"UnknownDevice", {"training.device=gpu"}, "training.device: 'gpu' is not cpu, cuda or auto"},
    {"PrefetchUnderBsp", {"training.prefetch=true", "training.staleness=0"}, "training.prefetch"},
    {"PrefetchWithLocalSgd",
     {"training.prefetch=true", "training.local_sgd.steps=4"},
     "training.prefetch: does not combine with local_sgd"},
    {"DeterministicNeedsBsp", {"training.deterministic=true"}, "training.deterministic: needs BSP"},
    {"DeterministicUnderSsp",
     {"training.deterministic=true", "training.staleness=2"},
     "training.deterministic: needs BSP"},
    {"TargetMetric", {"training.target_metric=1.5"}, "training.target_metric"},
    {"KeepZero", {"checkpoint.keep=0"}, "checkpoint.keep: must be >= 1"},
    {"ServerMessageLimit", {"server.max_message_bytes=0"}, "server.max_message_bytes"},
    {"ServerStreams", {"server.max_concurrent_streams=0"}, "server.max_concurrent_streams"},
    {"ServerHandshake",
     {"server.handshake_timeout_s=0"},
     "server.handshake_timeout_s: must be > 0"},
    {"ServerStreamsOverInt",
     {"server.max_concurrent_streams=2147483648"},
     "server.max_concurrent_streams"},
    {"ServerPoolRequests", {"server.max_pool_requests=0"}, "server.max_pool_requests: must be > 0"},
    {"ServerPoolBytes",
     {"server.max_pool_request_bytes=0"},
     "server.max_pool_request_bytes: must be > 0"},
    {"ServerUnsentAnswers",
     {"server.max_unsent_answer_bytes=0"},
     "server.max_unsent_answer_bytes: must be > 0"},
    {"ServerUnsentAnswersPerPeer",
     {"server.max_unsent_answer_bytes_per_peer=0"},
     "server.max_unsent_answer_bytes_per_peer: must be > 0"},
    {"ServerBusyPoll", {"server.busy_poll_us=1000001"}, "server.busy_poll_us: must be <= 1000000"},
    {"RpcMessageLimit", {"rpc.max_message_bytes=4294967296"}, "rpc.max_message_bytes"},
    {"RpcBusyPoll", {"rpc.busy_poll_us=4000000"}, "rpc.busy_poll_us: must be <= 1000000"},
    {"ApplySpin", {"server.apply_spin_us=1000001"}, "server.apply_spin_us: must be <= 1000000"},
    {"DataThreads", {"server.data_threads=1025"}, "server.data_threads: must be <= 1024"},
    {"ApplyThreads", {"server.apply_threads=1025"}, "server.apply_threads: must be <= 1024"},
    {"ServerThreads", {"server.num_threads=4294967295"}, "server.num_threads: must be <= 1024"},
    {"RpcBackoffZero", {"rpc.initial_backoff_s=0"}, "rpc.initial_backoff_s: must be > 0"},
    {"RpcBackoffOrder",
     {"rpc.max_backoff_s=0.01"},
     "rpc.max_backoff_s: must be >= initial_backoff_s"},
    {"RpcDeadline", {"rpc.deadline_s=0"}, "rpc.deadline_s: must be > 0"},
    // More often than the server takes pings, idle connections are closed (GOAWAY).
    {"RpcKeepaliveBelowTheServersPingInterval",
     {"rpc.keepalive_s=1"},
     "rpc.keepalive_s: must be in [5, 2147483], got 1"},
    {"RpcKeepalivePastIntMilliseconds", {"rpc.keepalive_s=3e6"}, "rpc.keepalive_s: must be in"},
    {"MetricsPort", {"metrics.port=70000"}, "metrics.port"},
    // Security.
    {"SecurityUnchosen", {"security.plaintext=false"}, "security: choose plaintext"},
    {"PlaintextAndTls", {"security.ca_cert=ca.pem"}, "security.plaintext: set together with"},
    {"TlsMissingKey",
     {"security.plaintext=false", "security.ca_cert=ca.pem", "security.cert=c.pem"},
     "security.key: required for mutual TLS"},
};

INSTANTIATE_TEST_SUITE_P(AllFields, ValidateJobConfigErrorTest, testing::ValuesIn(kErrorCases),
                         [](const testing::TestParamInfo<ErrorCase>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace ps::common
