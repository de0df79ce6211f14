#include "eagle3/cpu/cpu_backend.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cpu/cpu_backend_internal.h"
#include "eagle3/detail/quant_tiles.h"
#include "eagle3/half.h"
#include "eagle3/quantized_weight_view.h"
#include "eagle3/status.h"

namespace eagle3::cpu {
namespace {

using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMatrixMap = Eigen::Map<const RowMajorMatrix, Eigen::Unaligned, Eigen::OuterStride<>>;
using MatrixMap = Eigen::Map<RowMajorMatrix, Eigen::Unaligned, Eigen::OuterStride<>>;
using ConstVectorMap = Eigen::Map<const Eigen::VectorXf>;
using VectorMap = Eigen::Map<Eigen::VectorXf>;

// Below this many flops a Gemm is not worth waking worker threads for.
constexpr double kMinParallelFlops = 1 << 20;

// Eigen wants an outer stride of at least the row length even when there is a single row.
Eigen::OuterStride<> OuterStrideOf(const TensorView& t) {
  return Eigen::OuterStride<>(std::max(t.stride(0), t.dim(1)));
}

struct GemmArgs {
  TensorView a, b, c;
  const float* bias;
  float alpha, beta;
};

// c[:, n0:n1] = alpha * a * b[n0:n1]^T + beta * c[:, n0:n1] + bias[n0:n1]. Column blocks are
// independent, which is how the work is split across threads.
void GemmColumns(const GemmArgs& g, int64_t n0, int64_t n1) {
  const int64_t cols = n1 - n0;
  if (cols <= 0) return;
  const int64_t m = g.a.dim(0);
  const int64_t k = g.a.dim(1);
  ConstMatrixMap a(g.a.data_as<const float>(), m, k, OuterStrideOf(g.a));
  ConstMatrixMap b(g.b.data_as<const float>() + n0 * g.b.stride(0), cols, k, OuterStrideOf(g.b));
  MatrixMap c(g.c.data_as<float>() + n0, m, cols, OuterStrideOf(g.c));
  if (g.beta == 0.0f) {
    c.noalias() = g.alpha * a * b.transpose();  // c is write-only: never read stale NaNs
  } else {
    if (g.beta != 1.0f) c *= g.beta;
    c.noalias() += g.alpha * a * b.transpose();
  }
  if (g.bias != nullptr) c.rowwise() += Eigen::Map<const Eigen::RowVectorXf>(g.bias + n0, cols);
}

// out = x * rsqrt(mean(x^2) + eps) * w over one row of length h; out may be x.
void NormRow(const float* x, const float* w, int64_t h, float eps, float* out) {
  ConstVectorMap xv(x, h);
  const float inv_rms = 1.0f / std::sqrt(xv.squaredNorm() / static_cast<float>(h) + eps);
  VectorMap(out, h) = (xv * inv_rms).cwiseProduct(ConstVectorMap(w, h));
}

// Index of the first NaN in [x, x + n), or -1.
int64_t FindNaN(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return i;
  }
  return -1;
}

// Top-k selection that works inside the output row itself (no scratch memory): a k-entry heap
// whose root is the worst entry kept, then a heap sort into best-first order. "Better" is the
// larger value, ties going to the lower index.
template <typename Index>
class TopKHeap {
 public:
  TopKHeap(float* values, Index* indices, int k) : v_(values), i_(indices), k_(k) {}

  void Select(const float* x, int64_t n) {
    for (int64_t j = 0; j < k_; ++j) {
      v_[j] = x[j];
      i_[j] = static_cast<Index>(j);
      SiftUp(j);
    }
    for (int64_t j = k_; j < n; ++j) {
      // Later indices lose ties, so only a strictly larger value displaces the worst kept.
      if (x[j] > v_[0]) {
        v_[0] = x[j];
        i_[0] = static_cast<Index>(j);
        SiftDown(0, k_);
      }
    }
    for (int64_t end = k_ - 1; end > 0; --end) {
      Swap(0, end);
      SiftDown(0, end);
    }
  }

