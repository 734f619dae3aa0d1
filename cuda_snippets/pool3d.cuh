// pool3d.cuh: MaxPool3D forward and deterministic backward kernels, with their host launchers.
//
// Contract (checked in Python by ops/pool3d.py before any launch):
//   * x is a contiguous (P, D, H, W) tensor, P = N * C planes; outputs are (P, Do, Ho, Wo); all sizes >= 1.
//   * D * H * W <= 2^31 - 1: positions inside one plane (the saved indices) are int.
//   * I (the index type of work items and plane offsets) is int while every tensor holds < 2^31 elements,
//     long long otherwise.
//   * NOPAD == true only when padding is 0 and every window lies inside the input (no bounds checks then).
//   * The k2s2 kernels: kernel = stride = 2, dilation 1, NOPAD, W % VEC == 0 (so every row of x and y starts
//     on a VEC-element boundary; jittor allocations are 256-byte aligned at element 0).
//   * fwd_rows: values only, NOPAD, dilation 1 along W, kw == KW, sw == SW, W % VEC == 0 (the launcher checks
//     the last four and x's alignment).
//   * The backward (a gather from the indices the forward saves) is in pool3d_gather.cuh, shared with the CPU
//     path.
//
// Semantics (PyTorch's): elements of a window are offered in (d, h, w) order; a larger value or a NaN takes
// over, so ties keep the first maximum, a NaN sticks, and a later NaN moves the index to itself. A window
// that holds no element (possible only with padding and dilation) gives -inf and index -1.
// Compile-time window sizes KD/KH/KW: 0 means "read it from Pool3dGeom at run time".
#pragma once

// ---------------------------------------------------------------------------------------------------------
// Index math (the divider: OpsDiv, index_math.h)

struct Pool3dGeom {
  int D, H, W;     // input plane
  int Do, Ho, Wo;  // output plane
  int kd, kh, kw, sd, sh, sw, pd, ph, pw, dd, dh, dw;
};

// A launch's work items: item i -> (plane, z, y, x) with x fastest; total items in `total`.
template <typename I> struct Pool3dArgs {
  Pool3dGeom g;
  I total;
  I plane_in, plane_out;  // elements of one input plane, one output plane
  OpsDiv<I> nx, ny, nz;  // index_math.h
};

template <typename I>
__device__ __forceinline__ void pool3d_split(const Pool3dArgs<I>& a, I i, I& plane, int& z, int& y, int& x) {
  const I q0 = a.nx.div(i);
  x = (int)(i - q0 * a.nx.value());
  const I q1 = a.ny.div(q0);
  y = (int)(q0 - q1 * a.ny.value());
  plane = a.nz.div(q1);
  z = (int)(q1 - plane * a.nz.value());
}

// The geometry of one launch: the sizes from the tensors' shapes, the pooling parameters from jittor's `data`
// (kd kh kw sd sh sw pd ph pw dd dh dw), so one compiled kernel serves every layer of its kind.
template <class Map>
inline Pool3dGeom pool3d_geom(long long D, long long H, long long W, long long Do, long long Ho, long long Wo,
                              Map& data) {
  Pool3dGeom g;
  g.D = (int)D; g.H = (int)H; g.W = (int)W; g.Do = (int)Do; g.Ho = (int)Ho; g.Wo = (int)Wo;
  g.kd = (int)data["kd"]; g.kh = (int)data["kh"]; g.kw = (int)data["kw"];
  g.sd = (int)data["sd"]; g.sh = (int)data["sh"]; g.sw = (int)data["sw"];
  g.pd = (int)data["pd"]; g.ph = (int)data["ph"]; g.pw = (int)data["pw"];
  g.dd = (int)data["dd"]; g.dh = (int)data["dh"]; g.dw = (int)data["dw"];
  return g;
}

template <typename I>
inline Pool3dArgs<I> pool3d_args(const Pool3dGeom& g, long long planes, long long nx, long long ny, long long nz) {
  Pool3dArgs<I> a;
  a.g = g;
  a.total = (I)(planes * nz * ny * nx);
  a.plane_in = (I)g.D * g.H * g.W;
  a.plane_out = (I)g.Do * g.Ho * g.Wo;
  a.nx = OpsDiv<I>::make(nx);
  a.ny = OpsDiv<I>::make(ny);
  a.nz = OpsDiv<I>::make(nz);
  return a;
}

