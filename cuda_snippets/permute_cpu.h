// permute_cpu.h: the permute / transpose_add CPU path (jt.code cpu_src of ops/permutation.py). Includes cpu_common.h
// first.
//
// The plan (ops/permutation.py: cpu_plan_data) is the simplified permutation in elements, in one of three forms:
//   * flat (mode 0): the identity: one memcpy, or one elementwise sum for transpose_add;
//   * rows (mode 1): the last dim stays: every output row of `row` elements is an input row; an odometer over
//     the outer output dims (sizes, input strides) gives each row's start: one memcpy (or one sum) per row;
//   * tiles (mode 2): the last dim moves: the plane of the input's last dim (A: contiguous in the input) and the
//     output's last dim (B: contiguous in the output, input stride isb) in TILE x TILE blocks, for every index
//     of the other (batch) output dims. A block is read and written in L1: each output row segment is written
//     contiguously from an input column (the input rows of the block stay cached between columns).
// Elements move as unsigned integers of their size (no dtype: one code per element size). transpose_add sums in
// the element type, the 16-bit floats in float rounded to nearest even (cpu_common.h's branch-free conversions,
// bit-identical to jittor's float16 and to the GPU's __float2bfloat16_rn), bool as logical or, integers wrap.
//
// `data` holds the plan's fields (cpu_common.h: read_fields, in one key; a lookup would build and hash a
// std::string, ~20 ns): m mode, r row, a A, b B, i isb, o osa, k the outer or batch rank; dims k: 'A' + k sizes,
// 'I' + k input strides, 'Q' + k output strides (batch dims).
#pragma once
// "# include": jittor scans a source's `#include "..."` lines and looks for each file in its own folders only;
// this form it leaves to the compiler, which finds the file beside this one (ops/_codegen.py: cpu_include
// hashes both files into the header line, so an edit of either still recompiles).
# include "cpu_common.h"
#if defined(__SSE2__) || defined(__AVX2__)
#include <immintrin.h>
#endif
// the last include stays unconditional: jittor's defines follow it
#include <cstdint>
#include <cstring>

