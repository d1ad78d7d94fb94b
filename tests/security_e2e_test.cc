// Mutual TLS and the bearer token against a real ps_server on 127.0.0.1 (port 0).
//
// tools/make_certs.sh writes the job's CA, certificates and token into TEST_TMPDIR, and a
// second run writes an unrelated CA with its own certificates. One server runs the whole suite
// with mutual TLS + token; each test connects a GrpcParameterStore with a different
// SecurityConfig and checks the exact refusal: UNAVAILABLE when the TLS handshake fails
// (plaintext client, certificate of another CA, server not trusted), UNAUTHENTICATED when
// the handshake succeeds but the token is wrong or missing. Bad clients get one attempt with a
// short deadline, so each refusal takes milliseconds, not the retry schedule.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/subprocess.h"
#include "worker/rpc/grpc_store.h"

namespace ps {
namespace {

using ::ps::common::IsOk;
using ::ps::common::StatusIs;
using ::ps::testing::Subprocess;
using ::testing::HasSubstr;

constexpr char kOpenssl[] = "/usr/bin/openssl";
constexpr int kFloats = 64;
constexpr float kLearningRate = 0.5f;

// Tables only: one small dense table, no checkpoints. The security section is appended.
constexpr char kTablesConfig[] = R"pb(
  cluster { num_servers: 1 num_workers: 1 }
  tables {
    name: "w"
    kind: TABLE_KIND_DENSE
    shape: 64
    initializer { kind: UNIFORM low: -1 high: 1 seed: 3 }
    optimizer { kind: SGD learning_rate: 0.5 }
  }
  checkpoint { interval_s: 0 }
)pb";

std::string SecurityText(const SecurityConfig& s) {
  std::string text = "security {";
  if (s.has_plaintext()) absl::StrAppend(&text, " plaintext: ", s.plaintext() ? "true" : "false");
  if (!s.ca_cert().empty()) absl::StrAppend(&text, " ca_cert: \"", s.ca_cert(), "\"");
  if (!s.cert().empty()) absl::StrAppend(&text, " cert: \"", s.cert(), "\"");
  if (!s.key().empty()) absl::StrAppend(&text, " key: \"", s.key(), "\"");
  if (!s.token_file().empty()) absl::StrAppend(&text, " token_file: \"", s.token_file(), "\"");
  return text + " }\n";
}

// What make_certs.sh wrote into `dir`, as the snippet it prints: every process uses the
// server pair.
SecurityConfig JobSecurity(const std::string& dir) {
  SecurityConfig s;
  s.set_ca_cert(dir + "/ca.pem");
  s.set_cert(dir + "/server.pem");
  s.set_key(dir + "/server.key");
  s.set_token_file(dir + "/token.txt");
  return s;
}

class SecurityE2eTest : public ::testing::Test {
 protected:
  static bool HaveOpenssl() { return access(kOpenssl, X_OK) == 0; }

  static void SetUpTestSuite() {
    if (!HaveOpenssl()) return;
    dir_ = new std::string(testing::MakeTempDir("security"));
    ASSERT_FALSE(dir_->empty());
    MakeCerts(*dir_ + "/job");
    MakeCerts(*dir_ + "/other");
    std::ofstream(*dir_ + "/wrong_token.txt") << "not-the-token\n";
    std::ofstream(*dir_ + "/empty.pem");  // zero bytes
    server_ = StartServer("tls", JobSecurity(*dir_ + "/job")).release();
    ASSERT_NE(server_, nullptr);
    auto port = testing::WaitForFileLine(*dir_ + "/tls.port", absl::Seconds(30), server_);
    ASSERT_THAT(port.status(), IsOk());
    address_ = new std::string(absl::StrCat("127.0.0.1:", *port));
  }

