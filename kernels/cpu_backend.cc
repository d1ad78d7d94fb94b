// The CPU backend: OpenBLAS for GEMM, plain single-threaded loops for the rest. "Device"
// pointers are host pointers. Also the reference the CUDA backend is tested against, so the
// loops favour clarity and a fixed summation order over cleverness.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/nonfinite.h"
#include "common/status_macros.h"
#include "kernels/backend.h"
#include "kernels/blas_core.h"
#include "kernels/internal/backend_checks.h"
#include "kernels/internal/backend_factories.h"
#include "kernels/optimizer.h"

namespace ps::kernels {
namespace {

using internal::CheckMatrix;
using internal::CheckPointer;
using internal::CheckSize;

constexpr size_t kAlignment = 256;

// Log-sum-exp and argmax (lowest index among ties) of one row; if `probs` is not null writes
// softmax(row) there (probs may equal row).
struct RowStats {
  float log_sum_exp;
  int64_t argmax;
};

RowStats SoftmaxRow(const float* row, int64_t classes, float* probs) {
  float max = row[0];
  int64_t argmax = 0;
  for (int64_t j = 1; j < classes; ++j) {
    if (row[j] > max) {
      max = row[j];
      argmax = j;
    }
  }
  float sum = 0;
  for (int64_t j = 0; j < classes; ++j) sum += std::exp(row[j] - max);
  if (probs != nullptr) {
    const float inv_sum = 1.f / sum;
    for (int64_t j = 0; j < classes; ++j) probs[j] = std::exp(row[j] - max) * inv_sum;
  }
  return {max + std::log(sum), argmax};
}

absl::Status CheckLabels(int64_t rows, int64_t classes, const int32_t* labels) {
  for (int64_t r = 0; r < rows; ++r) {
    if (labels[r] < 0 || labels[r] >= classes) {
      return absl::InvalidArgumentError(absl::StrCat("softmax cross-entropy: label ", labels[r],
                                                     " of row ", r, " is outside [0, ",
                                                     classes, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status IndexError(absl::string_view op, int64_t bad_count, int64_t rows) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", bad_count,
                                                 " indices outside [0, ", rows, ")"));
}

// Thread-compatible (see Backend).
class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options) {
    if (options.num_threads > 0) openblas_set_num_threads(options.num_threads);
  }

  DeviceKind kind() const override { return DeviceKind::kCpu; }

  std::string Description() const override {
    return absl::StrCat("cpu (OpenBLAS ", BlasCoreName(), " kernels, ", openblas_get_num_threads(),
                        " threads)");
  }

  absl::Status CopyToDevice(void* device_dst, const void* host_src, size_t bytes) override {
    return Copy("CopyToDevice", device_dst, host_src, bytes);
  }
  absl::Status CopyToHost(void* host_dst, const void* device_src, size_t bytes) override {
    return Copy("CopyToHost", host_dst, device_src, bytes);
  }
  absl::Status CopyDeviceToDevice(void* device_dst, const void* device_src,
                                  size_t bytes) override {
    return Copy("CopyDeviceToDevice", device_dst, device_src, bytes);
  }

  absl::Status Fill(float* x, int64_t n, float value) override {
    RETURN_IF_ERROR(CheckSize("Fill", "n", n));
    RETURN_IF_ERROR(CheckPointer("Fill", "x", x, n));
    std::fill_n(x, n, value);
    return absl::OkStatus();
  }

  absl::Status Zero(void* x, size_t bytes) override {
    RETURN_IF_ERROR(CheckPointer("Zero", "x", x, static_cast<int64_t>(bytes)));
    if (bytes > 0) std::memset(x, 0, bytes);
    return absl::OkStatus();
  }

  absl::Status Synchronize() override { return absl::OkStatus(); }

  absl::Status Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                    int lda, const float* b, int ldb, float beta, float* c, int ldc) override {
    RETURN_IF_ERROR(internal::CheckGemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc));
    if (m == 0 || n == 0) return absl::OkStatus();
    if (k == 0) {
      // C = beta * C; done here because BLAS implementations disagree on k == 0.
      for (int64_t i = 0; i < m; ++i) {
        float* row = c + i * ldc;
        for (int64_t j = 0; j < n; ++j) row[j] = beta == 0 ? 0.f : beta * row[j];
      }
      return absl::OkStatus();
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c,
                ldc);
    return absl::OkStatus();
  }

