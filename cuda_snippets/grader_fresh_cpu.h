// grader_fresh_cpu.h: the grader's per-call inputs and output samples on the CPU (ops/scoring/fresh.py; the CUDA
// side is grader_fresh.cuh, the NumPy mirror fresh.flip_numpy; the hash: grader_hash.h, included before).
//
// Every timed call gets inputs of its own: a copy of an input set whose elements each have a bit pattern flipped
// (the sign of a float, every bit of an integer, a bool's value) where a hash of the call and the element's
// position says so, about half of them. The parent recomputes any call's inputs from the set, the two keys and
// the call's number. The hash runs once per 32 elements; its bits decide the 32 elements.
#pragma once
#include "type/fp16_compute.h"
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ops_grader {

// outs[j] = in with the elements the hash of call first + j picks XOR mask (count outputs of n elements each);
// with ``rich`` (a small array), each normal float's low significand bits (``low``) flipped by a hash too.
template <typename T>
static void fresh_copies(const void* in, size_t n, void* const* outs, int count, uint32_t k0, uint32_t k1,
                         uint32_t first, T mask, T low, T expo, int rich) {
  typedef T __attribute__((may_alias)) alias_t;
  const alias_t* src = (const alias_t*)in;
  for (int j = 0; j < count; j++) {
    alias_t* dst = (alias_t*)outs[j];
    const uint32_t key = call_key(k0, k1, first + (uint32_t)j);
    const size_t full = n / 32;
    for (size_t b = 0; b < full; b++) {  // a constant trip count: the inner loop vectorizes
      const uint32_t h = mix((uint32_t)b * 0x9E3779B1u + key);
      for (int l = 0; l < 32; l++) dst[b * 32 + l] = src[b * 32 + l] ^ (((T)0 - (T)((h >> l) & 1u)) & mask);
    }
    if (full * 32 < n) {
      const uint32_t h = mix((uint32_t)full * 0x9E3779B1u + key);
      for (size_t i = full * 32; i < n; i++) dst[i] = src[i] ^ (((T)0 - (T)((h >> (i - full * 32)) & 1u)) & mask);
    }
    if (rich)
      for (size_t i = 0; i < n; i++) dst[i] = low_bits<T>(dst[i], key, (uint32_t)i, low, expo);
  }
}

// out[b][i * itemsize ...] = the bytes of element pos[i] of ins[b], for b < count and i < k.
static void sample_bytes(const void* const* ins, int count, size_t itemsize, const int32_t* pos, int k, uint8_t* out) {
  for (int b = 0; b < count; b++) {
    const uint8_t* src = (const uint8_t*)ins[b];
    uint8_t* dst = out + (size_t)b * k * itemsize;
    for (int i = 0; i < k; i++) std::memcpy(dst + (size_t)i * itemsize, src + (size_t)pos[i] * itemsize, itemsize);
  }
}

}  // namespace ops_grader
