// Inline-PTX wrappers of the CUDA backend's kernels: release / acquire counters, cp.async, ldmatrix,
// mma.sync, the warpgroup products (wgmma, sm_90a), ex2, lop3 and max.NaN. A kernel that needs
// another instruction adds its wrapper here rather than a copy in its own file. sm_80+ instructions
// unless marked (the backend builds for sm_90). No abseil here: nvcc must never see it.
#pragma once

#include <cstdint>

namespace eagle3::cuda {

// ---- Flags between the blocks of one grid --------------------------------------------------------
//
// A producer block's writes become visible to a consumer block that sees its count: every thread of
// the producer writes, the block meets a barrier, one thread adds with release semantics; the
// consumer's thread loads the count with acquire semantics, then meets its threads (a barrier or a
// warp sync) before they read.

// *counter += value, release at GPU scope (no result).
__device__ __forceinline__ void RedReleaseAddGpu(int* counter, int value) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(counter), "r"(value) : "memory");
}

// *counter, acquire at GPU scope.
__device__ __forceinline__ int LdAcquireGpu(const int* counter) {
  int value;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(value) : "l"(counter) : "memory");
  return value;
}

// *counter, relaxed at GPU scope: a spin's polls. Unlike the acquire load (which invalidates the
// whole L1 each time), it leaves the multiprocessor's cached lines alone; the spin ends with one
// LdAcquireGpu of the count it saw.
__device__ __forceinline__ int LdRelaxedGpu(const int* counter) {
  int value;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];\n" : "=r"(value) : "l"(counter) : "memory");
  return value;
}

// Asks L2 for the line holding `p` (no result, no wait).
__device__ __forceinline__ void PrefetchL2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

// The 32-bit shared-window address of a pointer into shared memory, as the instructions below take it.
__device__ __forceinline__ uint32_t SharedAddress(const void* smem) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(smem));
}

// ---- cp.async: global -> shared without registers ----------------------------------------------
//
// A thread's copies complete in commit groups: CpAsyncCommit closes the group of the copies issued
// since the last one, CpAsyncWait<n> waits until at most n of the thread's groups are pending.
// Other threads see the data only after a barrier that follows their writers' waits.

// 16 bytes, cached in L2 only (.cg); both addresses 16-byte aligned.
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  const unsigned s = SharedAddress(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}

// 16 bytes as CpAsync16, or 16 zero bytes when !valid (src-size 0: nothing is read from gmem).
__device__ __forceinline__ void CpAsync16OrZero(void* smem, const void* gmem, bool valid) {
  const unsigned s = SharedAddress(smem);
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}

// 4 bytes (.ca: the 4-byte form cannot bypass L1); both addresses 4-byte aligned.
__device__ __forceinline__ void CpAsync4(void* smem, const void* gmem) {
  const unsigned s = SharedAddress(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem));
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }

// The "memory" clobber keeps the compiler from moving shared-memory reads above the wait.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// ---- mbarriers and named barriers (sm_90) ---------------------------------------------------------
//
// A phase of an mbarrier completes once its expected arrivals have come; MbarWait returns once the
// phase of the given parity has completed (phases alternate 0, 1, 0, ...). Shared addresses are
// SharedAddress's. Before sm_90 these trap: no kernel built for an older device calls them.

// A barrier expecting `count` arrivals a phase; then the init made visible to the copy engine.
__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#else
  __trap();
#endif
}

// Spins until the barrier's phase of parity `parity` has completed. The "memory" clobber keeps the
// compiler from moving the copied data's reads above it.
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
#else
  __trap();
#endif
}

// Ends the barrier's life: its memory may then serve other data (the PTX ISA asks for this before
// an mbarrier's bytes are reused). No arrival or wait on it may be pending or follow.
__device__ __forceinline__ void MbarInval(uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
#else
  __trap();
#endif
}

// The barrier receives one arrival once every cp.async this thread issued before has completed.
// .noinc: the arrival is one of the barrier's expected arrivals (its init count includes one per
// thread that calls this for a phase).
__device__ __forceinline__ void CpAsyncMbarArrive(uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
#else
  __trap();
#endif
}

// Named barrier `id` (1-15; 0 is __syncthreads'): `threads` arrivals complete it. Arrive does not
// wait (a producer's signal); Sync waits (a consumer), both counting toward `threads`.
__device__ __forceinline__ void NamedBarrierArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void NamedBarrierSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- ldmatrix: 8x8 b16 matrices from shared memory into mma fragments --------------------------
//
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8j .. 8j+7 give the row addresses (16
// bytes each, 16-byte aligned) of 8x8 matrix j; register j of lane l gets matrix j's row l / 4,
// elements 2 (l % 4), 2 (l % 4) + 1 (.trans: elements (2 (l % 4), l / 4) and
// (2 (l % 4) + 1, l / 4)).

__device__ __forceinline__ void LdMatrixX4(unsigned (&r)[4], const uint16_t* smem) {
  const unsigned s = SharedAddress(smem);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s)
               : "memory");
}