namespace permute_cpu {

const int MAX_DIMS = 8;
// Tile edge of the tiled walk: a 32 x 32 block of 8-byte elements is 8 KB per side, in L1 with its output.
const int TILE = 32;

struct Plan {
  int mode, rank;
  long long row, A, B, isb, osa;
  long long dim[MAX_DIMS], in_stride[MAX_DIMS], out_stride[MAX_DIMS];
};

// `grad`: the plan of the backward (the inverse permute of dout), whose keys are the forward's with a '_' in
// front (the grad source gets the forward's `data`).
template <class Map> inline Plan plan(Map& data, bool grad = false) {
  const ops_cpu::Fields v = ops_cpu::read_fields(data, grad ? '_' : 0);
  Plan p = Plan();
  p.mode = (int)v['m'];
  if (p.mode == 0) return p;
  p.rank = (int)v['k'];
  if (p.mode == 1) {
    p.row = (long long)v['r'];
  } else {
    p.A = (long long)v['a'];
    p.B = (long long)v['b'];
    p.isb = (long long)v['i'];
    p.osa = (long long)v['o'];
  }
  for (int k = 0; k < p.rank && k < MAX_DIMS; ++k) {
    p.dim[k] = (long long)v['A' + k];
    p.in_stride[k] = (long long)v['I' + k];
    if (p.mode == 2) p.out_stride[k] = (long long)v['Q' + k];
  }
  return p;
}

// Walks the outer (rows) or batch (tiles) output dims in order, keeping the element offsets of the current
// index in the input and the output (no division per row: rows are often 16-64 elements).
struct Odometer {
  long long idx[MAX_DIMS], in, out;
  Odometer() : in(0), out(0) {
    for (int k = 0; k < MAX_DIMS; ++k) idx[k] = 0;
  }
  void next(const Plan& p) {
    for (int k = p.rank - 1; k >= 0; --k) {
      in += p.in_stride[k];
      out += p.out_stride[k];
      if (++idx[k] < p.dim[k]) return;
      in -= p.dim[k] * p.in_stride[k];
      out -= p.dim[k] * p.out_stride[k];
      idx[k] = 0;
    }
  }
};

inline long long outer_count(const Plan& p) {
  long long n = 1;
  for (int k = 0; k < p.rank; ++k) n *= p.dim[k];
  return n;
}

// Moves: E is an unsigned integer of the element's size. A tile is moved in N x N blocks read into registers
// row by row and written out column by column (shuffles move bits only), the tile's remainder element by
// element. Interleaved timings on the dev machine (2026-11-25, microseconds, median of 15 rounds of best-of-40;
// a plain loop nest / compiler-unrolled 4x4 blocks / the shuffles below): (256,192) int8 31.4 / 9.3 / -,
// (4,64,96) f16 8.3 / 5.9 / 1.7, (257,191) f16 16.2 / 13.0 / 5.4, (96,80) int64 1.9 / 1.9 / 1.5, (8,96,80) f32
// 21.4 / 14.4 / 10.9, (256,192) f32 32.5 / 12.8 / 8.6 (AVX2 8x8; blocks of 8 or 16 without shuffles lose).
template <typename E> struct Block {  // portable: a 4 x 4 block the compiler unrolls
  static const int N = 4;
  static void move(const E* s, long long ss, E* d, long long ds) {
    E r[N][N];
    for (int i = 0; i < N; ++i)
      for (int j = 0; j < N; ++j) r[i][j] = s[i * ss + j];
    for (int j = 0; j < N; ++j)
      for (int i = 0; i < N; ++i) d[j * ds + i] = r[i][j];
  }
};

#ifdef __SSE2__
template <> struct Block<uint8_t> {  // 8 x 8 bytes: 8-byte row loads, three rounds of interleaves
  static const int N = 8;
  static void move(const uint8_t* s, long long ss, uint8_t* d, long long ds) {
    __m128i r[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm_loadl_epi64((const __m128i*)(s + i * ss));
    const __m128i a0 = _mm_unpacklo_epi8(r[0], r[1]), a1 = _mm_unpacklo_epi8(r[2], r[3]),
                  a2 = _mm_unpacklo_epi8(r[4], r[5]), a3 = _mm_unpacklo_epi8(r[6], r[7]);
    const __m128i b0 = _mm_unpacklo_epi16(a0, a1), b1 = _mm_unpackhi_epi16(a0, a1), b2 = _mm_unpacklo_epi16(a2, a3),
                  b3 = _mm_unpackhi_epi16(a2, a3);
    const __m128i c[4] = {_mm_unpacklo_epi32(b0, b2), _mm_unpackhi_epi32(b0, b2), _mm_unpacklo_epi32(b1, b3),
                          _mm_unpackhi_epi32(b1, b3)};
    for (int j = 0; j < 4; ++j) {
      _mm_storel_epi64((__m128i*)(d + 2 * j * ds), c[j]);
      _mm_storel_epi64((__m128i*)(d + (2 * j + 1) * ds), _mm_unpackhi_epi64(c[j], c[j]));
    }
  }
};
template <> struct Block<uint16_t> {  // 8 x 8 two-byte elements: 16-byte rows, three rounds
  static const int N = 8;
  static void move(const uint16_t* s, long long ss, uint16_t* d, long long ds) {
    __m128i r[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm_loadu_si128((const __m128i*)(s + i * ss));
    __m128i a[8], b[8];
    for (int i = 0; i < 4; ++i) {
      a[2 * i] = _mm_unpacklo_epi16(r[2 * i], r[2 * i + 1]);
      a[2 * i + 1] = _mm_unpackhi_epi16(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {  // a[0..3]: rows 0-3, a[4..7]: rows 4-7
      b[4 * i] = _mm_unpacklo_epi32(a[4 * i], a[4 * i + 2]);
      b[4 * i + 1] = _mm_unpackhi_epi32(a[4 * i], a[4 * i + 2]);
      b[4 * i + 2] = _mm_unpacklo_epi32(a[4 * i + 1], a[4 * i + 3]);
      b[4 * i + 3] = _mm_unpackhi_epi32(a[4 * i + 1], a[4 * i + 3]);
    }
    for (int j = 0; j < 4; ++j) {  // b[j]: columns 2j, 2j + 1 of rows 0-3; b[4 + j]: of rows 4-7
      _mm_storeu_si128((__m128i*)(d + 2 * j * ds), _mm_unpacklo_epi64(b[j], b[4 + j]));
      _mm_storeu_si128((__m128i*)(d + (2 * j + 1) * ds), _mm_unpackhi_epi64(b[j], b[4 + j]));
    }
  }
};
#endif

#ifdef __AVX2__
template <> struct Block<uint32_t> {  // 8 x 8 four-byte elements: 32-byte rows, three rounds
  static const int N = 8;
  static void move(const uint32_t* si, long long ss, uint32_t* di, long long ds) {
    const float* s = (const float*)si;
    float* d = (float*)di;
    __m256 r[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(s + i * ss);
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]),
                 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]),
                 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]),
                 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 u[8] = {_mm256_shuffle_ps(t0, t2, 0x44), _mm256_shuffle_ps(t0, t2, 0xEE),
                         _mm256_shuffle_ps(t1, t3, 0x44), _mm256_shuffle_ps(t1, t3, 0xEE),
                         _mm256_shuffle_ps(t4, t6, 0x44), _mm256_shuffle_ps(t4, t6, 0xEE),
                         _mm256_shuffle_ps(t5, t7, 0x44), _mm256_shuffle_ps(t5, t7, 0xEE)};
    for (int j = 0; j < 4; ++j) {
      _mm256_storeu_ps(d + j * ds, _mm256_permute2f128_ps(u[j], u[4 + j], 0x20));
      _mm256_storeu_ps(d + (4 + j) * ds, _mm256_permute2f128_ps(u[j], u[4 + j], 0x31));
    }
  }
};
template <> struct Block<uint64_t> {  // 4 x 4 eight-byte elements: 32-byte rows, two rounds
  static const int N = 4;
  static void move(const uint64_t* si, long long ss, uint64_t* di, long long ds) {
    const double* s = (const double*)si;
    double* d = (double*)di;
    const __m256d r0 = _mm256_loadu_pd(s), r1 = _mm256_loadu_pd(s + ss), r2 = _mm256_loadu_pd(s + 2 * ss),
                  r3 = _mm256_loadu_pd(s + 3 * ss);
    const __m256d t0 = _mm256_unpacklo_pd(r0, r1), t1 = _mm256_unpackhi_pd(r0, r1), t2 = _mm256_unpacklo_pd(r2, r3),
                  t3 = _mm256_unpackhi_pd(r2, r3);
    _mm256_storeu_pd(d, _mm256_permute2f128_pd(t0, t2, 0x20));
    _mm256_storeu_pd(d + ds, _mm256_permute2f128_pd(t1, t3, 0x20));
    _mm256_storeu_pd(d + 2 * ds, _mm256_permute2f128_pd(t0, t2, 0x31));
    _mm256_storeu_pd(d + 3 * ds, _mm256_permute2f128_pd(t1, t3, 0x31));
  }
};
#endif

