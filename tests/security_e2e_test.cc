// Mutual TLS and the bearer token against a real ps_server on 127.0.0.1 (port 0).
//
// tools/make_certs.sh writes the job's CA, certificates and token into TEST_TMPDIR, and a
// second run writes an unrelated CA with its own certificates. One server runs the whole suite
// with mutual TLS + token; each test connects a GrpcParameterStore with a different
// SecurityConfig and checks the exact refusal: UNAVAILABLE when the TLS handshake fails
// (plaintext client, certificate of another CA, server not trusted), UNAUTHENTICATED when
// the handshake succeeds but the token is wrong or missing. Bad clients get one attempt with a
// short deadline, so each refusal takes milliseconds, not the retry schedule.
//
// Identities: every process has a certificate naming its role (worker-I, operator, server,
// or client with no role). A worker may push, pull and heartbeat only as itself
// (PERMISSION_DENIED otherwise), admin calls (psctl checkpoint/shutdown) need the operator's
// certificate and token, and forged headers (negative ids, incarnation 2^64-1) are refused
// without locking the real worker out.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config/config.h"
#include "common/metrics/testing.h"
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
  cluster { num_servers: 1 num_workers: 2 }
  tables {
    name: "w"
    kind: TABLE_KIND_DENSE
    shape: 64
    initializer { kind: UNIFORM low: -1 high: 1 seed: 3 }
    optimizer { kind: SGD learning_rate: 0.5 }
  }
  checkpoint { interval_s: 0 }
  server { handshake_timeout_s: 1 }
)pb";

std::string SecurityText(const SecurityConfig& s) {
  std::string text = "security {";
  if (s.has_plaintext()) absl::StrAppend(&text, " plaintext: ", s.plaintext() ? "true" : "false");
  if (!s.ca_cert().empty()) absl::StrAppend(&text, " ca_cert: \"", s.ca_cert(), "\"");
  if (!s.cert().empty()) absl::StrAppend(&text, " cert: \"", s.cert(), "\"");
  if (!s.key().empty()) absl::StrAppend(&text, " key: \"", s.key(), "\"");
  if (!s.token_file().empty()) absl::StrAppend(&text, " token_file: \"", s.token_file(), "\"");
  if (!s.operator_token_file().empty()) {
    absl::StrAppend(&text, " operator_token_file: \"", s.operator_token_file(), "\"");
  }
  return text + " }\n";
}

// What make_certs.sh wrote into `dir`, as the snippet it prints: the servers' section.
SecurityConfig JobSecurity(const std::string& dir) {
  SecurityConfig s;
  s.set_ca_cert(dir + "/ca.pem");
  s.set_cert(dir + "/server.pem");
  s.set_key(dir + "/server.key");
  s.set_token_file(dir + "/token.txt");
  s.set_operator_token_file(dir + "/operator_token.txt");
  return s;
}

