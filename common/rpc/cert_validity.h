// The validity period of X.509 certificates in PEM files, read without a TLS library.
//
// gRPC loads an expired or not-yet-valid certificate without complaint; peers then fail the
// handshake and see only UNAVAILABLE or DEADLINE_EXCEEDED. Checking the dates where the
// credentials are made turns that into one clear error at start, naming the file and dates.
#ifndef PS_COMMON_RPC_CERT_VALIDITY_H_
#define PS_COMMON_RPC_CERT_VALIDITY_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ps::common {

struct CertValidity {
  absl::Time not_before;
  absl::Time not_after;
};

// The validity of every certificate ("-----BEGIN CERTIFICATE-----" block) in `pem`, in order.
// INVALID_ARGUMENT when a block is not base64 or not a DER certificate whose dates parse.
absl::StatusOr<std::vector<CertValidity>> ReadCertValidity(absl::string_view pem);

// OK when every certificate in `pem` is valid at `now`. FAILED_PRECONDITION naming `what`
// (e.g. "security.cert /path/server.pem") and the certificate's dates when one has expired or
// is not yet valid; INVALID_ARGUMENT as ReadCertValidity.
absl::Status CheckCertValidity(absl::string_view pem, absl::string_view what, absl::Time now);

}  // namespace ps::common

#endif  // PS_COMMON_RPC_CERT_VALIDITY_H_