using ops_cpu::Word;

// out[a * osa + b] = in[b * isb + a] for a < na, b < nb.
template <typename E> inline void move_tile(const E* in, long long isb, E* out, long long osa, int na, int nb) {
  const int N = Block<E>::N, na_n = na - na % N, nb_n = nb - nb % N;
  for (int a = 0; a < na_n; a += N)
    for (int b = 0; b < nb_n; b += N) Block<E>::move(in + b * isb + a, isb, out + a * osa + b, osa);
  if (nb_n < nb)  // the columns right of the blocks
    for (int a = 0; a < na_n; ++a)
      for (int b = nb_n; b < nb; ++b) out[a * osa + b] = in[b * isb + a];
  for (int a = na_n; a < na; ++a)  // the rows below them
    for (int b = 0; b < nb; ++b) out[a * osa + b] = in[b * isb + a];
}

// The rows of mode 1, `bytes` bytes each (elements of `size` bytes), as fixed-size copies of CH bytes that the
// compiler turns into single loads and stores (CH = 0: one memcpy per row). A memcpy call per row costs its call
// and size dispatch: (64,48,16) f32 (1,0,2), 64-byte rows, 8.7 us with a memcpy per row against 6.7 us inline
// (standalone, interleaved, median of 15 rounds).
template <int CH>
inline void copy_rows(const char* src, char* dst, long long size, long long bytes, long long n, const Plan& p) {
  // the last outer dim as a plain loop (rows at a fixed input step), the odometer over the others
  Plan outer = p;
  outer.rank = p.rank - 1;
  const long long inner = p.dim[p.rank - 1], step = p.in_stride[p.rank - 1] * size;
  Odometer at;
  for (long long r = 0; r < n; r += inner, at.next(outer)) {
    const char* s = src + at.in * size;
    char* d = dst + r * bytes;
    for (long long j = 0; j < inner; ++j, s += step, d += bytes) {
      if (CH == 0) {
        std::memcpy(d, s, bytes);
        continue;
      }
      for (long long k = 0; k < bytes; k += CH) std::memcpy(d + k, s + k, CH);
    }
  }
}

// The tiles walk (mode 2): tile(src, dst, na, nb) for every na x nb block (TILE x TILE but at the plane's edges)
// of the plane of every one of the n batch indices, src and dst the element offsets of its first element.
template <class F> inline void for_each_tile(const Plan& p, long long n, F tile) {
  Odometer at;
  for (long long t = 0; t < n; ++t, at.next(p)) {
    for (long long a0 = 0; a0 < p.A; a0 += TILE) {
      const int na = (int)(p.A - a0 < TILE ? p.A - a0 : TILE);
      for (long long b0 = 0; b0 < p.B; b0 += TILE) {
        const int nb = (int)(p.B - b0 < TILE ? p.B - b0 : TILE);
        tile(at.in + b0 * p.isb + a0, at.out + a0 * p.osa + b0, na, nb);
      }
    }
  }
}