__device__ __forceinline__ void LdMatrixX4Trans(unsigned (&r)[4], const uint16_t* smem) {
  const unsigned s = SharedAddress(smem);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s)
               : "memory");
}

// ---- mma.sync: tensor cores --------------------------------------------------------------------

// c += a b for one m16n8k16 tile on the tensor cores: a [16, 16] bf16 (row), b [16, 8] bf16 (col),
// c [16, 8] f32. Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), g = lane / 4,
// c = lane % 4: a = {(g, 2c..2c+1), (g + 8, 2c..), (g, 2c + 8..), (g + 8, 2c + 8..)},
// b = {(2c..2c+1, g), (2c + 8.., g)}, c = {(g, 2c), (g, 2c + 1), (g + 8, 2c), (g + 8, 2c + 1)};
// bf16 pairs low first.
__device__ __forceinline__ void MmaBf16(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                        unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- wgmma: warpgroup tensor-core products (sm_90a) ---------------------------------------------
//
// A warpgroup (4 consecutive warps, the first a multiple of 4) issues each product together; the
// operands come from shared memory through matrix descriptors (latent_wgmma_layout.h states the
// layouts), the accumulators stay in registers. Products run asynchronously: WgmmaFence before the
// first product that reads accumulators ordinary code wrote, WgmmaCommit closes a group of the
// products issued since the last, WgmmaWait<n> waits until at most n of the warpgroup's groups are
// pending (only then may ordinary code read or write their accumulators). Shared memory that
// ordinary stores or cp.async wrote needs FenceProxyAsyncShared in each writing thread, then a
// barrier, before a product reads it. These need the arch-specific sm_90a target (only
// latent_wgmma_kernels.cu is built for it); elsewhere they trap.
//
// Accumulator layout of an m64nNk16 product (PTX ISA, "Register fragment D of wgmma .m64nNk16"):
// warp w of the warpgroup holds rows 16 w + g and 16 w + g + 8 (g = lane / 4, c = lane % 4):
// d[4 j + 0], d[4 j + 1] = row 16 w + g, columns 8 j + 2 c, + 1; d[4 j + 2], d[4 j + 3] = row 16 w +
// g + 8, the same columns.

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define EAGLE3_WGMMA_ENABLED 1
#else
#define EAGLE3_WGMMA_ENABLED 0
#endif

__device__ __forceinline__ void WgmmaFence() {
#if EAGLE3_WGMMA_ENABLED
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void WgmmaCommit() {
#if EAGLE3_WGMMA_ENABLED
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
#if EAGLE3_WGMMA_ENABLED
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#else
  __trap();
#endif
}

// Makes this thread's ordinary (generic-proxy) writes to shared memory visible to the tensor cores'
// and the copy engine's reads (the async proxy), once a barrier follows.
__device__ __forceinline__ void FenceProxyAsyncShared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#else
  __trap();
#endif
}

// d (+)= a b, m64n32k16, bf16 operands from shared memory, both K-major; f32 d [64 x 32].
// accumulate false: d = a b.
__device__ __forceinline__ void WgmmaBf16M64N32(float (&d)[16], uint64_t a, uint64_t b, bool accumulate) {
#if EAGLE3_WGMMA_ENABLED
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate))
      : "memory");
#else
  __trap();
#endif
}

#define EAGLE3_WGMMA_D8(i)                                                                               \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
// The accumulators of an m64n64 (32 a thread) and an m64n256 (128) f32 product: their operands and
// their places in the instruction's text (%0 ..).
#define EAGLE3_WGMMA_D32 EAGLE3_WGMMA_D8(0), EAGLE3_WGMMA_D8(8), EAGLE3_WGMMA_D8(16), EAGLE3_WGMMA_D8(24)
#define EAGLE3_WGMMA_D128                                                                                  \
  EAGLE3_WGMMA_D32, EAGLE3_WGMMA_D8(32), EAGLE3_WGMMA_D8(40), EAGLE3_WGMMA_D8(48), EAGLE3_WGMMA_D8(56),   \
      EAGLE3_WGMMA_D8(64), EAGLE3_WGMMA_D8(72), EAGLE3_WGMMA_D8(80), EAGLE3_WGMMA_D8(88), EAGLE3_WGMMA_D8(96), \
      EAGLE3_WGMMA_D8(104), EAGLE3_WGMMA_D8(112), EAGLE3_WGMMA_D8(120)