// ---------------------------------------------------------------------------------------------------------
// Numerics: compare in float (exact for half/bfloat16) or double; NaN tests on the bits, so no compiler
// flag can fold them away.

template <typename T> struct Pool3dAcc { typedef float type; };
template <> struct Pool3dAcc<double> { typedef double type; };

__device__ __forceinline__ float pool3d_acc(float v) { return v; }
__device__ __forceinline__ double pool3d_acc(double v) { return v; }
__device__ __forceinline__ float pool3d_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float pool3d_acc(__nv_bfloat16 v) { return __bfloat162float(v); }

__device__ __forceinline__ bool pool3d_isnan(float v) { return (__float_as_uint(v) << 1) > 0xff000000u; }
__device__ __forceinline__ bool pool3d_isnan(double v) {
  return ((unsigned long long)__double_as_longlong(v) << 1) > 0xffe0000000000000ull;
}

template <typename T> __device__ __forceinline__ T pool3d_from_acc(typename Pool3dAcc<T>::type v) {
  return ops_from_float<T>(v);  // round to nearest for half/bfloat16
}
template <> __device__ __forceinline__ double pool3d_from_acc<double>(double v) { return v; }

__device__ __forceinline__ int pool3d_min(int a, int b) { return a < b ? a : b; }

template <typename T> __device__ __forceinline__ T pool3d_neg_inf();
template <> __device__ __forceinline__ float pool3d_neg_inf<float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double pool3d_neg_inf<double>() {
  return __longlong_as_double((long long)0xfff0000000000000ull);
}
template <> __device__ __forceinline__ __half pool3d_neg_inf<__half>() { return __ushort_as_half(0xfc00); }
template <> __device__ __forceinline__ __nv_bfloat16 pool3d_neg_inf<__nv_bfloat16>() {
  return __ushort_as_bfloat16(0xff80);
}

template <typename T> __device__ __forceinline__ T pool3d_zero();
template <> __device__ __forceinline__ float pool3d_zero<float>() { return 0.f; }
template <> __device__ __forceinline__ double pool3d_zero<double>() { return 0.0; }
template <> __device__ __forceinline__ __half pool3d_zero<__half>() { return __ushort_as_half(0); }
template <> __device__ __forceinline__ __nv_bfloat16 pool3d_zero<__nv_bfloat16>() { return __ushort_as_bfloat16(0); }

// The running maximum of one window.
template <typename T> struct Pool3dBest {
  typedef typename Pool3dAcc<T>::type A;
  A v;    // compare value
  T raw;  // the element itself, written out unchanged
  int pos;  // position (d * H + h) * W + w in the plane; -1 while no element was offered

  __device__ __forceinline__ void take(T x, int p) { raw = x; v = pool3d_acc(x); pos = p; }
  // EMPTY: the window may still be empty (pos < 0); false once an element was taken.
  template <bool EMPTY> __device__ __forceinline__ void offer(T x, int p) {
    const A c = pool3d_acc(x);
    if ((EMPTY && pos < 0) || pool3d_isnan(c) || (!pool3d_isnan(v) && c > v)) { v = c; raw = x; pos = p; }
  }
  __device__ __forceinline__ T out() const { return pos >= 0 ? raw : pool3d_neg_inf<T>(); }
};

// True when partial result (bv, bp) beats (av, ap); both summarize disjoint position sets each scanned in
// order, so this reproduces the in-order scan: NaN beats numbers and the later NaN wins, else the larger
// value, ties to the smaller position. It is a strict total order: the warp butterfly agrees on all lanes.
template <typename A> __device__ __forceinline__ bool pool3d_beats(A bv, int bp, A av, int ap) {
  if (bp < 0) return false;
  if (ap < 0) return true;
  const bool an = pool3d_isnan(av), bn = pool3d_isnan(bv);
  if (an || bn) return bn && (!an || bp > ap);
  if (bv != av) return bv > av;
  return bp < ap;
}