template <typename E> void permute_elems(const E* in, E* out, long long count, const Plan& p) {
  if (p.mode == 0) {
    std::memcpy((void*)out, (const void*)in, sizeof(E) * count);
    return;
  }
  const long long n = outer_count(p);
  if (p.mode == 1) {
    const char* src = reinterpret_cast<const char*>(in);
    char* dst = reinterpret_cast<char*>(out);
    const long long bytes = sizeof(E) * p.row;
    if (bytes % 32 == 0) return copy_rows<32>(src, dst, sizeof(E), bytes, n, p);
    if (bytes % 16 == 0) return copy_rows<16>(src, dst, sizeof(E), bytes, n, p);
    if (bytes % 8 == 0) return copy_rows<8>(src, dst, sizeof(E), bytes, n, p);
    return copy_rows<0>(src, dst, sizeof(E), bytes, n, p);
  }
  for_each_tile(p, n, [&](long long src, long long dst, int na, int nb) {
    move_tile<E>(in + src, p.isb, out + dst, p.osa, na, nb);
  });
}

template <typename T> void permute(const T* in, T* out, long long count, const Plan& p) {
  typedef typename Word<sizeof(T)>::type E;
  permute_elems<E>(reinterpret_cast<const E*>(in), reinterpret_cast<E*>(out), count, p);
}

// Sums: S is what an element is added as (its bits for the 16-bit floats; the buffers are only touched as S).
template <typename T> struct Sum {
  typedef T S;
  static S add(S a, S b) { return (S)(a + b); }  // bool: a || b; integers wrap
};
template <> struct Sum<jittor::float16> {
  typedef uint16_t S;
  static S add(S a, S b) {
    return ops_cpu::float_to_half_bits(ops_cpu::half_bits_to_float(a) + ops_cpu::half_bits_to_float(b));
  }
};
template <> struct Sum<jittor::bfloat16> {
  typedef uint16_t S;
  static S add(S a, S b) {
    return ops_cpu::float_to_bfloat_bits(ops_cpu::bfloat_bits_to_float(a) + ops_cpu::bfloat_bits_to_float(b));
  }
};

template <typename T> inline void add_row(const typename Sum<T>::S* x, const typename Sum<T>::S* y,
                                          typename Sum<T>::S* out, long long n) {
  for (long long i = 0; i < n; ++i) out[i] = Sum<T>::add(x[i], y[i]);
}

// A tile of transpose_add: x's tile transposed into a local block first, then each output row segment summed
// with y's in one contiguous (vectorizable) loop.
template <typename T>
inline void add_tile(const typename Sum<T>::S* x, const typename Sum<T>::S* y, typename Sum<T>::S* out,
                     long long isb, long long osa, int na, int nb) {
  typedef typename Sum<T>::S S;
  typedef typename Word<sizeof(S)>::type E;
  S xt[TILE * TILE];
  move_tile<E>(reinterpret_cast<const E*>(x), isb, reinterpret_cast<E*>(xt), TILE, na, nb);
  for (int a = 0; a < na; ++a) add_row<T>(xt + a * TILE, y + a * osa, out + a * osa, nb);
}

template <typename T> void transpose_add(const T* xt, const T* yt, T* outt, long long count, const Plan& p) {
  typedef typename Sum<T>::S S;
  const S* x = reinterpret_cast<const S*>(xt);
  const S* y = reinterpret_cast<const S*>(yt);
  S* out = reinterpret_cast<S*>(outt);
  if (p.mode == 0) return add_row<T>(x, y, out, count);
  const long long n = outer_count(p);
  Odometer at;
  if (p.mode == 1) {
    for (long long r = 0; r < n; ++r, at.next(p)) add_row<T>(x + at.in, y + r * p.row, out + r * p.row, p.row);
    return;
  }
  for_each_tile(p, n, [&](long long src, long long dst, int na, int nb) {
    add_tile<T>(x + src, y + dst, out + dst, p.isb, p.osa, na, nb);
  });
}

}  // namespace permute_cpu

// The jt.code sources of ops/permutation.py, one short name each (broadcast_cpu.h says why): the forward, the
// gradient through the inverse plan ('_' keys), and transpose_add's gradient of y (dout itself).
#define OPS_PERMUTE_FWD permute_cpu::permute(in0_p, out0_p, in0->num, permute_cpu::plan(data))
#define OPS_TRANSPOSE_ADD_FWD permute_cpu::transpose_add(in0_p, in1_p, out0_p, in0->num, permute_cpu::plan(data))
#define OPS_PERMUTE_GRAD permute_cpu::permute(dout_p, out0_p, dout->num, permute_cpu::plan(data, true))
#define OPS_COPY_GRAD std::memcpy(out0_p, dout_p, (size_t)dout->num * sizeof(*out0_p))
