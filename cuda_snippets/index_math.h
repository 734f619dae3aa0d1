// index_math.h: the index arithmetic of every kernel, in plain C++ that the host compiler builds too (common.cuh
// includes it for the CUDA kernels; tests/test_index_math.py builds it with g++ and checks it against NumPy).
//
// OpsDiv<I>: division by a divisor fixed for a whole launch, built on the host (OpsDiv<I>::make) and passed to
// the kernel by value. For I = int (every index below 2^31) the quotient is a multiply-high and a shift
// (Granlund-Montgomery, Hacker's Delight 10-9: q = (mulhi(n, magic) + n) >> shift, exact for 0 <= n < 2^31 and
// 1 <= d < 2^31); for I = long long (tensors of 2^31 elements and more) a plain division.
#pragma once

#if defined(__CUDACC__)
#define OPS_HD __host__ __device__ __forceinline__
#else
#define OPS_HD inline
#endif

struct OpsDivisor {
  unsigned int d, magic, shift;
  OPS_HD unsigned int div(unsigned int n) const {
#if defined(__CUDA_ARCH__)
    return (__umulhi(n, magic) + n) >> shift;
#else
    return (unsigned int)((((unsigned long long)n * magic) >> 32) + n) >> shift;
#endif
  }
};

inline OpsDivisor ops_make_divisor(unsigned int d) {
  OpsDivisor r;
  r.d = d;
  r.shift = 0;
  while ((1ull << r.shift) < d) r.shift++;
  r.magic = (unsigned int)((((1ull << 32) * ((1ull << r.shift) - d)) / d) + 1);
  return r;
}

template <typename I> struct OpsDiv;
template <> struct OpsDiv<int> {
  OpsDivisor f;
  static OpsDiv make(long long d) {
    OpsDiv r;
    r.f = ops_make_divisor((unsigned int)d);
    return r;
  }
  OPS_HD int div(int n) const { return (int)f.div((unsigned int)n); }
  OPS_HD int value() const { return (int)f.d; }
};
template <> struct OpsDiv<long long> {
  long long d;
  static OpsDiv make(long long v) {
    OpsDiv r;
    r.d = v;
    return r;
  }
  OPS_HD long long div(long long n) const { return n / d; }
  OPS_HD long long value() const { return d; }
};

// n = q * d + r, 0 <= r < d (n >= 0).
template <typename I> OPS_HD I ops_divmod(const OpsDiv<I>& d, I n, I& r) {
  const I q = d.div(n);
  r = n - q * d.value();
  return q;
}
