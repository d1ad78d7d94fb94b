#include "common/cluster/cluster_env.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/config.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::common {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// An OK StatusOr whose value matches `inner`.
MATCHER_P(HoldsValue, inner, "") {
  if (!arg.ok()) {
    *result_listener << "whose status is " << arg.status();
    return false;
  }
  return ::testing::ExplainMatchResult(inner, *arg, result_listener);
}

// ---- Choosing the source -------------------------------------------------------------------

TEST(ChooseClusterSource, AutoPrefersTfConfigThenSlurmThenFlags) {
  EXPECT_THAT(ChooseClusterSource("auto", {}), HoldsValue(ClusterSource::kFlags));
  EXPECT_THAT(ChooseClusterSource("auto", {{"SLURM_PROCID", "0"}}),
              HoldsValue(ClusterSource::kSlurm));
  EXPECT_THAT(ChooseClusterSource("auto", {{"SLURM_PROCID", "0"}, {"TF_CONFIG", "{}"}}),
              HoldsValue(ClusterSource::kTfConfig));
  // An empty TF_CONFIG counts as unset; auto never picks MPI.
  EXPECT_THAT(ChooseClusterSource("auto", {{"TF_CONFIG", ""}, {"OMPI_COMM_WORLD_RANK", "0"}}),
              HoldsValue(ClusterSource::kFlags));
}

TEST(ChooseClusterSource, ExplicitChoiceIgnoresTheEnvironment) {
  EXPECT_THAT(ChooseClusterSource("flags", {{"TF_CONFIG", "{}"}}),
              HoldsValue(ClusterSource::kFlags));
  EXPECT_THAT(ChooseClusterSource("tf_config", {}), HoldsValue(ClusterSource::kTfConfig));
  EXPECT_THAT(ChooseClusterSource("slurm", {}), HoldsValue(ClusterSource::kSlurm));
  EXPECT_THAT(ChooseClusterSource("mpi", {}), HoldsValue(ClusterSource::kMpi));
  EXPECT_THAT(ChooseClusterSource("k8s", {}),
              StatusIs(kInvalid, HasSubstr("--cluster_from=k8s: expected flags, tf_config")));
}

TEST(EnvMapFromEnviron, SplitsAtTheFirstEquals) {
  const char* entries[] = {"A=1", "B=x=y", "EMPTY=", "NOEQUALS", nullptr};
  EnvMap env = EnvMapFromEnviron(entries);
  EXPECT_EQ(env, (EnvMap{{"A", "1"}, {"B", "x=y"}, {"EMPTY", ""}}));
  EXPECT_TRUE(EnvMapFromEnviron(nullptr).empty());
}

// ---- TF_CONFIG -----------------------------------------------------------------------------

constexpr char kCluster[] =
    R"("cluster": {"chief": ["c0:2222"], "worker": ["w0:2222", "w1:2222"],
                   "ps": ["p0:2222", "p1:2223"], "evaluator": ["e0:2222"]})";

std::string TfConfig(const std::string& task) {
  return absl::StrCat("{", kCluster, R"(, "task": )", task, R"(, "environment": "cloud"})");
}

TEST(ClusterFromTfConfig, PsTaskIsAServerListeningOnItsPort) {
  ASSERT_OK_AND_ASSIGN(ClusterEnv env,
                       ClusterFromTfConfig(TfConfig(R"({"type": "ps", "index": 1})")));
  EXPECT_EQ(env.source, ClusterSource::kTfConfig);
  EXPECT_EQ(env.role, ClusterRole::kServer);
  EXPECT_EQ(env.index, 1);
  EXPECT_EQ(env.port, 2223);
  EXPECT_THAT(env.servers, ElementsAre("p0:2222", "p1:2223"));
  EXPECT_EQ(env.num_servers, 2u);
  EXPECT_EQ(env.num_workers, 3u);
  EXPECT_THAT(env.description, HasSubstr("server 1 of 2"));
}

TEST(ClusterFromTfConfig, ChiefIsWorkerZeroAndWorkersFollow) {
  ASSERT_OK_AND_ASSIGN(ClusterEnv chief,
                       ClusterFromTfConfig(TfConfig(R"({"type": "chief", "index": 0})")));
  EXPECT_EQ(chief.role, ClusterRole::kWorker);
  EXPECT_EQ(chief.index, 0);
  ASSERT_OK_AND_ASSIGN(ClusterEnv worker,
                       ClusterFromTfConfig(TfConfig(R"({"type": "worker", "index": 1})")));
  EXPECT_EQ(worker.role, ClusterRole::kWorker);
  EXPECT_EQ(worker.index, 2);
  EXPECT_EQ(worker.port, 0);
  EXPECT_EQ(worker.num_workers, 3u);
}

TEST(ClusterFromTfConfig, WithoutChiefWorkersKeepTheirIndex) {
  ASSERT_OK_AND_ASSIGN(ClusterEnv env,
                       ClusterFromTfConfig(R"({"cluster": {"ps": ["p:1"], "worker": ["a:1", "b:1"]},
                              "task": {"type": "worker", "index": 1}})"));
  EXPECT_EQ(env.index, 1);
  EXPECT_EQ(env.num_workers, 2u);
}

