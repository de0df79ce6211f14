// CpuBackend ApplyRope, Attention, LatentAttention, PagedWrite, PagedRead and LatentRowsAndQueries against naive
// references written here.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/half.h"
#include "eagle3/rope_table.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eagle3::cpu {
namespace {

using ::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

void ExpectInvalid(const absl::Status& s, const std::vector<std::string>& needles) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  for (const std::string& n : needles) EXPECT_THAT(Msg(s), HasSubstr(n));
}

// Bitwise equality that treats NaN padding as equal to itself.
bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// An f32 [d0, d1, d2] tensor in a NaN-filled buffer, with `pad2` spare floats after every
// innermost row and `pad1` after every block of d1 rows, so that strides differ from the
// contiguous ones and stray reads or writes show up.
struct Buf3 {
  int64_t d0, d1, d2, s0, s1;
  std::vector<float> data;

  Buf3(int64_t a, int64_t b, int64_t c, int64_t pad2 = 0, int64_t pad1 = 0)
      : d0(a),
        d1(b),
        d2(c),
        s0(b * (c + pad2) + pad1),
        s1(c + pad2),
        data(static_cast<size_t>(std::max<int64_t>(a * (b * (c + pad2) + pad1), 1)), kNaN) {}
  float& at(int64_t i, int64_t j, int64_t k) { return data[i * s0 + j * s1 + k]; }
  float at(int64_t i, int64_t j, int64_t k) const { return data[i * s0 + j * s1 + k]; }
  TensorView view() {
    return TensorView(data.data(), DType::kF32, Shape{d0, d1, d2}, Shape{s0, s1, 1}, Device::Cpu());
  }
  void Fill(std::mt19937& rng, float scale = 1.0f) {
    std::normal_distribution<float> normal(0.0f, scale);
    for (int64_t i = 0; i < d0; ++i) {
      for (int64_t j = 0; j < d1; ++j) {
        for (int64_t k = 0; k < d2; ++k) at(i, j, k) = normal(rng);
      }
    }
  }
};

// Element [i, j, k] of any f32 3-D view.
float At(const TensorView& t, int64_t i, int64_t j, int64_t k) {
  return t.data_as<const float>()[i * t.stride(0) + j * t.stride(1) + k * t.stride(2)];
}

// A [rows, cols] u8 mask with a row stride of cols + pad.
struct Mask {
  int64_t rows, cols, ld;
  std::vector<uint8_t> data;
  Mask(int64_t r, int64_t c, int64_t pad = 0)
      : rows(r), cols(c), ld(c + pad), data(r * (c + pad) + 1, 0) {}
  uint8_t& at(int64_t r, int64_t c) { return data[r * ld + c]; }
  TensorView view(DType dtype = DType::kU8) {
    return TensorView(data.data(), dtype, Shape{rows, cols}, Shape{ld, 1}, Device::Cpu());
  }
  // Query t (at position context - rows + t) sees keys 0 .. its position.
  static Mask Causal(int64_t rows, int64_t cols, int64_t pad = 0) {
    Mask m(rows, cols, pad);
    for (int64_t t = 0; t < rows; ++t) {
      for (int64_t s = 0; s <= cols - rows + t; ++s) m.at(t, s) = 1;
    }
    return m;
  }
};

// A verify-style tree mask: every query sees the prefix [0, prefix) plus its ancestors and itself
// among the rows' own keys [prefix, prefix + rows), parents[t] < t (-1 for a root).
Mask TreeMask(int64_t prefix, const std::vector<int>& parents) {
  const int64_t rows = static_cast<int64_t>(parents.size());
  Mask m(rows, prefix + rows, 3);
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t s = 0; s < prefix; ++s) m.at(t, s) = 1;
    for (int64_t a = t; a >= 0; a = parents[a]) m.at(t, prefix + a) = 1;
  }
  return m;
}

// Naive masked attention in double for one (t, n): keys/values given as callables.
template <typename K, typename V>
std::vector<double> NaiveAttend(const std::vector<double>& q, int64_t s_len, const uint8_t* mask,
                                double scale, K key, V value, int64_t dv) {
  std::vector<double> logits(s_len, -INFINITY);
  double max = -INFINITY;
  for (int64_t s = 0; s < s_len; ++s) {
    if (!mask[s]) continue;
    double dot = 0;
    for (size_t d = 0; d < q.size(); ++d) dot += q[d] * key(s, d);
    logits[s] = scale * dot;
    max = std::max(max, logits[s]);
  }
  double sum = 0;
  std::vector<double> out(dv, 0.0);
  for (int64_t s = 0; s < s_len; ++s) {
    if (!mask[s]) continue;
    const double p = std::exp(logits[s] - max);
    sum += p;
    for (int64_t d = 0; d < dv; ++d) out[d] += p * value(s, d);
  }
  for (double& o : out) o /= sum;
  return out;
}

void ExpectAttentionMatches(const TensorView& q, const TensorView& k, const TensorView& v,
                            Mask& mask, float scale, const TensorView& out) {
  for (int64_t t = 0; t < q.dim(0); ++t) {
    for (int64_t n = 0; n < q.dim(1); ++n) {
      std::vector<double> qv(q.dim(2));
      for (int64_t d = 0; d < q.dim(2); ++d) qv[d] = At(q, t, n, d);
      const std::vector<double> expected = NaiveAttend(
          qv, k.dim(0), &mask.at(t, 0), scale, [&](int64_t s, int64_t d) { return At(k, s, n, d); },
          [&](int64_t s, int64_t d) { return At(v, s, n, d); }, v.dim(2));
      for (int64_t d = 0; d < v.dim(2); ++d) {
        ASSERT_NEAR(At(out, t, n, d), expected[d], 2e-5 * (1 + std::abs(expected[d])))
            << "out[" << t << ", " << n << ", " << d << "]";
      }
    }
  }
}

bool PaddingIsNaN(const Buf3& b, const TensorView& inner) {
  // Every float of the buffer that the view does not cover is still NaN.
  std::vector<bool> covered(b.data.size(), false);
  const int64_t base = inner.data_as<const float>() - b.data.data();
  for (int64_t i = 0; i < inner.dim(0); ++i) {
    for (int64_t j = 0; j < inner.dim(1); ++j) {
      for (int64_t k = 0; k < inner.dim(2); ++k) {
        covered[base + i * inner.stride(0) + j * inner.stride(1) + k] = true;
      }
    }
  }
  for (size_t i = 0; i < b.data.size(); ++i) {
    if (!covered[i] && !std::isnan(b.data[i])) return false;
  }
  return true;
}

// ---- ApplyRope ----------------------------------------------------------------------------------

// A table of arbitrary angles and magnitude `m`: the op must apply whatever the table says.
std::vector<float> RandomTable(int64_t rows, int64_t rope_dim, float m, std::mt19937& rng) {
  std::uniform_real_distribution<float> angle(-3.0f, 3.0f);
  std::vector<float> table(rows * rope_dim);
  for (int64_t p = 0; p < rows; ++p) {
    for (int64_t i = 0; i < rope_dim / 2; ++i) {
      const float a = angle(rng);
      table[p * rope_dim + i] = m * std::cos(a);
      table[p * rope_dim + rope_dim / 2 + i] = m * std::sin(a);
    }
  }
  return table;
}