  static void TearDownTestSuite() {
    if (server_ != nullptr) {
      server_->Signal(SIGTERM);
      auto status = server_->Wait(absl::Seconds(20));
      EXPECT_THAT(status.status(), IsOk());
      EXPECT_TRUE(status.ok() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
          << server_->ReadLog();
      delete server_;
      server_ = nullptr;
    }
    delete address_;
    address_ = nullptr;
    delete dir_;
    dir_ = nullptr;
  }

  void SetUp() override {
    if (!HaveOpenssl()) GTEST_SKIP() << kOpenssl << " is missing (tools/setup.sh installs it)";
    ASSERT_NE(address_, nullptr) << "the TLS server did not start";
  }

  void TearDown() override {
    if (HasFailure() && server_ != nullptr) {
      ADD_FAILURE() << "server log:\n" << server_->ReadLog();
    }
  }

  static void MakeCerts(const std::string& out) {
    auto p = Subprocess::Start({"/bin/bash", testing::RunfilePath("tools/make_certs.sh"), out},
                               out + ".log");
    ASSERT_THAT(p.status(), IsOk());
    auto status = (*p)->Wait(absl::Seconds(30));
    ASSERT_THAT(status.status(), IsOk());
    ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << (*p)->ReadLog();
  }

  // Starts ps_server with kTablesConfig and `security`; it writes its port to <name>.port and
  // logs to <name>.log.
  static std::unique_ptr<Subprocess> StartServer(const std::string& name,
                                                 const SecurityConfig& security) {
    const std::string config_path = absl::StrCat(*dir_, "/", name, ".textproto");
    std::ofstream(config_path) << kTablesConfig << SecurityText(security);
    auto p =
        Subprocess::Start({testing::RunfilePath("server/ps_server"), "--config=" + config_path,
                           "--server_index=0", "--host=127.0.0.1", "--port=0",
                           absl::StrCat("--port_file=", *dir_, "/", name, ".port"), "--threads=2"},
                          absl::StrCat(*dir_, "/", name, ".log"));
    EXPECT_THAT(p.status(), IsOk());
    return p.ok() ? *std::move(p) : nullptr;
  }

  static JobConfig ClientConfig(const SecurityConfig& security) {
    auto config = common::ParseJobConfigText(kTablesConfig, "client");
    EXPECT_THAT(config.status(), IsOk());
    JobConfig c = config.ok() ? *config : JobConfig();
    *c.mutable_security() = security;
    c.mutable_cluster()->add_servers(*address_);
    return c;
  }

  // A worker that waits for the server and retries as in training.
  static std::unique_ptr<worker::GrpcParameterStore> GoodClient(const SecurityConfig& security) {
    worker::GrpcStoreOptions options;
    options.worker_id = 0;
    // Each store is a new incarnation of worker 0, newer than the last one.
    options.worker_incarnation = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
    options.deadline = absl::Seconds(10);
    auto store = worker::GrpcParameterStore::Create(ClientConfig(security), options);
    EXPECT_THAT(store.status(), IsOk());
    if (!store.ok()) return nullptr;
    EXPECT_THAT((*store)->WaitForServers(absl::Seconds(20)), IsOk());
    return *std::move(store);
  }

  // The result of one pull by a client that gives up at the first refusal.
  static absl::Status BadClientPull(const SecurityConfig& security) {
    worker::GrpcStoreOptions options;
    options.worker_id = -1;  // a tool: no part in the consistency bound
    options.deadline = absl::Seconds(5);
    options.max_retries = 0;
    auto store = worker::GrpcParameterStore::Create(ClientConfig(security), options);
    if (!store.ok()) return store.status();
    absl::Status status = Pull(store->get(), nullptr);
    // A refusal is the handshake or the token check failing, not the deadline running out.
    EXPECT_FALSE(absl::IsDeadlineExceeded(status)) << status;
    return status;
  }

  static absl::Status Pull(worker::GrpcParameterStore* store, std::vector<float>* out) {
    std::vector<float> w(kFloats);
    common::PullBatch batch;
    batch.dense.push_back({"w", absl::MakeSpan(w)});
    absl::Status status = store->Pull(batch, {});
    if (out != nullptr) *out = std::move(w);
    return status;
  }

  static std::string Job(const std::string& file) { return *dir_ + "/job/" + file; }
  static std::string Other(const std::string& file) { return *dir_ + "/other/" + file; }

  // Shared by the suite: set up once, since certificates and the server take a second.
  static std::string* dir_;
  static std::string* address_;
  static Subprocess* server_;
};

std::string* SecurityE2eTest::dir_ = nullptr;
std::string* SecurityE2eTest::address_ = nullptr;
Subprocess* SecurityE2eTest::server_ = nullptr;

TEST_F(SecurityE2eTest, ConfiguredClientPullsAndPushes) {
  auto store = GoodClient(JobSecurity(*dir_ + "/job"));
  ASSERT_NE(store, nullptr);
  std::vector<float> before, after;
  ASSERT_THAT(Pull(store.get(), &before), IsOk());
  common::PushBatch batch;
  const std::vector<float> grad(kFloats, 1.0f);
  batch.dense.push_back({"w", grad});
  ASSERT_THAT(store->Push(batch, {1, false}), IsOk());
  ASSERT_THAT(Pull(store.get(), &after), IsOk());
  for (int i = 0; i < kFloats; ++i) {
    EXPECT_NEAR(after[i], before[i] - kLearningRate, 1e-6) << "w[" << i << "]";
  }
}

TEST_F(SecurityE2eTest, ClientCertificateWithoutServerAuthIsAccepted) {
  // The client-only pair make_certs.sh writes for worker hosts.
  SecurityConfig s = JobSecurity(*dir_ + "/job");
  s.set_cert(Job("client.pem"));
  s.set_key(Job("client.key"));
  auto store = GoodClient(s);
  ASSERT_NE(store, nullptr);
  EXPECT_THAT(Pull(store.get(), nullptr), IsOk());
}

TEST_F(SecurityE2eTest, PlaintextClientIsUnavailable) {
  SecurityConfig s;
  s.set_plaintext(true);
  EXPECT_THAT(BadClientPull(s), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(SecurityE2eTest, ClientCertificateOfAnotherCaIsUnavailable) {
  // The client trusts the job's CA (so it accepts the server), but presents a certificate
  // the server's CA never signed.
  SecurityConfig s = JobSecurity(*dir_ + "/job");
  s.set_cert(Other("client.pem"));
  s.set_key(Other("client.key"));
  EXPECT_THAT(BadClientPull(s), StatusIs(absl::StatusCode::kUnavailable));
  s.set_cert(Other("server.pem"));
  s.set_key(Other("server.key"));
  EXPECT_THAT(BadClientPull(s), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(SecurityE2eTest, ServerOfAnotherCaIsUnavailable) {
  // A client of the other job does not trust this server (as if it were an impostor).
  EXPECT_THAT(BadClientPull(JobSecurity(*dir_ + "/other")),
              StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(SecurityE2eTest, WrongTokenIsUnauthenticated) {
  SecurityConfig s = JobSecurity(*dir_ + "/job");
  s.set_token_file(*dir_ + "/wrong_token.txt");
  EXPECT_THAT(BadClientPull(s), StatusIs(absl::StatusCode::kUnauthenticated));
}

TEST_F(SecurityE2eTest, MissingTokenIsUnauthenticated) {
  SecurityConfig s = JobSecurity(*dir_ + "/job");
  s.clear_token_file();
  EXPECT_THAT(BadClientPull(s), StatusIs(absl::StatusCode::kUnauthenticated));
}

TEST_F(SecurityE2eTest, EmptyCaFileIsInvalidArgument) {
  // gRPC would trust the system's roots for an empty CA, not the job's: refused up front.
  SecurityConfig s = JobSecurity(*dir_ + "/job");
  s.set_ca_cert(*dir_ + "/empty.pem");
  EXPECT_THAT(BadClientPull(s),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("security.ca_cert")));
}

TEST_F(SecurityE2eTest, ServerKeepsServingAfterRefusals) {
  SecurityConfig plaintext;
  plaintext.set_plaintext(true);
  SecurityConfig other_ca = JobSecurity(*dir_ + "/job");
  other_ca.set_cert(Other("client.pem"));
  other_ca.set_key(Other("client.key"));
  SecurityConfig wrong_token = JobSecurity(*dir_ + "/job");
  wrong_token.set_token_file(*dir_ + "/wrong_token.txt");
  for (int round = 0; round < 3; ++round) {
    EXPECT_THAT(BadClientPull(plaintext), StatusIs(absl::StatusCode::kUnavailable));
    EXPECT_THAT(BadClientPull(other_ca), StatusIs(absl::StatusCode::kUnavailable));
    EXPECT_THAT(BadClientPull(wrong_token), StatusIs(absl::StatusCode::kUnauthenticated));
  }
  EXPECT_TRUE(server_->running());
  auto store = GoodClient(JobSecurity(*dir_ + "/job"));
  ASSERT_NE(store, nullptr);
  EXPECT_THAT(Pull(store.get(), nullptr), IsOk());
}

TEST_F(SecurityE2eTest, ServerWithoutSecurityChoiceExitsNamingSecurity) {
  SecurityConfig incomplete_tls = JobSecurity(*dir_ + "/job");
  incomplete_tls.clear_key();
  SecurityConfig token_without_tls;
  token_without_tls.set_plaintext(true);
  token_without_tls.set_token_file(Job("token.txt"));
  const struct {
    std::string name;
    SecurityConfig security;
  } cases[] = {{"unchosen", SecurityConfig()},
               {"incomplete_tls", incomplete_tls},
               {"token_without_tls", token_without_tls}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::unique_ptr<Subprocess> p = StartServer(c.name, c.security);
    ASSERT_NE(p, nullptr);
    auto status = p->Wait(absl::Seconds(20));
    ASSERT_THAT(status.status(), IsOk());
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) != 0) << p->ReadLog();
    EXPECT_THAT(p->ReadLog(), HasSubstr("security"));
  }
}

TEST_F(SecurityE2eTest, PlaintextServerWarns) {
  SecurityConfig s;
  s.set_plaintext(true);
  std::unique_ptr<Subprocess> p = StartServer("plaintext", s);
  ASSERT_NE(p, nullptr);
  // The warning comes before the server listens, so it is in the log once the port is.
  ASSERT_THAT(
      testing::WaitForFileLine(*dir_ + "/plaintext.port", absl::Seconds(30), p.get()).status(),
      IsOk());
  EXPECT_THAT(p->ReadLog(), HasSubstr("security.plaintext is set: calls are neither encrypted nor "
                                      "authenticated"));
  p->Signal(SIGTERM);
  auto status = p->Wait(absl::Seconds(20));
  ASSERT_THAT(status.status(), IsOk());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << p->ReadLog();
}

}  // namespace
}  // namespace ps
