// cpu_common.h: helpers of every family's CPU path (the jt.code cpu_src of ops/*.py; the jt.code cpu_header side
// of common.cuh), included before the family's own CPU header: NaN and finiteness tests on the bits, integer
// views of element bits, float16/bfloat16 conversions that vectorize, and per-thread scratch buffers.
//
// jittor compiles CPU code with -Ofast (no NaN or signed-zero semantics in float compares, isnan/isinf may be
// folded to false), so NaN is tested on the bits. jittor's own float16 conversions are branchy software routines
// (~20 instructions each, not vectorized) and its bfloat16 conversion from float truncates (half of all results
// one ulp toward zero); the conversions here are branch-free, exact from the 16-bit types, and round to nearest
// even to them (as jittor's float16 and the GPU's __float2bfloat16_rn do), so loops over arrays of them
// vectorize. jittor inserts its float16/bfloat16 include only after the last #include of the source, so it
// comes first.
#pragma once
#include "type/fp16_compute.h"
// ops_data.h: OpsData, the named parameters' reader (the "# include" form: see permute_cpu.h)
# include "ops_data.h"
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace ops_cpu {

// Views of element bits that may alias any type: jittor's float16/bfloat16 are structs holding a uint16, and
// -Ofast includes -fstrict-aliasing.
typedef int16_t __attribute__((may_alias)) alias_i16;
typedef uint16_t __attribute__((may_alias)) alias_u16;
typedef int32_t __attribute__((may_alias)) alias_i32;
typedef uint32_t __attribute__((may_alias)) alias_u32;
typedef int64_t __attribute__((may_alias)) alias_i64;
typedef uint64_t __attribute__((may_alias)) alias_u64;
typedef float __attribute__((may_alias)) alias_f32;

// A CPU launch's integer parameters, one slot per ASCII character. ops/_launch.py's pack_fields sends them as the
// text of one `data` key: an optional prefix, '#', then character, decimal value, character, value, ...
// ("#m2a56b30"; the prefix '_' marks a backward's fields): jt.code builds and frees a map node per `data` entry
// on every call, ~40 ns each on the 2-core CPU machine, so six fields in one key save ~0.2 us a call.
// Entries of one character after the prefix (a value that is not an integer) are read too. (The CUDA launches
// pack theirs by name, common.cuh's OpsData: their launchers read names as they read jittor's map.) A field the
// launch did not pass is a fatal error naming it, not a 0.
struct Fields {
  double v[128];
  uint64_t given[2] = {0, 0};
  Fields() { std::memset(v, 0, sizeof(v)); }
  void set(int c, double value) {
    c &= 127;
    v[c] = value;
    given[c >> 6] |= 1ull << (c & 63);
  }
  double operator[](int c) const {
    c &= 127;
    if (!((given[c >> 6] >> (c & 63)) & 1))
      LOGf << std::string("ops: the CPU kernel reads field '") + (char)c + "', which its launch did not pass";
    return v[c];
  }
};

// data[key] of jittor's map, or a fatal error naming the key (the map would read 0).
template <class Map> inline double need(const Map& data, const char* key) {
  const auto it = data.find(key);
  if (it == data.end())  // one string: jittor's log puts blanks between the operands of <<
    LOGf << std::string("ops: the CPU kernel reads data[\"") + key + "\"], which its launch did not pass";
  return it->second;
}

template <class Map> inline Fields read_fields(const Map& data, char prefix = 0) {
  Fields f;
  for (const auto& kv : data) {
    const char* key = kv.first.data();
    const size_t n = kv.first.size();
    size_t i = 0;
    if (prefix) {
      if (n == 0 || key[0] != prefix) continue;
      i = 1;
    }
    if (n == i + 1) {
      f.set((unsigned char)key[i], kv.second);
    } else if (i < n && key[i] == '#') {
      for (++i; i < n;) {
        const int c = (unsigned char)key[i++] & 127;
        const bool negative = i < n && key[i] == '-';
        i += negative;
        long long value = 0;
        for (; i < n && key[i] >= '0' && key[i] <= '9'; ++i) value = value * 10 + (key[i] - '0');
        f.set(c, (double)(negative ? -value : value));
      }
    }
  }
  return f;
}

// The unsigned integer elements of SIZE bytes move as (a kernel touches its buffers only through these, so
// reading, say, floats as uint32_t reorders nothing; GCC drops a may_alias attribute on template arguments).
template <int SIZE> struct Word;
template <> struct Word<1> { typedef uint8_t type; };
template <> struct Word<2> { typedef uint16_t type; };
template <> struct Word<4> { typedef uint32_t type; };
template <> struct Word<8> { typedef uint64_t type; };

inline float float_of_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t bits_of_float(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline uint64_t bits_of_double(double d) { uint64_t u; std::memcpy(&u, &d, 8); return u; }

// float16 bits -> float, exact. Subnormal halves are renormalized by one float subtraction whose operands and
// result are normal floats (so flush-to-zero modes leave it exact); infinities and NaN keep their class.
inline float half_bits_to_float(uint16_t h) {
  const uint32_t em = (uint32_t)(h & 0x7fffu) << 13;
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t exp = em & (0x1fu << 23);
  const uint32_t normal = em + ((127u - 15u) << 23) + (exp == (0x1fu << 23) ? ((128u - 16u) << 23) : 0u);
  const float sub = float_of_bits(em + (113u << 23)) - float_of_bits(113u << 23);
  return float_of_bits((exp == 0 ? bits_of_float(sub) : normal) | sign);
}

// float -> float16 bits, rounded to nearest even (overflow to infinity, NaN to a quiet NaN). Results in the
// subnormal range are rounded by one float addition of 0.5 (the hardware's round to nearest even).
inline uint16_t float_to_half_bits(float f) {
  uint32_t u = bits_of_float(f);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  const uint32_t big = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  const uint32_t sub = bits_of_float(float_of_bits(u) + float_of_bits(126u << 23)) - (126u << 23);
  const uint32_t normal = (u + ((uint32_t)(15 - 127) << 23) + 0xfffu + ((u >> 13) & 1u)) >> 13;
  const uint32_t h = u >= (143u << 23) ? big : (u < (113u << 23) ? sub : normal);
  return (uint16_t)(h | (sign >> 16));
}

inline float bfloat_bits_to_float(uint16_t b) { return float_of_bits((uint32_t)b << 16); }

// float -> bfloat16 bits, rounded to nearest even; NaN stays a (quiet) NaN.
inline uint16_t float_to_bfloat_bits(float f) {
  const uint32_t u = bits_of_float(f);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  return (uint16_t)(nan ? ((u >> 16) | 0x40u) : ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16));
}

// Element <-> accumulator (float for the 16-bit types and float, double for double).
template <typename T> struct Acc { typedef float type; };
template <> struct Acc<double> { typedef double type; };
inline float to_acc(float v) { return v; }
inline double to_acc(double v) { return v; }
inline float to_acc(jittor::float16 v) { return half_bits_to_float(v.x); }
inline float to_acc(jittor::bfloat16 v) { return bfloat_bits_to_float(v.x); }
template <typename T> inline T from_acc(typename Acc<T>::type v) { return (T)v; }
template <typename H> inline H of_bits(uint16_t bits) {  // a float16 or bfloat16 holding these bits
  H r(0.0f);
  r.x = bits;
  return r;
}
template <> inline jittor::float16 from_acc<jittor::float16>(float v) {
  return of_bits<jittor::float16>(float_to_half_bits(v));
}
template <> inline jittor::bfloat16 from_acc<jittor::bfloat16>(float v) {
  return of_bits<jittor::bfloat16>(float_to_bfloat_bits(v));
}

// A per-thread buffer of at least n elements of T, kept between calls (no allocation per call once it has
// grown); `slot` tells apart the buffers one kernel uses at the same time.
template <typename T, int SLOT> inline T* scratch(size_t n) {
  static thread_local std::vector<T> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

}  // namespace ops_cpu

static inline bool ops_isnan_bits(float v) { return (ops_cpu::bits_of_float(v) << 1) > 0xff000000u; }
static inline bool ops_isnan_bits(double v) { return (ops_cpu::bits_of_double(v) << 1) > 0xffe0000000000000ull; }
static inline bool ops_isfinite_bits(float v) { return (ops_cpu::bits_of_float(v) & 0x7f800000u) != 0x7f800000u; }

// float -> bfloat16 rounded to nearest even, as the GPU's __float2bfloat16_rn. A NaN stays a (quiet) NaN
// whatever its payload.
static inline jittor::bfloat16 ops_cpu_bfloat16(float v) { return ops_cpu::from_acc<jittor::bfloat16>(v); }

// An accumulator (float or double) -> T, as the GPU's ops_from_float stores it: a plain conversion (float16's
// rounds to nearest even), bfloat16 through ops_cpu_bfloat16.
template <typename T> struct OpsCpuConvert {
  template <typename A> static inline T from(A v) { return (T)v; }
};
template <> struct OpsCpuConvert<jittor::bfloat16> {
  static inline jittor::bfloat16 from(float v) { return ops_cpu_bfloat16(v); }
};
template <typename T, typename A> static inline T ops_cpu_from(A v) { return OpsCpuConvert<T>::from(v); }
