// Backend::BatchedGemm's default (the per-item Gemm loop every backend inherits) on the CPU
// reference: it equals Gemm item by item, bit for bit, on the head-major layouts the absorbed MLA
// path uses, and refuses bad operands naming them.
#include <cstdint>
#include <random>
#include <string>

#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/tensor.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

Tensor Random(const Shape& shape, uint32_t seed) {
  Tensor t = *Tensor::Empty(DType::kF32, shape);
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = dist(rng);
  return t;
}

// [n, rows, cols] head-major view of columns [col, col + cols) of the heads of a [rows, n * d] tensor.
TensorView HeadMajor(const Tensor& t, int64_t n, int64_t d, int64_t col, int64_t cols) {
  return TensorView(t.data_as<float>() + col, DType::kF32, Shape{n, t.shape()[0], cols}, Shape{d, t.shape()[1], 1},
                    t.device());
}

TEST(BatchedGemmTest, DefaultEqualsGemmPerItemOnHeadMajorViews) {
  cpu::CpuBackend cpu;
  const int64_t t = 3, heads = 4, qk = 12, nope = 8, latent = 10, width = 11;
  const Tensor q = Random(Shape{t, heads * qk}, 1), w = Random(Shape{heads, latent, nope}, 2);
  Tensor batched = Random(Shape{t, heads * width}, 3);
  Tensor looped = *Tensor::Empty(DType::kF32, batched.shape());
  ASSERT_TRUE(cpu.Copy(batched, looped).ok());
  const GemmOptions options{0.5f, 0.25f, nullptr};
  ASSERT_TRUE(cpu.BatchedGemm(HeadMajor(q, heads, qk, 0, nope), w, HeadMajor(batched, heads, width, 0, latent), options)
                  .ok());
  for (int64_t h = 0; h < heads; ++h) {
    const TensorView a(q.data_as<float>() + h * qk, DType::kF32, Shape{t, nope}, Shape{heads * qk, 1}, q.device());
    const TensorView b(w.data_as<float>() + h * latent * nope, DType::kF32, Shape{latent, nope}, q.device());
    const TensorView c(looped.data_as<float>() + h * width, DType::kF32, Shape{t, latent}, Shape{heads * width, 1},
                       q.device());
    ASSERT_TRUE(cpu.Gemm(a, b, c, options).ok());
  }
  for (int64_t i = 0; i < batched.numel(); ++i) {
    ASSERT_EQ(batched.data_as<float>()[i], looped.data_as<float>()[i]) << "element " << i;
  }
}

TEST(BatchedGemmTest, BadShapesAndOverlapsAreRefusedNamingTheOperand) {
  cpu::CpuBackend cpu;
  const Tensor a = Random(Shape{2, 3, 4}, 1), b = Random(Shape{2, 5, 4}, 2);
  Tensor c = *Tensor::Empty(DType::kF32, Shape{2, 3, 5});
  auto expect = [](const absl::Status& st, const std::string& needle) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st;
  };
  expect(cpu.BatchedGemm(a, Random(Shape{3, 5, 4}, 3), c, {}), "batch mismatch");
  expect(cpu.BatchedGemm(a, Random(Shape{2, 5, 6}, 4), c, {}), "K mismatch");
  expect(cpu.BatchedGemm(a, b, *Tensor::Empty(DType::kF32, Shape{2, 3, 6}), {}), "c ");
  expect(cpu.BatchedGemm(Random(Shape{3, 4}, 5), b, c, {}), "a must be 3-D");
  const TensorView overlapping(c.data(), DType::kF32, Shape{2, 3, 5}, Shape{2, 5, 1}, c.device());
  expect(cpu.BatchedGemm(a, b, overlapping, {}), "overlap one another");
  // c sharing memory with a.
  Tensor shared = Random(Shape{64}, 6);
  const TensorView a_in(shared.data(), DType::kF32, Shape{2, 3, 4}, Shape{12, 4, 1}, shared.device());
  const TensorView c_on_a(shared.data_as<float>() + 4, DType::kF32, Shape{2, 3, 5}, Shape{15, 5, 1}, shared.device());
  expect(cpu.BatchedGemm(a_in, b, c_on_a, {}), "overlaps a");
  // An item's own Gemm failure names the item: a bf16 weight on the f32-only reference.
  Tensor b_bf16 = *Tensor::Empty(DType::kBF16, Shape{2, 5, 4});
  const absl::Status item = cpu.BatchedGemm(a, b_bf16, c, {});
  EXPECT_FALSE(item.ok());
  EXPECT_NE(item.message().find("BatchedGemm item 0"), std::string::npos) << item;
}

}  // namespace
}  // namespace eagle3
