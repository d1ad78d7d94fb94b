// Argument checks shared by every Backend implementation, so that the CPU and CUDA backends
// reject exactly the same calls with the same messages. Header-only (also compiled by nvcc):
// the CUDA objects are linked after //kernels:backend and must not depend on its symbols.
// Internal to //kernels.
#ifndef PS_KERNELS_INTERNAL_BACKEND_CHECKS_H_
#define PS_KERNELS_INTERNAL_BACKEND_CHECKS_H_

#include <cstdint>
#include <initializer_list>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/optimizer.h"

namespace ps::kernels::internal {

inline absl::Status CheckSize(absl::string_view op, absl::string_view name, int64_t value,
                              int64_t min_value = 0) {
  if (value >= min_value) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", name, " must be >= ", min_value, ", got ", value));
}

// A pointer may be null only when it addresses nothing.
inline absl::Status CheckPointer(absl::string_view op, absl::string_view name, const void* p,
                                 int64_t count) {
  if (p != nullptr || count == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " is null"));
}

inline absl::Status CheckGemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a,
                              int lda, const float* b, int ldb, const float* c, int ldc) {
  constexpr absl::string_view kOp = "Gemm";
  const struct {
    const char* name;
    int64_t value;
    int64_t min;
  } checks[] = {
      {"m", m, 0},
      {"n", n, 0},
      {"k", k, 0},
      {"lda", lda, trans_a ? (m > 1 ? m : 1) : (k > 1 ? k : 1)},
      {"ldb", ldb, trans_b ? (k > 1 ? k : 1) : (n > 1 ? n : 1)},
      {"ldc", ldc, n > 1 ? n : 1},
  };
  for (const auto& check : checks) {
    if (absl::Status s = CheckSize(kOp, check.name, check.value, check.min); !s.ok()) return s;
  }
  const int64_t mk = int64_t{m} * k, kn = int64_t{k} * n, mn = int64_t{m} * n;
  for (absl::Status s : {CheckPointer(kOp, "a", a, mk), CheckPointer(kOp, "b", b, kn),
                         CheckPointer(kOp, "c", c, mn)}) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// rows x cols, both >= min, and the pointers non-null when there is data.
inline absl::Status CheckMatrix(absl::string_view op, int64_t rows, int64_t cols,
                                int64_t min_size, std::initializer_list<const void*> ptrs) {
  if (absl::Status s = CheckSize(op, "rows", rows, min_size); !s.ok()) return s;
  if (absl::Status s = CheckSize(op, "cols", cols, min_size); !s.ok()) return s;
  for (const void* p : ptrs) {
    if (absl::Status s = CheckPointer(op, "a data pointer", p, rows * cols); !s.ok()) return s;
  }
  return absl::OkStatus();
}

inline absl::Status CheckOptimizerCall(const OptimizerParams& p, int64_t step, int64_t n,
                                       const float* params, const float* grads,
                                       absl::Span<float* const> slots) {
  constexpr absl::string_view kOp = "ApplyOptimizer";
  for (absl::Status s : {ValidateOptimizerParams(p), CheckSize(kOp, "step", step, 1),
                         CheckSize(kOp, "n", n, 0), CheckPointer(kOp, "params", params, n),
                         CheckPointer(kOp, "grads", grads, n)}) {
    if (!s.ok()) return s;
  }
  if (slots.size() != static_cast<size_t>(NumSlots(p.kind))) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": ", OptimizerKindName(p.kind),
                                                   " needs ", NumSlots(p.kind),
                                                   " slots, got ", slots.size()));
  }
  for (float* slot : slots) {
    if (absl::Status s = CheckPointer(kOp, "slot", slot, n); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_INTERNAL_BACKEND_CHECKS_H_
