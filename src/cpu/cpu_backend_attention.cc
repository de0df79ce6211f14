// CpuBackend: RoPE, attention over dense and paged keys, paged cache rows. The paged latent cache
// of LatentAttention, BatchedLatentAttention, PagedWrite and PagedRead may be f32 or bf16, with the
// bf16 semantics of eagle3/backend.h (PagedWrite rounds to nearest even, PagedRead widens; the
// attention rounds q to bf16 and the softmax weights to bf16 for the value product, fp32 sums).
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "cpu/cpu_backend_internal.h"
#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/half.h"
#include "eagle3/status.h"

namespace eagle3::cpu {
namespace {

using ConstVectorMap = Eigen::Map<const Eigen::VectorXf>;
using VectorMap = Eigen::Map<Eigen::VectorXf>;

// Element [i, j, 0] of a 3-D view whose last dim is contiguous.
float* Head(const TensorView& t, int64_t i, int64_t j) {
  return t.data_as<float>() + i * t.stride(0) + j * t.stride(1);
}

// Row t of a [T, S] u8/bool mask (both one byte, nonzero = allowed).
const uint8_t* MaskRow(const TensorView& mask, int64_t t) {
  return mask.data_as<const uint8_t>() + t * mask.stride(0);
}

// Every query row must allow at least one key; checked up front so that a bad mask writes nothing.
absl::Status CheckMaskRows(const char* op, const TensorView& mask) {
  for (int64_t t = 0; t < mask.dim(0); ++t) {
    const uint8_t* row = MaskRow(mask, t);
    if (std::none_of(row, row + mask.dim(1), [](uint8_t m) { return m != 0; })) {
      return Invalid(op, "row ", t, " of mask ", mask.ToString(), " allows no key: query ", t,
                     " would attend to nothing");
    }
  }
  return absl::OkStatus();
}

// out = sum_s softmax_s(scale * q . key(s) over allowed s) * value(s)[:dv], in fp32 with the
// maximum subtracted. key(s) / value(s) return the rows of key s (dk floats) and value s; each
// pointer is used before the next call. round_weights: the weights exp(score - max) enter the value
// sum rounded to bf16 (the sum of weights that divides it stays fp32), as over a bf16 cache.
// `scores` holds at least S floats.
template <typename KeyFn, typename ValueFn>
void AttendRow(const float* q, int64_t dk, const uint8_t* mask, int64_t s_len, float scale,
               KeyFn key, ValueFn value, int64_t dv, float* scores, float* out,
               bool round_weights = false) {
  const ConstVectorMap qv(q, dk);
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t s = 0; s < s_len; ++s) {
    if (mask[s] == 0) continue;
    scores[s] = scale * qv.dot(ConstVectorMap(key(s), dk));
    max = std::max(max, scores[s]);
  }
  VectorMap o(out, dv);
  o.setZero();
  float sum = 0.0f;
  for (int64_t s = 0; s < s_len; ++s) {
    if (mask[s] == 0) continue;
    const float p = std::exp(scores[s] - max);
    sum += p;
    o += (round_weights ? Bf16ToFloat(FloatToBf16(p)) : p) * ConstVectorMap(value(s), dv);
  }
  o *= 1.0f / sum;
}

// Cache row of sequence position s (page entries validated by the caller), as f32: an f32 cache's
// row in place; a bf16 cache's row widened into `widened` (width floats), valid until the next call.
struct PagedRows {
  const void* cache;
  bool bf16;
  const int32_t* page_table;
  int64_t page_size;
  int64_t width;
  float* widened = nullptr;