// A process of the job using the certificate pair `stem` (worker-0, operator, client...).
SecurityConfig RoleSecurity(const std::string& dir, const std::string& stem,
                            const std::string& token = "token.txt") {
  SecurityConfig s;
  s.set_ca_cert(dir + "/ca.pem");
  s.set_cert(absl::StrCat(dir, "/", stem, ".pem"));
  s.set_key(absl::StrCat(dir, "/", stem, ".key"));
  s.set_token_file(absl::StrCat(dir, "/", token));
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
    auto p = Subprocess::Start(
        {"/bin/bash", testing::RunfilePath("tools/make_certs.sh"), "--workers=2", out},
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
  static std::unique_ptr<worker::GrpcParameterStore> GoodClient(const SecurityConfig& security,
                                                                int32_t worker_id = 0) {
    worker::GrpcStoreOptions options;
    options.worker_id = worker_id;
    // Each store is a new incarnation of its worker, newer than the last one.
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

  // A client that gives up at the first refusal, acting as `worker_id`.
  static std::unique_ptr<worker::GrpcParameterStore> OneShotClient(
      const SecurityConfig& security, int32_t worker_id,
      uint64_t incarnation = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()))) {
    worker::GrpcStoreOptions options;
    options.worker_id = worker_id;
    options.worker_incarnation = incarnation;
    options.deadline = absl::Seconds(5);
    options.max_retries = 0;
    auto store = worker::GrpcParameterStore::Create(ClientConfig(security), options);
    EXPECT_THAT(store.status(), IsOk());
    return store.ok() ? *std::move(store) : nullptr;
  }

  static absl::Status PushOnes(worker::GrpcParameterStore* store, int64_t clock = 1) {
    common::PushBatch batch;
    const std::vector<float> grad(kFloats, 1.0f);
    batch.dense.push_back({"w", grad});
    return store->Push(batch, {clock, false});
  }

  // What a tool reads: the parameters, pulled as worker -1 with the client-only pair.
  static std::vector<float> Parameters() {
    auto store = OneShotClient(RoleSecurity(*dir_ + "/job", "client"), -1);
    std::vector<float> w;
    EXPECT_THAT(Pull(store.get(), &w), IsOk());
    return w;
  }

  // Runs psctl `command` with a client config using `security` against `address`; returns
  // its exit code, with its output in *log.
  static int Psctl(const std::vector<std::string>& command, const SecurityConfig& security,
                   const std::string& address, std::string* log) {
    static int runs = 0;
    const std::string name = absl::StrCat(*dir_, "/psctl", ++runs);
    std::ofstream(name + ".textproto") << kTablesConfig << SecurityText(security);
    std::vector<std::string> argv = {testing::RunfilePath("tools/psctl")};
    argv.insert(argv.end(), command.begin(), command.end());
    argv.push_back("--config=" + name + ".textproto");
    argv.push_back("--servers=" + address);
    argv.push_back("--timeout_s=10");
    auto p = Subprocess::Start(argv, name + ".log");
    EXPECT_THAT(p.status(), IsOk());
    if (!p.ok()) return -1;
    auto status = (*p)->Wait(absl::Seconds(30));
    *log = (*p)->ReadLog();
    if (!status.ok() || !WIFEXITED(*status)) return -1;
    return WEXITSTATUS(*status);
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
  auto store = GoodClient(RoleSecurity(*dir_ + "/job", "worker-0"));
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

TEST_F(SecurityE2eTest, ClientCertificateWithoutARoleMayReadButNotAct) {
  // The client-only pair (clientAuth, no role): a tool may read, never act as a worker.
  const SecurityConfig s = RoleSecurity(*dir_ + "/job", "client");
  EXPECT_THAT(BadClientPull(s), IsOk());
  auto store = OneShotClient(s, 0);
  ASSERT_NE(store, nullptr);
  EXPECT_THAT(PushOnes(store.get()), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(Pull(store.get(), nullptr), StatusIs(absl::StatusCode::kPermissionDenied));
}

// A peer that connects and sends nothing (no ClientHello: no certificate asked for yet) is
// disconnected after server.handshake_timeout_s (1 s here). Before 2026-12-05 it held its
// descriptor and memory for gRPC's default of 120 s; thousands of them ran the server out of
// descriptors.
TEST_F(SecurityE2eTest, APeerThatNeverHandshakesIsDisconnected) {
  const int port = std::stoi(address_->substr(address_->rfind(':') + 1));
  // Sends nothing and reads until the server closes (30 s: a safety net, not an assertion).
  absl::StatusOr<std::string> got = common::metrics::testing::SendRaw(port, "", absl::Seconds(30));
  ASSERT_THAT(got.status(), IsOk());  // DEADLINE_EXCEEDED: still open after 30 s
  EXPECT_EQ(*got, "");
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
  auto store = GoodClient(RoleSecurity(*dir_ + "/job", "worker-0"));
  ASSERT_NE(store, nullptr);
  EXPECT_THAT(Pull(store.get(), nullptr), IsOk());
}

// ---- Identities: who may act as whom ------------------------------------------------

TEST_F(SecurityE2eTest, WorkerCannotActAsAnotherWorker) {
  const std::vector<float> before = Parameters();
  // Worker 1's certificate, claiming worker 0; and the servers' shared certificate.
  for (const char* stem : {"worker-1", "server"}) {
    SCOPED_TRACE(stem);
    auto impostor = OneShotClient(RoleSecurity(*dir_ + "/job", stem), 0);
    ASSERT_NE(impostor, nullptr);
    EXPECT_THAT(PushOnes(impostor.get()),
                StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("worker 0")));
    EXPECT_THAT(Pull(impostor.get(), nullptr), StatusIs(absl::StatusCode::kPermissionDenied));
    // A forged finished=true heartbeat would take worker 0 out of the job.
    EXPECT_THAT(impostor->Finish(), StatusIs(absl::StatusCode::kPermissionDenied));
  }
  EXPECT_EQ(Parameters(), before);
}

TEST_F(SecurityE2eTest, PushWithoutAWorkerSlotIsRefused) {
  // Tools used to push as worker -1: applied every time, without exactly-once.
  const std::vector<float> before = Parameters();
  auto tool = OneShotClient(RoleSecurity(*dir_ + "/job", "client"), -1);
  ASSERT_NE(tool, nullptr);
  EXPECT_THAT(PushOnes(tool.get()), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(PushOnes(tool.get()), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(Parameters(), before);
}

TEST_F(SecurityE2eTest, ForgedIncarnationDoesNotLockTheWorkerOut) {
  // Worker 1 itself (a buggy or compromised process) claims incarnation 2^64-1.
  auto forged = OneShotClient(RoleSecurity(*dir_ + "/job", "worker-1"), 1, UINT64_MAX);
  ASSERT_NE(forged, nullptr);
  EXPECT_THAT(PushOnes(forged.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ahead")));
  // A real worker 1 started afterwards pushes, and its push is applied.
  const std::vector<float> before = Parameters();
  auto real = GoodClient(RoleSecurity(*dir_ + "/job", "worker-1"), 1);
  ASSERT_NE(real, nullptr);
  ASSERT_THAT(PushOnes(real.get()), IsOk());
  const std::vector<float> after = Parameters();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_NEAR(after[i], before[i] - kLearningRate, 1e-6) << "w[" << i << "]";
  }
}

TEST_F(SecurityE2eTest, AdminCallsNeedTheOperatorCertificateAndToken) {
  const std::string job = *dir_ + "/job";
  const struct {
    std::string name;
    SecurityConfig security;
  } cases[] = {{"client", RoleSecurity(job, "client")},
               {"worker", RoleSecurity(job, "worker-0")},
               {"server", RoleSecurity(job, "server")},
               {"operator_with_worker_token", RoleSecurity(job, "operator")},
               {"client_with_operator_token", RoleSecurity(job, "client", "operator_token.txt")}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::string log;
    EXPECT_EQ(Psctl({"shutdown", "--reason=test"}, c.security, *address_, &log), 1) << log;
    EXPECT_THAT(log, HasSubstr("PERMISSION_DENIED"));
    EXPECT_EQ(Psctl({"checkpoint"}, c.security, *address_, &log), 1) << log;
    EXPECT_THAT(log, HasSubstr("PERMISSION_DENIED"));
  }
  EXPECT_TRUE(server_->running());
  // The operator gets through to the call itself (this server has no data dir).
  std::string log;
  EXPECT_EQ(
      Psctl({"checkpoint"}, RoleSecurity(job, "operator", "operator_token.txt"), *address_, &log),
      1);
  EXPECT_THAT(log, HasSubstr("FAILED_PRECONDITION"));
  // Anyone of the job may read the status.
  EXPECT_EQ(Psctl({"status"}, RoleSecurity(job, "client"), *address_, &log), 0) << log;
}

TEST_F(SecurityE2eTest, OperatorShutdownNeedsAReasonAndIsLoggedWithWhoAsked) {
  std::unique_ptr<Subprocess> p = StartServer("stoppable", JobSecurity(*dir_ + "/job"));
  ASSERT_NE(p, nullptr);
  auto port = testing::WaitForFileLine(*dir_ + "/stoppable.port", absl::Seconds(30), p.get());
  ASSERT_THAT(port.status(), IsOk());
  const std::string address = absl::StrCat("127.0.0.1:", *port);
  const SecurityConfig op = RoleSecurity(*dir_ + "/job", "operator", "operator_token.txt");
  std::string log;
  EXPECT_EQ(Psctl({"shutdown"}, op, address, &log), 1) << log;  // no --reason
  EXPECT_TRUE(p->running());
  // A server that is down (nothing listens on port 1) does not keep the others running: each
  // is asked, and the failure is reported with the count (psctl stopped at the first
  // failure before 2026-12-05).
  EXPECT_EQ(Psctl({"shutdown", "--reason=disk swap on rack 4", "--checkpoint=false"}, op,
                  "127.0.0.1:1," + address, &log),
            1)
      << log;
  EXPECT_THAT(log, HasSubstr("1 of 2 servers did not take the shutdown"));
  EXPECT_THAT(log, HasSubstr(address + ": shutting down"));
  auto status = p->Wait(absl::Seconds(30));
  ASSERT_THAT(status.status(), IsOk());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << p->ReadLog();
  const std::string server_log = p->ReadLog();
  EXPECT_THAT(server_log, HasSubstr("shutdown requested by operator (ps://job/operator)"));
  EXPECT_THAT(server_log, HasSubstr("disk swap on rack 4"));
  EXPECT_THAT(server_log, ::testing::Not(HasSubstr("signal 15")));
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
  EXPECT_THAT(p->ReadLog(), HasSubstr("identities are not checked"));
  p->Signal(SIGTERM);
  auto status = p->Wait(absl::Seconds(20));
  ASSERT_THAT(status.status(), IsOk());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << p->ReadLog();
}

}  // namespace
}  // namespace ps