// ---------------------------------------------------------------------------------------------------------
// One window, one thread: the loops are fully unrolled when KD/KH/KW are compile-time.
// CLAMP (no padding, dilation 1; only ceil_mode's last windows reach past the input's end): an index past the
// end reads the dim's last element instead of being skipped. That element is the window's own last one along
// that dim and comes earlier in the (d, h, w) scan, so the duplicate never wins a tie, and a clamped row or
// plane replays the last real one (the last NaN stays the last): the same value and index, with every load
// unconditional.
template <typename T, int KD, int KH, int KW, bool NOPAD, bool CLAMP = false>
__device__ __forceinline__ Pool3dBest<T> pool3d_window_max(const T* __restrict__ plane, const Pool3dGeom& g,
                                                           int od, int oh, int ow) {
  constexpr bool CHECK = !NOPAD && !CLAMP;  // skip elements outside the input
  const int kd = KD ? KD : g.kd, kh = KH ? KH : g.kh, kw = KW ? KW : g.kw;
  const int d0 = od * g.sd - g.pd, h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
  Pool3dBest<T> b;
  b.pos = -1;
  if (!CHECK) {  // the first element exists: seed with it, then no emptiness test per element
    const int p0 = (d0 * g.H + h0) * g.W + w0;
    b.take(plane[p0], p0);
  }
#pragma unroll
  for (int i = 0; i < kd; ++i) {
    const int d = CLAMP ? (d0 + i < g.D ? d0 + i : g.D - 1) : d0 + i * g.dd;
    if (CHECK && (d < 0 || d >= g.D)) continue;
#pragma unroll
    for (int j = 0; j < kh; ++j) {
      const int h = CLAMP ? (h0 + j < g.H ? h0 + j : g.H - 1) : h0 + j * g.dh;
      if (CHECK && (h < 0 || h >= g.H)) continue;
      const int row = (d * g.H + h) * g.W;
#pragma unroll
      for (int k = 0; k < kw; ++k) {
        const int w = CLAMP ? (w0 + k < g.W ? w0 + k : g.W - 1) : w0 + k * g.dw;
        if (CHECK && (w < 0 || w >= g.W)) continue;
        b.template offer<CHECK>(plane[row + w], row + w);
      }
    }
  }
  return b;
}

// One window, one warp: lane l scans window elements l, l + 32, ... (coalesced along each window row),
// then a butterfly merges the lanes. Every lane returns the window's (v, pos); raw is not merged (reload it).
template <typename T, int KD, int KH, int KW, bool NOPAD>
__device__ __forceinline__ Pool3dBest<T> pool3d_window_max_warp(const T* __restrict__ plane, const Pool3dGeom& g,
                                                                int od, int oh, int ow, int lane) {
  const int kd = KD ? KD : g.kd, kh = KH ? KH : g.kh, kw = KW ? KW : g.kw;
  const int khw = kh * kw, kvol = kd * khw;
  const int d0 = od * g.sd - g.pd, h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
  Pool3dBest<T> b;
  b.pos = -1;
#pragma unroll 4
  for (int e = lane; e < kvol; e += 32) {
    const int i = e / khw, r = e - i * khw, j = r / kw, k = r - j * kw;
    const int d = d0 + i * g.dd, h = h0 + j * g.dh, w = w0 + k * g.dw;
    if (!NOPAD && (d < 0 || d >= g.D || h < 0 || h >= g.H || w < 0 || w >= g.W)) continue;
    const int p = (d * g.H + h) * g.W + w;
    b.template offer<true>(plane[p], p);
  }
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    const typename Pool3dAcc<T>::type ov = __shfl_xor_sync(0xffffffffu, b.v, m);
    const int op = __shfl_xor_sync(0xffffffffu, b.pos, m);
    if (pool3d_beats(ov, op, b.v, b.pos)) { b.v = ov; b.pos = op; }
  }
  return b;
}

// ---------------------------------------------------------------------------------------------------------
// Forward. MODE bit 1: write the maximum to y; bit 2: write the index to yi.