template <typename Index>
void CheckRope(RopeStyle style, DType index_dtype) {
  CpuBackend backend;
  std::mt19937 rng(11);
  const int64_t t_len = 5, heads = 3, nope = 6, rope = 8, table_rows = 20;
  std::vector<float> table = RandomTable(table_rows, rope, 1.25f, rng);
  TensorView cos_sin(table.data(), DType::kF32, Shape{table_rows, rope});
  std::vector<Index> positions = {0, 19, 3, 3, 11};
  TensorView pos_view(positions.data(), index_dtype, Shape{t_len});

  // q laid out as [T, N, nope + rope] with padding; RoPE on the rope dims (offset = nope).
  Buf3 q(t_len, heads, nope + rope, 2, 5);
  q.Fill(rng);
  const Buf3 before = q;
  ASSERT_TRUE(backend.ApplyRope(q.view(), nope, rope, pos_view, cos_sin, style).ok());
  for (int64_t t = 0; t < t_len; ++t) {
    const float* c = &table[positions[t] * rope];
    const float* s = c + rope / 2;
    for (int64_t n = 0; n < heads; ++n) {
      for (int64_t d = 0; d < nope; ++d) ASSERT_EQ(q.at(t, n, d), before.at(t, n, d));
      for (int64_t i = 0; i < rope / 2; ++i) {
        const int64_t ia = style == RopeStyle::kAdjacentPairs ? nope + 2 * i : nope + i;
        const int64_t ib =
            style == RopeStyle::kAdjacentPairs ? nope + 2 * i + 1 : nope + rope / 2 + i;
        const double a = before.at(t, n, ia), b = before.at(t, n, ib);
        ASSERT_NEAR(q.at(t, n, ia), a * c[i] - b * s[i], 1e-6) << t << " " << n << " " << i;
        ASSERT_NEAR(q.at(t, n, ib), b * c[i] + a * s[i], 1e-6) << t << " " << n << " " << i;
      }
    }
  }
  EXPECT_TRUE(PaddingIsNaN(q, q.view()));
}

TEST(CpuBackendRopeTest, AdjacentPairsMatchExplicitRotation) {
  CheckRope<int32_t>(RopeStyle::kAdjacentPairs, DType::kI32);
  CheckRope<int64_t>(RopeStyle::kAdjacentPairs, DType::kI64);
}

TEST(CpuBackendRopeTest, RotateHalfMatchesExplicitRotation) {
  CheckRope<int32_t>(RopeStyle::kRotateHalf, DType::kI32);
  CheckRope<int64_t>(RopeStyle::kRotateHalf, DType::kI64);
}

// Head-major memory [N, T, D] viewed as [T, N, D]; and the MLA k_pe, a [T, 1, rope] view into the
// kv_a output rows [T, kv_lora + rope].
// A contiguous [T, 0, D] view (no heads) has stride 0 along dim 0 but maps no element twice: it is
// an empty operand, not an aliasing one.
TEST(CpuBackendRopeTest, NoHeadsIsAnEmptyOperand) {
  CpuBackend backend;
  std::mt19937 rng(13);
  std::vector<float> table = RandomTable(8, 6, 1.0f, rng);
  std::vector<int32_t> positions = {1, 2, 3};
  std::vector<float> none(1);
  const absl::Status st =
      backend.ApplyRope(TensorView(none.data(), DType::kF32, Shape{3, 0, 6}), 0, 6,
                        TensorView(positions.data(), DType::kI32, Shape{3}),
                        TensorView(table.data(), DType::kF32, Shape{8, 6}), RopeStyle::kAdjacentPairs);
  EXPECT_TRUE(st.ok()) << st;
}

TEST(CpuBackendRopeTest, HeadMajorAndSingleHeadViews) {
  CpuBackend backend;
  std::mt19937 rng(12);
  const int64_t t_len = 4, heads = 2, dim = 6;
  std::vector<float> table = RandomTable(8, dim, 1.0f, rng);
  TensorView cos_sin(table.data(), DType::kF32, Shape{8, dim});
  std::vector<int32_t> positions = {7, 0, 2, 5};
  TensorView pos(positions.data(), DType::kI32, Shape{t_len});

  std::vector<float> head_major(heads * t_len * dim);
  for (float& f : head_major) f = std::normal_distribution<float>()(rng);
  std::vector<float> token_major(t_len * heads * dim);
  for (int64_t t = 0; t < t_len; ++t) {
    for (int64_t n = 0; n < heads; ++n) {
      for (int64_t d = 0; d < dim; ++d) {
        token_major[(t * heads + n) * dim + d] = head_major[(n * t_len + t) * dim + d];
      }
    }
  }
  TensorView transposed(head_major.data(), DType::kF32, Shape{t_len, heads, dim},
                        Shape{dim, t_len * dim, 1}, Device::Cpu());
  ASSERT_TRUE(backend.ApplyRope(transposed, 0, dim, pos, cos_sin, RopeStyle::kAdjacentPairs).ok());
  ASSERT_TRUE(backend
                  .ApplyRope(TensorView(token_major.data(), DType::kF32, Shape{t_len, heads, dim}),
                             0, dim, pos, cos_sin, RopeStyle::kAdjacentPairs)
                  .ok());
  for (int64_t t = 0; t < t_len; ++t) {
    for (int64_t n = 0; n < heads; ++n) {
      for (int64_t d = 0; d < dim; ++d) {
        ASSERT_EQ(head_major[(n * t_len + t) * dim + d], token_major[(t * heads + n) * dim + d]);
      }
    }
  }

  const int64_t lora = 5;
  std::vector<float> kv_a(t_len * (lora + dim));
  for (float& f : kv_a) f = std::normal_distribution<float>()(rng);
  const std::vector<float> kv_a0 = kv_a;
  TensorView k_pe(kv_a.data(), DType::kF32, Shape{t_len, 1, lora + dim},
                  Shape{lora + dim, lora + dim, 1}, Device::Cpu());
  ASSERT_TRUE(backend.ApplyRope(k_pe, lora, dim, pos, cos_sin, RopeStyle::kAdjacentPairs).ok());
  for (int64_t t = 0; t < t_len; ++t) {
    for (int64_t d = 0; d < lora; ++d)
      ASSERT_EQ(kv_a[t * (lora + dim) + d], kv_a0[t * (lora + dim) + d]);
    const float* c = &table[positions[t] * dim];
    const double a = kv_a0[t * (lora + dim) + lora], b = kv_a0[t * (lora + dim) + lora + 1];
    EXPECT_NEAR(kv_a[t * (lora + dim) + lora], a * c[0] - b * c[dim / 2], 1e-6);
  }
}

// With an unscaled table (no YaRN magnitude), RoPE is a rotation: it keeps norms, and q.k after it
// depends only on the position difference.
TEST(CpuBackendRopeTest, RotationPropertiesWithRealTables) {
  CpuBackend backend;
  std::mt19937 rng(13);
  RopeConfig v2;  // DeepSeek-V2's YaRN: attention factor 1
  v2.scaling.type = RopeScaling::Type::kYarn;
  v2.scaling.factor = 40;
  v2.scaling.original_max_position_embeddings = 4096;
  v2.scaling.mscale = 0.707;
  v2.scaling.mscale_all_dim = 0.707;
  RopeConfig plain;
  plain.theta = 500000;
  for (const RopeConfig& rope : {v2, plain}) {
    for (RopeStyle style : {RopeStyle::kAdjacentPairs, RopeStyle::kRotateHalf}) {
      const int64_t dim = 64, positions_total = 9000;
      auto table = MakeRopeCosSin(rope, dim, positions_total);
      ASSERT_TRUE(table.ok());
      // Row 0: q at p, row 1: k at p - delta; rows 2, 3: the same vectors shifted by `shift`.
      const int64_t p = 5000, delta = 1234, shift = 2999;
      std::vector<int64_t> positions = {p, p - delta, p + shift, p - delta + shift};
      Buf3 x(4, 1, dim);
      for (int64_t d = 0; d < dim; ++d) {
        x.at(0, 0, d) = x.at(2, 0, d) = std::normal_distribution<float>()(rng);
        x.at(1, 0, d) = x.at(3, 0, d) = std::normal_distribution<float>()(rng);
      }
      const Buf3 before = x;
      ASSERT_TRUE(backend
                      .ApplyRope(x.view(), 0, dim,
                                 TensorView(positions.data(), DType::kI64, Shape{4}), *table, style)
                      .ok());
      auto dot = [&](const Buf3& b, int r, int s) {
        double sum = 0;
        for (int64_t d = 0; d < dim; ++d) sum += static_cast<double>(b.at(r, 0, d)) * b.at(s, 0, d);
        return sum;
      };
      for (int r = 0; r < 4; ++r) {
        EXPECT_NEAR(std::sqrt(dot(x, r, r)), std::sqrt(dot(before, r, r)),
                    1e-5 * std::sqrt(dot(before, r, r)));
      }
      EXPECT_NEAR(dot(x, 0, 1), dot(x, 2, 3),
                  1e-4 * std::sqrt(dot(before, 0, 0) * dot(before, 1, 1)));
      EXPECT_GT(std::abs(dot(x, 0, 1) - dot(before, 0, 1)), 1e-3);  // the rotation did something
    }
  }
}

