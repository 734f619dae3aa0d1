// cpu_common.h: helpers every CPU source of this package may use (the jt.code cpu_header side of common.cuh).
// jittor inserts its float16/bfloat16 include only after the last #include of the source, so it comes first.
#pragma once
#include "type/fp16_compute.h"
#include <cstdint>
#include <cstring>

// jittor compiles CPU code with -Ofast, where isnan/isinf may be folded to false: these read the bits.
static inline bool ops_isnan_bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return (b << 1) > 0xff000000u;
}
static inline bool ops_isnan_bits(double v) {
  uint64_t b;
  std::memcpy(&b, &v, 8);
  return (b << 1) > 0xffe0000000000000ull;
}
static inline bool ops_isfinite_bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return (b & 0x7f800000u) != 0x7f800000u;
}

// float -> bfloat16 rounded to nearest even, as the GPU's __float2bfloat16_rn: jittor's CPU conversion
// truncates (half of all results one ulp toward zero). A NaN stays a (quiet) NaN whatever its payload.
static inline jittor::bfloat16 ops_cpu_bfloat16(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  jittor::bfloat16 r(0.0f);
  r.x = ops_isnan_bits(v) ? (uint16_t)((b >> 16) | 0x40u) : (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
  return r;
}

// An accumulator (float or double) -> T, as the GPU's ops_from_float stores it: a plain conversion (float16's
// rounds to nearest even), bfloat16 through ops_cpu_bfloat16.
template <typename T> struct OpsCpuConvert {
  template <typename A> static inline T from(A v) { return (T)v; }
};
template <> struct OpsCpuConvert<jittor::bfloat16> {
  static inline jittor::bfloat16 from(float v) { return ops_cpu_bfloat16(v); }
};
template <typename T, typename A> static inline T ops_cpu_from(A v) { return OpsCpuConvert<T>::from(v); }
