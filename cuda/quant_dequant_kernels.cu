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
                                      uint16_t* __restrict__ out, int64_t ld_out, int64_t n, int64_t k, bool vector) {
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
      if (vector && count == kRun) {
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
                                       int64_t k, bool vector) {
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
        w[j] = j < count ? static_cast<float>(Int4At(row, shift + c0 + j)) * cursor.At(c0 + j) : 0.0f;
      }
      StoreRun(out + r * ld_out, c0, w, count, vector);
    }
  }
}

// Tiled codes of either format: a thread per lane of a tile (two 16-byte chunks, whole loads), each
// chunk 16 columns of one row's codes (fp8) or 4 words of 8 columns, 32 columns apart (int4), written
// as that row's bf16 weights, the threads ordered so that a warp writes long runs of few rows (a
// lane a thread, as the tiles are ordered, would spread each warp's writes over 8 rows). Scales as
// the row kernels take them: fp8 by (row0 + r, col0 + c) blocks, int4 from the slice's row of
// scales.
template <bool kInt4>
__global__ void TiledDequantKernel(const uint8_t* __restrict__ tiles, TileGeometry geometry, int64_t chunks,
                                   const float* __restrict__ scale_inv, const uint16_t* __restrict__ scale,
                                   int64_t scale_ld, int64_t row0, int64_t col0, int64_t block_rows,
                                   int64_t block_cols, uint16_t* __restrict__ out, int64_t ld_out, int64_t n,
                                   int64_t k) {
  PdlEnter();  // out may be scratch that the product before this one still reads
  constexpr int kValues = kInt4 ? 32 : 16;
  // Thread u takes lane 4 g + c of tile (group, step): 32 contiguous bytes, row g's chunk c of the
  // step and row g + 8's (eagle3/detail/quant_tiles.h). u runs over c, then the steps, then g, then
  // the groups, so a warp reads 4 lanes (128 contiguous bytes) of 8 consecutive tiles and writes 8
  // steps' columns of two rows: 512 contiguous columns of each (the writes of the row-major kernel).
  const int64_t units = chunks / 2;
  for (int64_t u = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; u < units;
       u += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t chunk = u % 4, step = (u / 4) % geometry.steps, g = (u / (4 * geometry.steps)) % 8;
    const int64_t group = u / (32 * geometry.steps);
    const uint8_t* lane_bytes = tiles + (group * geometry.steps + step) * kQuantTileBytes + 32 * (4 * g + chunk);
    // Value v's column of the slice: its byte among the step's (QuantTileChunkByte; fp8 a byte a
    // column, int4 2 columns a byte). Increasing in v, in runs of 8 contiguous columns at least.
    const int64_t step_byte = kQuantTileStepBytes * step - (kInt4 ? geometry.shift / 2 : geometry.shift);
    const auto column = [&](int v) -> int64_t {
      return kInt4 ? 2 * (step_byte + QuantTileChunkByte(true, chunk, v / 2)) + v % 2
                   : step_byte + QuantTileChunkByte(false, chunk, v);
    };
    if (column(kValues - 1) < 0 || column(0) >= k) continue;  // padding
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t r = kQuantTileRows * group + g + 8 * half;
      if (r >= n) continue;
      const uint4 raw = *reinterpret_cast<const uint4*>(lane_bytes + 16 * half);
      const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
      ScaleCursor cursor;
      if (kInt4) {
        cursor.bf16 = scale + r * scale_ld;
      } else {
        cursor.f32 = scale_inv + (row0 + r) / block_rows * scale_ld;
      }
      cursor.width = block_cols;
      const int64_t start = column(0) < 0 ? 0 : column(0);
      cursor.Seek(start, col0);
      uint16_t* out_row = out + r * ld_out;
      uint16_t bits[kValues];
#pragma unroll
      for (int v = 0; v < kValues; ++v) {
        const int64_t c = column(v);
        float w = 0.0f;
        if (c >= 0 && c < k) {
          if (kInt4) {
            w = static_cast<float>(Int4At(reinterpret_cast<const int32_t*>(words), v)) * cursor.At(c);
          } else {
            const uint8_t code = static_cast<uint8_t>(words[v / 4] >> (8 * (v % 4)));
            // e4m3 -> f16 is exact (every e4m3 value, subnormals and NaN included, is an f16 value).
            w = __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3))) * cursor.At(c);
          }
        }
        bits[v] = Bf16Bits(w);
      }
      // Runs of 8 contiguous columns: one 16-byte store each where whole and aligned.
#pragma unroll
      for (int v = 0; v < kValues; v += 8) {
        const int64_t c = column(v);
        if (c >= 0 && c + 8 <= k && reinterpret_cast<uintptr_t>(out_row + c) % 16 == 0) {
          uint32_t packed[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) packed[j] = bits[v + 2 * j] | static_cast<uint32_t>(bits[v + 2 * j + 1]) << 16;
          *reinterpret_cast<uint4*>(out_row + c) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            if (c + e >= 0 && c + e < k) out_row[c + e] = bits[v + e];
          }
        }
      }
    }
  }
}

// The warp tiles of tiled codes (QuantTileSteps / QuantTileShift of the slice's k and GLOBAL first
// column); steps 0: row-major.
TileGeometry TilesOf(bool int4, bool tiled, int64_t k, int64_t global_col0) {
  if (!tiled) return {};
  return {QuantTileSteps(int4, k, global_col0), QuantTileShift(int4, global_col0)};
}

dim3 TiledGrid(int64_t chunks) {
  return dim3(static_cast<unsigned>(std::min<int64_t>((chunks + kThreads - 1) / kThreads, 16 * kMaxGrid)));
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
  if (tiles.tiled) {
    const TileGeometry geometry = TilesOf(false, true, k, tiles.global_col0);
    const int64_t chunks = QuantTiledBytes(false, n, k, tiles.global_col0) / 16;
    return LaunchKernel(programmatic, TiledDequantKernel<false>, TiledGrid(chunks), dim3(kThreads), 0, stream, codes,
                        geometry, chunks, scale_inv, static_cast<const uint16_t*>(nullptr), scale_ld, row0, col0,
                        block_rows, block_cols, out, ld_out, n, k);
  }
  const bool vector = RunsAligned(codes, ld, n, 1) && RunsAligned(out, ld_out, n, 2);
  return LaunchKernel(programmatic, Fp8BlockDequantKernel, Grid(n, k), dim3(kThreads), 0, stream, codes, ld,
                      scale_inv, scale_ld, row0, col0, block_rows, block_cols, out, ld_out, n, k, vector);
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
  if (tiles.tiled) {
    const TileGeometry geometry = TilesOf(true, true, k, tiles.global_col0);
    const int64_t chunks = QuantTiledBytes(true, n, k, tiles.global_col0) / 16;
    return LaunchKernel(programmatic, TiledDequantKernel<true>, TiledGrid(chunks), dim3(kThreads), 0, stream,
                        reinterpret_cast<const uint8_t*>(packed), geometry, chunks, static_cast<const float*>(nullptr),
                        scale, scale_ld, int64_t{0}, col0, int64_t{1}, group_size, out, ld_out, n, k);
  }
  const bool vector = RunsAligned(out, ld_out, n, 2);
  return LaunchKernel(programmatic, Int4GroupDequantKernel, Grid(n, k), dim3(kThreads), 0, stream, packed, ld, shift,
                      scale, scale_ld, col0, group_size, out, ld_out, n, k, vector);
}

}  // namespace eagle3::cuda