TEST(ClusterFromTfConfig, MasterIsTheChiefsOlderName) {
  ASSERT_OK_AND_ASSIGN(
      ClusterEnv env,
      ClusterFromTfConfig(R"({"cluster": {"ps": ["[::1]:5"], "master": ["m:1"], "worker": ["a:1"]},
                              "task": {"type": "worker", "index": 0}})"));
  EXPECT_EQ(env.index, 1);
  EXPECT_EQ(env.num_workers, 2u);
  EXPECT_THAT(env.servers, ElementsAre("[::1]:5"));
}

TEST(ClusterFromTfConfig, MalformedInputNamesTheVariableAndTheProblem) {
  struct Case {
    std::string value;
    std::string error;
  };
  const std::string ps = R"("ps": ["p:1"])";
  const std::string w = R"("worker": ["w:1"])";
  const std::string task = R"("task": {"type": "worker", "index": 0})";
  const Case cases[] = {
      {"", "empty"},
      {"{cluster}", "not valid JSON: Expected : between key:value pair"},
      {absl::StrCat(R"({"cluster": {)", ps, " ", w, "},", task, "}"), "not valid JSON"},
      {"[]", "is a JSON array, expected an object"},
      {absl::StrCat("{", task, "}"), "no \"cluster\""},
      {absl::StrCat(R"({"cluster": [], )", task, "}"), "\"cluster\" is a array"},
      {absl::StrCat(R"({"cluster": {)", ps, ",", w, "}}"), "no \"task\""},
      {absl::StrCat(R"({"cluster": {)", ps, ",", w, R"(}, "task": 3})"), "\"task\" is a number"},
      {absl::StrCat(R"({"cluster": {)", w, "},", task, "}"), "cluster.ps is missing or empty"},
      {absl::StrCat(R"({"cluster": {"ps": [], )", w, "},", task, "}"),
       "cluster.ps is missing or empty"},
      {absl::StrCat(R"({"cluster": {)", ps, "},", task, "}"),
       "cluster.worker and cluster.chief are missing or empty"},
      {absl::StrCat(R"({"cluster": {"ps": "p:1", )", w, "},", task, "}"),
       "cluster.ps is a string, expected an array"},
      {absl::StrCat(R"({"cluster": {"ps": ["p"], )", w, "},", task, "}"),
       "cluster.ps[0] is 'p', expected \"host:port\""},
      {absl::StrCat(R"({"cluster": {"ps": ["p:0"], )", w, "},", task, "}"),
       "cluster.ps[0] is 'p:0'"},
      {absl::StrCat(R"({"cluster": {"ps": ["p:65536"], )", w, "},", task, "}"),
       "cluster.ps[0] is 'p:65536'"},
      {absl::StrCat(R"({"cluster": {"ps": [":1"], )", w, "},", task, "}"), "cluster.ps[0] is ':1'"},
      {absl::StrCat(R"({"cluster": {"ps": ["p:1", 7], )", w, "},", task, "}"),
       "cluster.ps[1] is a number"},
      {absl::StrCat(R"({"cluster": {)", ps, R"(, "chief": ["a:1", "b:1"]},)", task, "}"),
       "cluster.chief lists 2 tasks"},
      {absl::StrCat(R"({"cluster": {)", ps, R"(, "chief": ["a:1"], "master": ["b:1"]},)", task,
                    "}"),
       "both \"chief\" and \"master\""},
      {absl::StrCat(R"({"cluster": {)", ps, ",", w, R"(}, "task": {"index": 0}})"),
       "task.type is missing"},
      {absl::StrCat(R"({"cluster": {)", ps, ",", w, R"(}, "task": {"type": 1, "index": 0}})"),
       "task.type is a number"},
      {absl::StrCat(R"({"cluster": {)", ps, ",", w, R"(}, "task": {"type": "ps"}})"),
       "task.index is missing"},
      {absl::StrCat(R"({"cluster": {)", ps, ",", w, R"(}, "task": {"type": "ps", "index": -1}})"),
       "task.index is -1, expected an integer >= 0"},
      {absl::StrCat(R"({"cluster": {)", ps, ",", w, R"(}, "task": {"type": "ps", "index": 0.5}})"),
       "task.index is 0.5"},
      {absl::StrCat(R"({"cluster": {)", ps, ",", w, R"(}, "task": {"type": "ps", "index": "0"}})"),
       "task.index is a string"},
      {absl::StrCat(R"({"cluster": {)", ps, ",", w, R"(}, "task": {"type": "ps", "index": 1}})"),
       "task.index 1 is out of range: cluster.ps has 1 entry"},
      {absl::StrCat(R"({"cluster": {)", ps, ",", w,
                    R"(}, "task": {"type": "worker", "index": 3}})"),
       "task.index 3 is out of range: cluster.worker has 1 entry"},
      {absl::StrCat(R"({"cluster": {)", ps, ",", w, R"(}, "task": {"type": "chief", "index": 0}})"),
       "task.type is \"chief\" but cluster.chief is missing"},
      {absl::StrCat(R"({"cluster": {)", ps,
                    R"(, "chief": ["c:1"]}, "task": {"type": "chief", "index": 1}})"),
       "task.index 1 is out of range: cluster.chief has 1 entry"},
      {absl::StrCat(R"({"cluster": {)", ps, ",", w,
                    R"(}, "task": {"type": "evaluator", "index": 0}})"),
       "task.type \"evaluator\" has no role"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ClusterFromTfConfig(c.value),
                StatusIs(kInvalid, AllOf(HasSubstr(absl::StrCat("TF_CONFIG='", c.value)),
                                         HasSubstr(c.error))))
        << c.value;
  }
}

