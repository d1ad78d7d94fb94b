#include "worker/rpc/unanswered.h"

#include "absl/time/clock.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::worker {
namespace {

using ::ps::common::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(NotAnsweringLog, NamesTheServerItsAddressAndHowLongItIsSilent) {
  NotAnsweringLog log({"h0:7000", "h1:7001"}, absl::Seconds(10));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  // The first attempt ran out its deadline: silent for one deadline already.
  EXPECT_EQ(log.OnRetry(1, 1, absl::DeadlineExceededError("Deadline Exceeded"), t0),
            "server 1 (h1:7001) not answering for 10 s, retrying (attempt 1: DEADLINE_EXCEEDED: "
            "Deadline Exceeded)");
  EXPECT_THAT(log.OnRetry(1, 2, absl::DeadlineExceededError("x"), t0 + absl::Seconds(12)),
              HasSubstr("not answering for 22 s, retrying (attempt 2"));
  log.OnAnswer(1);
  EXPECT_THAT(log.OnRetry(1, 1, absl::UnavailableError("refused"), t0 + absl::Seconds(60)),
              HasSubstr("server 1 (h1:7001) not answering for 0 s"));
}

TEST(TlsHandshakeFailure, IsAClearErrorNamingTheServerAndTheReason) {
  const absl::Status tls = absl::UnavailableError(
      "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:7000: Ssl "
      "handshake failed: SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:"
      "CERTIFICATE_VERIFY_FAILED");
  std::optional<absl::Status> error = TlsHandshakeFailure(tls, 0, "127.0.0.1:7000");
  ASSERT_TRUE(error.has_value());
  EXPECT_THAT(*error, StatusIs(absl::StatusCode::kUnavailable,
                               AllOf(HasSubstr("server 0 (127.0.0.1:7000): TLS handshake failed"),
                                     HasSubstr("CERTIFICATE_VERIFY_FAILED"))));
}

TEST(TlsHandshakeFailure, OtherErrorsAreNotTlsFailures) {
  EXPECT_FALSE(TlsHandshakeFailure(absl::UnavailableError(
                                       "failed to connect to all addresses; last error: "
                                       "UNKNOWN: ipv4:127.0.0.1:7000: Connection refused"),
                                   0, "a")
                   .has_value());
  EXPECT_FALSE(TlsHandshakeFailure(absl::OkStatus(), 0, "a").has_value());
}

}  // namespace
}  // namespace ps::worker
