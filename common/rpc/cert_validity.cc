// A minimal DER walk: Certificate ::= SEQUENCE { tbsCertificate, ... } and
// TBSCertificate ::= SEQUENCE { [0] version OPTIONAL, serialNumber INTEGER, signature
// AlgorithmIdentifier, issuer Name, validity SEQUENCE { notBefore Time, notAfter Time }, ... }
// where Time is UTCTime (tag 0x17, YYMMDDHHMMSSZ) or GeneralizedTime (0x18, YYYYMMDDHHMMSSZ).
#include "common/rpc/cert_validity.h"

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace ps::common {
namespace {

constexpr absl::string_view kBegin = "-----BEGIN CERTIFICATE-----";
constexpr absl::string_view kEnd = "-----END CERTIFICATE-----";

struct Tlv {
  uint8_t tag = 0;
  absl::string_view value;
};

// Reads one DER element from the front of `*in` and advances past it.
bool ReadTlv(absl::string_view* in, Tlv* out) {
  if (in->size() < 2) return false;
  out->tag = static_cast<uint8_t>((*in)[0]);
  size_t len = static_cast<uint8_t>((*in)[1]);
  size_t header = 2;
  if (len & 0x80) {
    const size_t bytes = len & 0x7f;
    if (bytes == 0 || bytes > 4 || in->size() < 2 + bytes) return false;
    len = 0;
    for (size_t i = 0; i < bytes; ++i) len = (len << 8) | static_cast<uint8_t>((*in)[2 + i]);
    header += bytes;
  }
  if (in->size() - header < len) return false;
  out->value = in->substr(header, len);
  in->remove_prefix(header + len);
  return true;
}

bool Digits(absl::string_view s, size_t pos, size_t n, int* out) {
  if (pos + n > s.size()) return false;
  for (size_t i = pos; i < pos + n; ++i) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  return absl::SimpleAtoi(s.substr(pos, n), out);
}

bool ParseTime(const Tlv& tlv, absl::Time* out) {
  const absl::string_view s = tlv.value;
  int year = 0;
  size_t pos = 0;
  if (tlv.tag == 0x17) {  // UTCTime: 50..99 are 19xx (RFC 5280 4.1.2.5.1).
    if (!Digits(s, 0, 2, &year)) return false;
    year += year >= 50 ? 1900 : 2000;
    pos = 2;
  } else if (tlv.tag == 0x18) {
    if (!Digits(s, 0, 4, &year)) return false;
    pos = 4;
  } else {
    return false;
  }
  int month, day, hour, minute, second;
  if (!Digits(s, pos, 2, &month) || !Digits(s, pos + 2, 2, &day) ||
      !Digits(s, pos + 4, 2, &hour) || !Digits(s, pos + 6, 2, &minute) ||
      !Digits(s, pos + 8, 2, &second) || s.size() != pos + 11 || s[pos + 10] != 'Z') {
    return false;
  }
  *out = absl::FromCivil(absl::CivilSecond(year, month, day, hour, minute, second),
                         absl::UTCTimeZone());
  return true;
}

bool ParseValidity(absl::string_view der, CertValidity* out) {
  Tlv cert, tbs, field;
  if (!ReadTlv(&der, &cert) || cert.tag != 0x30) return false;
  absl::string_view rest = cert.value;
  if (!ReadTlv(&rest, &tbs) || tbs.tag != 0x30) return false;
  rest = tbs.value;
  if (!ReadTlv(&rest, &field)) return false;
  if (field.tag == 0xa0 && !ReadTlv(&rest, &field)) return false;  // version, then serial
  if (field.tag != 0x02) return false;
  Tlv algorithm, issuer, validity, not_before, not_after;
  if (!ReadTlv(&rest, &algorithm) || !ReadTlv(&rest, &issuer) || !ReadTlv(&rest, &validity) ||
      validity.tag != 0x30) {
    return false;
  }
  absl::string_view times = validity.value;
  return ReadTlv(&times, &not_before) && ReadTlv(&times, &not_after) &&
         ParseTime(not_before, &out->not_before) && ParseTime(not_after, &out->not_after);
}

std::string Format(absl::Time t) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", t, absl::UTCTimeZone());
}

}  // namespace

absl::StatusOr<std::vector<CertValidity>> ReadCertValidity(absl::string_view pem) {
  std::vector<CertValidity> result;
  for (size_t begin = pem.find(kBegin); begin != absl::string_view::npos;
       begin = pem.find(kBegin, begin + 1)) {
    const size_t body = begin + kBegin.size();
    const size_t end = pem.find(kEnd, body);
    if (end == absl::string_view::npos) {
      return absl::InvalidArgumentError("certificate block without its END line");
    }
    std::string base64 = absl::StrReplaceAll(pem.substr(body, end - body),
                                             {{"\n", ""}, {"\r", ""}, {" ", ""}, {"\t", ""}});
    std::string der;
    if (!absl::Base64Unescape(base64, &der)) {
      return absl::InvalidArgumentError(
          absl::StrCat("certificate ", result.size() + 1, " is not base64"));
    }
    CertValidity validity;
    if (!ParseValidity(der, &validity)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "certificate ", result.size() + 1, " is not an X.509 certificate with readable dates"));
    }
    result.push_back(validity);
  }
  return result;
}

absl::Status CheckCertValidity(absl::string_view pem, absl::string_view what, absl::Time now) {
  absl::StatusOr<std::vector<CertValidity>> all = ReadCertValidity(pem);
  if (!all.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", all.status().message()));
  for (size_t i = 0; i < all->size(); ++i) {
    const CertValidity& v = (*all)[i];
    const std::string which = all->size() > 1 ? absl::StrCat(" (certificate ", i + 1, ")") : "";
    if (now < v.not_before) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, which, " is not valid yet: valid from ", Format(v.not_before), " to ",
          Format(v.not_after), ", now ", Format(now)));
    }
    if (now > v.not_after) {
      return absl::FailedPreconditionError(absl::StrCat(what, which, " expired on ",
                                                        Format(v.not_after), " (valid from ",
                                                        Format(v.not_before), "), now ",
                                                        Format(now)));
    }
  }
  return absl::OkStatus();
}

}  // namespace ps::common