TEST(CpuBackendRopeTest, RejectsBadArgumentsWithoutWriting) {
  CpuBackend backend;
  std::mt19937 rng(14);
  std::vector<float> table = RandomTable(10, 8, 1.0f, rng);
  TensorView cos_sin(table.data(), DType::kF32, Shape{10, 8});
  std::vector<int32_t> positions = {1, 2, 10};
  TensorView pos(positions.data(), DType::kI32, Shape{3});
  Buf3 x(3, 2, 12);
  x.Fill(rng);
  const std::vector<float> before = x.data;
  const auto apply = [&](const TensorView& xv, int64_t offset, int64_t dim, const TensorView& p,
                         const TensorView& cs) {
    return backend.ApplyRope(xv, offset, dim, p, cs, RopeStyle::kAdjacentPairs);
  };
  ExpectInvalid(
      apply(x.view(), 4, 8, pos, cos_sin),
      {"ApplyRope", "positions[2] = 10 is outside the [0, 10) rows of cos_sin f32[10, 8] cpu"});
  positions[2] = -1;
  ExpectInvalid(apply(x.view(), 4, 8, pos, cos_sin), {"positions[2] = -1"});
  EXPECT_TRUE(SameBits(x.data, before));  // token 0 and 1 were valid but nothing was written
  positions[2] = 3;
  ExpectInvalid(apply(x.view(), 4, 7, pos, cos_sin), {"rope_dim must be even and >= 2, got 7"});
  ExpectInvalid(apply(x.view(), 6, 8, pos, cos_sin),
                {"dims [offset, offset + rope_dim) = [6, 14) must lie within the D = 12 dims of x "
                 "f32[3, 2, 12] cpu"});
  ExpectInvalid(apply(x.view(), -1, 8, pos, cos_sin), {"[-1, 7)"});
  ExpectInvalid(apply(x.view(), 0, 8, pos, TensorView(table.data(), DType::kF32, Shape{5, 16})),
                {"cos_sin f32[5, 16] cpu must be [P, rope_dim = 8]"});
  ExpectInvalid(apply(x.view(), 0, 8, TensorView(positions.data(), DType::kI32, Shape{2}), cos_sin),
                {"positions i32[2] cpu must be [T] = [3] for x f32[3, 2, 12] cpu"});
  ExpectInvalid(apply(x.view(), 0, 8, TensorView(table.data(), DType::kF32, Shape{3}), cos_sin),
                {"positions f32[3] cpu must be i32 or i64"});
  ExpectInvalid(
      apply(TensorView(x.data.data(), DType::kF32, Shape{3, 2, 12}, Shape{24, 0, 1}, Device::Cpu()),
            0, 8, pos, cos_sin),
      {"x f32[3, 2, 12] cpu with strides [24, 0, 1] maps several elements to one address"});
  ExpectInvalid(
      apply(TensorView(x.data.data(), DType::kF32, Shape{3, 2, 6}, Shape{24, 12, 2}, Device::Cpu()),
            0, 6, pos, cos_sin),
      {"x f32[3, 2, 6] cpu needs unit stride along its last dim"});
  ExpectInvalid(apply(TensorView(x.data.data(), DType::kF32, Shape{72}), 0, 8, pos, cos_sin),
                {"x must be 3-D [T, N, D], got f32[72] cpu"});
  std::vector<uint16_t> half(72);
  ExpectInvalid(apply(TensorView(half.data(), DType::kBF16, Shape{3, 2, 12}), 0, 8, pos, cos_sin),
                {"x is bf16[3, 2, 12] cpu but CpuBackend takes f32 only"});
  // x must not overlap the table it reads.
  ExpectInvalid(apply(TensorView(table.data(), DType::kF32, Shape{3, 1, 8}), 0, 8, pos, cos_sin),
                {"x f32[3, 1, 8] cpu overlaps cos_sin"});
  EXPECT_TRUE(SameBits(x.data, before));
}

// ---- Attention ----------------------------------------------------------------------------------

struct AttentionCase {
  int64_t t_len, s_len, heads, dk, dv;
  const char* mask;  // "causal", "full" or "tree"
};

void PrintTo(const AttentionCase& c, std::ostream* os) {
  *os << "T " << c.t_len << " S " << c.s_len << " N " << c.heads << " Dk " << c.dk << " Dv " << c.dv
      << " " << c.mask;
}

class CpuBackendAttentionShapeTest : public ::testing::TestWithParam<AttentionCase> {};

Mask MakeMask(const AttentionCase& c) {
  const std::string kind = c.mask;
  if (kind == "causal") return Mask::Causal(c.t_len, c.s_len, 2);
  if (kind == "tree") {
    std::vector<int> parents = {-1, 0, 0, 1, 1, 2, 3};
    parents.resize(c.t_len);
    return TreeMask(c.s_len - c.t_len, parents);
  }
  Mask m(c.t_len, c.s_len);
  std::fill(m.data.begin(), m.data.end(), 1);
  return m;
}

TEST_P(CpuBackendAttentionShapeTest, MatchesNaive) {
  const AttentionCase c = GetParam();
  CpuBackend backend;
  std::mt19937 rng(static_cast<uint32_t>(c.t_len * 7 + c.s_len * 3 + c.dk));
  // q: the rope-and-nope layout [T, N, Dk] padded; k and v: views into one kv buffer
  // [S, N, Dk + Dv] (the k_nope/v split of kv_b_proj's output).
  Buf3 q(c.t_len, c.heads, c.dk, 3, 1);
  Buf3 kv(c.s_len, c.heads, c.dk + c.dv, 1, 2);
  Buf3 out(c.t_len, c.heads, c.dv, 2, 0);
  q.Fill(rng);
  kv.Fill(rng, 2.0f);
  const TensorView k = kv.view().Narrow(2, 0, c.dk);
  const TensorView v = kv.view().Narrow(2, c.dk, c.dv);
  Mask mask = MakeMask(c);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.dk));
  for (DType mask_dtype : {DType::kU8, DType::kBool}) {
    ASSERT_TRUE(backend.Attention(q.view(), k, v, mask.view(mask_dtype), scale, out.view()).ok());
    ExpectAttentionMatches(q.view(), k, v, mask, scale, out.view());
    EXPECT_TRUE(PaddingIsNaN(out, out.view()));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuBackendAttentionShapeTest,
                         ::testing::Values(AttentionCase{1, 1, 1, 1, 1, "full"},
                                           AttentionCase{3, 5, 2, 8, 4, "full"},
                                           AttentionCase{7, 7, 4, 24, 16, "causal"},
                                           AttentionCase{4, 19, 3, 40, 32, "causal"},
                                           AttentionCase{7, 12, 2, 16, 8, "tree"},
                                           AttentionCase{0, 3, 2, 4, 4, "full"}),
                         [](const ::testing::TestParamInfo<AttentionCase>& info) {
                           const AttentionCase& c = info.param;
                           return std::string(c.mask) + "T" + std::to_string(c.t_len) + "S" +
                                  std::to_string(c.s_len) + "N" + std::to_string(c.heads) + "Dk" +
                                  std::to_string(c.dk) + "Dv" + std::to_string(c.dv);
                         });