  const float* operator()(int64_t s) const {
    const int64_t page = page_table[s / page_size];
    const int64_t row = (page * page_size + s % page_size) * width;
    if (!bf16) return static_cast<const float*>(cache) + row;
    const uint16_t* bits = static_cast<const uint16_t*>(cache) + row;
    for (int64_t i = 0; i < width; ++i) widened[i] = Bf16ToFloat(bits[i]);
    return widened;
  }
};

// Query row q[t, n] as the attention multiplies it: as is over an f32 cache, rounded to bf16 over a
// bf16 cache (written to `rounded`, dk floats).
const float* QueryRow(const float* q, int64_t dk, bool bf16, float* rounded) {
  if (!bf16) return q;
  for (int64_t i = 0; i < dk; ++i) rounded[i] = Bf16ToFloat(FloatToBf16(q[i]));
  return rounded;
}

// Where token t's row lives in `cache` (as a row index over all pages), or InvalidArgument naming t
// when its position is outside the page table or its page entry outside the cache.
absl::Status ResolveSlot(const char* op, const TensorView& positions, const TensorView& page_table,
                         const TensorView& cache, int64_t t, int64_t* slot) {
  const int64_t page_size = cache.dim(1);
  const int64_t num_pages = cache.dim(0);
  const int64_t capacity = page_table.dim(0) * page_size;
  const int64_t pos = LoadIndex(positions, t);
  if (pos < 0 || pos >= capacity) {
    return Invalid(op, "positions[", t, "] = ", pos, " is outside the [0, ", capacity,
                   ") positions of page_table ", page_table.ToString(), " with page_size ",
                   page_size);
  }
  const int64_t j = pos / page_size;
  const int64_t page = page_table.data_as<const int32_t>()[j];
  if (page < 0 || page >= num_pages) {
    return Invalid(op, "positions[", t, "] = ", pos, " falls in page_table[", j, "] = ", page,
                   ", outside the [0, ", num_pages, ") pages of cache ", cache.ToString());
  }
  *slot = page * page_size + pos % page_size;
  return absl::OkStatus();
}

// Sequence b of a batched op owns query rows [begin, end) of T: end must be in [begin, T].
absl::Status CheckQueryRows(const char* op, int64_t b, int64_t begin, int64_t end, int64_t t_all) {
  if (end < begin || end > t_all) {
    return Invalid(op, "sequence ", b, ": q_start[", b + 1, "] = ", end, " must be in [q_start[", b,
                   "] = ", begin, ", T = ", t_all, "]");
  }
  return absl::OkStatus();
}

// The page entries sequence b uses for its first `len` positions, each in [0, num_pages).
absl::Status CheckSequencePages(const char* op, int64_t b, const int32_t* pages, int64_t len,
                                const TensorView& cache) {
  const int64_t page_size = cache.dim(1);
  const int64_t num_pages = cache.dim(0);
  for (int64_t j = 0; j < (len + page_size - 1) / page_size; ++j) {
    if (pages[j] < 0 || pages[j] >= num_pages) {
      return Invalid(op, "sequence ", b, ": page_tables[", b, "][", j, "] = ", pages[j],
                     " (positions [", j * page_size, ", ", std::min(len, (j + 1) * page_size),
                     ")) is outside the [0, ", num_pages, ") pages of cache ", cache.ToString());
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CpuBackend::ApplyRope(const TensorView& x, int64_t offset, int64_t rope_dim,
                                   const TensorView& positions, const TensorView& cos_sin,
                                   RopeStyle style) {
  EAGLE3_RETURN_IF_ERROR(CheckApplyRope(x, offset, rope_dim, positions, cos_sin));
  EAGLE3_RETURN_IF_ERROR(CheckF32("ApplyRope", "x", x));
  EAGLE3_RETURN_IF_ERROR(CheckF32("ApplyRope", "cos_sin", cos_sin));
  const int64_t table_rows = cos_sin.dim(0);
  for (int64_t t = 0; t < x.dim(0); ++t) {
    const int64_t p = LoadIndex(positions, t);
    if (p < 0 || p >= table_rows) {
      return Invalid("ApplyRope", "positions[", t, "] = ", p, " is outside the [0, ", table_rows,
                     ") rows of cos_sin ", cos_sin.ToString());
    }
  }
  const int64_t half = rope_dim / 2;
  // Pair i is (h[i * a_step], h[i * a_step + b_off]).
  const int64_t a_step = style == RopeStyle::kAdjacentPairs ? 2 : 1;
  const int64_t b_off = style == RopeStyle::kAdjacentPairs ? 1 : half;
  for (int64_t t = 0; t < x.dim(0); ++t) {
    const float* cos = Row(cos_sin, LoadIndex(positions, t));
    const float* sin = cos + half;
    for (int64_t n = 0; n < x.dim(1); ++n) {
      float* h = Head(x, t, n) + offset;
      for (int64_t i = 0; i < half; ++i) {
        float& a = h[i * a_step];
        float& b = h[i * a_step + b_off];
        const float a0 = a;
        a = a0 * cos[i] - b * sin[i];
        b = b * cos[i] + a0 * sin[i];
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& mask, float scale, const TensorView& out) {
  EAGLE3_RETURN_IF_ERROR(CheckAttention(q, k, v, mask, scale, out));
  EAGLE3_RETURN_IF_ERROR(CheckF32("Attention", "q", q));
  EAGLE3_RETURN_IF_ERROR(CheckF32("Attention", "k", k));
  EAGLE3_RETURN_IF_ERROR(CheckF32("Attention", "v", v));
  EAGLE3_RETURN_IF_ERROR(CheckF32("Attention", "out", out));
  EAGLE3_RETURN_IF_ERROR(CheckMaskRows("Attention", mask));
  const int64_t s_len = k.dim(0);
  float* scores = Scratch(s_len);
  for (int64_t t = 0; t < q.dim(0); ++t) {
    for (int64_t n = 0; n < q.dim(1); ++n) {
      AttendRow(
          Head(q, t, n), q.dim(2), MaskRow(mask, t), s_len, scale,
          [&](int64_t s) { return Head(k, s, n); }, [&](int64_t s) { return Head(v, s, n); },
          v.dim(2), scores, Head(out, t, n));
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::LatentAttention(const TensorView& q, const TensorView& cache,
                                         const TensorView& page_table, int64_t context_len,
                                         const TensorView& mask, float scale, int64_t value_dim,
                                         const TensorView& out) {
  const char* op = "LatentAttention";
  EAGLE3_RETURN_IF_ERROR(
      CheckLatentAttention(q, cache, page_table, context_len, mask, scale, value_dim, out));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "q", q));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "out", out));
  const int64_t page_size = cache.dim(1);
  const int64_t num_pages = cache.dim(0);
  const int32_t* pages = page_table.data_as<const int32_t>();
  for (int64_t j = 0; j < (context_len + page_size - 1) / page_size; ++j) {
    if (pages[j] < 0 || pages[j] >= num_pages) {
      return Invalid(op, "page_table[", j, "] = ", pages[j], " (used by positions [", j * page_size,
                     ", ", std::min(context_len, (j + 1) * page_size), ")) is outside the [0, ",
                     num_pages, ") pages of cache ", cache.ToString());
    }
  }
  EAGLE3_RETURN_IF_ERROR(CheckMaskRows(op, mask));
  const bool bf16 = cache.dtype() == DType::kBF16;
  const int64_t width = cache.dim(2), dk = q.dim(2);
  // Scores, then a widened cache row and a rounded query row (bf16 cache).
  float* scores = Scratch(context_len + width + dk);
  const PagedRows rows{cache.data(), bf16, pages, page_size, width, scores + context_len};
  float* q_row = scores + context_len + width;
  for (int64_t t = 0; t < q.dim(0); ++t) {
    for (int64_t n = 0; n < q.dim(1); ++n) {
      // Keys and values are the same latent rows: the values are their first value_dim columns.
      AttendRow(QueryRow(Head(q, t, n), dk, bf16, q_row), dk, MaskRow(mask, t), context_len, scale,
                rows, rows, value_dim, scores, Head(out, t, n), bf16);
    }
  }
  return absl::OkStatus();
}

namespace {

// The data-dependent checks of a batched latent attention call, in sequence order (so that a bad
// call writes nothing), then its attention sequence by sequence. The mask has one of two forms:
// tree_mask over each sequence's new keys (causal when empty; BatchedLatentAttention) or key_mask
// over all of them (BatchedLatentAttentionKeyMask). `scratch` holds LatentBatchScratch floats.
struct LatentBatch {
  const char* op;
  const TensorView& q;
  const TensorView& cache;
  const TensorView& page_tables;
  const TensorView& q_start;
  const TensorView& kv_len;
  int64_t max_kv_len;
  const TensorView& tree_mask;  // empty unless the tree form
  const TensorView& key_mask;   // empty unless the key form

  const int32_t* TableRow(int64_t b) const {
    return page_tables.data_as<const int32_t>() + b * page_tables.stride(0);
  }

  absl::Status Check() const {
    const int64_t batch = page_tables.dim(0);
    const int64_t capacity = page_tables.dim(1) * cache.dim(1);
    const int64_t t_all = q.dim(0);
    const bool has_tree = HasTreeMask(tree_mask), has_keys = HasTreeMask(key_mask);
    const int32_t* starts = q_start.data_as<const int32_t>();
    const int32_t* lens = kv_len.data_as<const int32_t>();
    if (starts[0] != 0) return Invalid(op, "q_start[0] must be 0, got ", starts[0]);
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t begin = starts[b], end = starts[b + 1], len = lens[b];
      EAGLE3_RETURN_IF_ERROR(CheckQueryRows(op, b, begin, end, t_all));
      const int64_t n = end - begin;
      if (n == 0) continue;
      if (len < n || len > max_kv_len || len > capacity) {
        return Invalid(op, "sequence ", b, ": kv_len[", b, "] = ", len, " must be in [n = ", n,
                       " new tokens, min(max_kv_len = ", max_kv_len, ", P * page_size = ", capacity,
                       ")]");
      }
      if (has_tree && n > tree_mask.dim(1)) {
        return Invalid(op, "sequence ", b, ": ", n, " new tokens do not fit tree_mask ",
                       tree_mask.ToString(), " (M = ", tree_mask.dim(1), ")");
      }
      EAGLE3_RETURN_IF_ERROR(CheckSequencePages(op, b, TableRow(b), len, cache));
      // Each row needs a key: with a tree mask only when no cached prefix is visible to all.
      const int64_t columns = has_keys ? len : has_tree && len == n ? n : 0;
      for (int64_t i = 0; i < n && columns > 0; ++i) {
        const uint8_t* row = MaskRow(has_keys ? key_mask : tree_mask, begin + i);
        if (std::none_of(row, row + columns, [](uint8_t m) { return m != 0; })) {
          return has_keys ? Invalid(op, "sequence ", b, ": row ", begin + i, " of key_mask ",
                                    key_mask.ToString(), " allows none of the sequence's ", len, " keys")
                          : Invalid(op, "sequence ", b, ": row ", begin + i, " of tree_mask ",
                                    tree_mask.ToString(),
                                    " allows no key and the sequence has no cached prefix");
        }
      }
    }
    if (starts[batch] != t_all) {
      return Invalid(op, "q_start[B = ", batch, "] = ", starts[batch], " must be T = ", t_all);
    }
    return absl::OkStatus();
  }

  // Scores, a widened cache row and a rounded query row (bf16 cache), then the mask row as bytes.
  int64_t ScratchFloats() const { return max_kv_len + cache.dim(2) + q.dim(2) + (max_kv_len + 3) / 4 + 1; }

  void Run(float scale, int64_t value_dim, const TensorView& out, float* scratch) const {
    const int64_t batch = page_tables.dim(0);
    const bool has_tree = HasTreeMask(tree_mask), has_keys = HasTreeMask(key_mask);
    const int32_t* starts = q_start.data_as<const int32_t>();
    const int32_t* lens = kv_len.data_as<const int32_t>();
    const bool bf16 = cache.dtype() == DType::kBF16;
    const int64_t width = cache.dim(2), dk = q.dim(2);
    float* scores = scratch;
    float* widened = scores + max_kv_len;
    float* q_row = widened + width;
    uint8_t* mask_row = reinterpret_cast<uint8_t*>(q_row + dk);
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t begin = starts[b], n = starts[b + 1] - begin, len = lens[b];
      const PagedRows rows{cache.data(), bf16, TableRow(b), cache.dim(1), width, widened};
      const int64_t prefix = len - n;
      if (!has_keys) std::fill(mask_row, mask_row + prefix, uint8_t{1});
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t* allowed = mask_row;
        if (has_keys) {
          allowed = MaskRow(key_mask, begin + i);
        } else {
          const uint8_t* tree_row = has_tree ? MaskRow(tree_mask, begin + i) : nullptr;
          for (int64_t j = 0; j < n; ++j) {
            mask_row[prefix + j] = has_tree ? (tree_row[j] != 0 ? 1 : 0) : (j <= i ? 1 : 0);
          }
        }
        for (int64_t h = 0; h < q.dim(1); ++h) {
          AttendRow(QueryRow(Head(q, begin + i, h), dk, bf16, q_row), dk, allowed, len, scale, rows,
                    rows, value_dim, scores, Head(out, begin + i, h), bf16);
        }
      }
    }
  }
};

}  // namespace

absl::Status CpuBackend::BatchedLatentAttention(const TensorView& q, const TensorView& cache,
                                                const TensorView& page_tables,
                                                const TensorView& q_start, const TensorView& kv_len,
                                                int64_t max_kv_len, const TensorView& tree_mask,
                                                float scale, int64_t value_dim,
                                                const TensorView& out) {
  const char* op = "BatchedLatentAttention";
  EAGLE3_RETURN_IF_ERROR(CheckBatchedLatentAttention(q, cache, page_tables, q_start, kv_len,
                                                     max_kv_len, tree_mask, scale, value_dim, out));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "q", q));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "out", out));
  const TensorView no_key_mask;
  const LatentBatch batch{op, q, cache, page_tables, q_start, kv_len, max_kv_len, tree_mask, no_key_mask};
  EAGLE3_RETURN_IF_ERROR(batch.Check());
  batch.Run(scale, value_dim, out, Scratch(batch.ScratchFloats()));
  return absl::OkStatus();
}

