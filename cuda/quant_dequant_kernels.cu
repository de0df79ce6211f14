// Dequantization of weight-only quantized weights into bf16 (quant_dequant_ops.h). No abseil here:
// nvcc must never see it.
//
// Each thread writes 8 consecutive columns of a row (one 16-byte store where rows are aligned, after
// one 8-byte code load for fp8 / one packed word for int4), so that a warp moves contiguous bytes;
// the scale index is divided out once per 8 columns and stepped at block boundaries, since a 64-bit
// division per weight would cost more than the memory traffic. The pass reads the stored bytes once
// and writes 2 bytes per weight; it precedes a product with many activation rows, whose cost
// dwarfs it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "eagle3/detail/int4_packing.h"
#include "eagle3/detail/quant_tiles.h"
#include "programmatic_launch.cuh"
#include "quant_dequant_ops.h"

namespace eagle3::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRun = 8;              // columns per thread
constexpr int64_t kMaxGrid = 65535;  // blocks per grid dimension launched; the kernels loop past it

// Where tiled codes lie (eagle3/detail/quant_tiles.h); steps 0: row-major codes.
struct TileGeometry {
  int64_t steps = 0, shift = 0;
};

__device__ __forceinline__ uint16_t Bf16Bits(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }

// Scales of consecutive columns: the block of column c and where the next block starts.
struct ScaleCursor {
  const float* f32 = nullptr;     // fp8: a row of f32 scales
  const uint16_t* bf16 = nullptr;  // int4: a row of bf16 scales
  int64_t block = 0, next = 0, width = 0;
  float value = 0.0f;

  __device__ float Load() const {
    return f32 != nullptr ? f32[block] : __uint_as_float(static_cast<uint32_t>(bf16[block]) << 16);
  }
  // Positions the cursor at column c (slice column; col0 the slice's offset in the scale grid).
  __device__ void Seek(int64_t c, int64_t col0) {
    block = (col0 + c) / width;
    next = (block + 1) * width - col0;
    value = Load();
  }
  // The scale of column c, for c from the last Seek on, increasing.
  __device__ float At(int64_t c) {
    while (c >= next) {
      ++block;
      next += width;
      value = Load();
    }
    return value;
  }
};

// Writes the run of columns [c0, c0 + count) of an output row from its weights w[0 .. count).
__device__ __forceinline__ void StoreRun(uint16_t* out_row, int64_t c0, const float (&w)[kRun], int count,
                                         bool vector) {
  if (vector && count == kRun) {
    uint32_t packed[kRun / 2];
#pragma unroll
    for (int j = 0; j < kRun / 2; ++j) {
      packed[j] = static_cast<uint32_t>(Bf16Bits(w[2 * j])) | (static_cast<uint32_t>(Bf16Bits(w[2 * j + 1])) << 16);
    }
    *reinterpret_cast<uint4*>(out_row + c0) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    return;
  }
#pragma unroll
  for (int j = 0; j < kRun; ++j) {  // unrolled with a guard: the arrays stay in registers
    if (j < count) out_row[c0 + j] = Bf16Bits(w[j]);
  }
}

__global__ void Fp8BlockDequantKernel(const uint8_t* __restrict__ codes, int64_t ld,
                                      const float* __restrict__ scale_inv, int64_t scale_ld, int64_t row0,
                                      int64_t col0, int64_t block_rows, int64_t block_cols,
                                      uint16_t* __restrict__ out, int64_t ld_out, int64_t n, int64_t k, bool vector,
                                      TileGeometry tiles) {
  PdlEnter();  // out may be scratch that the product before this one still reads
  for (int64_t r = blockIdx.y; r < n; r += gridDim.y) {
    ScaleCursor scale;
    scale.f32 = scale_inv + (row0 + r) / block_rows * scale_ld;
    scale.width = block_cols;
    const uint8_t* code_row = codes + r * ld;
    for (int64_t c0 = (blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x) * kRun; c0 < k;
         c0 += static_cast<int64_t>(gridDim.x) * kThreads * kRun) {
      const int count = static_cast<int>(min(static_cast<int64_t>(kRun), k - c0));
      uint8_t q[kRun];
      if (tiles.steps > 0) {
#pragma unroll
        for (int j = 0; j < kRun; ++j) {
          q[j] = j < count ? codes[QuantTileOffset(false, tiles.steps, tiles.shift, r, c0 + j)] : 0;
        }
      } else if (vector && count == kRun) {
        const uint2 raw = *reinterpret_cast<const uint2*>(code_row + c0);
#pragma unroll
        for (int j = 0; j < kRun; ++j) q[j] = static_cast<uint8_t>((j < 4 ? raw.x : raw.y) >> (8 * (j % 4)));
      } else {
#pragma unroll
        for (int j = 0; j < kRun; ++j) q[j] = j < count ? code_row[c0 + j] : 0;
      }
      scale.Seek(c0, col0);
      float w[kRun];
#pragma unroll
      for (int j = 0; j < kRun; ++j) {
        // e4m3 -> f16 is exact (every e4m3 value, subnormals and NaN included, is an f16 value).
        w[j] = j < count ? __half2float(__half(__nv_cvt_fp8_to_halfraw(q[j], __NV_E4M3))) * scale.At(c0 + j) : 0.0f;
      }
      StoreRun(out + r * ld_out, c0, w, count, vector);
    }
  }
}

