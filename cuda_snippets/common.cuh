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
// the compiler resolves beside this file (ops/_codegen.py hashes index_math.h into this file's include line).
# include "index_math.h"

#define OPS_CHECK_LAUNCH() CHECK(cudaSuccess == cudaPeekAtLastError())

// A CUDA launch's parameters as ops/_launch.py packs them (``pack_named``): one `data` key
// "$name=value,name=value,..." instead of an entry each, since jt.code builds and frees a map node per entry on
// every call (a permute's 17 entries cost 0.72 us of a 1.2 us jt.code on a 2-core host, the packed key 0.21).
// The launch's source sees it under jittor's name `data` (a block that shadows the op's map) and reads it as it
// reads a map, data["name"] (or data.at("d", 2) for "d2"), on the host. A name the launch did not pass is a
// fatal error naming it (jittor's map would read 0).
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
        CHECK(eq && n < kMax);  // ops/_launch.py packs at most kMax names, each with its '='
        name[n] = p;
        len[n] = (int)(eq - p);
        char* end = nullptr;
        value[n] = std::strtod(eq + 1, &end);  // integers exactly (below 2^53), floats as Python's repr wrote them
        ++n;
        p = (*end == ',') ? end + 1 : end;
      }
    }
  }
  double operator[](const char* key) const {
    const int k = (int)std::strlen(key);
    for (int i = 0; i < n; ++i)
      if (len[i] == k && std::memcmp(name[i], key, k) == 0) return value[i];
    LOGf << "ops: the kernel reads data[\"" << key << "\"], which its launch did not pass";
    return 0.0;
  }
  double operator[](const std::string& key) const { return (*this)[key.c_str()]; }
  // data["<name><i>"]: an entry of a per-dim list ("d0", "d1", ...)
  double at(const char* key, int i) const {
    char full[32];
    std::snprintf(full, sizeof(full), "%s%d", key, i);
    return (*this)[full];
  }
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