absl::Status CpuBackend::BatchedLatentAttentionKeyMask(const TensorView& q, const TensorView& cache,
                                                       const TensorView& page_tables,
                                                       const TensorView& q_start, const TensorView& kv_len,
                                                       int64_t max_kv_len, const TensorView& key_mask,
                                                       float scale, int64_t value_dim,
                                                       const TensorView& out) {
  const char* op = "BatchedLatentAttentionKeyMask";
  EAGLE3_RETURN_IF_ERROR(CheckBatchedLatentAttentionKeyMask(q, cache, page_tables, q_start, kv_len,
                                                            max_kv_len, key_mask, scale, value_dim, out));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "q", q));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "out", out));
  const TensorView no_tree_mask;
  const LatentBatch batch{op, q, cache, page_tables, q_start, kv_len, max_kv_len, no_tree_mask, key_mask};
  EAGLE3_RETURN_IF_ERROR(batch.Check());
  batch.Run(scale, value_dim, out, Scratch(batch.ScratchFloats()));
  return absl::OkStatus();
}

absl::Status CpuBackend::BatchedPagedAttention(const TensorView& q, const TensorView& cache,
                                               const TensorView& page_tables,
                                               const TensorView& q_start, const TensorView& kv_len,
                                               int64_t max_kv_len, const TensorView& mask,
                                               float scale, const TensorView& out) {
  const char* op = "BatchedPagedAttention";
  EAGLE3_RETURN_IF_ERROR(CheckBatchedPagedAttention(q, cache, page_tables, q_start, kv_len,
                                                    max_kv_len, mask, scale, out));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "q", q));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "cache", cache));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "out", out));
  const int64_t batch = page_tables.dim(0);
  const int64_t page_size = cache.dim(1);
  const int64_t capacity = page_tables.dim(1) * page_size;
  const int64_t t_all = q.dim(0);
  const int64_t dim = q.dim(2);
  const int64_t kv_heads = cache.dim(2) / (2 * dim);
  const int64_t group = q.dim(1) / kv_heads;
  const bool has_mask = HasTreeMask(mask);
  const int32_t* starts = q_start.data_as<const int32_t>();
  const int32_t* lens = kv_len.data_as<const int32_t>();
  auto table_row = [&](int64_t b) {
    return page_tables.data_as<const int32_t>() + b * page_tables.stride(0);
  };
  // Every data-dependent condition first, in sequence order, so that a bad call writes nothing.
  if (starts[0] != 0) return Invalid(op, "q_start[0] must be 0, got ", starts[0]);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t begin = starts[b], end = starts[b + 1], len = lens[b];
    EAGLE3_RETURN_IF_ERROR(CheckQueryRows(op, b, begin, end, t_all));
    if (end == begin) continue;
    if (len < 0 || len > max_kv_len || len > capacity) {
      return Invalid(op, "sequence ", b, ": kv_len[", b, "] = ", len, " must be in [0, min(max_kv_len = ",
                     max_kv_len, ", P * page_size = ", capacity, ")]");
    }
    if (!has_mask && end - begin > len) {
      return Invalid(op, "sequence ", b, ": ", end - begin, " query rows exceed kv_len[", b, "] = ", len,
                     " (causal: row i's own key is kv_len[b] - n_b + i)");
    }
    EAGLE3_RETURN_IF_ERROR(CheckSequencePages(op, b, table_row(b), len, cache));
    if (!has_mask) continue;  // causal: every row allows its own key
    for (int64_t t = begin; t < end; ++t) {
      const uint8_t* row = MaskRow(mask, t);
      if (std::none_of(row, row + len, [](uint8_t m) { return m != 0; })) {
        return Invalid(op, "sequence ", b, ": row ", t, " of mask ", mask.ToString(),
                       " allows no key among its kv_len[", b, "] = ", len);
      }
    }
  }
  if (starts[batch] != t_all) {
    return Invalid(op, "q_start[B = ", batch, "] = ", starts[batch], " must be T = ", t_all);
  }
  // Scores, then (causal) a row of ones: row i attends to the first kv_len[b] - n_b + i + 1 keys.
  float* scores = Scratch(max_kv_len + (max_kv_len + 3) / 4);
  uint8_t* all_keys = reinterpret_cast<uint8_t*>(scores + max_kv_len);
  if (!has_mask) std::fill(all_keys, all_keys + max_kv_len, uint8_t{1});
  for (int64_t b = 0; b < batch; ++b) {
    const PagedRows rows{cache.data(), false, table_row(b), page_size, cache.dim(2)};
    const int64_t begin = starts[b], end = starts[b + 1];
    for (int64_t t = begin; t < end; ++t) {
      const uint8_t* mask_row = has_mask ? MaskRow(mask, t) : all_keys;
      const int64_t keys = has_mask ? lens[b] : lens[b] - (end - begin) + (t - begin) + 1;
      for (int64_t h = 0; h < q.dim(1); ++h) {
        const int64_t key_col = h / group * dim;  // K of kv head h / group; its V Nkv heads later
        const int64_t value_col = key_col + kv_heads * dim;
        AttendRow(
            Head(q, t, h), dim, mask_row, keys, scale,
            [&](int64_t s) { return rows(s) + key_col; },
            [&](int64_t s) { return rows(s) + value_col; }, dim, scores, Head(out, t, h));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::PagedWrite(const TensorView& rows, const TensorView& positions,
                                    const TensorView& page_table, const TensorView& cache) {
  EAGLE3_RETURN_IF_ERROR(CheckPaged("PagedWrite", rows, positions, page_table, cache));
  EAGLE3_RETURN_IF_ERROR(CheckF32("PagedWrite", "rows", rows));
  int64_t slot = 0;
  for (int64_t t = 0; t < rows.dim(0); ++t) {
    EAGLE3_RETURN_IF_ERROR(ResolveSlot("PagedWrite", positions, page_table, cache, t, &slot));
  }
  const int64_t width = rows.dim(1);
  for (int64_t t = 0; t < rows.dim(0); ++t) {
    EAGLE3_RETURN_IF_ERROR(ResolveSlot("PagedWrite", positions, page_table, cache, t, &slot));
    if (cache.dtype() == DType::kBF16) {
      uint16_t* dst = cache.data_as<uint16_t>() + slot * width;
      const float* src = Row(rows, t);
      for (int64_t i = 0; i < width; ++i) dst[i] = FloatToBf16(src[i]);
    } else {
      std::memcpy(cache.data_as<float>() + slot * width, Row(rows, t), width * sizeof(float));
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::PagedRead(const TensorView& cache, const TensorView& page_table,
                                   const TensorView& positions, const TensorView& out) {
  EAGLE3_RETURN_IF_ERROR(CheckPaged("PagedRead", out, positions, page_table, cache));
  EAGLE3_RETURN_IF_ERROR(CheckF32("PagedRead", "out", out));
  int64_t slot = 0;
  for (int64_t t = 0; t < out.dim(0); ++t) {
    EAGLE3_RETURN_IF_ERROR(ResolveSlot("PagedRead", positions, page_table, cache, t, &slot));
  }
  const int64_t width = out.dim(1);
  for (int64_t t = 0; t < out.dim(0); ++t) {
    EAGLE3_RETURN_IF_ERROR(ResolveSlot("PagedRead", positions, page_table, cache, t, &slot));
    if (cache.dtype() == DType::kBF16) {
      const uint16_t* src = cache.data_as<const uint16_t>() + slot * width;
      float* dst = Row(out, t);
      for (int64_t i = 0; i < width; ++i) dst[i] = Bf16ToFloat(src[i]);
    } else {
      std::memcpy(Row(out, t), cache.data_as<const float>() + slot * width, width * sizeof(float));
    }
  }
  return absl::OkStatus();
}

}  // namespace eagle3::cpu
