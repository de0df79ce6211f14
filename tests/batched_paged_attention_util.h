// Test helper shared by the CPU and CUDA BatchedPagedAttention tests: a random batch (shuffled,
// disjoint pages; random masks with at least one allowed key per row, or the causal mode's mask)
// and a plain per-sequence reference computed in double.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "eagle3/tensor_view.h"
#include "gtest/gtest.h"

namespace eagle3::testing {

struct PagedBatch {
  int64_t nq = 4, nkv = 2, dim = 8, page_size = 16;
  int64_t num_pages = 0, max_pages = 0, max_kv_len = 0, total = 0;
  std::vector<int64_t> n, len;               // per sequence: query rows, kv_len
  std::vector<float> q, cache, out;          // [T, Nq, D], [pages, page, 2 Nkv D], [T, Nq, D]
  std::vector<int32_t> tables, starts, lens;  // [B, P], [B + 1], [B]
  std::vector<uint8_t> mask;                 // [T, max_kv_len]

  int64_t b() const { return static_cast<int64_t>(n.size()); }
  int64_t row() const { return 2 * nkv * dim; }
  TensorView Q() { return TensorView(q.data(), DType::kF32, Shape{total, nq, dim}, Device::Cpu()); }
  TensorView Cache() {
    return TensorView(cache.data(), DType::kF32, Shape{num_pages, page_size, row()}, Device::Cpu());
  }
  TensorView Tables() { return TensorView(tables.data(), DType::kI32, Shape{b(), max_pages}, Device::Cpu()); }
  TensorView Starts() { return TensorView(starts.data(), DType::kI32, Shape{b() + 1}, Device::Cpu()); }
  TensorView Lens() { return TensorView(lens.data(), DType::kI32, Shape{b()}, Device::Cpu()); }
  TensorView Mask() { return TensorView(mask.data(), DType::kU8, Shape{total, max_kv_len}, Device::Cpu()); }
  TensorView Out() { return TensorView(out.data(), DType::kF32, Shape{total, nq, dim}, Device::Cpu()); }

  // The reference: row t, head h of every sequence, straight from the definition.
  std::vector<float> Reference(float scale) const {
    std::vector<float> ref(static_cast<size_t>(total * nq * dim), 0.0f);
    const int64_t group = nq / nkv;
    for (int64_t s = 0; s < b(); ++s) {
      for (int64_t t = starts[s]; t < starts[s + 1]; ++t) {
        for (int64_t h = 0; h < nq; ++h) {
          const int64_t g = h / group;
          std::vector<double> score(static_cast<size_t>(len[s]), 0.0);
          double max = -std::numeric_limits<double>::infinity();
          for (int64_t j = 0; j < len[s]; ++j) {
            if (mask[t * max_kv_len + j] == 0) continue;
            const float* key = KeyRow(s, j) + g * dim;
            double dot = 0.0;
            for (int64_t d = 0; d < dim; ++d) dot += double(q[(t * nq + h) * dim + d]) * key[d];
            score[j] = scale * dot;
            max = std::max(max, score[j]);
          }
          double sum = 0.0;
          std::vector<double> acc(static_cast<size_t>(dim), 0.0);
          for (int64_t j = 0; j < len[s]; ++j) {
            if (mask[t * max_kv_len + j] == 0) continue;
            const double p = std::exp(score[j] - max);
            sum += p;
            const float* value = KeyRow(s, j) + (nkv + g) * dim;
            for (int64_t d = 0; d < dim; ++d) acc[d] += p * value[d];
          }
          for (int64_t d = 0; d < dim; ++d) ref[(t * nq + h) * dim + d] = static_cast<float>(acc[d] / sum);
        }
      }
    }
    return ref;
  }

  // The explicit mask of the causal mode (an empty mask): row i of sequence s allows keys
  // j <= len[s] - n[s] + i; the columns from len[s] on are junk ones, never read.
  void SetCausalMask() {
    for (int64_t s = 0; s < b(); ++s) {
      for (int64_t i = 0; i < n[s]; ++i) {
        uint8_t* row = &mask[static_cast<size_t>((starts[s] + i) * max_kv_len)];
        for (int64_t j = 0; j < max_kv_len; ++j) row[j] = (j <= len[s] - n[s] + i || j >= len[s]) ? 1 : 0;
      }
    }
  }

  const float* KeyRow(int64_t s, int64_t j) const {
    const int64_t page = tables[s * max_pages + j / page_size];
    return cache.data() + (page * page_size + j % page_size) * row();
  }
};

// n[b] query rows over kv_len len[b] (n[b] may be 0: a skipped sequence). Masks are random with the
// last allowed key forced on (mask_density 1: all keys).
inline PagedBatch MakePagedBatch(std::mt19937& rng, int64_t nq, int64_t nkv, int64_t dim, int64_t page_size,
                                 const std::vector<int64_t>& n, const std::vector<int64_t>& len,
                                 double mask_density = 0.6) {
  PagedBatch x;
  x.nq = nq;
  x.nkv = nkv;
  x.dim = dim;
  x.page_size = page_size;
  x.n = n;
  x.len = len;
  int64_t most = 1, longest = 1;
  for (int64_t l : len) {
    most = std::max(most, (l + page_size - 1) / page_size);
    longest = std::max(longest, l);
  }
  x.max_pages = most + 1;
  x.max_kv_len = longest + 3;  // a wider mask than any kv_len: its tail is never read
  x.num_pages = x.b() * x.max_pages + 2;
  std::vector<int32_t> perm(static_cast<size_t>(x.num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  x.tables.assign(perm.begin(), perm.begin() + x.b() * x.max_pages);
  x.starts.push_back(0);
  for (int64_t v : n) x.starts.push_back(x.starts.back() + static_cast<int32_t>(v));
  for (int64_t l : len) x.lens.push_back(static_cast<int32_t>(l));
  x.total = x.starts.back();
  std::normal_distribution<float> normal(0.0f, 1.0f);
  x.q.resize(static_cast<size_t>(x.total * nq * dim));
  for (float& v : x.q) v = normal(rng);
  x.cache.resize(static_cast<size_t>(x.num_pages * page_size * x.row()));
  for (float& v : x.cache) v = normal(rng);
  x.out.assign(static_cast<size_t>(x.total * nq * dim), std::numeric_limits<float>::quiet_NaN());
  std::bernoulli_distribution keep(mask_density);
  x.mask.assign(static_cast<size_t>(x.total * x.max_kv_len), 0);
  for (int64_t s = 0; s < x.b(); ++s) {
    for (int64_t t = x.starts[s]; t < x.starts[s + 1]; ++t) {
      uint8_t* row = &x.mask[static_cast<size_t>(t * x.max_kv_len)];
      for (int64_t j = 0; j < x.max_kv_len; ++j) row[j] = (j >= len[s] || keep(rng)) ? 1 : 0;  // tail: junk ones
      if (len[s] > 0) row[std::uniform_int_distribution<int64_t>(0, len[s] - 1)(rng)] = 1;
    }
  }
  return x;
}

// Element by element within 1e-5.
inline void ExpectAllNear(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << "element " << i;
}

}  // namespace eagle3::testing