  absl::Status BiasAdd(int64_t rows, int64_t cols, const float* bias, float* x) override {
    RETURN_IF_ERROR(CheckMatrix("BiasAdd", rows, cols, 0, {bias, x}));
    for (int64_t r = 0; r < rows; ++r) {
      float* __restrict row = x + r * cols;
      for (int64_t c = 0; c < cols; ++c) row[c] += bias[c];
    }
    return absl::OkStatus();
  }

  absl::Status BiasGrad(int64_t rows, int64_t cols, const float* dy, float* db) override {
    RETURN_IF_ERROR(CheckMatrix("BiasGrad", rows, cols, 0, {dy, db}));
    // Row by row (not column by column) so the inner loop is contiguous; the CUDA kernel adds
    // in the same row order, so both give bit-identical sums.
    std::fill_n(db, cols, 0.f);
    for (int64_t r = 0; r < rows; ++r) {
      const float* __restrict row = dy + r * cols;
      for (int64_t c = 0; c < cols; ++c) db[c] += row[c];
    }
    return absl::OkStatus();
  }

  absl::Status ActivationForward(Activation act, int64_t n, const float* x, float* y) override {
    RETURN_IF_ERROR(CheckMatrix("ActivationForward", 1, n, 0, {x, y}));
    switch (act) {
      case Activation::kRelu:
        for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0 ? x[i] : 0.f;
        return absl::OkStatus();
      case Activation::kTanh:
        for (int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
        return absl::OkStatus();
      case Activation::kSigmoid:
        for (int64_t i = 0; i < n; ++i) y[i] = 1.f / (1.f + std::exp(-x[i]));
        return absl::OkStatus();
    }
    return absl::InvalidArgumentError("ActivationForward: unknown activation");
  }

  absl::Status ActivationBackward(Activation act, int64_t n, const float* y, const float* dy,
                                  float* dx) override {
    RETURN_IF_ERROR(CheckMatrix("ActivationBackward", 1, n, 0, {y, dy, dx}));
    switch (act) {
      case Activation::kRelu:
        // dy[i] read whatever y[i] is: GCC then makes the select a vector blend. Read only
        // where y[i] > 0, the loop was not vectorized ("control flow in loop") and its branch
        // mispredicted on about half the elements: 3 ns each, 5% of a 2 + 2 MLP run's CPU.
        for (int64_t i = 0; i < n; ++i) {
          const float g = dy[i];
          dx[i] = y[i] > 0 ? g : 0.f;
        }
        return absl::OkStatus();
      case Activation::kTanh:
        for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * (1.f - y[i] * y[i]);
        return absl::OkStatus();
      case Activation::kSigmoid:
        for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * y[i] * (1.f - y[i]);
        return absl::OkStatus();
    }
    return absl::InvalidArgumentError("ActivationBackward: unknown activation");
  }

  absl::StatusOr<float> SoftmaxCrossEntropy(int64_t rows, int64_t classes, const float* logits,
                                            const int32_t* labels, float* grad_out) override {
    RETURN_IF_ERROR(CheckMatrix("SoftmaxCrossEntropy", rows, classes, 1, {logits, labels}));
    RETURN_IF_ERROR(CheckLabels(rows, classes, labels));
    double loss_sum = 0;
    const float inv_rows = 1.f / static_cast<float>(rows);
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = logits + r * classes;
      const float label_logit = row[labels[r]];  // Read before grad_out may overwrite it.
      float* grad = grad_out == nullptr ? nullptr : grad_out + r * classes;
      const RowStats stats = SoftmaxRow(row, classes, grad);
      loss_sum += stats.log_sum_exp - label_logit;
      if (grad != nullptr) {
        grad[labels[r]] -= 1.f;
        for (int64_t j = 0; j < classes; ++j) grad[j] *= inv_rows;
      }
    }
    return static_cast<float>(loss_sum / rows);
  }

