#include "common/rpc/cert_validity.h"

#include <string>

#include "absl/time/civil_time.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::common {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Self-signed EC certificates made for this test (public parts only).
constexpr char kExpiredPem[] = R"pem(-----BEGIN CERTIFICATE-----
MIIBETCBuKADAgECAgID6DAKBggqhkjOPQQDAjASMRAwDgYDVQQDDAdleHBpcmVk
MB4XDTIwMDEwMTAwMDAwMFoXDTIxMDEwMTEyMzAwNVowEjEQMA4GA1UEAwwHZXhw
aXJlZDBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABDjV5U1FY3TTelEVOvT9YRdb
Ss/KmGHX3RvAIB4amYJua/VGDpZiQVNsKn3rkhBnymd9bNOm3V4KWR7LGWa+u90w
CgYIKoZIzj0EAwIDSAAwRQIhAN9P3OEe2iMdmM4Ivn6lWnI2S+Tdngr5yg/SWWsH
NUJ9AiA5kbslNxVwkKie1YE1xsfqY1Ar1d1tfd47S9WrFGQ9tw==
-----END CERTIFICATE-----)pem";
constexpr char kFuturePem[] = R"pem(-----BEGIN CERTIFICATE-----
MIIBEjCBuqADAgECAgID6DAKBggqhkjOPQQDAjARMQ8wDQYDVQQDDAZmdXR1cmUw
IhgPMjA5OTA2MDEwMDAwMDBaGA8yMTAwMDEwMTAwMDAwMFowETEPMA0GA1UEAwwG
ZnV0dXJlMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEONXlTUVjdNN6URU69P1h
F1tKz8qYYdfdG8AgHhqZgm5r9UYOlmJBU2wqfeuSEGfKZ31s06bdXgpZHssZZr67
3TAKBggqhkjOPQQDAgNHADBEAiAm3M7aBDCsg5vLwXkH4NFjeKAu4kf81Mpbw+aj
SCI3cgIgROIjd10u9J/iPiaXJM6XhVIpdmqSkxbk1Q7Ic6A6Ibs=
-----END CERTIFICATE-----)pem";
constexpr char kValidPem[] = R"pem(-----BEGIN CERTIFICATE-----
MIIBDjCBtKADAgECAgID6DAKBggqhkjOPQQDAjAQMQ4wDAYDVQQDDAV2YWxpZDAe
Fw0yMDAxMDEwMDAwMDBaFw00OTEyMzEyMzU5NTlaMBAxDjAMBgNVBAMMBXZhbGlk
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEONXlTUVjdNN6URU69P1hF1tKz8qY
YdfdG8AgHhqZgm5r9UYOlmJBU2wqfeuSEGfKZ31s06bdXgpZHssZZr673TAKBggq
hkjOPQQDAgNJADBGAiEAgSWQezT+sWx6rWfMJj75oOmCFyY7qapkMVWjGFtXFd0C
IQCfN/TBze5KCtcpleUtr6kMVUGxKWFlr/woM8PaxZwpbg==
-----END CERTIFICATE-----)pem";

absl::Time Utc(int y, int m, int d, int hh = 0, int mm = 0, int ss = 0) {
  return absl::FromCivil(absl::CivilSecond(y, m, d, hh, mm, ss), absl::UTCTimeZone());
}

const absl::Time kNow = Utc(2026, 12, 1, 20, 45);

TEST(CertValidity, ReadsUtcAndGeneralizedTimes) {
  absl::StatusOr<std::vector<CertValidity>> expired = ReadCertValidity(kExpiredPem);
  ASSERT_TRUE(expired.ok()) << expired.status();
  ASSERT_EQ(expired->size(), 1u);
  EXPECT_EQ((*expired)[0].not_before, Utc(2020, 1, 1));
  EXPECT_EQ((*expired)[0].not_after, Utc(2021, 1, 1, 12, 30, 5));
  absl::StatusOr<std::vector<CertValidity>> future = ReadCertValidity(kFuturePem);
  ASSERT_TRUE(future.ok()) << future.status();
  EXPECT_EQ((*future)[0].not_before, Utc(2099, 6, 1));  // GeneralizedTime (year >= 2050)
}

TEST(CertValidity, ValidCertificateIsAccepted) {
  EXPECT_TRUE(CheckCertValidity(kValidPem, "security.cert v.pem", kNow).ok());
  // A chain: every certificate counts.
  EXPECT_TRUE(CheckCertValidity(std::string(kValidPem) + "\n" + kValidPem, "chain", kNow).ok());
}

TEST(CertValidity, ExpiredCertificateIsRefusedWithItsDates) {
  EXPECT_THAT(CheckCertValidity(kExpiredPem, "security.cert /x/server.pem", kNow),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("security.cert /x/server.pem expired on "
                                       "2021-01-01 12:30:05 UTC"),
                             HasSubstr("valid from 2020-01-01 00:00:00 UTC"),
                             HasSubstr("now 2026-12-01 20:45:00 UTC"))));
  EXPECT_THAT(CheckCertValidity(std::string(kValidPem) + kExpiredPem, "chain", kNow),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("(certificate 2)")));
}

TEST(CertValidity, NotYetValidCertificateIsRefusedWithItsDates) {
  EXPECT_THAT(CheckCertValidity(kFuturePem, "security.ca_cert ca.pem", kNow),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("is not valid yet: valid from 2099-06-01 00:00:00 UTC"),
                             HasSubstr("to 2100-01-01 00:00:00 UTC"))));
}

TEST(CertValidity, DamagedCertificateIsInvalidArgument) {
  std::string damaged = kValidPem;
  damaged.replace(damaged.find("MII") + 3, 4, "!!!!");
  EXPECT_THAT(CheckCertValidity(damaged, "security.cert c.pem", kNow),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("security.cert c.pem")));
  EXPECT_THAT(CheckCertValidity("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
                                "c", kNow),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace ps::common