TEST(CpuBackendAttentionTest, MaskedKeysAreIgnoredAndLargeScoresDoNotOverflow) {
  CpuBackend backend;
  // Query 0 scores the keys 5000 and 4999 (exp overflows without max subtraction), query 1 scores
  // them -5000 and -4999 (exp underflows to 0 / 0 unless the maximum is subtracted).
  Buf3 q(2, 1, 2), k(3, 1, 2), v(3, 1, 1), out(2, 1, 1);
  q.at(0, 0, 0) = 100.0f;
  q.at(0, 0, 1) = 0.0f;
  q.at(1, 0, 0) = -100.0f;
  q.at(1, 0, 1) = 0.0f;
  k.at(0, 0, 0) = 50.0f;
  k.at(1, 0, 0) = 49.99f;
  k.at(2, 0, 0) = 1e6f;  // masked: would dominate
  for (int s = 0; s < 3; ++s) k.at(s, 0, 1) = 0.0f;
  v.at(0, 0, 0) = 1.0f;
  v.at(1, 0, 0) = 3.0f;
  v.at(2, 0, 0) = kNaN;  // masked: must not be read into the result
  Mask mask(2, 3);
  mask.at(0, 0) = mask.at(0, 1) = mask.at(1, 0) = mask.at(1, 1) = 1;
  ASSERT_TRUE(backend.Attention(q.view(), k.view(), v.view(), mask.view(), 1.0f, out.view()).ok());
  // Scores 100 * 49.99 = 4999 in f32, so the weights are 1 / (1 + e^-1) and e^-1 / (1 + e^-1).
  const double w = 1 / (1 + std::exp(-1.0));
  EXPECT_NEAR(out.at(0, 0, 0), w * 1 + (1 - w) * 3, 2e-3);
  EXPECT_NEAR(out.at(1, 0, 0), (1 - w) * 1 + w * 3, 2e-3);
}

TEST(CpuBackendAttentionTest, RejectsFullyMaskedRowWithoutWriting) {
  CpuBackend backend;
  std::mt19937 rng(21);
  Buf3 q(3, 2, 4), k(5, 2, 4), v(5, 2, 4), out(3, 2, 4);
  q.Fill(rng);
  k.Fill(rng);
  v.Fill(rng);
  Mask mask = Mask::Causal(3, 5);
  for (int64_t s = 0; s < 5; ++s) mask.at(2, s) = 0;
  const std::vector<float> before = out.data;
  ExpectInvalid(backend.Attention(q.view(), k.view(), v.view(), mask.view(), 0.5f, out.view()),
                {"Attention", "row 2 of mask u8[3, 5] cpu allows no key"});
  EXPECT_TRUE(SameBits(out.data, before));
}

TEST(CpuBackendAttentionTest, RejectsBadOperands) {
  CpuBackend backend;
  Buf3 q(3, 2, 4), k(5, 2, 4), v(5, 2, 6), out(3, 2, 6);
  Mask mask = Mask::Causal(3, 5);
  const auto run = [&](const TensorView& qv, const TensorView& kv, const TensorView& vv,
                       const TensorView& m, float scale,
                       const TensorView& o) { return backend.Attention(qv, kv, vv, m, scale, o); };
  ExpectInvalid(
      run(q.view(), Buf3(5, 2, 3).view(), v.view(), mask.view(), 1, out.view()),
      {"k f32[5, 2, 3] cpu must be [S, N, Dk] with N = 2, Dk = 4 from q f32[3, 2, 4] cpu"});
  ExpectInvalid(run(q.view(), k.view(), Buf3(4, 2, 6).view(), mask.view(), 1, out.view()),
                {"v f32[4, 2, 6] cpu must be [S, N, Dv] with S = 5"});
  ExpectInvalid(run(q.view(), k.view(), v.view(), Mask(3, 4).view(), 1, out.view()),
                {"mask u8[3, 4] cpu must be [T, S] = [3, 5]"});
  std::vector<float> fmask(15, 1.0f);
  ExpectInvalid(run(q.view(), k.view(), v.view(),
                    TensorView(fmask.data(), DType::kF32, Shape{3, 5}), 1, out.view()),
                {"mask f32[3, 5] cpu must be u8 or bool, got f32"});
  ExpectInvalid(run(q.view(), k.view(), v.view(), mask.view(), 1, Buf3(3, 2, 4).view()),
                {"out f32[3, 2, 4] cpu must be [T, N, Dv] = [3, 2, 6]"});
  ExpectInvalid(run(q.view(), k.view(), v.view(), mask.view(), kNaN, out.view()),
                {"scale must be finite"});
  ExpectInvalid(run(q.view(), k.view(), v.view(), mask.view(), 1,
                    TensorView(v.data.data(), DType::kF32, Shape{3, 2, 6})),
                {"out f32[3, 2, 6] cpu overlaps v"});
  ExpectInvalid(
      run(q.view(), k.view(), v.view(), mask.view(), 1,
          TensorView(out.data.data(), DType::kF32, Shape{3, 2, 6}, Shape{6, 0, 1}, Device::Cpu())),
      {"out", "maps several elements to one address"});
  ExpectInvalid(
      run(q.view(), k.view(), v.view(),
          TensorView(mask.data.data(), DType::kU8, Shape{3, 5}, Shape{5, 1}, Device::Cuda(0)), 1,
          out.view()),
      {"mask is u8[3, 5] cuda:0 but this backend runs on cpu"});
}

// ---- PagedWrite / PagedRead ---------------------------------------------------------------------

// A NaN-filled [num_pages, page_size, W] cache.
struct Cache {
  int64_t pages, page_size, width;
  std::vector<float> data;
  Cache(int64_t p, int64_t ps, int64_t w)
      : pages(p), page_size(ps), width(w), data(p * ps * w, kNaN) {}
  TensorView view() { return TensorView(data.data(), DType::kF32, Shape{pages, page_size, width}); }
  // The row of position `pos` under `table`, addressed independently of the op.
  const float* Slot(const std::vector<int32_t>& table, int64_t pos) const {
    return &data[(table[pos / page_size] * page_size + pos % page_size) * width];
  }
};

// A page table of `used` entries over a cache of `pages` pages, in a scrambled order.
std::vector<int32_t> ScrambledTable(int64_t used, int64_t pages, std::mt19937& rng) {
  std::vector<int32_t> all(pages);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(used);
  return all;
}