// Large output planes: one output per thread, OPT outputs per thread BLOCK apart (OPT windows in flight).
template <typename T, typename I, int KD, int KH, int KW, bool NOPAD, bool CLAMP, int MODE, int OPT, int BLOCK>
__global__ void __launch_bounds__(BLOCK) pool3d_fwd_flat(const T* __restrict__ x, T* __restrict__ y,
                                                         int* __restrict__ yi, const Pool3dArgs<I> a) {
  const I first = (I)blockIdx.x * (BLOCK * OPT) + threadIdx.x;
  Pool3dBest<T> best[OPT];
#pragma unroll
  for (int t = 0; t < OPT; ++t) {
    const I o = first + (I)t * BLOCK;
    if (o < a.total) {
      I plane; int od, oh, ow;
      pool3d_split(a, o, plane, od, oh, ow);
      best[t] = pool3d_window_max<T, KD, KH, KW, NOPAD, CLAMP>(x + plane * a.plane_in, a.g, od, oh, ow);
    }
  }
#pragma unroll
  for (int t = 0; t < OPT; ++t) {
    const I o = first + (I)t * BLOCK;
    if (o < a.total) {
      if (MODE & 1) y[o] = best[t].out();
      if (MODE & 2) yi[o] = best[t].pos;
    }
  }
}

// Few outputs with big windows (e.g. k8 on 8x8x8, h = w = 1): one warp per output.
template <typename T, typename I, int KD, int KH, int KW, bool NOPAD, int MODE, int BLOCK>
__global__ void __launch_bounds__(BLOCK) pool3d_fwd_warp(const T* __restrict__ x, T* __restrict__ y,
                                                         int* __restrict__ yi, const Pool3dArgs<I> a) {
  const I o = (I)blockIdx.x * (BLOCK / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (o >= a.total) return;  // o is uniform across the warp: whole warps leave
  I plane; int od, oh, ow;
  pool3d_split(a, o, plane, od, oh, ow);
  const T* __restrict__ xp = x + plane * a.plane_in;
  const Pool3dBest<T> b = pool3d_window_max_warp<T, KD, KH, KW, NOPAD>(xp, a.g, od, oh, ow, lane);
  if (lane == 0) {
    if (MODE & 1) y[o] = b.pos >= 0 ? xp[b.pos] : pool3d_neg_inf<T>();
    if (MODE & 2) yi[o] = b.pos;
  }
}

// kernel 2 stride 2, padding-free, W % VEC == 0: a work item is VEC/2 adjacent outputs of one output row;
// it reads its four input rows (d, h), (d, h+1), (d+1, h), (d+1, h+1) as one VEC-wide load each.
template <typename T, int VEC> struct Pool3dK2 {
  static constexpr int NO = VEC / 2;  // outputs per item
  typedef OpsVec<T, VEC> In;
  typedef OpsVec<T, NO> Out;
  typedef OpsVec<int, NO> Idx;
  // Loads the 4 rows of item (plane pointer xp, output od, oh, first output column ow0); returns their
  // in-plane offsets in row[].
  __device__ __forceinline__ static void load(const T* __restrict__ xp, const Pool3dGeom& g, int od, int oh,
                                              int ow0, In (&v)[4], int (&row)[4]) {
    row[0] = ((2 * od) * g.H + 2 * oh) * g.W + 2 * ow0;
    row[1] = row[0] + g.W;
    row[2] = row[0] + g.H * g.W;
    row[3] = row[2] + g.W;
#pragma unroll
    for (int r = 0; r < 4; ++r) v[r] = *reinterpret_cast<const In*>(xp + row[r]);
  }
  // The 8 elements of output q come in (d, h, w) order: rows 0..3, then columns 2q, 2q+1.
  __device__ __forceinline__ static Pool3dBest<T> argmax(const In (&v)[4], const int (&row)[4], int q) {
    Pool3dBest<T> b;
    b.take(v[0].v[2 * q], row[0] + 2 * q);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
#pragma unroll
      for (int c = 0; c < 2; ++c) b.template offer<false>(v[r].v[2 * q + c], row[r] + 2 * q + c);
    }
    return b;
  }
};

