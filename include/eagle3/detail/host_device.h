// EAGLE3_HOST_DEVICE marks a function that headers share between host code and CUDA kernels
// (__host__ __device__ under nvcc, nothing elsewhere).
//
// eagle3/detail/: installed because public headers (eagle3/philox.h) include it, but internal: no
// compatibility promise.
#pragma once

#ifndef EAGLE3_HOST_DEVICE
#if defined(__CUDACC__)
#define EAGLE3_HOST_DEVICE __host__ __device__
#else
#define EAGLE3_HOST_DEVICE
#endif
#endif