TEST(CpuBackendPagedTest, WriteThenReadAtScatteredPositions) {
  std::mt19937 rng(31);
  CpuBackend backend;
  for (int64_t page_size : {1, 3, 64}) {
    SCOPED_TRACE(page_size);
    const int64_t width = 9, context = 130, t_len = 40;
    const int64_t used = (context + page_size - 1) / page_size;
    Cache cache(used + 2, page_size, width);
    std::vector<int32_t> table = ScrambledTable(used, used + 2, rng);
    TensorView table_view(table.data(), DType::kI32, Shape{used});
    std::vector<int64_t> positions(context);
    std::iota(positions.begin(), positions.end(), 0);
    std::shuffle(positions.begin(), positions.end(), rng);
    positions.resize(t_len);
    // rows: [T, W] with a row stride of W + 4.
    std::vector<float> rows(t_len * (width + 4), kNaN);
    for (int64_t t = 0; t < t_len; ++t) {
      for (int64_t d = 0; d < width; ++d)
        rows[t * (width + 4) + d] = static_cast<float>(t * 100 + d);
    }
    TensorView rows_view(rows.data(), DType::kF32, Shape{t_len, width}, Shape{width + 4, 1},
                         Device::Cpu());
    TensorView pos_view(positions.data(), DType::kI64, Shape{t_len});
    ASSERT_TRUE(backend.PagedWrite(rows_view, pos_view, table_view, cache.view()).ok());
    for (int64_t t = 0; t < t_len; ++t) {
      const float* slot = cache.Slot(table, positions[t]);
      for (int64_t d = 0; d < width; ++d) ASSERT_EQ(slot[d], t * 100 + d);
    }
    // Exactly T rows were written.
    int64_t written = 0;
    for (int64_t r = 0; r < cache.pages * page_size; ++r)
      written += !std::isnan(cache.data[r * width]);
    EXPECT_EQ(written, t_len);

    // Read back in reverse order into a padded out, with i32 positions.
    std::vector<int32_t> reversed(positions.rbegin(), positions.rend());
    std::vector<float> out(t_len * (width + 1), kNaN);
    TensorView out_view(out.data(), DType::kF32, Shape{t_len, width}, Shape{width + 1, 1},
                        Device::Cpu());
    ASSERT_TRUE(backend
                    .PagedRead(cache.view(), table_view,
                               TensorView(reversed.data(), DType::kI32, Shape{t_len}), out_view)
                    .ok());
    for (int64_t t = 0; t < t_len; ++t) {
      for (int64_t d = 0; d < width; ++d)
        ASSERT_EQ(out[t * (width + 1) + d], (t_len - 1 - t) * 100 + d);
      ASSERT_TRUE(std::isnan(out[t * (width + 1) + width]));
    }
  }
}

// A latent cache of another dtype than f32 / bf16 is refused by every op that touches it, naming
// the tensor and its dtype, before anything is written.
TEST(CpuBackendPagedTest, RefusesAnF16CacheNamingIt) {
  CpuBackend backend;
  std::vector<uint16_t> cache_bits(4 * 3 * 2, 0x3c00);  // 1.0 in f16
  const TensorView cache(cache_bits.data(), DType::kF16, Shape{4, 3, 2});
  std::vector<int32_t> table = {2, 0};
  const TensorView table_view(table.data(), DType::kI32, Shape{2});
  std::vector<float> rows = {1, 2, 3, 4};
  const TensorView rows_view(rows.data(), DType::kF32, Shape{2, 2});
  std::vector<int32_t> positions = {0, 4};
  const TensorView pos_view(positions.data(), DType::kI32, Shape{2});
  const std::string named = "cache is f16[4, 3, 2] cpu but ";
  const std::string rule = "takes an f32 or bf16 cache (got f16)";
  ExpectInvalid(backend.PagedWrite(rows_view, pos_view, table_view, cache), {"PagedWrite", named, rule});
  EXPECT_TRUE(std::all_of(cache_bits.begin(), cache_bits.end(), [](uint16_t b) { return b == 0x3c00; }));
  std::vector<float> out(4, kNaN);
  const TensorView out_view(out.data(), DType::kF32, Shape{2, 2});
  ExpectInvalid(backend.PagedRead(cache, table_view, pos_view, out_view), {"PagedRead", named, rule});
  std::vector<float> q(1 * 2 * 2, 1.0f), attn(1 * 2 * 2, kNaN);
  std::vector<uint8_t> mask(5, 1);
  const TensorView q_view(q.data(), DType::kF32, Shape{1, 2, 2});
  const TensorView attn_view(attn.data(), DType::kF32, Shape{1, 2, 2});
  ExpectInvalid(backend.LatentAttention(q_view, cache, table_view, 5,
                                        TensorView(mask.data(), DType::kU8, Shape{1, 5}), 1.0f, 2,
                                        attn_view),
                {"LatentAttention", named, rule});
  std::vector<int32_t> starts = {0, 1}, lens = {5};
  ExpectInvalid(backend.BatchedLatentAttention(
                    q_view, cache, TensorView(table.data(), DType::kI32, Shape{1, 2}),
                    TensorView(starts.data(), DType::kI32, Shape{2}),
                    TensorView(lens.data(), DType::kI32, Shape{1}), 5, TensorView(), 1.0f, 2,
                    attn_view),
                {"BatchedLatentAttention", named, rule});
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float f) { return std::isnan(f); }));
  EXPECT_TRUE(std::all_of(attn.begin(), attn.end(), [](float f) { return std::isnan(f); }));
}

// A bf16 cache (eagle3/backend.h): PagedWrite rounds each value to nearest even (NaN stays NaN,
// large values overflow to inf), PagedRead widens the stored bits exactly.
TEST(CpuBackendPagedTest, Bf16CacheRoundsToNearestEvenAndReadsBackExactly) {
  CpuBackend backend;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  // 1 + 2^-8 is a tie (to even: 1), 1 + 3 * 2^-8 a tie (to even: 1 + 2^-6), 1 + 2^-8 + 2^-12 rounds
  // up, 3.4e38 overflows.
  const std::vector<float> values = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-12f,
                                     -2.5f, kNaN, 3.4e38f};
  const std::vector<float> expected = {1.0f, 1.0f + 0x1p-6f, 1.0f + 0x1p-7f, -2.5f, kNaN, kInf};
  const int64_t width = static_cast<int64_t>(values.size());
  std::vector<uint16_t> cache_bits(3 * 2 * width, 0xffff);  // NaN: untouched slots stay so
  const TensorView cache(cache_bits.data(), DType::kBF16, Shape{3, 2, width});
  std::vector<int32_t> table = {2, 0};
  const TensorView table_view(table.data(), DType::kI32, Shape{2});
  std::vector<float> rows(values);
  rows.insert(rows.end(), values.rbegin(), values.rend());
  std::vector<int64_t> positions = {3, 0};  // page 0 slot 1, page 2 slot 0
  const TensorView pos_view(positions.data(), DType::kI64, Shape{2});
  ASSERT_TRUE(backend.PagedWrite(TensorView(rows.data(), DType::kF32, Shape{2, width}), pos_view,
                                 table_view, cache).ok());
  std::vector<float> out(2 * width, 0.0f);
  ASSERT_TRUE(backend.PagedRead(cache, table_view, pos_view,
                                TensorView(out.data(), DType::kF32, Shape{2, width})).ok());
  for (int64_t i = 0; i < width; ++i) {
    for (int64_t t = 0; t < 2; ++t) {
      const float want = expected[t == 0 ? i : width - 1 - i];
      const float got = out[t * width + i];
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << t << " " << i;
      } else {
        EXPECT_EQ(got, want) << t << " " << i;
      }
    }
  }
  // Only the two slots written changed: page 0 slot 1 and page 2 slot 0.
  for (int64_t slot = 0; slot < 6; ++slot) {
    if (slot == 1 || slot == 4) continue;
    for (int64_t i = 0; i < width; ++i) EXPECT_EQ(cache_bits[slot * width + i], 0xffff) << slot;
  }
}

// Rounds like a bf16 cache stores.
float RoundBf16(float v) { return Bf16ToFloat(FloatToBf16(v)); }