__global__ void Int4GroupDequantKernel(const int32_t* __restrict__ packed, int64_t ld, int shift,
                                       const uint16_t* __restrict__ scale, int64_t scale_ld, int64_t col0,
                                       int64_t group_size, uint16_t* __restrict__ out, int64_t ld_out, int64_t n,
                                       int64_t k, bool vector, TileGeometry tiles) {
  PdlEnter();  // out may be scratch that the product before this one still reads
  for (int64_t r = blockIdx.y; r < n; r += gridDim.y) {
    ScaleCursor cursor;
    cursor.bf16 = scale + r * scale_ld;
    cursor.width = group_size;
    const int32_t* row = packed + r * ld;
    for (int64_t c0 = (blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x) * kRun; c0 < k;
         c0 += static_cast<int64_t>(gridDim.x) * kThreads * kRun) {
      const int count = static_cast<int>(min(static_cast<int64_t>(kRun), k - c0));
      cursor.Seek(c0, col0);
      float w[kRun];
#pragma unroll
      for (int j = 0; j < kRun; ++j) {
        int32_t q = 0;
        if (j < count && tiles.steps > 0) {
          // Tiled codes start on a whole word (shift 0): value c is nibble c % 8 of word c / 8.
          const int64_t at = QuantTileOffset(true, tiles.steps, tiles.shift, r, 4 * ((c0 + j) / kInt4PerWord));
          const int32_t word = *reinterpret_cast<const int32_t*>(reinterpret_cast<const uint8_t*>(packed) + at);
          q = Int4At(&word, (c0 + j) % kInt4PerWord);
        } else if (j < count) {
          q = Int4At(row, shift + c0 + j);
        }
        w[j] = j < count ? static_cast<float>(q) * cursor.At(c0 + j) : 0.0f;
      }
      StoreRun(out + r * ld_out, c0, w, count, vector);
    }
  }
}

// The warp tiles of tiled codes (QuantTileSteps / QuantTileShift of the slice's k and GLOBAL first
// column); steps 0: row-major.
TileGeometry TilesOf(bool int4, bool tiled, int64_t k, int64_t global_col0) {
  if (!tiled) return {};
  return {QuantTileSteps(int4, k, global_col0), QuantTileShift(int4, global_col0)};
}

dim3 Grid(int64_t n, int64_t k) {
  const int64_t runs = (k + kRun - 1) / kRun;
  return dim3(static_cast<unsigned>(std::min<int64_t>((runs + kThreads - 1) / kThreads, kMaxGrid)),
              static_cast<unsigned>(std::min<int64_t>(n, kMaxGrid)));
}

// Whether a row-strided [n, k] operand of `size`-byte elements has every run of kRun columns (from a
// multiple of kRun) aligned to kRun * size bytes.
bool RunsAligned(const void* p, int64_t ld, int64_t n, int64_t size) {
  const int64_t bytes = kRun * size;
  return reinterpret_cast<uintptr_t>(p) % bytes == 0 && (n <= 1 || (ld * size) % bytes == 0);
}

}  // namespace

cudaError_t LaunchFp8BlockDequant(const uint8_t* codes, int64_t ld, const float* scale_inv, int64_t scale_ld,
                                  int64_t row0, int64_t col0, int64_t block_rows, int64_t block_cols,
                                  uint16_t* out, int64_t ld_out, int64_t n, int64_t k, bool programmatic,
                                  cudaStream_t stream, const DequantTiles& tiles) {
  if (n < 0 || k < 0 || row0 < 0 || col0 < 0 || block_rows < 1 || block_cols < 1 || tiles.global_col0 < 0) {
    return cudaErrorInvalidValue;
  }
  if (n == 0 || k == 0) return cudaSuccess;
  if (codes == nullptr || scale_inv == nullptr || out == nullptr) return cudaErrorInvalidValue;
  if (n > 1 && ((!tiles.tiled && ld < k) || ld_out < k)) return cudaErrorInvalidValue;
  if ((row0 + n - 1) / block_rows > 0 && scale_ld < (col0 + k - 1) / block_cols + 1) return cudaErrorInvalidValue;
  const bool vector = (tiles.tiled || RunsAligned(codes, ld, n, 1)) && RunsAligned(out, ld_out, n, 2);
  return LaunchKernel(programmatic, Fp8BlockDequantKernel, Grid(n, k), dim3(kThreads), 0, stream, codes, ld,
                      scale_inv, scale_ld, row0, col0, block_rows, block_cols, out, ld_out, n, k, vector,
                      TilesOf(false, tiles.tiled, k, tiles.global_col0));
}

cudaError_t LaunchInt4GroupDequant(const int32_t* packed, int64_t ld, int shift, const uint16_t* scale,
                                   int64_t scale_ld, int64_t col0, int64_t group_size, uint16_t* out,
                                   int64_t ld_out, int64_t n, int64_t k, bool programmatic, cudaStream_t stream,
                                   const DequantTiles& tiles) {
  if (n < 0 || k < 0 || shift < 0 || shift >= kInt4PerWord || col0 < 0 || group_size < 1 ||
      (tiles.tiled && (shift != 0 || tiles.global_col0 < 0 || tiles.global_col0 % kInt4PerWord != 0))) {
    return cudaErrorInvalidValue;
  }
  if (n == 0 || k == 0) return cudaSuccess;
  if (packed == nullptr || scale == nullptr || out == nullptr) return cudaErrorInvalidValue;
  if (n > 1 && ((!tiles.tiled && ld < Int4PackedWords(shift + k)) || ld_out < k ||
                scale_ld < (col0 + k - 1) / group_size + 1)) {
    return cudaErrorInvalidValue;
  }
  const bool vector = RunsAligned(out, ld_out, n, 2);
  return LaunchKernel(programmatic, Int4GroupDequantKernel, Grid(n, k), dim3(kThreads), 0, stream, packed, ld, shift,
                      scale, scale_ld, col0, group_size, out, ld_out, n, k, vector,
                      TilesOf(true, tiles.tiled, k, tiles.global_col0));
}

}  // namespace eagle3::cuda