// What JSON itself refuses, each as a whole TF_CONFIG: the parser's problem is named.
TEST(ClusterFromTfConfig, RefusesWhatIsNotJson) {
  const std::string cluster = R"("cluster": {"ps": ["p:1"], "worker": ["w:1"]})";
  const std::string task = R"("task": {"type": "worker", "index": 0})";
  const std::string cases[] = {
      absl::StrCat("{", cluster, " ", task, "}"),           // no comma between members
      absl::StrCat("{", cluster, ",", task, "} x"),         // text after the value
      absl::StrCat("{", cluster, ",", task, ",, }"),        // an empty member
      absl::StrCat("{", cluster, ",", task, ", \"e\": 01}"),  // leading zero
      absl::StrCat("{", cluster, ",", task, ", \"e\": +1}"),  // '+'
      absl::StrCat("{", cluster, ",", task, ", \"e\": -}"),
      absl::StrCat("{", cluster, ",", task, ", \"e\": NaN}"),
      absl::StrCat("{", cluster, ",", task, ", \"e\": tru}"),
      absl::StrCat("// c\n{", cluster, ",", task, "}"),  // comments
      absl::StrCat("{", cluster, ",", task, R"(, "e": "abc})"),      // unterminated string
      absl::StrCat("{", cluster, ",", task, R"(, "e": "\u12"})"),    // truncated \u escape
      absl::StrCat("{", cluster, ",", task, R"(, "e": "\u12G4"})"),  // not hex
      absl::StrCat("{", cluster, ",", task, R"(, "e": "\udc00"})"),  // lone low surrogate
      absl::StrCat("{", cluster, ",", task, R"(, "e": "\ud83d x"})"),  // lone high surrogate
      absl::StrCat("{", cluster, ",", task, ", \"e\": 1e400}"),  // beyond a double
      absl::StrCat("{", cluster, ","),
      absl::StrCat("{", cluster, ",", task, ", \"e\": [}"),
  };
  for (const std::string& value : cases) {
    EXPECT_THAT(ClusterFromTfConfig(value),
                StatusIs(kInvalid, AllOf(HasSubstr(absl::StrCat("TF_CONFIG='", value)),
                                         HasSubstr("not valid JSON: "))))
        << value;
  }
}

// A key given twice is refused, not silently resolved one way or the other.
TEST(ClusterFromTfConfig, RefusesADuplicateKey) {
  EXPECT_THAT(
      ClusterFromTfConfig(R"({"cluster": {"ps": ["a:1"], "worker": ["w:1"]},
                              "cluster": {"ps": ["b:1"], "worker": ["w:1"]},
                              "task": {"type": "ps", "index": 0}})"),
      StatusIs(kInvalid, AllOf(HasSubstr("not valid JSON"), HasSubstr("cluster"),
                               HasSubstr("already set"))));
  EXPECT_THAT(ClusterFromTfConfig(R"({"cluster": {"ps": ["a:1"], "worker": ["w:1"]},
                                      "task": {"type": "ps", "index": 0, "index": 0}})"),
              StatusIs(kInvalid, HasSubstr("'index' is already set")));
}

// The nesting bound is checked before parsing (the parser's time grows with the square of the
// depth): 32 levels are read, 33 refused, and brackets inside strings do not count.
TEST(ClusterFromTfConfig, BoundsTheNestingDepth) {
  auto with_extra = [](int depth, const std::string& inner) {
    return absl::StrCat(R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"]},
                            "task": {"type": "ps", "index": 0}, "environment": )",
                        std::string(depth - 1, '['), inner, std::string(depth - 1, ']'), "}");
  };
  EXPECT_THAT(ClusterFromTfConfig(with_extra(32, "")), IsOk());
  EXPECT_THAT(ClusterFromTfConfig(with_extra(33, "")),
              StatusIs(kInvalid, HasSubstr("not valid JSON: arrays and objects nested more than "
                                           "32 deep")));
  const std::string deep_text = absl::StrCat(R"(")", std::string(10000, '['), R"(\"")");
  EXPECT_THAT(ClusterFromTfConfig(with_extra(2, deep_text)), IsOk());
  EXPECT_THAT(ClusterFromTfConfig(std::string(100000, '[')),
              StatusIs(kInvalid, HasSubstr("nested more than 32 deep")));
}

TEST(ClusterFromTfConfig, DecodesUnicodeEscapesInAddresses) {
  ASSERT_OK_AND_ASSIGN(
      ClusterEnv env,
      ClusterFromTfConfig(R"({"cluster": {"ps": ["\u00e9\u20ac\ud83d\ude00:1"], "worker": ["w:1"]},
                              "task": {"type": "ps", "index": 0}})"));
  EXPECT_THAT(env.servers, ElementsAre("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80:1"));
  EXPECT_EQ(env.port, 1);
}