// LatentAttention and BatchedLatentAttention over a bf16 cache follow eagle3/backend.h: q rounded to
// bf16, the keys / values the cache's bf16 rows, fp32 scores and softmax, the weights rounded to
// bf16 in the value product and not in their sum. Checked against a naive double reference that
// rounds at exactly those points, and the f32-cache result is close but not equal.
TEST(CpuBackendPagedTest, LatentAttentionOverABf16CacheRoundsQAndTheWeights) {
  CpuBackend backend;
  std::mt19937 rng(17);
  const int64_t page_size = 4, context = 11, width = 12, value_dim = 8, heads = 3, t_len = 2;
  const int64_t pages = (context + page_size - 1) / page_size;
  std::vector<int32_t> table = ScrambledTable(pages, pages + 2, rng);
  const TensorView table_view(table.data(), DType::kI32, Shape{pages});
  std::vector<float> rows(context * width);
  for (float& f : rows) f = std::normal_distribution<float>()(rng);
  std::vector<int64_t> positions(context);
  std::iota(positions.begin(), positions.end(), 0);
  const TensorView rows_view(rows.data(), DType::kF32, Shape{context, width});
  const TensorView pos_view(positions.data(), DType::kI64, Shape{context});
  std::vector<uint16_t> bf16_bits((pages + 2) * page_size * width, 0);
  const TensorView bf16_cache(bf16_bits.data(), DType::kBF16, Shape{pages + 2, page_size, width});
  Cache f32_cache(pages + 2, page_size, width);
  ASSERT_TRUE(backend.PagedWrite(rows_view, pos_view, table_view, bf16_cache).ok());
  ASSERT_TRUE(backend.PagedWrite(rows_view, pos_view, table_view, f32_cache.view()).ok());

  Buf3 q(t_len, heads, width);
  q.Fill(rng, 2.0f);
  // The last t_len keys are the new tokens: causal among them (BatchedLatentAttention's rule).
  Mask mask = Mask::Causal(t_len, context, 1);
  const float scale = 0.7f;
  Buf3 latent(t_len, heads, value_dim), batched(t_len, heads, value_dim), f32_out(t_len, heads, value_dim);
  ASSERT_TRUE(backend.LatentAttention(q.view(), bf16_cache, table_view, context, mask.view(), scale,
                                      value_dim, latent.view()).ok());
  std::vector<int32_t> starts = {0, static_cast<int32_t>(t_len)}, lens = {static_cast<int32_t>(context)};
  ASSERT_TRUE(backend.BatchedLatentAttention(
                  q.view(), bf16_cache, TensorView(table.data(), DType::kI32, Shape{1, pages}),
                  TensorView(starts.data(), DType::kI32, Shape{2}),
                  TensorView(lens.data(), DType::kI32, Shape{1}), context, TensorView(), scale,
                  value_dim, batched.view()).ok());
  ASSERT_TRUE(backend.LatentAttention(q.view(), f32_cache.view(), table_view, context, mask.view(),
                                      scale, value_dim, f32_out.view()).ok());
  float max_f32_diff = 0.0f;
  for (int64_t t = 0; t < t_len; ++t) {
    for (int64_t n = 0; n < heads; ++n) {
      std::vector<double> logits(context, -INFINITY);
      double max = -INFINITY;
      for (int64_t s = 0; s < context; ++s) {
        if (mask.at(t, s) == 0) continue;
        double dot = 0;
        for (int64_t d = 0; d < width; ++d) dot += double{RoundBf16(q.at(t, n, d))} * RoundBf16(rows[s * width + d]);
        logits[s] = scale * dot;
        max = std::max(max, logits[s]);
      }
      double sum = 0;
      std::vector<double> expected(value_dim, 0.0);
      for (int64_t s = 0; s < context; ++s) {
        if (mask.at(t, s) == 0) continue;
        const double p = std::exp(logits[s] - max);
        sum += p;
        const double p_rounded = RoundBf16(static_cast<float>(p));
        for (int64_t d = 0; d < value_dim; ++d) expected[d] += p_rounded * RoundBf16(rows[s * width + d]);
      }
      for (int64_t d = 0; d < value_dim; ++d) {
        const double want = expected[d] / sum;
        EXPECT_NEAR(latent.at(t, n, d), want, 2e-5 * (1 + std::abs(want))) << t << " " << n << " " << d;
        EXPECT_NEAR(batched.at(t, n, d), want, 2e-5 * (1 + std::abs(want))) << t << " " << n << " " << d;
        max_f32_diff = std::max(max_f32_diff, std::abs(f32_out.at(t, n, d) - latent.at(t, n, d)));
      }
    }
  }
  // bf16 rounding moves the result (the op did round), but only by about bf16's precision.
  EXPECT_GT(max_f32_diff, 1e-4f);
  EXPECT_LT(max_f32_diff, 0.1f);
}

TEST(CpuBackendPagedTest, RejectsPositionsOutsideThePageTableWithoutWriting) {
  CpuBackend backend;
  Cache cache(4, 3, 2);
  std::vector<int32_t> table = {2, 0};  // positions [0, 6)
  TensorView table_view(table.data(), DType::kI32, Shape{2});
  std::vector<float> rows = {1, 2, 3, 4, 5, 6};
  TensorView rows_view(rows.data(), DType::kF32, Shape{3, 2});
  std::vector<int32_t> positions = {0, 5, 6};
  TensorView pos_view(positions.data(), DType::kI32, Shape{3});
  const std::vector<float> before = cache.data;
  ExpectInvalid(backend.PagedWrite(rows_view, pos_view, table_view, cache.view()),
                {"PagedWrite",
                 "positions[2] = 6 is outside the [0, 6) positions of page_table i32[2] cpu "
                 "with page_size 3"});
  EXPECT_TRUE(SameBits(cache.data, before));
  positions[2] = -2;
  ExpectInvalid(backend.PagedWrite(rows_view, pos_view, table_view, cache.view()),
                {"positions[2] = -2 is outside"});
  positions[2] = 1;
  table[1] = 4;  // page 4 of a 4-page cache
  ExpectInvalid(backend.PagedWrite(rows_view, pos_view, table_view, cache.view()),
                {"positions[1] = 5 falls in page_table[1] = 4, outside the [0, 4) pages of cache "
                 "f32[4, 3, 2] cpu"});
  EXPECT_TRUE(SameBits(cache.data, before));
  std::vector<float> out(6, kNaN);
  ExpectInvalid(backend.PagedRead(cache.view(), table_view, pos_view,
                                  TensorView(out.data(), DType::kF32, Shape{3, 2})),
                {"PagedRead", "positions[1] = 5 falls in page_table[1] = 4"});
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float f) { return std::isnan(f); }));
  table[1] = 0;

  ExpectInvalid(backend.PagedWrite(TensorView(rows.data(), DType::kF32, Shape{2, 3}), pos_view,
                                   table_view, cache.view()),
                {"positions i32[3] cpu must be [T] = [2] for rows f32[2, 3] cpu"});
  ExpectInvalid(backend.PagedWrite(TensorView(rows.data(), DType::kF32, Shape{3, 1}), pos_view,
                                   table_view, cache.view()),
                {"cache f32[4, 3, 2] cpu rows must have the width W = 1 of rows f32[3, 1] cpu"});
  std::vector<int64_t> table64 = {2, 0};
  ExpectInvalid(backend.PagedWrite(rows_view, pos_view,
                                   TensorView(table64.data(), DType::kI64, Shape{2}), cache.view()),
                {"page_table i64[2] cpu must be i32, got i64"});
  ExpectInvalid(backend.PagedWrite(rows_view, pos_view, table_view,
                                   TensorView(cache.data.data(), DType::kF32, Shape{3, 3, 2},
                                              Shape{7, 2, 1}, Device::Cpu())),
                {"cache f32[3, 3, 2] cpu must be contiguous, got strides [7, 2, 1]"});
  ExpectInvalid(backend.PagedWrite(rows_view, pos_view, table_view,
                                   TensorView(cache.data.data(), DType::kF32, Shape{4, 0, 2})),
                {"needs page_size >= 1"});
  ExpectInvalid(backend.PagedRead(cache.view(), table_view, pos_view,
                                  TensorView(cache.data.data() + 4, DType::kF32, Shape{3, 2})),
                {"PagedRead", "out f32[3, 2] cpu overlaps cache"});
}

// ---- LatentAttention ----------------------------------------------------------------------------

struct LatentCase {
  int64_t page_size, context, t_len, heads, width, value_dim;
};

void PrintTo(const LatentCase& c, std::ostream* os) {
  *os << "page_size " << c.page_size << " S " << c.context << " T " << c.t_len << " N " << c.heads
      << " W " << c.width << " value_dim " << c.value_dim;
}

class CpuBackendLatentAttentionTest : public ::testing::TestWithParam<LatentCase> {};