template <typename T, typename I, int VEC, int MODE, int OPT, int BLOCK>
__global__ void __launch_bounds__(BLOCK) pool3d_fwd_k2s2(const T* __restrict__ x, T* __restrict__ y,
                                                         int* __restrict__ yi, const Pool3dArgs<I> a) {
  typedef Pool3dK2<T, VEC> K2;
  const I first = (I)blockIdx.x * (BLOCK * OPT) + threadIdx.x;
  typename K2::In v[OPT][4];
  int row[OPT][4];
#pragma unroll
  for (int t = 0; t < OPT; ++t) {  // all OPT * 4 loads first
    const I item = first + (I)t * BLOCK;
    if (item < a.total) {
      I plane; int od, oh, og;
      pool3d_split(a, item, plane, od, oh, og);
      K2::load(x + plane * a.plane_in, a.g, od, oh, og * K2::NO, v[t], row[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < OPT; ++t) {
    const I item = first + (I)t * BLOCK;
    if (item < a.total) {
      typename K2::Out ov;
      typename K2::Idx oi;
#pragma unroll
      for (int q = 0; q < K2::NO; ++q) {
        const Pool3dBest<T> b = K2::argmax(v[t], row[t], q);
        ov.v[q] = b.raw;
        oi.v[q] = b.pos;
      }
      // item * NO is the flat index of its first output (outputs of an item are contiguous in y).
      if (MODE & 1) *reinterpret_cast<typename K2::Out*>(y + item * K2::NO) = ov;
      if (MODE & 2) *reinterpret_cast<typename K2::Idx*>(yi + item * K2::NO) = oi;
    }
  }
}

// Values only (no indices), dilation 1 along W, W % VEC == 0, W padding PW <= VEC: a work item is the VEC
// adjacent outputs ow = VEC * og + t (t < VEC) of one output row. They read input columns w0 - PW ..
// w0 - PW + SPAN - 1 of each of the kd * kh window rows, w0 = og * VEC * SW. Each row span is loaded as NCH
// aligned VEC-wide chunks from w0 - LEAD (w0, the row starts and the plane starts are multiples of VEC, so is
// every chunk start; a chunk that starts inside the row ends inside it because W % VEC == 0). Chunks outside
// [0, W) are not read and count as -inf: the padding (PyTorch pads with -inf), and, padding-free, columns no
// valid output reads. Without NOPAD, window rows outside the input (padding, ceil_mode) are skipped. The
// column-wise maximum over the rows stays in registers (separable max: each loaded element costs one max
// instead of one compare per window holding it), then each output takes the maximum of its KW columns. The
// maximum propagates NaN; a value-only result does not depend on which equal element is first, except for the
// sign of a zero maximum: the separable order is not (d, h, w) order, so an output whose maximum is +-0 scans
// its window again for its first zero (PyTorch keeps the first maximum: -0.0 before 0.0 gives -0.0). Random
// data never takes that path; an all-zero window (after a ReLU) costs one more pass over it, from cache. The
// scan is a call after the item's outputs are written, taking the geometry by value: called from inside the
// unrolled output loop with the geometry by reference, it put the kernel parameters on a 120-byte stack frame
// in every thread and doubled the kernel's time (k3s1 (4,32,32,32,32) float32 on an H100: 19.7 -> 52.0 us).
// Inlined or called, the scan made ptxas hold the kernel to 32 registers and spill: see the launch bounds.
__device__ __forceinline__ float pool3d_max_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));  // one instruction; NaN if either is NaN
  return r;
#else
  return (pool3d_isnan(b) || b > a) ? b : a;
#endif
}
__device__ __forceinline__ double pool3d_max_nan(double a, double b) { return (pool3d_isnan(b) || b > a) ? b : a; }

// The first element equal to zero, in (d, h, w) order, of the window whose rows start at (d0, h0) and whose
// columns start at w (dilation 1 along W), as the accumulator type: its sign is the window's maximum's when
// that maximum is +-0 (every element is then <= 0, so the first zero is the first maximum). A call, with the
// geometry by value: taking the kernel's parameters by reference would put them in local memory.
template <typename T, int KW, bool NOPAD>
__device__ __noinline__ typename Pool3dAcc<T>::type pool3d_first_zero(const T* __restrict__ xp, int D, int H, int W,
                                                                      int kd, int kh, int dd, int dh, int d0, int h0,
                                                                      int w) {
  typedef typename Pool3dAcc<T>::type A;
  for (int i = 0; i < kd; ++i) {
    const int d = d0 + i * dd;
    if (!NOPAD && (d < 0 || d >= D)) continue;
    for (int j = 0; j < kh; ++j) {
      const int h = h0 + j * dh;
      if (!NOPAD && (h < 0 || h >= H)) continue;
      const T* __restrict__ row = xp + (d * H + h) * W;
      for (int k = 0; k < KW; ++k) {
        if (w + k < 0 || w + k >= W) continue;  // the W padding
        const A v = pool3d_acc(row[w + k]);
        if (v == A(0)) return v;
      }
    }
  }
  return A(0);
}

