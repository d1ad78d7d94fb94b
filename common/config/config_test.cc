#include "common/config/config.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"

namespace ps::common {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

constexpr char kMnistConfig[] = R"pb(
  name: "mnist"
  cluster { num_servers: 2 num_workers: 2 }
  model {
    mlp {
      input_dim: 784
      hidden: [ 128 ]
      num_classes: 10
    }
  }
  data {
    format: IDX
    train_images: "train-images-idx3-ubyte.gz"
    train_labels: "train-labels-idx1-ubyte.gz"
  }
  training { batch_size: 32 staleness: 2 }
  security { plaintext: true }
  default_optimizer { kind: ADAM learning_rate: 0.001 }
  tables { name: "extra/emb" kind: TABLE_KIND_SPARSE dim: 4 }
  tables {
    name: "mlp/layer0.w"
    kind: TABLE_KIND_DENSE
    shape: [ 784, 128 ]
  }
)pb";

std::string WriteTempFile(const std::string& name, const std::string& contents) {
  std::string path = testing::TempDir() + "/" + name;
  std::ofstream(path) << contents;
  return path;
}

ps::JobConfig Parsed(const std::string& text = kMnistConfig) {
  absl::StatusOr<ps::JobConfig> config = ParseJobConfigText(text, "test.textproto");
  EXPECT_OK(config);
  return config.ok() ? *config : ps::JobConfig();
}

TEST(ParseJobConfigText, ParsesAndKeepsProtoDefaults) {
  ps::JobConfig config = Parsed();
  EXPECT_EQ(config.name(), "mnist");
  EXPECT_EQ(config.cluster().num_servers(), 2u);
  EXPECT_EQ(config.cluster().num_virtual_shards(), 4096u);  // Schema default.
  EXPECT_THAT(config.model().mlp().hidden(), ElementsAre(128u));
  EXPECT_EQ(config.training().staleness(), 2);
  EXPECT_EQ(config.tables_size(), 2);
}

TEST(ParseJobConfigText, UnknownFieldNamesSourceLineAndColumn) {
  EXPECT_THAT(
      ParseJobConfigText("name: \"x\"\ncluster {\n  num_servrs: 2\n}\n", "job.textproto"),
      StatusIs(kInvalid, testing::AllOf(HasSubstr("job.textproto:3:"), HasSubstr("num_servrs"))));
}

TEST(ParseJobConfigText, SyntaxErrorNamesLineAndColumn) {
  EXPECT_THAT(ParseJobConfigText("cluster {\n  num_servers: 2\n", "a.textproto"),
              StatusIs(kInvalid, HasSubstr("a.textproto:3:1:")));
  EXPECT_THAT(ParseJobConfigText("training { batch_size: -4 }", "b.textproto"),
              StatusIs(kInvalid, HasSubstr("b.textproto:1:24:")));
  EXPECT_THAT(ParseJobConfigText("cluster { num_servers: 1 num_servers: 2 }", "c.textproto"),
              StatusIs(kInvalid, HasSubstr("c.textproto:1:")));
}