 private:
  bool Worse(int64_t p, int64_t q) const {
    return v_[p] < v_[q] || (v_[p] == v_[q] && i_[p] > i_[q]);
  }
  void Swap(int64_t p, int64_t q) {
    std::swap(v_[p], v_[q]);
    std::swap(i_[p], i_[q]);
  }
  void SiftUp(int64_t j) {
    while (j > 0) {
      const int64_t parent = (j - 1) / 2;
      if (!Worse(j, parent)) return;
      Swap(j, parent);
      j = parent;
    }
  }
  void SiftDown(int64_t j, int64_t size) {
    while (true) {
      int64_t worst = j;
      for (int64_t child = 2 * j + 1; child <= 2 * j + 2 && child < size; ++child) {
        if (Worse(child, worst)) worst = child;
      }
      if (worst == j) return;
      Swap(j, worst);
      j = worst;
    }
  }

  float* v_;
  Index* i_;
  int64_t k_;
};

}  // namespace

// Fork-join pool for Gemm: the calling thread runs part 0, workers parts 1..n-1. Persistent
// threads and a plain function pointer keep a call free of allocation.
class CpuBackend::WorkerPool {
 public:
  using Fn = void (*)(const void* arg, int part, int parts);

  explicit WorkerPool(int parts) : parts_(parts) {
    for (int p = 1; p < parts; ++p) workers_.emplace_back([this, p] { WorkerLoop(p); });
  }

  ~WorkerPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    start_cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  int parts() const { return parts_; }

  void Run(Fn fn, const void* arg) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = fn;
      arg_ = arg;
      pending_ = parts_ - 1;
      ++generation_;
    }
    start_cv_.notify_all();
    fn(arg, 0, parts_);
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return pending_ == 0; });
  }

 private:
  void WorkerLoop(int part) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      const Fn fn = fn_;
      const void* arg = arg_;
      lock.unlock();
      fn(arg, part, parts_);
      lock.lock();
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }

  const int parts_;
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  Fn fn_ = nullptr;
  const void* arg_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

CpuBackend::CpuBackend(const CpuBackendOptions& options)
    : allocator_(options.allocator != nullptr ? options.allocator : &DefaultHostAllocator()) {
  if (options.num_threads > 1) pool_ = std::make_unique<WorkerPool>(options.num_threads);
}

CpuBackend::~CpuBackend() = default;

int CpuBackend::num_threads() const { return pool_ ? pool_->parts() : 1; }

float* CpuBackend::Scratch(int64_t n) {
  if (static_cast<int64_t>(scratch_.size()) < n) scratch_.resize(static_cast<size_t>(n));
  return scratch_.data();
}