// JSON numbers are doubles: 1.0 is the index 1, and an index no list can reach (or no int64
// can hold) is out of range rather than undefined.
TEST(ClusterFromTfConfig, IndexIsAnyIntegralNumber) {
  const std::string cluster = R"({"cluster": {"ps": ["p:1", "q:2"], "worker": ["w:1"]}, )";
  ASSERT_OK_AND_ASSIGN(ClusterEnv env, ClusterFromTfConfig(absl::StrCat(
                                           cluster, R"("task": {"type": "ps", "index": 1.0}})")));
  EXPECT_EQ(env.index, 1);
  EXPECT_EQ(env.port, 2);
  EXPECT_THAT(
      ClusterFromTfConfig(absl::StrCat(cluster, R"("task": {"type": "ps", "index": 1e300}})")),
      StatusIs(kInvalid, HasSubstr("task.index 1e+300 is out of range: cluster.ps has 2")));
  EXPECT_THAT(ClusterFromTfConfig(absl::StrCat(
                  cluster, R"("task": {"type": "ps", "index": 123456789012345678901234}})")),
              StatusIs(kInvalid, HasSubstr("is out of range: cluster.ps has 2 entries")));
}

// Protobuf's parser takes a trailing comma (RFC 8259 does not); what the TF_CONFIG means is
// unchanged by it.
TEST(ClusterFromTfConfig, ATrailingCommaChangesNothing) {
  ASSERT_OK_AND_ASSIGN(ClusterEnv env,
                       ClusterFromTfConfig(R"({"cluster": {"ps": ["p:1", "q:2",], "worker": ["w:1"]},
                              "task": {"type": "ps", "index": 1},})"));
  EXPECT_THAT(env.servers, ElementsAre("p:1", "q:2"));
  EXPECT_EQ(env.index, 1);
}

// ---- SLURM hostlists and task lists --------------------------------------------------------

TEST(ExpandHostlist, ExpandsRangesListsAndPadding) {
  EXPECT_THAT(ExpandHostlist("n1"), HoldsValue(ElementsAre("n1")));
  EXPECT_THAT(ExpandHostlist("node[01-03,07],gpu5"),
              HoldsValue(ElementsAre("node01", "node02", "node03", "node07", "gpu5")));
  EXPECT_THAT(ExpandHostlist("n[8-10]"), HoldsValue(ElementsAre("n8", "n9", "n10")));
  EXPECT_THAT(ExpandHostlist("n[098-100]"), HoldsValue(ElementsAre("n098", "n099", "n100")));
  EXPECT_THAT(ExpandHostlist("r[1-2]n[1-2]"),
              HoldsValue(ElementsAre("r1n1", "r1n2", "r2n1", "r2n2")));
  EXPECT_THAT(ExpandHostlist("a,b[3],c-d.example.com"),
              HoldsValue(ElementsAre("a", "b3", "c-d.example.com")));
  EXPECT_THAT(ExpandHostlist("[1-2]x"), HoldsValue(ElementsAre("1x", "2x")));
  EXPECT_THAT(ExpandHostlist("127.0.0.[1-2]"), HoldsValue(ElementsAre("127.0.0.1", "127.0.0.2")));
}

TEST(ExpandHostlist, RefusesMalformedLists) {
  struct Case {
    const char* value;
    const char* error;
  };
  const Case cases[] = {
      {"", "empty host name"},
      {"a,,b", "empty host name"},
      {"a,", "empty host name"},
      {"n[1-2", "unclosed '['"},
      {"n1-2]", "']' without '['"},
      {"n[[1]]", "nested '['"},
      {"n[]", "empty []"},
      {"n[3-1]", "range '3-1' runs backwards"},
      {"n[a-b]", "bad range 'a-b'"},
      {"n[1-]", "bad range '1-'"},
      {"n[1-2-3]", "bad range '1-2-3'"},
      {"n[1,,2]", "bad range ''"},
      {"n[0-2000000]", "more than 1048576 names"},
      {"a b", "space in host name"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ExpandHostlist(c.value),
                StatusIs(kInvalid, AllOf(HasSubstr(absl::StrCat("hostlist '", c.value, "'")),
                                         HasSubstr(c.error))))
        << c.value;
  }
}

TEST(ExpandTasksPerNode, ExpandsRepeats) {
  EXPECT_THAT(ExpandTasksPerNode("2(x3),1"), HoldsValue(ElementsAre(2, 2, 2, 1)));
  EXPECT_THAT(ExpandTasksPerNode("4"), HoldsValue(ElementsAre(4)));
  EXPECT_THAT(ExpandTasksPerNode("1,2(x1),3"), HoldsValue(ElementsAre(1, 2, 3)));
}

TEST(ExpandTasksPerNode, RefusesMalformedLists) {
  for (const char* value : {"", "0", "x", "-1", "+2", "2,,1", "2(x0)", "2(3)", "2(x3", "2(x)",
                            "2(x-1)", "(x2)", "2(x2000000)"}) {
    EXPECT_THAT(ExpandTasksPerNode(value),
                StatusIs(kInvalid, HasSubstr(absl::StrCat("tasks per node '", value, "'"))))
        << value;
  }
}

// ---- SLURM ---------------------------------------------------------------------------------

