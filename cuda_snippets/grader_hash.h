// grader_hash.h: the hash that picks which elements a grader's timed call flips (grader_fresh_cpu.h for the CPU,
// grader_fresh.cuh for the GPU; ops/scoring/fresh.py mirrors it in NumPy): murmur3's finalizer.
#pragma once
#include <stdint.h>

#ifdef __CUDACC__
#define OPS_GRADER_FN __host__ __device__ __forceinline__
#else
#define OPS_GRADER_FN static inline
#endif

namespace ops_grader {

OPS_GRADER_FN uint32_t mix(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}

// The key of call ``call`` under the keys (k0, k1); the elements of a call are picked 32 at a time by
// mix(block * 0x9E3779B1 + key), one bit each.
OPS_GRADER_FN uint32_t call_key(uint32_t k0, uint32_t k1, uint32_t call) { return mix(mix(k0 ^ mix(call)) ^ k1); }

// The low significand bits a call also flips in element i of a small array (``rich``): normal floats only, so a
// value keeps its sign's flip, its exponent and its kind.
template <typename T>
OPS_GRADER_FN T low_bits(T v, uint32_t key, uint32_t i, T low, T expo) {
  const T e = v & expo;
  return (e != 0 && e != expo) ? (T)(v ^ ((T)mix(i * 0x27D4EB2Fu ^ key) & low)) : v;
}

}  // namespace ops_grader
