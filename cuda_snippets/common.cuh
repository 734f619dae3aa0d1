// common.cuh: helpers every kernel of this package may use (CUDA side only).
// jittor defines float16 (= __half) and bfloat16 (= __nv_bfloat16) before this text.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
// "# include": jittor scans `#include "..."` lines and looks for the file in its own folders only; this form
// the compiler resolves beside this file (ops/_codegen.py hashes the included files into this file's include
// line).
# include "index_math.h"
# include "ops_data.h"

#define OPS_CHECK_LAUNCH() CHECK(cudaSuccess == cudaPeekAtLastError())

template <typename T> __host__ __device__ __forceinline__ T ops_ceil_div(T a, T b) { return (a + b - 1) / b; }

// Conversions through float for the accumulating kernels; exact for every value of the narrow types.
__device__ __forceinline__ float ops_to_float(float v) { return v; }
__device__ __forceinline__ float ops_to_float(double v) { return (float)v; }
__device__ __forceinline__ float ops_to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float ops_to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T ops_from_float(float v) { return (T)v; }
template <> __device__ __forceinline__ __half ops_from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 ops_from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// An opaque, aligned chunk of BYTES bytes: moves any dtype without looking at it.
template <int BYTES> struct alignas(BYTES) OpsBytes { unsigned char b[BYTES]; };
template <> struct alignas(16) OpsBytes<16> { uint4 v; };
template <> struct alignas(8) OpsBytes<8> { uint2 v; };
template <> struct alignas(4) OpsBytes<4> { unsigned int v; };
template <> struct alignas(2) OpsBytes<2> { unsigned short v; };
template <> struct alignas(1) OpsBytes<1> { unsigned char v; };

// N elements of T that load and store as one access of N * sizeof(T) bytes.
template <typename T, int N> struct alignas(sizeof(T) * N) OpsVec { T v[N]; };