// The absorbed MLA core: attention over cache rows shared by all heads, values = their first
// value_dim columns, is ordinary attention with k = the rows broadcast to every head (a stride-0
// view) and v = its first value_dim columns.
TEST_P(CpuBackendLatentAttentionTest, EqualsAttentionOverBroadcastRows) {
  const LatentCase c = GetParam();
  CpuBackend backend;
  std::mt19937 rng(static_cast<uint32_t>(c.page_size * 1000 + c.context));
  const int64_t used = (c.context + c.page_size - 1) / c.page_size;
  Cache cache(used + 3, c.page_size, c.width);
  // Entries past the used ones are garbage the op must not look at.
  std::vector<int32_t> table = ScrambledTable(used, used + 3, rng);
  table.push_back(-1);
  table.push_back(1 << 30);
  TensorView table_view(table.data(), DType::kI32, Shape{static_cast<int64_t>(table.size())});

  // The sequence's latent rows, written into the cache through PagedWrite.
  std::vector<float> rows(c.context * c.width);
  for (float& f : rows) f = std::normal_distribution<float>()(rng);
  std::vector<int64_t> positions(c.context);
  std::iota(positions.begin(), positions.end(), 0);
  ASSERT_TRUE(backend
                  .PagedWrite(TensorView(rows.data(), DType::kF32, Shape{c.context, c.width}),
                              TensorView(positions.data(), DType::kI64, Shape{c.context}),
                              table_view, cache.view())
                  .ok());

  Buf3 q(c.t_len, c.heads, c.width, 1, 2);
  q.Fill(rng);
  Mask mask = Mask::Causal(c.t_len, c.context, 1);
  if (c.t_len > 2) mask.at(c.t_len - 1, 0) = 0;  // a hole, as a tree mask would make
  const float scale = 0.3f / std::sqrt(static_cast<float>(c.width));
  Buf3 latent_out(c.t_len, c.heads, c.value_dim, 2);
  ASSERT_TRUE(backend
                  .LatentAttention(q.view(), cache.view(), table_view, c.context, mask.view(),
                                   scale, c.value_dim, latent_out.view())
                  .ok());

  const TensorView k(rows.data(), DType::kF32, Shape{c.context, c.heads, c.width},
                     Shape{c.width, 0, 1}, Device::Cpu());
  const TensorView v = k.Narrow(2, 0, c.value_dim);
  Buf3 dense_out(c.t_len, c.heads, c.value_dim);
  ASSERT_TRUE(backend.Attention(q.view(), k, v, mask.view(), scale, dense_out.view()).ok());
  for (int64_t t = 0; t < c.t_len; ++t) {
    for (int64_t n = 0; n < c.heads; ++n) {
      for (int64_t d = 0; d < c.value_dim; ++d) {
        ASSERT_NEAR(latent_out.at(t, n, d), dense_out.at(t, n, d), 1e-5)
            << t << " " << n << " " << d;
      }
    }
  }
  // And both against the naive reference, reading the cache through the page table directly.
  for (int64_t t = 0; t < c.t_len; ++t) {
    for (int64_t n = 0; n < c.heads; ++n) {
      std::vector<double> qv(c.width);
      for (int64_t d = 0; d < c.width; ++d) qv[d] = q.at(t, n, d);
      const auto row = [&](int64_t s, int64_t d) { return cache.Slot(table, s)[d]; };
      const std::vector<double> expected =
          NaiveAttend(qv, c.context, &mask.at(t, 0), scale, row, row, c.value_dim);
      for (int64_t d = 0; d < c.value_dim; ++d) {
        ASSERT_NEAR(latent_out.at(t, n, d), expected[d], 2e-5 * (1 + std::abs(expected[d])));
      }
    }
  }
  EXPECT_TRUE(PaddingIsNaN(latent_out, latent_out.view()));
}

INSTANTIATE_TEST_SUITE_P(PageSizes, CpuBackendLatentAttentionTest,
                         ::testing::Values(LatentCase{1, 9, 3, 4, 12, 8},
                                           LatentCase{3, 10, 4, 2, 20, 16},
                                           LatentCase{3, 1, 1, 2, 6, 6},
                                           LatentCase{64, 150, 5, 3, 36, 32},
                                           LatentCase{64, 64, 2, 1, 8, 1}),
                         [](const ::testing::TestParamInfo<LatentCase>& info) {
                           const LatentCase& c = info.param;
                           return "page" + std::to_string(c.page_size) + "S" +
                                  std::to_string(c.context) + "T" + std::to_string(c.t_len) + "W" +
                                  std::to_string(c.width) + "V" + std::to_string(c.value_dim);
                         });

TEST(CpuBackendLatentAttentionErrorsTest, RejectsBadOperands) {
  CpuBackend backend;
  std::mt19937 rng(41);
  Cache cache(3, 4, 6);
  std::fill(cache.data.begin(), cache.data.end(), 0.5f);
  std::vector<int32_t> table = {2, 0};
  TensorView table_view(table.data(), DType::kI32, Shape{2});
  Buf3 q(2, 2, 6), out(2, 2, 4);
  q.Fill(rng);
  Mask mask = Mask::Causal(2, 7);
  const std::vector<float> before = out.data;
  const auto run = [&](const TensorView& tv, int64_t context, const TensorView& m,
                       int64_t value_dim, const TensorView& o) {
    return backend.LatentAttention(q.view(), cache.view(), tv, context, m, 1.0f, value_dim, o);
  };
  table[1] = 3;
  ExpectInvalid(run(table_view, 7, mask.view(), 4, out.view()),
                {"LatentAttention",
                 "page_table[1] = 3 (used by positions [4, 7)) is outside the [0, 3) "
                 "pages of cache f32[3, 4, 6] cpu"});
  EXPECT_TRUE(SameBits(out.data, before));
  table[1] = 0;
  ExpectInvalid(
      run(table_view, 9, Mask::Causal(2, 9).view(), 4, out.view()),
      {"page_table i32[2] cpu has fewer than the ceil(9 / 4) = 3 pages context_len needs"});
  ExpectInvalid(run(table_view, 0, Mask(2, 0).view(), 4, out.view()),
                {"context_len must be >= 1, got 0"});
  ExpectInvalid(run(table_view, 7, Mask::Causal(2, 6).view(), 4, out.view()),
                {"mask u8[2, 6] cpu must be [T, S] = [2, 7]"});
  ExpectInvalid(run(table_view, 7, mask.view(), 7, Buf3(2, 2, 7).view()),
                {"value_dim must be in [1, W = 6], got 7"});
  ExpectInvalid(run(table_view, 7, mask.view(), 4, Buf3(2, 2, 3).view()),
                {"out f32[2, 2, 3] cpu must be [T, N, value_dim] = [2, 2, 4]"});
  std::vector<int64_t> table64 = {2, 0};
  ExpectInvalid(
      run(TensorView(table64.data(), DType::kI64, Shape{2}), 7, mask.view(), 4, out.view()),
      {"page_table i64[2] cpu must be i32"});
  ExpectInvalid(backend.LatentAttention(Buf3(2, 2, 5).view(), cache.view(), table_view, 7,
                                        mask.view(), 1.0f, 4, out.view()),
                {"cache f32[3, 4, 6] cpu rows must have q's width W = 5"});
  Mask empty_row = Mask::Causal(2, 7);
  for (int64_t s = 0; s < 7; ++s) empty_row.at(0, s) = 0;
  ExpectInvalid(run(table_view, 7, empty_row.view(), 4, out.view()),
                {"row 0 of mask u8[2, 7] cpu allows no key"});
  ExpectInvalid(run(table_view, 7, mask.view(), 4,
                    TensorView(cache.data.data(), DType::kF32, Shape{2, 2, 4})),
                {"out f32[2, 2, 4] cpu overlaps cache"});
  EXPECT_TRUE(SameBits(out.data, before));
}