TEST(LoadJobConfig, MissingFileIsNotFoundNamingThePath) {
  const std::string path = testing::TempDir() + "/does_not_exist.textproto";
  EXPECT_THAT(LoadJobConfig(path, {}), StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

TEST(LoadJobConfig, UnreadableFileIsInvalidArgumentNamingThePath) {
  const std::string dir = testing::TempDir();
  EXPECT_THAT(LoadJobConfig(dir, {}), StatusIs(kInvalid, HasSubstr(dir)));
}

TEST(LoadJobConfig, ParseErrorNamesFileAndLine) {
  const std::string path =
      WriteTempFile("bad.textproto", "name: \"x\"\n\ntraining { epochs: x }\n");
  EXPECT_THAT(LoadJobConfig(path, {}), StatusIs(kInvalid, HasSubstr(absl::StrCat(path, ":3:"))));
}

TEST(LoadJobConfig, AppliesOverridesInOrder) {
  const std::string path = WriteTempFile("good.textproto", kMnistConfig);
  std::vector<std::string> overrides = {"training.batch_size=7", "training.batch_size=9",
                                        "tables[extra/emb].dim=16"};
  ASSERT_OK_AND_ASSIGN(ps::JobConfig config, LoadJobConfig(path, overrides));
  EXPECT_EQ(config.training().batch_size(), 9u);
  EXPECT_EQ(config.tables(0).dim(), 16u);
}

TEST(LoadJobConfig, OverrideErrorNamesTheOverride) {
  const std::string path = WriteTempFile("good2.textproto", kMnistConfig);
  std::vector<std::string> overrides = {"training.batch_sise=7"};
  EXPECT_THAT(LoadJobConfig(path, overrides),
              StatusIs(kInvalid, HasSubstr("override 'training.batch_sise=7'")));
}

TEST(ApplyOverride, SetsScalarsOfEveryKind) {
  ps::JobConfig config = Parsed();
  EXPECT_OK(ApplyOverride("training.batch_size=128", &config));
  EXPECT_OK(ApplyOverride("training.staleness=-1", &config));
  EXPECT_OK(ApplyOverride("cluster.dense_block_floats=1024", &config));
  EXPECT_OK(ApplyOverride("training.target_metric=0.85", &config));
  EXPECT_OK(ApplyOverride("default_optimizer.learning_rate=0.5", &config));
  EXPECT_OK(ApplyOverride("security.plaintext=false", &config));
  EXPECT_OK(ApplyOverride("training.device=cuda", &config));
  EXPECT_OK(ApplyOverride("name=a=b", &config));  // Only the first '=' splits.
  EXPECT_EQ(config.training().batch_size(), 128u);
  EXPECT_EQ(config.training().staleness(), -1);
  EXPECT_EQ(config.cluster().dense_block_floats(), 1024u);
  EXPECT_DOUBLE_EQ(config.training().target_metric(), 0.85);
  EXPECT_FLOAT_EQ(config.default_optimizer().learning_rate(), 0.5f);
  EXPECT_TRUE(config.security().has_plaintext());
  EXPECT_FALSE(config.security().plaintext());
  EXPECT_EQ(config.training().device(), "cuda");
  EXPECT_EQ(config.name(), "a=b");
}

TEST(ApplyOverride, SetsEnumsByNameOrNumber) {
  ps::JobConfig config = Parsed();
  EXPECT_OK(ApplyOverride("default_optimizer.kind=FTRL", &config));
  EXPECT_EQ(config.default_optimizer().kind(), ps::OptimizerConfig::FTRL);
  EXPECT_OK(ApplyOverride("tables[0].kind=1", &config));
  EXPECT_EQ(config.tables(0).kind(), ps::TABLE_KIND_DENSE);
  EXPECT_THAT(
      ApplyOverride("default_optimizer.kind=ADAMW", &config),
      StatusIs(kInvalid, testing::AllOf(HasSubstr("'ADAMW'"), HasSubstr("default_optimizer.kind"),
                                        HasSubstr("MOMENTUM"))));
  EXPECT_THAT(ApplyOverride("default_optimizer.kind=17", &config), StatusIs(kInvalid));
}

TEST(ApplyOverride, SelectsRepeatedMessagesByIndexOrName) {
  ps::JobConfig config = Parsed();
  EXPECT_OK(ApplyOverride("tables[1].optimizer.learning_rate=0.1", &config));
  EXPECT_FLOAT_EQ(config.tables(1).optimizer().learning_rate(), 0.1f);
  // Names may contain '.' and '/'.
  EXPECT_OK(ApplyOverride("tables[mlp/layer0.w].initializer.seed=5", &config));
  EXPECT_EQ(config.tables(1).initializer().seed(), 5u);
  EXPECT_OK(ApplyOverride("tables[extra/emb].dim=8", &config));
  EXPECT_EQ(config.tables(0).dim(), 8u);
}

TEST(ApplyOverride, IndexOneBeyondTheEndAppends) {
  ps::JobConfig config = Parsed();
  EXPECT_OK(ApplyOverride("tables[2].name=new", &config));
  ASSERT_EQ(config.tables_size(), 3);
  EXPECT_EQ(config.tables(2).name(), "new");
  EXPECT_THAT(ApplyOverride("tables[4].name=x", &config),
              StatusIs(kInvalid, HasSubstr("tables[4]: index 4 out of range")));
  EXPECT_THAT(ApplyOverride("tables[nope].dim=8", &config),
              StatusIs(kInvalid, HasSubstr("no element of tables is named 'nope'")));
}

TEST(ApplyOverride, AssignsRepeatedScalarsFromCommaLists) {
  ps::JobConfig config = Parsed();
  EXPECT_OK(ApplyOverride("model.mlp.hidden=256, 128,64", &config));
  EXPECT_THAT(config.model().mlp().hidden(), ElementsAre(256u, 128u, 64u));
  EXPECT_OK(ApplyOverride("model.mlp.hidden[1]=32", &config));
  EXPECT_THAT(config.model().mlp().hidden(), ElementsAre(256u, 32u, 64u));
  EXPECT_OK(ApplyOverride("model.mlp.hidden[3]=16", &config));
  EXPECT_THAT(config.model().mlp().hidden(), ElementsAre(256u, 32u, 64u, 16u));
  EXPECT_OK(ApplyOverride("cluster.servers=h1:5000,h2:5000", &config));
  EXPECT_THAT(config.cluster().servers(), ElementsAre("h1:5000", "h2:5000"));
  EXPECT_OK(ApplyOverride("model.mlp.hidden=", &config));
  EXPECT_TRUE(config.model().mlp().hidden().empty());
  EXPECT_THAT(ApplyOverride("model.mlp.hidden=1,x", &config),
              StatusIs(kInvalid, HasSubstr("invalid value 'x' for model.mlp.hidden")));
}

TEST(ApplyOverride, ReplacesMessagesFromTextproto) {
  ps::JobConfig config = Parsed();
  EXPECT_OK(ApplyOverride("default_optimizer={kind: MOMENTUM nesterov: true}", &config));
  EXPECT_EQ(config.default_optimizer().kind(), ps::OptimizerConfig::MOMENTUM);
  EXPECT_TRUE(config.default_optimizer().nesterov());
  EXPECT_FALSE(config.default_optimizer().has_learning_rate());  // Replaced, not merged.
  EXPECT_OK(
      ApplyOverride("tables[extra/emb]={name: \"e2\" kind: TABLE_KIND_SPARSE dim: 3}", &config));
  EXPECT_EQ(config.tables(0).name(), "e2");
  EXPECT_THAT(ApplyOverride("default_optimizer={kind: NOPE}", &config),
              StatusIs(kInvalid, HasSubstr("default_optimizer:1:")));
}

TEST(ApplyOverride, SwitchesTheModelOneof) {
  ps::JobConfig config = Parsed();
  EXPECT_OK(ApplyOverride("model.ctr.embedding_dim=8", &config));
  EXPECT_TRUE(config.model().has_ctr());
  EXPECT_FALSE(config.model().has_mlp());
}

TEST(ApplyOverride, UnknownFieldNamesThePathComponent) {
  ps::JobConfig config = Parsed();
  EXPECT_THAT(ApplyOverride("cluster.num_servrs=2", &config),
              StatusIs(kInvalid, testing::AllOf(HasSubstr("unknown field 'num_servrs'"),
                                                HasSubstr("ps.ClusterConfig"))));
  EXPECT_THAT(ApplyOverride("bogus.x=1", &config),
              StatusIs(kInvalid, HasSubstr("unknown field 'bogus'")));
  EXPECT_THAT(ApplyOverride("tables[0].optimizer.lr=1", &config),
              StatusIs(kInvalid, HasSubstr("(at tables[0].optimizer.lr)")));
}

TEST(ApplyOverride, BadValueNamesFieldAndValue) {
  ps::JobConfig config = Parsed();
  EXPECT_THAT(
      ApplyOverride("training.batch_size=abc", &config),
      StatusIs(kInvalid, testing::AllOf(HasSubstr("'abc'"), HasSubstr("training.batch_size"))));
  EXPECT_THAT(ApplyOverride("training.batch_size=-1", &config),
              StatusIs(kInvalid, HasSubstr("'-1'")));
  EXPECT_THAT(ApplyOverride("training.batch_size=4294967296", &config), StatusIs(kInvalid));
  EXPECT_THAT(ApplyOverride("security.plaintext=yes", &config),
              StatusIs(kInvalid, HasSubstr("security.plaintext")));
  EXPECT_THAT(ApplyOverride("training.target_metric=0.5x", &config), StatusIs(kInvalid));
}

TEST(ApplyOverride, RejectsMalformedPaths) {
  ps::JobConfig config = Parsed();
  EXPECT_THAT(ApplyOverride("training.batch_size", &config),
              StatusIs(kInvalid, HasSubstr("expected path.to.field=value")));
  EXPECT_THAT(ApplyOverride("training..batch_size=1", &config), StatusIs(kInvalid));
  EXPECT_THAT(ApplyOverride("tables[0.dim=1", &config), StatusIs(kInvalid));
  EXPECT_THAT(ApplyOverride("tables[]=1", &config), StatusIs(kInvalid));
  EXPECT_THAT(ApplyOverride("training[0].epochs=1", &config),
              StatusIs(kInvalid, HasSubstr("not repeated")));
  EXPECT_THAT(ApplyOverride("tables.name=x", &config), StatusIs(kInvalid, HasSubstr("repeated")));
  EXPECT_THAT(ApplyOverride("tables=x", &config),
              StatusIs(kInvalid, HasSubstr("repeated message")));
  EXPECT_THAT(ApplyOverride("training.epochs.x=1", &config),
              StatusIs(kInvalid, HasSubstr("has no field 'x'")));
  EXPECT_THAT(ApplyOverride("model.mlp.hidden[0].x=1", &config),
              StatusIs(kInvalid, HasSubstr("has no fields")));
  EXPECT_THAT(ApplyOverride("cluster.servers[a]=x", &config),
              StatusIs(kInvalid, HasSubstr("not a number")));
}

TEST(LoadAndPrepareJobConfig, ExpandsAndValidates) {
  const std::string path = WriteTempFile("prepare.textproto", kMnistConfig);
  ASSERT_OK_AND_ASSIGN(ps::JobConfig config, LoadAndPrepareJobConfig(path, {}));
  std::vector<std::string> names;
  for (const ps::TableConfig& t : config.tables()) names.push_back(t.name());
  EXPECT_THAT(names, ElementsAre("extra/emb", "mlp/layer0.w", "mlp/layer0.b", "mlp/layer1.w",
                                 "mlp/layer1.b"));
  for (const ps::TableConfig& t : config.tables()) {
    EXPECT_EQ(t.optimizer().kind(), ps::OptimizerConfig::ADAM) << t.name();
  }
  // The declared table got the model's initializer.
  EXPECT_EQ(config.tables(1).initializer().kind(), ps::InitializerConfig::GLOROT_UNIFORM);
}

TEST(LoadAndPrepareJobConfig, ReportsExpansionAndValidationErrorsWithThePath) {
  const std::string path = WriteTempFile("prepare2.textproto", kMnistConfig);
  // The declared mlp/layer0.w is [784, 128]; 64 hidden units need [784, 64].
  EXPECT_THAT(LoadAndPrepareJobConfig(path, {"model.mlp.hidden=64"}),
              StatusIs(kInvalid, testing::AllOf(HasSubstr(path), HasSubstr("tables[1]"),
                                                HasSubstr("[784, 64]"))));
  EXPECT_THAT(LoadAndPrepareJobConfig(path, {"training.batch_size=0"}),
              StatusIs(kInvalid, testing::AllOf(HasSubstr(path),
                                                HasSubstr("training.batch_size: must be > 0"))));
}

}  // namespace
}  // namespace ps::common