// Four tasks on two nodes, two each, as `srun -n4` on 2 nodes sets them.
EnvMap SlurmStep(int procid) {
  return {{"SLURM_PROCID", absl::StrCat(procid)},
          {"SLURM_NTASKS", "4"},
          {"SLURM_STEP_NUM_TASKS", "4"},
          {"SLURM_STEP_NODELIST", "n[1-2]"},
          {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
          {"SLURM_JOB_NODELIST", "n[1-3]"},
          {"SLURM_TASKS_PER_NODE", "2(x3)"},
          {"SLURM_NODEID", absl::StrCat(procid / 2)},
          {"SLURM_LOCALID", absl::StrCat(procid % 2)},
          {"SLURM_JOB_ID", "1234"}};
}

TEST(ClusterFromSlurm, FirstRanksAreServersOnBasePortPlusLocalRank) {
  SlurmOptions options;
  options.num_servers = 2;
  options.base_port = 7000;
  ASSERT_OK_AND_ASSIGN(ClusterEnv server, ClusterFromSlurm(SlurmStep(1), options));
  EXPECT_EQ(server.source, ClusterSource::kSlurm);
  EXPECT_EQ(server.role, ClusterRole::kServer);
  EXPECT_EQ(server.index, 1);
  EXPECT_EQ(server.port, 7001);
  EXPECT_THAT(server.servers, ElementsAre("n1:7000", "n1:7001"));
  EXPECT_EQ(server.num_servers, 2u);
  EXPECT_EQ(server.num_workers, 2u);
  EXPECT_THAT(server.description, HasSubstr("on node n1 (local rank 1)"));

  ASSERT_OK_AND_ASSIGN(ClusterEnv worker, ClusterFromSlurm(SlurmStep(3), options));
  EXPECT_EQ(worker.role, ClusterRole::kWorker);
  EXPECT_EQ(worker.index, 1);
  EXPECT_EQ(worker.port, 0);
  EXPECT_THAT(worker.servers, ElementsAre("n1:7000", "n1:7001"));
}

TEST(ClusterFromSlurm, ServersOnDifferentNodesShareTheBasePort) {
  EnvMap env = {{"SLURM_PROCID", "1"},
                {"SLURM_NTASKS", "4"},
                {"SLURM_JOB_NODELIST", "a,b"},
                {"SLURM_TASKS_PER_NODE", "1,3"},
                {"SLURM_JOB_ID", "7"}};
  SlurmOptions options;
  options.num_servers = 2;
  options.base_port = 9000;
  ASSERT_OK_AND_ASSIGN(ClusterEnv env_out, ClusterFromSlurm(env, options));
  EXPECT_THAT(env_out.servers, ElementsAre("a:9000", "b:9000"));
  EXPECT_EQ(env_out.port, 9000);
}

TEST(ClusterFromSlurm, DerivesTheBasePortFromTheJobId) {
  SlurmOptions options;
  options.num_servers = 2;
  ASSERT_OK_AND_ASSIGN(ClusterEnv env, ClusterFromSlurm(SlurmStep(0), options));
  // 20000 + 16 * (1234 % 750)
  EXPECT_THAT(env.servers, ElementsAre("n1:27744", "n1:27745"));
  EXPECT_EQ(env.port, 27744);
}

TEST(ClusterFromSlurm, FallsBackToTheJobVariablesOutsideAStep) {
  EnvMap env = SlurmStep(2);
  env.erase("SLURM_STEP_NODELIST");
  env.erase("SLURM_STEP_TASKS_PER_NODE");
  env.erase("SLURM_STEP_NUM_TASKS");
  env["SLURM_NTASKS"] = "6";
  SlurmOptions options;
  options.num_servers = 1;
  options.base_port = 7000;
  ASSERT_OK_AND_ASSIGN(ClusterEnv out, ClusterFromSlurm(env, options));
  EXPECT_EQ(out.num_workers, 5u);
  EXPECT_EQ(out.index, 1);
}

TEST(ClusterFromSlurm, MalformedOrInconsistentVariablesAreNamed) {
  SlurmOptions options;
  options.num_servers = 2;
  options.base_port = 7000;
  struct Case {
    std::string name;
    std::string value;  // "" = unset
    std::string error;
  };
  const Case cases[] = {
      {"SLURM_PROCID", "", "SLURM_PROCID is not set"},
      {"SLURM_PROCID", "x", "SLURM_PROCID='x': expected a non-negative integer"},
      {"SLURM_PROCID", "-1", "SLURM_PROCID='-1'"},
      {"SLURM_PROCID", "4", "SLURM_PROCID=4 is out of range for SLURM_STEP_NUM_TASKS=4"},
      {"SLURM_STEP_NUM_TASKS", "5",
       "SLURM_STEP_TASKS_PER_NODE=2(x2) adds up to 4 tasks but "
       "SLURM_STEP_NUM_TASKS=5"},
      {"SLURM_STEP_NODELIST", "n[1-3]",
       "SLURM_STEP_NODELIST=n[1-3] names 3 nodes but SLURM_STEP_TASKS_PER_NODE=2(x2) counts 2"},
      {"SLURM_STEP_NODELIST", "n[1-", "SLURM_STEP_NODELIST: hostlist 'n[1-': unclosed '['"},
      {"SLURM_STEP_TASKS_PER_NODE", "", "SLURM_STEP_TASKS_PER_NODE is not set"},
      {"SLURM_STEP_TASKS_PER_NODE", "2(x2", "SLURM_STEP_TASKS_PER_NODE: tasks per node '2(x2'"},
      {"SLURM_NODEID", "1",
       "SLURM_NODEID=1 but the block layout of SLURM_STEP_NODELIST=n[1-2] and "
       "SLURM_STEP_TASKS_PER_NODE=2(x2) puts SLURM_PROCID=0 at node 0 (n1) local rank 0"},
      {"SLURM_LOCALID", "1", "--distribution=block"},
      {"SLURM_LOCALID", "one", "SLURM_LOCALID='one'"},
  };
  for (const Case& c : cases) {
    EnvMap env = SlurmStep(0);
    if (c.value.empty()) {
      env.erase(c.name);
    } else {
      env[c.name] = c.value;
    }
    EXPECT_THAT(ClusterFromSlurm(env, options), StatusIs(kInvalid, HasSubstr(c.error)))
        << c.name << "=" << c.value;
  }
}

TEST(ClusterFromSlurm, RefusesAServerCountThatLeavesNoWorker) {
  SlurmOptions options;
  options.num_servers = 4;
  options.base_port = 7000;
  EXPECT_THAT(ClusterFromSlurm(SlurmStep(0), options),
              StatusIs(kInvalid, HasSubstr("cluster.num_servers=4 leaves no worker among the "
                                           "SLURM_STEP_NUM_TASKS=4 tasks")));
}

TEST(ClusterFromSlurm, RefusesPortsItCannotGive) {
  SlurmOptions options;
  options.num_servers = 2;
  options.base_port = 65535;
  EXPECT_THAT(ClusterFromSlurm(SlurmStep(0), options),
              StatusIs(kInvalid, HasSubstr("--base_port=65535 + local rank 1 is beyond port")));
  options.base_port = 0;
  EnvMap no_job = SlurmStep(0);
  no_job.erase("SLURM_JOB_ID");
  EXPECT_THAT(ClusterFromSlurm(no_job, options),
              StatusIs(kInvalid, HasSubstr("SLURM_JOB_ID is not set")));
  EnvMap crowded = {{"SLURM_PROCID", "0"},
                    {"SLURM_NTASKS", "20"},
                    {"SLURM_JOB_NODELIST", "n1"},
                    {"SLURM_TASKS_PER_NODE", "20"},
                    {"SLURM_JOB_ID", "5"}};
  options.num_servers = 17;
  EXPECT_THAT(ClusterFromSlurm(crowded, options),
              StatusIs(kInvalid, HasSubstr("local rank 16 on its node")));
}

// ---- MPI -----------------------------------------------------------------------------------

EnvMap MpiRank(const std::string& rank, const std::string& size = "4") {
  return {{"OMPI_COMM_WORLD_RANK", rank},
          {"OMPI_COMM_WORLD_SIZE", size},
          {"OMPI_COMM_WORLD_LOCAL_RANK", rank},
          {"OMPI_MCA_ess_base_jobid", "622198785"}};
}

TEST(ClusterFromMpi, SplitsRanksIntoServersAndWorkers) {
  ASSERT_OK_AND_ASSIGN(ClusterEnv server, ClusterFromMpi(MpiRank("1"), 2));
  EXPECT_EQ(server.role, ClusterRole::kServer);
  EXPECT_EQ(server.index, 1);
  EXPECT_EQ(server.port, 0);
  EXPECT_TRUE(server.servers.empty());
  EXPECT_EQ(server.num_workers, 2u);
  ASSERT_OK_AND_ASSIGN(ClusterEnv worker, ClusterFromMpi(MpiRank("3"), 2));
  EXPECT_EQ(worker.role, ClusterRole::kWorker);
  EXPECT_EQ(worker.index, 1);
  EXPECT_THAT(worker.description, HasSubstr("MPI rank 3 of 4 (local rank 3): worker 1 of 2"));
}

TEST(ClusterFromMpi, MalformedVariablesAreNamed) {
  EnvMap no_rank = MpiRank("0");
  no_rank.erase("OMPI_COMM_WORLD_RANK");
  EXPECT_THAT(ClusterFromMpi(no_rank, 1),
              StatusIs(kInvalid, HasSubstr("OMPI_COMM_WORLD_RANK is not set")));
  EXPECT_THAT(ClusterFromMpi(MpiRank("one"), 1),
              StatusIs(kInvalid, HasSubstr("OMPI_COMM_WORLD_RANK='one'")));
  EXPECT_THAT(ClusterFromMpi(MpiRank("0", "four"), 1),
              StatusIs(kInvalid, HasSubstr("OMPI_COMM_WORLD_SIZE='four'")));
  EXPECT_THAT(ClusterFromMpi(MpiRank("4"), 1),
              StatusIs(kInvalid, HasSubstr("OMPI_COMM_WORLD_RANK=4 is out of range for "
                                           "OMPI_COMM_WORLD_SIZE=4")));
  EXPECT_THAT(ClusterFromMpi(MpiRank("0", "2"), 2),
              StatusIs(kInvalid, HasSubstr("cluster.num_servers=2 leaves no worker")));
}

// ---- Rendezvous ----------------------------------------------------------------------------

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(base != nullptr ? base : "/tmp", "/", name, "-", getpid());
  mkdir(dir.c_str(), 0755);
  return dir;
}