  absl::StatusOr<SoftmaxEvalResult> SoftmaxEval(int64_t rows, int64_t classes,
                                                const float* logits, const int32_t* labels,
                                                float* probabilities) override {
    RETURN_IF_ERROR(CheckMatrix("SoftmaxEval", rows, classes, 1, {logits, labels}));
    RETURN_IF_ERROR(CheckLabels(rows, classes, labels));
    double loss_sum = 0;
    SoftmaxEvalResult result;
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = logits + r * classes;
      const float label_logit = row[labels[r]];
      const RowStats stats = SoftmaxRow(
          row, classes, probabilities == nullptr ? nullptr : probabilities + r * classes);
      loss_sum += stats.log_sum_exp - label_logit;
      result.num_correct += stats.argmax == labels[r] ? 1 : 0;
    }
    result.mean_loss = static_cast<float>(loss_sum / rows);
    return result;
  }

  absl::StatusOr<float> SigmoidCrossEntropy(int64_t n, const float* logits, const float* labels,
                                            float* grad_out, float* probabilities) override {
    RETURN_IF_ERROR(CheckMatrix("SigmoidCrossEntropy", 1, n, 1, {logits, labels}));
    double loss_sum = 0;
    const float inv_n = 1.f / static_cast<float>(n);
    for (int64_t i = 0; i < n; ++i) {
      const float x = logits[i], y = labels[i];
      // log(1 + e^-|x|) form: no overflow for large |x|.
      loss_sum += std::max(x, 0.f) - x * y + std::log1p(std::exp(-std::fabs(x)));
      const float p = 1.f / (1.f + std::exp(-x));
      if (grad_out != nullptr) grad_out[i] = (p - y) * inv_n;
      if (probabilities != nullptr) probabilities[i] = p;
    }
    return static_cast<float>(loss_sum / n);
  }

  absl::Status EmbeddingGather(int64_t n, int64_t dim, const float* table, int64_t table_rows,
                               const int32_t* indices, float* out) override {
    constexpr absl::string_view kOp = "EmbeddingGather";
    RETURN_IF_ERROR(CheckMatrix(kOp, n, dim, 0, {indices, out}));
    RETURN_IF_ERROR(CheckSize(kOp, "table_rows", table_rows));
    RETURN_IF_ERROR(CheckPointer(kOp, "table", table, table_rows * dim));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      float* dst = out + i * dim;
      if (indices[i] < 0 || indices[i] >= table_rows) {
        ++bad;
        std::fill_n(dst, dim, 0.f);
      } else {
        std::memcpy(dst, table + indices[i] * dim, dim * sizeof(float));
      }
    }
    return bad == 0 ? absl::OkStatus() : IndexError(kOp, bad, table_rows);
  }

  absl::Status EmbeddingScatterAdd(int64_t n, int64_t dim, const float* grads,
                                   const int32_t* indices, int64_t out_rows,
                                   float* out) override {
    constexpr absl::string_view kOp = "EmbeddingScatterAdd";
    RETURN_IF_ERROR(CheckMatrix(kOp, n, dim, 0, {grads, indices}));
    RETURN_IF_ERROR(CheckSize(kOp, "out_rows", out_rows));
    RETURN_IF_ERROR(CheckPointer(kOp, "out", out, out_rows * dim));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (indices[i] < 0 || indices[i] >= out_rows) {
        ++bad;
        continue;
      }
      float* __restrict dst = out + indices[i] * dim;
      const float* __restrict src = grads + i * dim;
      for (int64_t j = 0; j < dim; ++j) dst[j] += src[j];
    }
    return bad == 0 ? absl::OkStatus() : IndexError(kOp, bad, out_rows);
  }

  absl::StatusOr<int64_t> CountNonFinite(int64_t n, const float* x) override {
    constexpr absl::string_view kOp = "CountNonFinite";
    RETURN_IF_ERROR(CheckSize(kOp, "n", n, 0));
    RETURN_IF_ERROR(CheckPointer(kOp, "x", x, n));
    return static_cast<int64_t>(common::CountNonFinite(absl::MakeConstSpan(x, n)));
  }

  absl::Status ApplyOptimizer(const OptimizerParams& p, int64_t step, int64_t n, float* params,
                              const float* grads, absl::Span<float* const> slots) override {
    RETURN_IF_ERROR(internal::CheckOptimizerCall(p, step, n, params, grads, slots));
    kernels::ApplyOptimizer(p, step, absl::MakeSpan(params, n), absl::MakeConstSpan(grads, n),
                            slots);
    return absl::OkStatus();
  }

 protected:
  absl::StatusOr<void*> AllocateRaw(size_t bytes) override {
    // aligned_alloc wants a multiple of the alignment.
    const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cpu: cannot allocate ", bytes, " bytes"));
    }
    return p;
  }

  void FreeRaw(void* data) override { std::free(data); }

 private:
  static absl::Status Copy(absl::string_view op, void* dst, const void* src, size_t bytes) {
    const int64_t count = static_cast<int64_t>(bytes);
    RETURN_IF_ERROR(CheckPointer(op, "destination", dst, count));
    RETURN_IF_ERROR(CheckPointer(op, "source", src, count));
    if (bytes > 0) std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }
};

}  // namespace

namespace internal {

std::unique_ptr<Backend> CreateCpuBackend(const BackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace internal
}  // namespace ps::kernels
