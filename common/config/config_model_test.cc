#include <string>
#include <vector>

#include "common/config/config.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"

namespace ps::common {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

ps::JobConfig Config(const std::string& text) {
  ps::JobConfig config;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &config)) << text;
  return config;
}

std::vector<std::string> Names(const ps::JobConfig& config) {
  std::vector<std::string> names;
  for (const ps::TableConfig& t : config.tables()) names.push_back(t.name());
  return names;
}

std::vector<int64_t> Shape(const ps::TableConfig& table) {
  return {table.shape().begin(), table.shape().end()};
}

TEST(ModelTableNames, FollowThePrefixAndLayer) {
  ps::MlpConfig mlp;
  mlp.add_hidden(64);
  EXPECT_EQ(MlpNumLayers(mlp), 2);
  EXPECT_EQ(MlpWeightTable(mlp, 0), "mlp/layer0.w");
  EXPECT_EQ(MlpBiasTable(mlp, 1), "mlp/layer1.b");
  EXPECT_THAT(MlpLayerWidths(mlp), ElementsAre(784u, 64u, 10u));
  mlp.set_table_prefix("net/fc");
  EXPECT_EQ(MlpWeightTable(mlp, 1), "net/fc1.w");

  ps::CtrConfig ctr;
  EXPECT_EQ(CtrNumDenseLayers(ctr), 1);
  EXPECT_EQ(CtrWeightTable(ctr, 0), "ctr/dense0.w");
  EXPECT_EQ(CtrBiasTable(ctr, 0), "ctr/dense0.b");
  EXPECT_THAT(CtrLayerWidths(ctr), ElementsAre(16u, 1u));
}

TEST(ExpandModelTables, GeneratesMlpTables) {
  ps::JobConfig config = Config(R"pb(
    model {
      mlp {
        input_dim: 784
        hidden: [ 256, 128 ]
        num_classes: 10
      }
    }
    default_optimizer { kind: MOMENTUM learning_rate: 0.05 }
  )pb");
  ASSERT_OK(ExpandModelTables(&config));
  EXPECT_THAT(Names(config), ElementsAre("mlp/layer0.w", "mlp/layer0.b", "mlp/layer1.w",
                                         "mlp/layer1.b", "mlp/layer2.w", "mlp/layer2.b"));
  EXPECT_THAT(Shape(config.tables(0)), ElementsAre(784, 256));
  EXPECT_THAT(Shape(config.tables(1)), ElementsAre(256));
  EXPECT_THAT(Shape(config.tables(2)), ElementsAre(256, 128));
  EXPECT_THAT(Shape(config.tables(4)), ElementsAre(128, 10));
  EXPECT_THAT(Shape(config.tables(5)), ElementsAre(10));
  for (const ps::TableConfig& t : config.tables()) {
    EXPECT_EQ(t.kind(), ps::TABLE_KIND_DENSE);
    EXPECT_EQ(t.optimizer().kind(), ps::OptimizerConfig::MOMENTUM) << t.name();
    EXPECT_FLOAT_EQ(t.optimizer().learning_rate(), 0.05f);
  }
  EXPECT_EQ(config.tables(0).initializer().kind(), ps::InitializerConfig::GLOROT_UNIFORM);
  EXPECT_EQ(config.tables(1).initializer().kind(), ps::InitializerConfig::ZEROS);
}

TEST(ExpandModelTables, GeneratesCtrTables) {
  ps::JobConfig config = Config(R"pb(
    model {
      ctr {
        embedding_dim: 8
        hidden: [ 32 ]
      }
    }
  )pb");
  ASSERT_OK(ExpandModelTables(&config));
  EXPECT_THAT(Names(config), ElementsAre("ctr/embedding", "ctr/dense0.w", "ctr/dense0.b",
                                         "ctr/dense1.w", "ctr/dense1.b"));
  const ps::TableConfig& emb = config.tables(0);
  EXPECT_EQ(emb.kind(), ps::TABLE_KIND_SPARSE);
  EXPECT_EQ(emb.dim(), 8u);
  EXPECT_TRUE(emb.shape().empty());
  EXPECT_EQ(emb.initializer().kind(), ps::InitializerConfig::NORMAL);
  EXPECT_FLOAT_EQ(emb.initializer().stddev(), 0.01f);
  EXPECT_THAT(Shape(config.tables(1)), ElementsAre(8, 32));
  EXPECT_THAT(Shape(config.tables(3)), ElementsAre(32, 1));
  EXPECT_THAT(Shape(config.tables(4)), ElementsAre(1));
  // No default_optimizer: the OptimizerConfig defaults (SGD, lr 0.01), present.
  EXPECT_TRUE(emb.has_optimizer());
  EXPECT_EQ(emb.optimizer().kind(), ps::OptimizerConfig::SGD);
  EXPECT_FLOAT_EQ(emb.optimizer().learning_rate(), 0.01f);
}

TEST(ExpandModelTables, CtrWithoutHiddenIsLogisticRegression) {
  ps::JobConfig config = Config("model { ctr { } }");
  ASSERT_OK(ExpandModelTables(&config));
  EXPECT_THAT(Names(config), ElementsAre("ctr/embedding", "ctr/dense0.w", "ctr/dense0.b"));
  EXPECT_THAT(Shape(config.tables(1)), ElementsAre(16, 1));
}