TEST(Rendezvous, JobDirIsKeyedByTheMpiJob) {
  EXPECT_EQ(RendezvousJobDir("/r", MpiRank("0")), "/r/622198785");
  EXPECT_EQ(RendezvousJobDir("/r", {{"PMIX_NAMESPACE", "prterun-h/1@0"}}), "/r/prterun-h_1_0");
  EXPECT_EQ(RendezvousJobDir("/r", {}), "/r/job");
  EXPECT_EQ(RendezvousJobDir("/r", {{"PMIX_NAMESPACE", ".."}}), "/r/job");
}

TEST(Rendezvous, WorkersReadWhatServersPublish) {
  const std::string job = TempDir("rendezvous") + "/a/b";
  ASSERT_OK(PublishServerAddress(job, 1, "h1:7001"));
  ASSERT_OK(PublishServerAddress(job, 0, "h0:7000"));
  EXPECT_THAT(WaitForServerAddresses(job, 2, absl::Seconds(10)),
              HoldsValue(ElementsAre("h0:7000", "h1:7001")));
}

TEST(Rendezvous, MissingServersAreNamedAfterTheTimeout) {
  const std::string job = TempDir("rendezvous-missing");
  ASSERT_OK(PublishServerAddress(job, 1, "h1:7001"));
  EXPECT_THAT(WaitForServerAddresses(job, 3, absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr("server(s) 0,2 of 3"), HasSubstr(job))));
}

