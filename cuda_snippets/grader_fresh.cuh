// grader_fresh.cuh: the grader's per-call inputs and output samples on the GPU; the same bits as
// grader_fresh_cpu.h (see there), one launch for up to FRESH_MAX_COPIES copies of an input set.
#pragma once
#include <stddef.h>
#include <stdint.h>

namespace ops_grader {

constexpr int FRESH_MAX_COPIES = 8;

template <typename T>
struct FreshOuts {
  T* p[FRESH_MAX_COPIES];
};

// blockIdx.y: the copy; a grid-stride loop over the elements.
template <typename T>
__global__ void fresh_kernel(const T* __restrict__ src, size_t n, FreshOuts<T> outs, uint32_t k0, uint32_t k1,
                             uint32_t first, T mask, T low, T expo, int rich) {
  const uint32_t key = call_key(k0, k1, first + blockIdx.y);
  T* __restrict__ dst = outs.p[blockIdx.y];
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const uint32_t h = mix((uint32_t)(i >> 5) * 0x9E3779B1u + key);
    const T pick = (T)0 - (T)((h >> (i & 31)) & 1u);
    const T v = src[i] ^ (pick & mask);
    dst[i] = rich ? low_bits<T>(v, key, (uint32_t)i, low, expo) : v;
  }
}

template <typename T>
void fresh_copies(const void* in, size_t n, void* const* outs, int count, uint32_t k0, uint32_t k1, uint32_t first,
                  T mask, T low, T expo, int rich) {
  FreshOuts<T> o;
  for (int j = 0; j < FRESH_MAX_COPIES; j++) o.p[j] = (T*)outs[j < count ? j : 0];
  size_t blocks = (n + 255) / 256;
  if (blocks > 8192) blocks = 8192;
  fresh_kernel<T><<<dim3((unsigned)blocks, (unsigned)count), 256>>>((const T*)in, n, o, k0, k1, first, mask, low, expo,
                                                                    rich);
}

struct SampleIns {
  const uint8_t* p[FRESH_MAX_COPIES];
};

// out[b][i * itemsize ...] = the bytes of element pos[i] of input b, for i < k (blockIdx.y: b; a thread a byte).
__global__ void sample_kernel(SampleIns ins, int itemsize, const int32_t* __restrict__ pos, int k,
                              uint8_t* __restrict__ out) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < k * itemsize)
    out[(size_t)blockIdx.y * k * itemsize + t] = ins.p[blockIdx.y][(size_t)pos[t / itemsize] * itemsize + t % itemsize];
}

inline void sample_bytes(const void* const* ins, int count, int itemsize, const int32_t* pos, int k, uint8_t* out) {
  SampleIns s;
  for (int j = 0; j < FRESH_MAX_COPIES; j++) s.p[j] = (const uint8_t*)ins[j < count ? j : 0];
  const int threads = k * itemsize;
  sample_kernel<<<dim3((threads + 255) / 256, count), 256>>>(s, itemsize, pos, k, out);
}

}  // namespace ops_grader