TEST(ExpandModelTables, KeepsDeclaredTablesAndTheirSettings) {
  ps::JobConfig config = Config(R"pb(
    model { mlp { input_dim: 4 num_classes: 3 } }
    tables {
      name: "mlp/layer0.w"
      shape: [ 4, 3 ]
      initializer { kind: UNIFORM }
      optimizer { kind: ADAGRAD }
    }
    tables {
      name: "mlp/layer0.b"
      shape: [ 3 ]
    }
    tables {
      name: "other"
      shape: [ 5 ]
    }
  )pb");
  ASSERT_OK(ExpandModelTables(&config));
  EXPECT_THAT(Names(config), ElementsAre("mlp/layer0.w", "mlp/layer0.b", "other"));
  EXPECT_EQ(config.tables(0).initializer().kind(), ps::InitializerConfig::UNIFORM);
  EXPECT_EQ(config.tables(0).optimizer().kind(), ps::OptimizerConfig::ADAGRAD);
  // Declared without an initializer: the model's; without an optimizer: the default.
  EXPECT_TRUE(config.tables(1).has_initializer());
  EXPECT_EQ(config.tables(1).initializer().kind(), ps::InitializerConfig::ZEROS);
  EXPECT_TRUE(config.tables(2).has_optimizer());
  EXPECT_FALSE(config.tables(2).has_initializer());  // Not a model table.
}

TEST(ExpandModelTables, RejectsDeclaredTablesOfTheWrongLayout) {
  ps::JobConfig config = Config(R"pb(
    model { mlp { input_dim: 4 num_classes: 3 } }
    tables {
      name: "x"
      shape: [ 1 ]
    }
    tables {
      name: "mlp/layer0.w"
      shape: [ 3, 4 ]
    }
  )pb");
  EXPECT_THAT(ExpandModelTables(&config),
              StatusIs(kInvalid, testing::AllOf(HasSubstr("tables[1]"), HasSubstr("shape [3, 4]"),
                                                HasSubstr("needs dense, shape [4, 3]"))));
  config = Config(R"pb(
    model { ctr { embedding_dim: 8 } }
    tables {
      name: "ctr/embedding"
      kind: TABLE_KIND_DENSE
      shape: [ 8 ]
    }
  )pb");
  EXPECT_THAT(ExpandModelTables(&config), StatusIs(kInvalid, HasSubstr("needs sparse, dim 8")));
  config = Config(R"pb(
    model { ctr { embedding_dim: 8 } }
    tables { name: "ctr/embedding" kind: TABLE_KIND_SPARSE dim: 4 }
  )pb");
  EXPECT_THAT(ExpandModelTables(&config), StatusIs(kInvalid, HasSubstr("sparse, dim 4")));
}

TEST(ExpandModelTables, DeclaredEmbeddingDecidesTheWidthWhenUnset) {
  ps::JobConfig config = Config(R"pb(
    model { ctr { hidden: [ 5 ] } }
    tables { name: "ctr/embedding" kind: TABLE_KIND_SPARSE dim: 4 }
  )pb");
  ASSERT_OK(ExpandModelTables(&config));
  EXPECT_EQ(config.model().ctr().embedding_dim(), 4u);
  EXPECT_THAT(Shape(config.tables(1)), ElementsAre(4, 5));
}

TEST(ExpandModelTables, IsIdempotent) {
  ps::JobConfig config = Config(R"pb(
    model { ctr { hidden: [ 5 ] } }
    default_optimizer { kind: ADAM }
  )pb");
  ASSERT_OK(ExpandModelTables(&config));
  ps::JobConfig again = config;
  ASSERT_OK(ExpandModelTables(&again));
  EXPECT_EQ(again.SerializeAsString(), config.SerializeAsString());
}

TEST(ExpandModelTables, WithoutAModelOnlyFillsOptimizers) {
  ps::JobConfig config = Config(R"pb(
    tables {
      name: "t"
      shape: [ 2 ]
    }
    default_optimizer { kind: FTRL }
  )pb");
  ASSERT_OK(ExpandModelTables(&config));
  EXPECT_THAT(Names(config), ElementsAre("t"));
  EXPECT_EQ(config.tables(0).optimizer().kind(), ps::OptimizerConfig::FTRL);
}

TEST(ExpandModelTables, ZeroWidthsNameTheModelField) {
  ps::JobConfig config = Config("model { mlp { hidden: [ 8, 0 ] } }");
  EXPECT_THAT(ExpandModelTables(&config),
              StatusIs(kInvalid, HasSubstr("model.mlp.hidden[1]: must be > 0")));
  config = Config("model { mlp { input_dim: 0 } }");
  EXPECT_THAT(ExpandModelTables(&config), StatusIs(kInvalid, HasSubstr("model.mlp.input_dim")));
  config = Config("model { ctr { embedding_dim: 0 } }");
  EXPECT_THAT(ExpandModelTables(&config), StatusIs(kInvalid, HasSubstr("model.ctr.embedding_dim")));
  config = Config("model { ctr { embedding_table: \"\" } }");
  EXPECT_THAT(ExpandModelTables(&config),
              StatusIs(kInvalid, HasSubstr("model.ctr.embedding_table")));
}

}  // namespace
}  // namespace ps::common