TEST(Rendezvous, RefusesAFileThatHoldsNoAddress) {
  const std::string job = TempDir("rendezvous-bad");
  std::ofstream(job + "/server-0") << "garbage\n";
  EXPECT_THAT(WaitForServerAddresses(job, 1, absl::Seconds(10)),
              StatusIs(kInvalid, HasSubstr("holds 'garbage', expected host:port")));
}

TEST(Rendezvous, PublishFailsWhereNoDirectoryCanBe) {
  const std::string dir = TempDir("rendezvous-file");
  std::ofstream(dir + "/plain") << "x";
  EXPECT_THAT(PublishServerAddress(dir + "/plain/job", 0, "h:1"),
              StatusIs(kInvalid, HasSubstr("exists and is not a directory")));
}

// ---- ResolveCluster ------------------------------------------------------------------------

JobConfig Config(const std::string& cluster) {
  absl::StatusOr<JobConfig> config =
      ParseJobConfigText(absl::StrCat("cluster {", cluster, "}"), "test");
  EXPECT_THAT(config.status(), IsOk());
  return config.value_or(JobConfig());
}

const char kTfWorker1[] =
    R"({"cluster": {"ps": ["p0:2222", "p1:2222"], "worker": ["w0:1", "w1:1"]},
        "task": {"type": "worker", "index": 1}})";
const char kTfPs0[] =
    R"({"cluster": {"ps": ["p0:2222", "p1:2222"], "worker": ["w0:1", "w1:1"]},
        "task": {"type": "ps", "index": 0}})";

TEST(ResolveCluster, FlagsChangeNothing) {
  JobConfig config = Config("num_servers: 2 num_workers: 3");
  const JobConfig before = config;
  ClusterOptions options;
  options.cluster_from = "flags";
  options.index = 2;
  ASSERT_OK_AND_ASSIGN(ClusterIdentity id,
                       ResolveCluster(options, {{"TF_CONFIG", kTfWorker1}}, &config));
  EXPECT_EQ(id.source, ClusterSource::kFlags);
  EXPECT_EQ(id.index, 2);
  EXPECT_EQ(config.DebugString(), before.DebugString());
}

TEST(ResolveCluster, TfConfigFillsTheClusterOfAWorker) {
  JobConfig config;
  ClusterOptions options;
  ASSERT_OK_AND_ASSIGN(ClusterIdentity id,
                       ResolveCluster(options, {{"TF_CONFIG", kTfWorker1}}, &config));
  EXPECT_EQ(id.source, ClusterSource::kTfConfig);
  EXPECT_EQ(id.index, 1);
  EXPECT_THAT(config.cluster().servers(), ElementsAre("p0:2222", "p1:2222"));
  EXPECT_EQ(config.cluster().num_servers(), 2u);
  EXPECT_EQ(config.cluster().num_workers(), 2u);
}

TEST(ResolveCluster, AgreeingFlagsAndConfigAreFine) {
  JobConfig config = Config(R"(num_servers: 2 num_workers: 2 servers: ["p0:2222", "p1:2222"])");
  ClusterOptions options;
  options.role = ClusterRole::kServer;
  options.index = 0;
  options.port = 2222;
  ASSERT_OK_AND_ASSIGN(ClusterIdentity id,
                       ResolveCluster(options, {{"TF_CONFIG", kTfPs0}}, &config));
  EXPECT_EQ(id.index, 0);
  EXPECT_EQ(id.port, 2222);
}

TEST(ResolveCluster, RefusesAProcessInTheWrongRole) {
  JobConfig config;
  ClusterOptions options;  // a worker binary
  EXPECT_THAT(
      ResolveCluster(options, {{"TF_CONFIG", kTfPs0}}, &config),
      StatusIs(kInvalid, AllOf(HasSubstr("TF_CONFIG task ps[0] makes this process server 0"),
                               HasSubstr("start ps_server for this task"))));
  options.role = ClusterRole::kServer;
  EXPECT_THAT(ResolveCluster(options, {{"TF_CONFIG", kTfWorker1}}, &config),
              StatusIs(kInvalid, HasSubstr("start ps_worker for this task")));
}