// ---- LatentRowsAndQueries ----------------------------------------------------------------------

// The op against a naive reference written here: c normed (or not), k_pe rotated in place, q_pe
// rotated into q_rot (q_pe untouched), each row stored at its slot of a [slots, 1, W] cache with the
// identity as its table; then the bad operands, each named, nothing written.
TEST(CpuBackendLatentRowsTest, NormsRotatesAndStoresAsWrittenHere) {
  CpuBackend backend;
  constexpr int64_t kT = 3, kLatent = 6, kRope = 4, kW = kLatent + kRope, kHeads = 2, kSlots = 8, kP = 5;
  std::vector<float> rows(kT * (kW + 1)), q(kT * kHeads * 7), rot(kT * kHeads * kRope, kNaN), cache(kSlots * kW, -1.0f);
  std::vector<float> weight(kLatent), table(kP * kRope);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = std::sin(0.7f * static_cast<float>(i)) * 2.0f;
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::cos(0.3f * static_cast<float>(i));
  for (size_t i = 0; i < weight.size(); ++i) weight[i] = 0.5f + 0.1f * static_cast<float>(i);
  for (size_t i = 0; i < table.size(); ++i) table[i] = std::cos(0.11f * static_cast<float>(i));
  const std::vector<int32_t> positions = {4, 0, 2}, slots = {7, 1, 3};
  std::vector<int32_t> identity(kSlots);
  for (int32_t i = 0; i < kSlots; ++i) identity[i] = i;
  const TensorView rows_v(rows.data(), DType::kF32, Shape{kT, kW}, Shape{kW + 1, 1}, Device::Cpu());
  const TensorView q_pe(q.data() + 3, DType::kF32, Shape{kT, kHeads, kRope}, Shape{kHeads * 7, 7, 1}, Device::Cpu());
  const TensorView q_rot(rot.data(), DType::kF32, Shape{kT, kHeads, kRope});
  const TensorView pos_v(const_cast<int32_t*>(positions.data()), DType::kI32, Shape{kT});
  const TensorView slots_v(const_cast<int32_t*>(slots.data()), DType::kI32, Shape{kT});
  const TensorView table_v(identity.data(), DType::kI32, Shape{kSlots});
  const TensorView cos_sin(table.data(), DType::kF32, Shape{kP, kRope});
  const TensorView cache_v(cache.data(), DType::kF32, Shape{kSlots, 1, kW});
  const TensorView weight_v(weight.data(), DType::kF32, Shape{kLatent});
  const std::vector<float> rows0 = rows, q0 = q, cache0 = cache;
  for (const bool norm : {true, false}) {
    rows = rows0;
    cache = cache0;
    ASSERT_TRUE(backend
                    .LatentRowsAndQueries(rows_v, norm ? weight_v : TensorView(), 1e-6f, q_pe, q_rot, pos_v, cos_sin,
                                          RopeStyle::kAdjacentPairs, slots_v, table_v, cache_v)
                    .ok());
    EXPECT_TRUE(SameBits(q, q0));
    for (int64_t t = 0; t < kT; ++t) {
      const float* r0 = rows0.data() + t * (kW + 1);
      double ss = 0;
      for (int64_t i = 0; i < kLatent; ++i) ss += static_cast<double>(r0[i]) * r0[i];
      const double inv = 1.0 / std::sqrt(ss / kLatent + 1e-6);
      const float* cs = table.data() + positions[t] * kRope;
      std::vector<float> want(r0, r0 + kW);
      if (norm) {
        for (int64_t i = 0; i < kLatent; ++i) want[i] = static_cast<float>(r0[i] * inv * weight[i]);
      }
      for (int64_t i = 0; i < kRope / 2; ++i) {
        const float a = r0[kLatent + 2 * i], b = r0[kLatent + 2 * i + 1], c = cs[i], sn = cs[kRope / 2 + i];
        want[kLatent + 2 * i] = a * c - b * sn;
        want[kLatent + 2 * i + 1] = b * c + a * sn;
      }
      for (int64_t i = 0; i < kW; ++i) {
        EXPECT_NEAR(rows[t * (kW + 1) + i], want[i], 1e-5f) << "t " << t << " col " << i;
        EXPECT_EQ(cache[slots[t] * kW + i], rows[t * (kW + 1) + i]) << "t " << t << " col " << i;
      }
      for (int64_t h = 0; h < kHeads; ++h) {
        const float* x = q0.data() + 3 + t * kHeads * 7 + h * 7;
        for (int64_t i = 0; i < kRope / 2; ++i) {
          const float c = cs[i], sn = cs[kRope / 2 + i];
          EXPECT_NEAR(rot[(t * kHeads + h) * kRope + 2 * i], x[2 * i] * c - x[2 * i + 1] * sn, 1e-6f);
          EXPECT_NEAR(rot[(t * kHeads + h) * kRope + 2 * i + 1], x[2 * i + 1] * c + x[2 * i] * sn, 1e-6f);
        }
      }
    }
    // Slots 0, 2, 4, 5, 6 are no token's: untouched.
    for (const int64_t s : {0, 2, 4, 5, 6}) EXPECT_EQ(cache[s * kW], -1.0f) << "slot " << s;
  }

  // Bad operands: refused, named, nothing written.
  rows = rows0;
  cache = cache0;
  const auto call = [&](const TensorView& r, const TensorView& w, const TensorView& qp, const TensorView& qr,
                        const TensorView& p, const TensorView& cs, const TensorView& sl) {
    return backend.LatentRowsAndQueries(r, w, 1e-6f, qp, qr, p, cs, RopeStyle::kAdjacentPairs, sl, table_v, cache_v);
  };
  const TensorView narrow(rows.data(), DType::kF32, Shape{kT, kRope}, Shape{kW + 1, 1}, Device::Cpu());
  ExpectInvalid(call(narrow, weight_v, q_pe, q_rot, pos_v, cos_sin, slots_v),
                {"LatentRowsAndQueries", "must be wider than rope_dim = 4"});
  ExpectInvalid(call(rows_v, TensorView(weight.data(), DType::kF32, Shape{kLatent - 1}), q_pe, q_rot, pos_v, cos_sin,
                     slots_v),
                {"LatentRowsAndQueries", "norm_weight"});
  ExpectInvalid(call(rows_v, weight_v, q_pe, TensorView(rot.data(), DType::kF32, Shape{kT, kHeads - 1, kRope}), pos_v,
                     cos_sin, slots_v),
                {"LatentRowsAndQueries", "q_pe", "q_rot", "must both be [T, H, rope_dim]"});
  ExpectInvalid(call(rows_v, weight_v, q_pe, TensorView(rows.data() + 1, DType::kF32, Shape{kT, kHeads, kRope},
                                                        Shape{kW + 1, kRope, 1}, Device::Cpu()),
                     pos_v, cos_sin, slots_v),
                {"LatentRowsAndQueries", "overlaps"});
  const std::vector<int32_t> bad_position = {4, 5, 2}, bad_slot = {7, 8, 3};
  ExpectInvalid(call(rows_v, weight_v, q_pe, q_rot, TensorView(const_cast<int32_t*>(bad_position.data()), DType::kI32,
                                                               Shape{kT}),
                     cos_sin, slots_v),
                {"ApplyRope", "positions[1]"});
  EXPECT_TRUE(SameBits(rows, rows0));
  ExpectInvalid(call(rows_v, weight_v, q_pe, q_rot, pos_v, cos_sin,
                     TensorView(const_cast<int32_t*>(bad_slot.data()), DType::kI32, Shape{kT})),
                {"PagedWrite"});
  // A bad slot stores nothing in the cache (the rows and q_rot may hold their new values).
  EXPECT_TRUE(SameBits(cache, cache0));
}

}  // namespace
}  // namespace eagle3::cpu