// At least 1280 threads resident per SM (5 blocks of 256): up to 48 registers a thread, the most a fwd_rows
// kernel took before the zero scan existed. Without the bound, ptxas held the kernels that hold the scan's call
// to 32 registers and spilled in 12 of the 60 float32 ones (28 of 60 float16); with it, by `ptxas -v` for
// sm_90, 1 of 60 float32, none of float16 or bfloat16 and 3 of 30 float64 keep a stack frame (before the scan:
// 2, 13 and 10).
constexpr int POOL3D_ROWS_MIN_THREADS = 1280;

template <typename T, typename I, int VEC, int KW, int SW, int PW, bool NOPAD, int BLOCK>
__global__ void __launch_bounds__(BLOCK, POOL3D_ROWS_MIN_THREADS / BLOCK)
    pool3d_fwd_rows(const T* __restrict__ x, T* __restrict__ y, const Pool3dArgs<I> a) {
  typedef typename Pool3dAcc<T>::type A;
  typedef OpsVec<T, VEC> V;
  constexpr int SPAN = SW * (VEC - 1) + KW;  // input columns of the item's VEC windows
  constexpr int LEAD = PW > 0 ? VEC : 0;     // one chunk before w0 holds the columns of the left padding
  constexpr int NCH = (SPAN + LEAD + VEC - 1) / VEC;
  const I item = (I)blockIdx.x * BLOCK + threadIdx.x;
  if (item >= a.total) return;
  const Pool3dGeom& g = a.g;
  I plane; int od, oh, og;
  pool3d_split(a, item, plane, od, oh, og);
  const int w0 = og * (VEC * SW);  // the first window starts at column w0 - PW
  const int c0 = w0 - LEAD;        // the first chunk loaded: a multiple of VEC
  const T* __restrict__ xp = x + plane * a.plane_in;
  A col[NCH * VEC];
#pragma unroll
  for (int e = 0; e < NCH * VEC; ++e) col[e] = pool3d_acc(pool3d_neg_inf<T>());
  const int d0 = od * g.sd - g.pd, h0 = oh * g.sh - g.ph;
  for (int i = 0; i < g.kd; ++i) {
    const int d = d0 + i * g.dd;
    if (!NOPAD && (d < 0 || d >= g.D)) continue;
#pragma unroll 4
    for (int j = 0; j < g.kh; ++j) {
      const int h = h0 + j * g.dh;
      if (!NOPAD && (h < 0 || h >= g.H)) continue;
      const T* __restrict__ row = xp + (d * g.H + h) * g.W;
#pragma unroll
      for (int c = 0; c < NCH; ++c) {
        const int cw = c0 + c * VEC;
        if (cw >= 0 && cw < g.W) {  // chunks in the padding (or past the last window) stay -inf
          const V v = *reinterpret_cast<const V*>(row + cw);
#pragma unroll
          for (int e = 0; e < VEC; ++e) col[c * VEC + e] = pool3d_max_nan(col[c * VEC + e], pool3d_acc(v.v[e]));
        }
      }
    }
  }
  // Outputs of this item: flat (plane, od, oh) row start + VEC * og + t; tap k of output t is input column
  // w0 + t * SW + k - PW, held in col[t * SW + k - PW + LEAD].
  T* __restrict__ yr = y + ((plane * g.Do + od) * g.Ho + oh) * g.Wo;
  unsigned zeros = 0u;  // bit t: output t's maximum is +-0
#pragma unroll
  for (int t = 0; t < VEC; ++t) {
    const int ow = og * VEC + t;
    if (ow < g.Wo) {
      A m = col[t * SW - PW + LEAD];
#pragma unroll
      for (int k = 1; k < KW; ++k) m = pool3d_max_nan(m, col[t * SW + k - PW + LEAD]);
      if (m == A(0)) zeros |= 1u << t;
      yr[ow] = pool3d_from_acc<T>(m);
    }
  }
  if (zeros) {
#pragma unroll 1
    for (int t = 0; t < VEC; ++t) {
      if ((zeros >> t) & 1u)
        yr[og * VEC + t] = pool3d_from_acc<T>(pool3d_first_zero<T, KW, NOPAD>(
            xp, g.D, g.H, g.W, g.kd, g.kh, g.dd, g.dh, d0, h0, w0 + t * SW - PW));
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Host launchers. Every one takes the same arguments (the menus of ops/pool3d.py call them through one switch)
// and computes its own grid from the geometry; the window sizes KD/KH/KW (0: run time), the vector width and
// the flags are the instantiation's, the rest comes from Pool3dGeom.

template <typename I, int PER_BLOCK>
inline unsigned int pool3d_grid(const Pool3dArgs<I>& a) {
  return (unsigned int)ops_ceil_div((long long)a.total, (long long)PER_BLOCK);
}

template <typename T, typename I, int KD, int KH, int KW, bool NOPAD, bool CLAMP, int MODE, int OPT, int BLOCK>
void pool3d_fwd_flat_launch(const T* x, T* y, int* yi, const Pool3dGeom& g, long long planes) {
  CHECK(!CLAMP || (g.pd == 0 && g.ph == 0 && g.pw == 0 && g.dd == 1 && g.dh == 1 && g.dw == 1));
  const Pool3dArgs<I> a = pool3d_args<I>(g, planes, g.Wo, g.Ho, g.Do);
  pool3d_fwd_flat<T, I, KD, KH, KW, NOPAD, CLAMP, MODE, OPT, BLOCK><<<pool3d_grid<I, BLOCK * OPT>(a), BLOCK>>>(
      x, y, yi, a);
  OPS_CHECK_LAUNCH();
}

template <typename T, typename I, int KD, int KH, int KW, bool NOPAD, int MODE, int BLOCK>
void pool3d_fwd_warp_launch(const T* x, T* y, int* yi, const Pool3dGeom& g, long long planes) {
  const Pool3dArgs<I> a = pool3d_args<I>(g, planes, g.Wo, g.Ho, g.Do);
  pool3d_fwd_warp<T, I, KD, KH, KW, NOPAD, MODE, BLOCK><<<pool3d_grid<I, BLOCK / 32>(a), BLOCK>>>(x, y, yi, a);
  OPS_CHECK_LAUNCH();
}

template <typename T, typename I, int VEC, int MODE, int OPT, int BLOCK>
void pool3d_fwd_k2s2_launch(const T* x, T* y, int* yi, const Pool3dGeom& g, long long planes) {
  CHECK(g.W % VEC == 0 && ((unsigned long long)x) % (VEC * sizeof(T)) == 0 &&
        ((unsigned long long)y) % (VEC / 2 * sizeof(T)) == 0 && ((unsigned long long)yi) % (VEC / 2 * 4) == 0);
  const Pool3dArgs<I> a = pool3d_args<I>(g, planes, g.Wo / (VEC / 2), g.Ho, g.Do);
  pool3d_fwd_k2s2<T, I, VEC, MODE, OPT, BLOCK><<<pool3d_grid<I, BLOCK * OPT>(a), BLOCK>>>(x, y, yi, a);
  OPS_CHECK_LAUNCH();
}

template <typename T, typename I, int VEC, int KW, int SW, int PW, bool NOPAD, int BLOCK>
void pool3d_fwd_rows_launch(const T* x, T* y, int* /* values only */, const Pool3dGeom& g, long long planes) {
  CHECK(g.W % VEC == 0 && g.kw == KW && g.sw == SW && g.pw == PW && PW <= VEC && g.dw == 1 &&
        ((unsigned long long)x) % (VEC * sizeof(T)) == 0);
  const Pool3dArgs<I> a = pool3d_args<I>(g, planes, ops_ceil_div(g.Wo, VEC), g.Ho, g.Do);
  pool3d_fwd_rows<T, I, VEC, KW, SW, PW, NOPAD, BLOCK><<<pool3d_grid<I, BLOCK>(a), BLOCK>>>(x, y, a);
  OPS_CHECK_LAUNCH();
}