absl::Status CpuBackend::Copy(const TensorView& src, const TensorView& dst) {
  EAGLE3_RETURN_IF_ERROR(CheckCopy(src, dst));
  if (!src.device().is_cpu() || !dst.device().is_cpu()) {
    return Invalid("Copy", "CpuBackend copies host memory only: src ", src.ToString(), ", dst ",
                   dst.ToString());
  }
  if (src.numel() == 0 || src.data() == dst.data()) return absl::OkStatus();
  const size_t elem = DTypeSize(src.dtype());
  if (src.is_contiguous() && dst.is_contiguous()) {
    std::memcpy(dst.data(), src.data(), src.nbytes());
    return absl::OkStatus();
  }
  // Walk every row of the last dim; a rank-0 view is one row of one element.
  const int rank = src.rank();
  const int64_t inner = rank == 0 ? 1 : src.dim(rank - 1);
  const int64_t src_step = rank == 0 ? 1 : src.stride(rank - 1);
  const int64_t dst_step = rank == 0 ? 1 : dst.stride(rank - 1);
  const int64_t rows = src.numel() / inner;
  int64_t index[Shape::kMaxRank] = {};
  const auto* from = static_cast<const char*>(src.data());
  auto* to = static_cast<char*>(dst.data());
  for (int64_t row = 0; row < rows; ++row) {
    int64_t src_offset = 0;
    int64_t dst_offset = 0;
    for (int d = 0; d + 1 < rank; ++d) {
      src_offset += index[d] * src.stride(d);
      dst_offset += index[d] * dst.stride(d);
    }
    if (src_step == 1 && dst_step == 1) {
      std::memcpy(to + dst_offset * elem, from + src_offset * elem, inner * elem);
    } else {
      for (int64_t j = 0; j < inner; ++j) {
        std::memcpy(to + (dst_offset + j * dst_step) * elem,
                    from + (src_offset + j * src_step) * elem, elem);
      }
    }
    for (int d = rank - 2; d >= 0; --d) {  // odometer over the outer dims
      if (++index[d] < src.dim(d)) break;
      index[d] = 0;
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Gemm(const TensorView& a, const TensorView& b, const TensorView& c,
                              const GemmOptions& options) {
  EAGLE3_RETURN_IF_ERROR(CheckGemm(a, b, c, options));
  EAGLE3_RETURN_IF_ERROR(CheckF32("Gemm", "a", a));
  // keep_f32_activations admits bf16 weights: widened exactly into the scratch, so the product is
  // the f32 one of the same values.
  const bool widen = options.keep_f32_activations && b.dtype() == DType::kBF16;
  if (!widen) EAGLE3_RETURN_IF_ERROR(CheckF32("Gemm", "b", b));
  EAGLE3_RETURN_IF_ERROR(CheckF32("Gemm", "c", c));
  if (options.bias != nullptr) EAGLE3_RETURN_IF_ERROR(CheckF32("Gemm", "bias", *options.bias));
  TensorView weights = b;
  if (widen) {
    const int64_t rows = b.dim(0), k = b.dim(1);
    float* widened = Scratch(rows * k);
    const auto* bits = b.data_as<const uint16_t>();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < k; ++j) widened[r * k + j] = Bf16ToFloat(bits[r * b.stride(0) + j]);
    }
    weights = TensorView(widened, DType::kF32, Shape{rows, k});
  }
  const GemmArgs args{a,
                      weights,
                      c,
                      options.bias ? options.bias->data_as<const float>() : nullptr,
                      options.alpha,
                      options.beta};
  const int64_t n = b.dim(0);
  const double flops =
      2.0 * static_cast<double>(a.dim(0)) * static_cast<double>(n) * static_cast<double>(a.dim(1));
  if (pool_ == nullptr || flops < kMinParallelFlops || n < pool_->parts()) {
    GemmColumns(args, 0, n);
    return absl::OkStatus();
  }
  pool_->Run(
      [](const void* arg, int part, int parts) {
        const auto& g = *static_cast<const GemmArgs*>(arg);
        const int64_t cols = g.b.dim(0);
        GemmColumns(g, cols * part / parts, cols * (part + 1) / parts);
      },
      &args);
  return absl::OkStatus();
}

absl::Status CpuBackend::QuantizedGemm(const TensorView& a, const QuantizedWeightView& w, const TensorView& c,
                                       const GemmOptions& options) {
  EAGLE3_RETURN_IF_ERROR(CheckQuantizedGemm(a, w, c, options));
  EAGLE3_RETURN_IF_ERROR(CheckF32("QuantizedGemm", "a", a));
  EAGLE3_RETURN_IF_ERROR(CheckF32("QuantizedGemm", "c", c));
  if (options.bias != nullptr) EAGLE3_RETURN_IF_ERROR(CheckF32("QuantizedGemm", "bias", *options.bias));
  const TensorView weights(Scratch(w.rows() * w.k), DType::kF32, Shape{w.rows(), w.k});
  EAGLE3_RETURN_IF_ERROR(DequantizeWeight(w, weights));
  return Gemm(a, weights, c, options);
}

absl::Status CpuBackend::TileQuantizedCodes(const QuantizedWeightView& w, const TensorView& tiles) {
  EAGLE3_RETURN_IF_ERROR(CheckTileQuantizedCodes(w, tiles));
  if (w.rows() == 0 || w.k == 0) return absl::OkStatus();
  ::eagle3::TileQuantizedCodes(w.format == WeightFormat::kInt4Group, static_cast<const uint8_t*>(w.codes.data()),
                               w.codes.stride(0), w.rows(), w.k, w.col0, static_cast<uint8_t*>(tiles.data()));
  return absl::OkStatus();
}

absl::Status CpuBackend::RmsNorm(const TensorView& x, const TensorView& weight, float eps,
                                 const TensorView& out) {
  EAGLE3_RETURN_IF_ERROR(CheckRmsNorm("RmsNorm", x, nullptr, weight, eps, out));
  EAGLE3_RETURN_IF_ERROR(CheckF32("RmsNorm", "x", x));
  EAGLE3_RETURN_IF_ERROR(CheckF32("RmsNorm", "weight", weight));
  EAGLE3_RETURN_IF_ERROR(CheckF32("RmsNorm", "out", out));
  const int64_t h = x.dim(1);
  for (int64_t t = 0; t < x.dim(0); ++t) {
    NormRow(Row(x, t), weight.data_as<const float>(), h, eps, Row(out, t));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::RmsNormPair(const TensorView& x0, const TensorView& weight0, const TensorView& out0,
                                     const TensorView& x1, const TensorView& weight1, const TensorView& out1,
                                     float eps) {
  EAGLE3_RETURN_IF_ERROR(CheckRmsNormPair(x0, weight0, out0, x1, weight1, out1, eps, CheckF32));
  return Backend::RmsNormPair(x0, weight0, out0, x1, weight1, out1, eps);
}

absl::Status CpuBackend::AddRmsNorm(const TensorView& x, const TensorView& residual,
                                    const TensorView& weight, float eps, const TensorView& out) {
  EAGLE3_RETURN_IF_ERROR(CheckRmsNorm("AddRmsNorm", x, &residual, weight, eps, out));
  EAGLE3_RETURN_IF_ERROR(CheckF32("AddRmsNorm", "x", x));
  EAGLE3_RETURN_IF_ERROR(CheckF32("AddRmsNorm", "residual", residual));
  EAGLE3_RETURN_IF_ERROR(CheckF32("AddRmsNorm", "weight", weight));
  EAGLE3_RETURN_IF_ERROR(CheckF32("AddRmsNorm", "out", out));
  const int64_t h = x.dim(1);
  for (int64_t t = 0; t < x.dim(0); ++t) {
    VectorMap r(Row(residual, t), h);
    r += ConstVectorMap(Row(x, t), h);
    NormRow(r.data(), weight.data_as<const float>(), h, eps, Row(out, t));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::SiluMul(const TensorView& gate_up, const TensorView& out) {
  EAGLE3_RETURN_IF_ERROR(CheckSiluMul(gate_up, out));
  EAGLE3_RETURN_IF_ERROR(CheckF32("SiluMul", "gate_up", gate_up));
  EAGLE3_RETURN_IF_ERROR(CheckF32("SiluMul", "out", out));
  const int64_t inter = out.dim(1);
  for (int64_t t = 0; t < out.dim(0); ++t) {
    const float* gate = Row(gate_up, t);
    const float* up = gate + inter;
    float* o = Row(out, t);
    for (int64_t i = 0; i < inter; ++i) o[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::EmbeddingLookup(const TensorView& ids, const TensorView& table,
                                         int64_t vocab_start, const TensorView& out) {
  EAGLE3_RETURN_IF_ERROR(CheckEmbeddingLookup(ids, table, vocab_start, out));
  EAGLE3_RETURN_IF_ERROR(CheckF32("EmbeddingLookup", "table", table));
  EAGLE3_RETURN_IF_ERROR(CheckF32("EmbeddingLookup", "out", out));
  const int64_t tokens = ids.dim(0);
  for (int64_t t = 0; t < tokens; ++t) {  // validate all ids before writing anything
    const int64_t id = LoadIndex(ids, t);
    if (id < 0) {
      return Invalid("EmbeddingLookup", "ids[", t, "] = ", id, " is negative (ids ", ids.ToString(),
                     ")");
    }
  }
  const int64_t hidden = table.dim(1);
  const int64_t shard_rows = table.dim(0);
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t local = LoadIndex(ids, t) - vocab_start;
    float* o = Row(out, t);
    if (local >= 0 && local < shard_rows) {
      std::memcpy(o, Row(table, local), hidden * sizeof(float));
    } else {
      std::fill(o, o + hidden, 0.0f);
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Softmax(const TensorView& logits, float temperature,
                                 const TensorView& out) {
  EAGLE3_RETURN_IF_ERROR(CheckSoftmax(logits, temperature, out));
  EAGLE3_RETURN_IF_ERROR(CheckF32("Softmax", "logits", logits));
  EAGLE3_RETURN_IF_ERROR(CheckF32("Softmax", "out", out));
  const int64_t v = logits.dim(1);
  for (int64_t r = 0; r < logits.dim(0); ++r) {
    const float* x = Row(logits, r);
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < v; ++i) {
      if (std::isnan(x[i]) || x[i] == std::numeric_limits<float>::infinity()) {
        return Invalid("Softmax", "row ", r, " of logits ", logits.ToString(), " has ", x[i],
                       " at index ", i);
      }
      max = std::max(max, x[i]);
    }
    if (max == -std::numeric_limits<float>::infinity()) {
      return Invalid("Softmax", "row ", r, " of logits ", logits.ToString(),
                     " has no finite logit");
    }
    float* o = Row(out, r);
    float sum = 0.0f;
    for (int64_t i = 0; i < v; ++i) {
      o[i] = std::exp((x[i] - max) / temperature);
      sum += o[i];
    }
    const float inv_sum = 1.0f / sum;
    for (int64_t i = 0; i < v; ++i) o[i] *= inv_sum;
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Argmax(const TensorView& logits, const TensorView& out) {
  EAGLE3_RETURN_IF_ERROR(CheckArgmax(logits, out));
  EAGLE3_RETURN_IF_ERROR(CheckF32("Argmax", "logits", logits));
  const int64_t v = logits.dim(1);
  for (int64_t r = 0; r < logits.dim(0); ++r) {
    const float* x = Row(logits, r);
    if (const int64_t nan = FindNaN(x, v); nan >= 0) {
      return Invalid("Argmax", "row ", r, " of logits ", logits.ToString(), " has NaN at index ",
                     nan);
    }
    const int64_t best = std::max_element(x, x + v) - x;  // first maximum: ties -> lowest index
    if (out.dtype() == DType::kI32) {
      out.data_as<int32_t>()[r] = static_cast<int32_t>(best);
    } else {
      out.data_as<int64_t>()[r] = best;
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::TopK(const TensorView& values, int k, const TensorView& out_values,
                              const TensorView& out_indices) {
  EAGLE3_RETURN_IF_ERROR(CheckTopK(values, k, out_values, out_indices));
  EAGLE3_RETURN_IF_ERROR(CheckF32("TopK", "values", values));
  EAGLE3_RETURN_IF_ERROR(CheckF32("TopK", "out_values", out_values));
  const int64_t v = values.dim(1);
  for (int64_t r = 0; r < values.dim(0); ++r) {
    const float* x = Row(values, r);
    if (const int64_t nan = FindNaN(x, v); nan >= 0) {
      return Invalid("TopK", "row ", r, " of values ", values.ToString(), " has NaN at index ",
                     nan);
    }
    if (out_indices.dtype() == DType::kI32) {
      int32_t* idx = out_indices.data_as<int32_t>() + r * out_indices.stride(0);
      TopKHeap<int32_t>(Row(out_values, r), idx, k).Select(x, v);
    } else {
      int64_t* idx = out_indices.data_as<int64_t>() + r * out_indices.stride(0);
      TopKHeap<int64_t>(Row(out_values, r), idx, k).Select(x, v);
    }
  }
  return absl::OkStatus();
}

}  // namespace eagle3::cpu