TEST(ResolveCluster, DisagreementsNameBothValuesAndOrigins) {
  struct Case {
    std::string cluster;
    std::optional<int32_t> index;
    std::optional<int32_t> port;
    ClusterRole role;
    std::string error;
  };
  const Case cases[] = {
      {"", 0, std::nullopt, ClusterRole::kWorker,
       "worker index: 0 from --worker_index disagrees with 1 from TF_CONFIG task worker[1]"},
      {"num_workers: 3", std::nullopt, std::nullopt, ClusterRole::kWorker,
       "cluster.num_workers: 3 from the config (file or --set) disagrees with 2 from TF_CONFIG "
       "(cluster.worker has 2)"},
      {"num_servers: 3", std::nullopt, std::nullopt, ClusterRole::kWorker,
       "cluster.num_servers: 3 from the config (file or --set) disagrees with 2 from TF_CONFIG "
       "(cluster.ps has 2)"},
      {R"(servers: ["x:1", "y:1"])", std::nullopt, std::nullopt, ClusterRole::kWorker,
       "cluster.servers: x:1,y:1 from --servers disagrees with p0:2222,p1:2222 from TF_CONFIG "
       "cluster.ps"},
      {"", std::nullopt, 7000, ClusterRole::kServer,
       "port: 7000 from --port disagrees with 2222 from TF_CONFIG cluster.ps[0]=p0:2222"},
  };
  for (const Case& c : cases) {
    JobConfig config = Config(c.cluster);
    ClusterOptions options;
    options.role = c.role;
    options.index = c.index;
    options.port = c.port;
    options.servers_origin = "--servers";
    const char* tf = c.role == ClusterRole::kServer ? kTfPs0 : kTfWorker1;
    EXPECT_THAT(ResolveCluster(options, {{"TF_CONFIG", tf}}, &config),
                StatusIs(kInvalid, HasSubstr(c.error)))
        << c.error;
  }
}

TEST(ResolveCluster, SlurmTakesTheServerCountFromTheConfig) {
  JobConfig config = Config("num_servers: 2");
  ClusterOptions options;
  options.cluster_from = "auto";
  options.role = ClusterRole::kServer;
  options.base_port = 7000;
  ASSERT_OK_AND_ASSIGN(ClusterIdentity id, ResolveCluster(options, SlurmStep(1), &config));
  EXPECT_EQ(id.source, ClusterSource::kSlurm);
  EXPECT_EQ(id.index, 1);
  EXPECT_EQ(id.port, 7001);
  EXPECT_THAT(config.cluster().servers(), ElementsAre("n1:7000", "n1:7001"));
  EXPECT_EQ(config.cluster().num_workers(), 2u);

  JobConfig no_count;
  EXPECT_THAT(ResolveCluster(options, SlurmStep(1), &no_count),
              StatusIs(kInvalid, HasSubstr("SLURM gives only the number of tasks: set "
                                           "cluster.num_servers")));
  JobConfig wrong_workers = Config("num_servers: 2 num_workers: 5");
  EXPECT_THAT(ResolveCluster(options, SlurmStep(1), &wrong_workers),
              StatusIs(kInvalid, HasSubstr("cluster.num_workers: 5 from the config (file or "
                                           "--set) disagrees with 2 from SLURM "
                                           "(SLURM_STEP_NUM_TASKS=4 less 2 servers)")));
  options.role = ClusterRole::kWorker;
  EXPECT_THAT(ResolveCluster(options, SlurmStep(1), &config),
              StatusIs(kInvalid, HasSubstr("SLURM_PROCID=1 with cluster.num_servers=2 makes "
                                           "this process server 1")));
}

TEST(ResolveCluster, MpiServersPublishAndWorkersWait) {
  const std::string dir = TempDir("resolve-mpi");
  ClusterOptions options;
  options.cluster_from = "mpi";
  options.role = ClusterRole::kServer;
  options.rendezvous_dir = dir;
  JobConfig server_config = Config("num_servers: 2");
  ASSERT_OK_AND_ASSIGN(ClusterIdentity server,
                       ResolveCluster(options, MpiRank("1"), &server_config));
  EXPECT_EQ(server.index, 1);
  EXPECT_EQ(server.rendezvous_job_dir, dir + "/622198785");
  ASSERT_OK(PublishServerAddress(server.rendezvous_job_dir, 0, "h:5000"));
  ASSERT_OK(PublishServerAddress(server.rendezvous_job_dir, 1, "h:5001"));

  options.role = ClusterRole::kWorker;
  options.rendezvous_timeout = absl::Seconds(10);
  JobConfig worker_config = Config("num_servers: 2");
  ASSERT_OK_AND_ASSIGN(ClusterIdentity worker,
                       ResolveCluster(options, MpiRank("3"), &worker_config));
  EXPECT_EQ(worker.index, 1);
  EXPECT_THAT(worker_config.cluster().servers(), ElementsAre("h:5000", "h:5001"));
  EXPECT_EQ(worker_config.cluster().num_workers(), 2u);

  options.rendezvous_dir.clear();
  EXPECT_THAT(ResolveCluster(options, MpiRank("3"), &worker_config),
              StatusIs(kInvalid, HasSubstr("--cluster_from=mpi needs --rendezvous_dir")));
}

TEST(ResolveCluster, ExplicitSourceWithoutItsVariablesFails) {
  JobConfig config = Config("num_servers: 1");
  ClusterOptions options;
  options.cluster_from = "tf_config";
  EXPECT_THAT(ResolveCluster(options, {}, &config),
              StatusIs(kInvalid, HasSubstr("TF_CONFIG is not set")));
  options.cluster_from = "slurm";
  EXPECT_THAT(ResolveCluster(options, {}, &config),
              StatusIs(kInvalid, HasSubstr("SLURM_PROCID is not set")));
}

}  // namespace
}  // namespace ps::common