#define EAGLE3_WGMMA_D32_TEXT                                                                   \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define EAGLE3_WGMMA_D128_TEXT                                                                           \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "   \
  "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "   \
  "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, "   \
  "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, "       \
  "%101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, " \
  "%118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"

// d += a b, m64n256k16, bf16 operands from shared memory: a K-major, b MN-major (trans-b); f32 d
// [64 x 256].
__device__ __forceinline__ void WgmmaBf16M64N256TransB(float (&d)[128], uint64_t a, uint64_t b) {
#if EAGLE3_WGMMA_ENABLED
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      EAGLE3_WGMMA_D128_TEXT ","
      " %128, %129, p, 1, 1, 0, 1;\n"
      "}\n"
      : EAGLE3_WGMMA_D128
      : "l"(a), "l"(b), "r"(1)
      : "memory");
#else
  __trap();
#endif
}

// d (+)= a b, m64n64k16, bf16 operands from shared memory, both K-major; f32 d [64 x 64].
// accumulate false: d = a b.
__device__ __forceinline__ void WgmmaBf16M64N64(float (&d)[32], uint64_t a, uint64_t b, bool accumulate) {
#if EAGLE3_WGMMA_ENABLED
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      EAGLE3_WGMMA_D32_TEXT ", "
      "%32, %33, p, 1, 1, 0, 0;\n"
      "}\n"
      : EAGLE3_WGMMA_D32
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate))
      : "memory");
#else
  __trap();
#endif
}

// d += a b, m64n64k16, a (bf16, 64 x 16) from registers in the warpgroup's A-fragment layout
// (warp w holds rows 16 w .. + 15 as mma.m16n8k16's A), b from shared memory, K-major.
__device__ __forceinline__ void WgmmaBf16M64N64RegA(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
#if EAGLE3_WGMMA_ENABLED
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      EAGLE3_WGMMA_D32_TEXT ", "
      "{%32, %33, %34, %35}, %36, 1, 1, 1, 0;\n"
      : EAGLE3_WGMMA_D32
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
      : "memory");
#else
  __trap();
#endif
}

// d += a b, m64n256k16, a (bf16, 64 x 16) from registers as in WgmmaBf16M64N64RegA, b from shared
// memory, MN-major (trans-b); f32 d [64 x 256].
__device__ __forceinline__ void WgmmaBf16M64N256TransBRegA(float (&d)[128], const uint32_t (&a)[4], uint64_t b) {
#if EAGLE3_WGMMA_ENABLED
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      EAGLE3_WGMMA_D128_TEXT ","
      " {%128, %129, %130, %131}, %132, 1, 1, 1, 1;\n"
      : EAGLE3_WGMMA_D128
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
      : "memory");
#else
  __trap();
#endif
}

#undef EAGLE3_WGMMA_D128_TEXT
#undef EAGLE3_WGMMA_D32_TEXT
#undef EAGLE3_WGMMA_D128
#undef EAGLE3_WGMMA_D32
#undef EAGLE3_WGMMA_D8
#undef EAGLE3_WGMMA_ENABLED

// ---- ex2.approx: 2^x in one MUFU instruction ---------------------------------------------------

// 2^x to ~2 ulp, subnormal results flushed to zero; 2^-inf = +0. exp2f adds range handling around
// the same instruction for results a softmax does not need (a probability rounded to bf16 next).
__device__ __forceinline__ float Exp2Approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---- lop3: any bitwise function of three words --------------------------------------------------

// The bitwise function of a, b and c whose truth table is kLut (bit (a << 2 | b << 1 | c) of kLut is
// the result for those input bits: 0xF0 & 0xCC | 0xAA = 0xEA is (a & b) | c). nvcc splits
// (x & mask) | constant into two instructions when both operands are immediates; this keeps one.
template <unsigned kLut>
__device__ __forceinline__ uint32_t Lop3(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, %4;" : "=r"(d) : "r"(a), "r"(b), "r"(c), "n"(kLut));
  return d;
}

// ---- max.NaN ------------------------------------------------------------------------------------

// max(a, b), NaN when either is NaN (PTX max.NaN, sm_80+).
__device__ __forceinline__ float MaxNaN(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return a != a ? a : (b != b ? b : fmaxf(a, b));
#endif
}

// Lane-wise max of two packed bf16 pairs, NaN when either lane is NaN.
__device__ __forceinline__ uint32_t MaxNaNBf16x2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
#else
  const float lo = MaxNaN(__uint_as_float(a << 16), __uint_as_float(b << 16));
  const float hi = MaxNaN(__uint_as_float(a & 0xFFFF0000u), __uint_as_float(b & 0xFFFF0000u));
  return (__float_as_uint(hi) & 0xFFFF0000u) | (__float_as_uint(lo) >> 16);  // exact: bf16 inputs
#endif
}

}  // namespace eagle3::cuda
