// common.cuh: helpers every kernel of this package may use (CUDA side only).
// jittor defines float16 (= __half) and bfloat16 (= __nv_bfloat16) before this text.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <cstdlib>
#include <cstring>
#include <string>
// "# include": jittor scans `#include "..."` lines and looks for the file in its own folders only; this form
// the compiler resolves beside this file (ops/_codegen.py hashes index_math.h into this file's include line).
# include "index_math.h"

#define OPS_CHECK_LAUNCH() CHECK(cudaSuccess == cudaPeekAtLastError())

// A launch's integer parameters as ops/_launch.py packs them (``pack_named``): one `data` key
// "$name=value,name=value,..." instead of an entry each, since jt.code builds and frees a map node per entry on
// every call (a permute's 17 entries cost 0.72 us of a 1.2 us jt.code on a 2-core host, the packed key 0.21).
// The launch's source sees it under jittor's name `data` (a block that shadows the op's map), and reads it as it
// reads a map: data["name"]; a name not there reads 0, as jittor's map gives. Host code only. (The CPU kernels'
// fields, cpu_common.h's Fields, are one character each in a table the kernels index by character arithmetic
// ('A' + i) and that shape-derived code fills too; the CUDA launchers read names, as they read jittor's map,
// so none of them changed for this.)
struct OpsData {
  static constexpr int kMax = 48;
  const char* name[kMax];
  int len[kMax];
  double value[kMax];
  int n = 0;

  template <class Map> explicit OpsData(const Map& data) {
    for (const auto& kv : data) {
      const std::string& key = kv.first;
      if (key.empty() || key[0] != '$') continue;
      const char* p = key.c_str() + 1;
      while (*p) {
        const char* eq = std::strchr(p, '=');
        CHECK(eq && n < kMax);  // ops/_launch.py packs at most kMax names, each with its '=
        name[n] = p;
        len[n] = (int)(eq - p);
        char* end = nullptr;
        value[n] = (double)std::strtoll(eq + 1, &end, 10);
        ++n;
        p = (*end == ',') ? end + 1 : end;
      }
    }
  }
  double operator[](const char* key) const {
    const int k = (int)std::strlen(key);
    for (int i = 0; i < n; ++i)
      if (len[i] == k && std::memcmp(name[i], key, k) == 0) return value[i];
    return 0.0;
  }
  double operator[](const std::string& key) const { return (*this)[key.c_str()]; }
};

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
