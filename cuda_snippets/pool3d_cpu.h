// pool3d_cpu.h: the MaxPool3D CPU path (jt.code cpu_src of ops/pool3d.py). Includes cpu_common.h first.
//
// Forward: a separable maximum over each (n, c) plane in three passes, D, then H, then W: pass D reduces the
// kd window slices of output slice od to one H x W slice, pass H its kh window rows of output row oh to one row,
// pass W each output's kw columns. An output costs kd + kh + kw taps instead of kd * kh * kw, and the D and H
// passes run over contiguous rows (they vectorize). The maximum is taken on integer keys of the bits that order
// like the values (negative values have their magnitude bits flipped), with every NaN mapped to the largest key:
// "a NaN takes over" costs no branch, and the 16-bit types are never converted.
//   * values only: the key is an involution of the bits, so the winner's bits come back from its key; a window
//     whose maximum is a zero takes its first zero's sign (keep_first_zero);
//   * with indices: each pass also carries the candidate's flat position in the plane and breaks ties on it
//     (PyTorch's scan order (d, h, w): the first maximum wins, among NaNs the last), so the passes' order does
//     not matter; -0 and +0 share a key (they compare equal), and the value is read back at the position.
// A window without elements yields -inf and index -1.
//
// Backward from the saved indices: dx zeroed, then each output's dy goes to dx at its index, outputs in order.
// Each element thus sums its windows' dy in (od, oh, ow) order, the order of the GPU's gather
// (pool3d_gather.cuh), from 0: the same dx bit for bit. Disjoint windows copy dy; overlapping ones add in the
// accumulator type (a float plane for the 16-bit types, rounded to nearest even once at the end).
//
// Geometry: sizes from the shapes, the window from `data["g"]`: the 12 parameters (kernel, stride, padding,
// dilation; d, h, w each) as 4-bit fields (one lookup: each costs ~20 ns), or -1 and four entries "gk", "gs",
// "gp", "gd" of three 17-bit fields when a parameter is 16 or more (ops/pool3d.py: cpu_geometry_data).
#pragma once
// "# include": jittor scans a source's `#include "..."` lines and looks for each file in its own folders only;
// this form it leaves to the compiler, which finds the file beside this one (ops/_codegen.py: cpu_include
// hashes both files into the header line, so an edit of either still recompiles).
# include "cpu_common.h"
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

namespace pool3d_cpu {

struct Geom {
  int D, H, W, Do, Ho, Wo;
  int kd, kh, kw, sd, sh, sw, pd, ph, pw, dd, dh, dw;
};

inline void unpack3(long long v, int bits, int& a, int& b, int& c) {
  const long long mask = (1ll << bits) - 1;
  a = (int)(v & mask);
  b = (int)((v >> bits) & mask);
  c = (int)((v >> (2 * bits)) & mask);
}

template <typename Map>
inline Geom geom(long long D, long long H, long long W, long long Do, long long Ho, long long Wo, Map& data) {
  Geom g;
  g.D = (int)D; g.H = (int)H; g.W = (int)W; g.Do = (int)Do; g.Ho = (int)Ho; g.Wo = (int)Wo;
  // A CPU launch's data is {"g"} alone unless a parameter is 16 or more; a one-entry map is read without
  // building and hashing the key (~200 instructions, a sixth of a tiny pooling's call).
  const auto first = data.begin();
  const double packed = data.size() == 1 && first->first == "g" ? first->second : ops_cpu::need(data, "g");
  if (packed >= 0) {
    const long long v = (long long)packed;
    unpack3(v, 4, g.kd, g.kh, g.kw);
    unpack3(v >> 12, 4, g.sd, g.sh, g.sw);
    unpack3(v >> 24, 4, g.pd, g.ph, g.pw);
    unpack3(v >> 36, 4, g.dd, g.dh, g.dw);
  } else {
    unpack3((long long)ops_cpu::need(data, "gk"), 17, g.kd, g.kh, g.kw);
    unpack3((long long)ops_cpu::need(data, "gs"), 17, g.sd, g.sh, g.sw);
    unpack3((long long)ops_cpu::need(data, "gp"), 17, g.pd, g.ph, g.pw);
    unpack3((long long)ops_cpu::need(data, "gd"), 17, g.dd, g.dh, g.dw);
  }
  return g;
}

// Taps i of a window starting at t0 (kernel k, dilation dl) inside [0, n): i in [lo, hi) (empty when lo >= hi).
// Undilated windows need no division (a division by a run-time value costs ~20-40 cycles, as much as a tiny
// window's whole pass).
inline void taps(int t0, int k, int dl, int n, int& lo, int& hi) {
  if (dl == 1) {
    lo = t0 >= 0 ? 0 : -t0;
    hi = std::min(k, n - t0);
    return;
  }
  lo = t0 >= 0 ? 0 : (-t0 + dl - 1) / dl;
  hi = t0 > n - 1 ? 0 : std::min(k, (n - 1 - t0) / dl + 1);
}

// Keys: S is the signed integer of T's width, inf() the bits of +infinity, A an aliasing view of T as S.
template <typename T> struct Key;
template <> struct Key<float> {
  typedef int32_t S;
  typedef ops_cpu::alias_i32 A;
  static S inf() { return 0x7f800000; }
};
template <> struct Key<double> {
  typedef int64_t S;
  typedef ops_cpu::alias_i64 A;
  static S inf() { return 0x7ff0000000000000ll; }
};
template <> struct Key<jittor::float16> {
  typedef int16_t S;
  typedef ops_cpu::alias_i16 A;
  static S inf() { return 0x7c00; }
};
template <> struct Key<jittor::bfloat16> {
  typedef int16_t S;
  typedef ops_cpu::alias_i16 A;
  static S inf() { return 0x7f80; }
};

// The values path's key: order-preserving, an involution on every non-NaN bit pattern; NaN -> the largest.
template <typename S> inline S key_of(S s, S inf) {
  const S top = std::numeric_limits<S>::max();
  const S mag = (S)(s & top);
  const S k = (S)(s ^ (S)((s >> (8 * sizeof(S) - 1)) & top));
  return mag > inf ? top : k;
}
template <typename S> inline S bits_of_key(S k) {
  return (S)(k ^ (S)((k >> (8 * sizeof(S) - 1)) & std::numeric_limits<S>::max()));
}
// The indices path's key: as key_of, but -0 and +0 share key 0 (they compare equal: the earlier one stays).
template <typename S> inline S tie_key_of(S s, S inf) {
  const S top = std::numeric_limits<S>::max();
  const S mag = (S)(s & top);
  const S k = s < 0 ? (S)((S)(s ^ top) + 1) : s;
  return mag > inf ? top : k;
}

// With indices: does candidate (k, p) replace (bk, bp)? A larger key; among equal keys the earlier position,
// or the later one for NaN (a NaN takes over from every earlier element, NaN included).
template <typename S> inline bool takes_over(S k, int p, S bk, int bp) {
  return k > bk || (k == bk && (k == std::numeric_limits<S>::max() ? p > bp : p < bp));
}

// Pass W of the values path over `rows` slab rows (stride wp) into consecutive output rows: output ow takes the
// maximum of columns ow * SW .. ow * SW + KW - 1 of its padded row; compile-time KW and SW for the common
// undilated layers. One dispatch per slab, not per row: rows are short.
template <int KW, int SW, typename S, typename A>
inline void pass_w(const S* hk, int wp, A* ys, int wo, int rows) {
  for (int r = 0; r < rows; ++r, hk += wp, ys += wo) {
    for (int ow = 0; ow < wo; ++ow) {
      S m = hk[ow * SW];
      for (int k = 1; k < KW; ++k) m = hk[ow * SW + k] > m ? hk[ow * SW + k] : m;
      ys[ow] = bits_of_key<S>(m);
    }
  }
}
// Run-time stride and dilation, compile-time KW (the taps unrolled).
template <int KW, typename S, typename A>
inline void pass_w_strided(const S* hk, int wp, A* ys, int wo, int rows, int sw, int dw) {
  for (int r = 0; r < rows; ++r, hk += wp, ys += wo) {
    for (int ow = 0; ow < wo; ++ow) {
      const S* c = hk + ow * sw;
      S m = c[0];
      for (int k = 1; k < KW; ++k) m = c[k * dw] > m ? c[k * dw] : m;
      ys[ow] = bits_of_key<S>(m);
    }
  }
}
template <typename S, typename A> inline void pass_w(const S* hk, int wp, A* ys, const Geom& g) {
  if (g.dw == 1) {
    switch (g.kw * 16 + g.sw) {
      case 2 * 16 + 2: return pass_w<2, 2>(hk, wp, ys, g.Wo, g.Ho);
      case 2 * 16 + 1: return pass_w<2, 1>(hk, wp, ys, g.Wo, g.Ho);
      case 3 * 16 + 1: return pass_w<3, 1>(hk, wp, ys, g.Wo, g.Ho);
      case 3 * 16 + 2: return pass_w<3, 2>(hk, wp, ys, g.Wo, g.Ho);
      case 3 * 16 + 3: return pass_w<3, 3>(hk, wp, ys, g.Wo, g.Ho);
      case 1 * 16 + 1: return pass_w<1, 1>(hk, wp, ys, g.Wo, g.Ho);
      default: break;
    }
  }
  switch (g.kw) {
    case 1: return pass_w_strided<1>(hk, wp, ys, g.Wo, g.Ho, g.sw, g.dw);
    case 2: return pass_w_strided<2>(hk, wp, ys, g.Wo, g.Ho, g.sw, g.dw);
    case 3: return pass_w_strided<3>(hk, wp, ys, g.Wo, g.Ho, g.sw, g.dw);
    case 4: return pass_w_strided<4>(hk, wp, ys, g.Wo, g.Ho, g.sw, g.dw);
    default: break;
  }
  for (int r = 0; r < g.Ho; ++r, hk += wp, ys += g.Wo) {
    for (int ow = 0; ow < g.Wo; ++ow) {
      const int c0 = ow * g.sw;
      S m = hk[c0];
      for (int k = 1; k < g.kw; ++k) {
        const S v = hk[c0 + k * g.dw];
        m = v > m ? v : m;
      }
      ys[ow] = bits_of_key<S>(m);
    }
  }
}

// A window whose maximum is a zero outputs its first zero, with its sign (-0.0 and +0.0 compare equal: the
// first of equal maxima is kept): the values path's keys order -0 below +0, so such outputs (rare: every element
// of the window at most zero, one of them a zero) are looked up again in the window, in scan order.
template <typename T>
inline void keep_first_zero(const typename Key<T>::A* xs, typename Key<T>::A* ys, const Geom& g, int od) {
  typedef typename Key<T>::S S;
  const S top = std::numeric_limits<S>::max();
  int d0, d1;
  taps(od * g.sd - g.pd, g.kd, g.dd, g.D, d0, d1);
  for (int oh = 0; oh < g.Ho; ++oh)
    for (int ow = 0; ow < g.Wo; ++ow) {
      if ((S)(ys[oh * g.Wo + ow] & top) != 0) continue;
      int h0, h1, w0, w1;
      taps(oh * g.sh - g.ph, g.kh, g.dh, g.H, h0, h1);
      taps(ow * g.sw - g.pw, g.kw, g.dw, g.W, w0, w1);
      bool found = false;
      for (int i = d0; i < d1 && !found; ++i)
        for (int j = h0; j < h1 && !found; ++j)
          for (int k = w0; k < w1 && !found; ++k) {
            const long long at = ((long long)(od * g.sd - g.pd + i * g.dd) * g.H + oh * g.sh - g.ph + j * g.dh) * g.W +
                                 ow * g.sw - g.pw + k * g.dw;
            if ((S)(xs[at] & top) == 0) {
              ys[oh * g.Wo + ow] = xs[at];
              found = true;
            }
          }
    }
}

// Elementwise merges of n candidates into the running maxima (the passes' inner loops: contiguous, no branch).
template <typename S> inline void merge_values(S* best, const S* cand, int n) {
  for (int i = 0; i < n; ++i) best[i] = cand[i] > best[i] ? cand[i] : best[i];
}
template <typename S> inline void merge_indexed(S* best, int* bpos, const S* cand, const int* cpos, int n) {
  for (int i = 0; i < n; ++i) {
    const bool take = takes_over<S>(cand[i], cpos[i], best[i], bpos[i]);
    best[i] = take ? cand[i] : best[i];
    bpos[i] = take ? cpos[i] : bpos[i];
  }
}

// Scratch of one call: the D pass's slice (H x W keys and positions) and the H pass's slab (Ho rows of the
// padded width wp = pw + W + right: columns -pw .. W + right - 1, the pads holding the empty key).
template <typename S> struct Work {
  S* dk;
  int* dp;
  S* hk;
  int* hp;
  int* htaps;  // each output row's valid window rows [htaps[2 oh], htaps[2 oh + 1]) (taps divides when dilated)
  int wp;
};

// One plane. MODE bit 1: write the values (y), bit 2: the indices (yi).
template <typename T, int MODE>
inline void forward_plane(const T* x, T* y, int* yi, const Geom& g, const Work<typename Key<T>::S>& wk) {
  typedef typename Key<T>::S S;
  typedef typename Key<T>::A A;
  const bool IDX = (MODE & 2) != 0;
  const S inf = Key<T>::inf();
  const S neg_inf = (S)(inf | std::numeric_limits<S>::min());
  // values: an empty tap set is -inf; with indices the sentinel lies below every element's key, -inf's included
  const S empty = IDX ? std::numeric_limits<S>::min() : key_of<S>(neg_inf, inf);
  const S nan_key = std::numeric_limits<S>::max();
  const int HW = g.H * g.W, wp = wk.wp;
  const A* xs = reinterpret_cast<const A*>(x);
  S* dk = wk.dk;
  int* dp = wk.dp;
  // pass H over whole slabs when output rows are consecutive input rows and the slab has no pads: one tap is
  // then one contiguous run of Ho * W elements (rows are often 10-60 elements: too short to vectorize alone)
  const bool flat_h = g.sh == 1 && g.dh == 1 && wp == g.W;
  for (int od = 0; od < g.Do; ++od) {
    // pass D: the slice's maximum over the window's valid slices, in d order
    int i0, i1;
    taps(od * g.sd - g.pd, g.kd, g.dd, g.D, i0, i1);
    if (i0 >= i1) {
      for (int j = 0; j < HW; ++j) { dk[j] = empty; if (IDX) dp[j] = -1; }
    }
    for (int i = i0; i < i1; ++i) {
      const int d = od * g.sd - g.pd + i * g.dd, base = d * HW;
      const A* r = xs + (long long)base;
      if (!IDX) {
        if (i == i0) {
          for (int j = 0; j < HW; ++j) dk[j] = key_of<S>(r[j], inf);
        } else {
          for (int j = 0; j < HW; ++j) {
            const S k = key_of<S>(r[j], inf);
            dk[j] = k > dk[j] ? k : dk[j];
          }
        }
      } else if (i == i0) {
        for (int j = 0; j < HW; ++j) { dk[j] = tie_key_of<S>(r[j], inf); dp[j] = base + j; }
      } else {
        for (int j = 0; j < HW; ++j) {  // a later slice: the larger key or a NaN takes over
          const S k = tie_key_of<S>(r[j], inf);
          const bool take = k > dk[j] || k == nan_key;
          dk[j] = take ? k : dk[j];
          dp[j] = take ? base + j : dp[j];
        }
      }
    }
    // pass H: each output row's maximum over its window rows, into the slab
    if (flat_h) {
      const int n = g.Ho * g.W;
      if (g.ph > 0) {
        for (int i = 0; i < n; ++i) { wk.hk[i] = empty; if (IDX) wk.hp[i] = -1; }
      }
      for (int j = 0; j < g.kh; ++j) {
        const int oh0 = std::max(0, g.ph - j), oh1 = std::min(g.Ho, g.H + g.ph - j);
        if (oh0 >= oh1) continue;
        const int src = (oh0 - g.ph + j) * g.W, dst = oh0 * g.W, len = (oh1 - oh0) * g.W;
        if (j == 0 && g.ph == 0) {
          std::memcpy(wk.hk, dk, sizeof(S) * len);
          if (IDX) std::memcpy(wk.hp, dp, sizeof(int) * len);
        } else if (IDX) {
          merge_indexed<S>(wk.hk + dst, wk.hp + dst, dk + src, dp + src, len);
        } else {
          merge_values<S>(wk.hk + dst, dk + src, len);
        }
      }
    } else {
      for (int oh = 0; oh < g.Ho; ++oh) {
        S* hrow = wk.hk + oh * wp + g.pw;
        int* hpos = IDX ? wk.hp + oh * wp + g.pw : nullptr;
        const int j0 = wk.htaps[2 * oh], j1 = wk.htaps[2 * oh + 1];
        if (j0 >= j1) {
          for (int w = 0; w < g.W; ++w) { hrow[w] = empty; if (IDX) hpos[w] = -1; }
        }
        for (int j = j0; j < j1; ++j) {
          const int src = (oh * g.sh - g.ph + j * g.dh) * g.W;
          if (j == j0) {
            std::memcpy(hrow, dk + src, sizeof(S) * g.W);
            if (IDX) std::memcpy(hpos, dp + src, sizeof(int) * g.W);
          } else if (IDX) {
            merge_indexed<S>(hrow, hpos, dk + src, dp + src, g.W);
          } else {
            merge_values<S>(hrow, dk + src, g.W);
          }
        }
      }
    }
    // pass W: each output's maximum over its columns of the padded row
    if (!IDX) {
      A* ys = reinterpret_cast<A*>(y + (long long)od * g.Ho * g.Wo);
      pass_w<S>(wk.hk, wp, ys, g);
      keep_first_zero<T>(xs, ys, g, od);
      continue;
    }
    for (int oh = 0; oh < g.Ho; ++oh) {
      const S* hk = wk.hk + oh * wp;
      const long long o0 = ((long long)od * g.Ho + oh) * g.Wo;
      const int* hp = wk.hp + oh * wp;
      for (int ow = 0; ow < g.Wo; ++ow) {
        const int c0 = ow * g.sw;
        S bk = hk[c0];
        int bp = hp[c0];
        for (int k = 1; k < g.kw; ++k) {
          const int c = c0 + k * g.dw;
          if (takes_over<S>(hk[c], hp[c], bk, bp)) { bk = hk[c]; bp = hp[c]; }
        }
        if (MODE & 1) reinterpret_cast<A*>(y)[o0 + ow] = bp >= 0 ? xs[bp] : neg_inf;
        yi[o0 + ow] = bp;
      }
    }
  }
}

// Columns past the input's right edge the W pass may read (ceil_mode's last windows, padding): they hold -inf.
inline int right_pad(const Geom& g) {
  return std::max(0, (g.Wo - 1) * g.sw + (g.kw - 1) * g.dw + 1 - g.pw - g.W);
}

// The scratch of a call: on the stack when it is small (a tiny pooling's whole call is ~100 ns; a thread_local
// buffer costs two TLS lookups), else per-thread buffers kept between calls.
const int STACK_SCRATCH_BYTES = 4096;

template <typename S> inline Work<S> make_work(const Geom& g, bool indices, unsigned char* stack) {
  Work<S> w;
  w.wp = g.pw + g.W + right_pad(g);
  const size_t HW = (size_t)g.H * g.W, slab = (size_t)g.Ho * w.wp, rows = 2 * (size_t)g.Ho;
  const size_t bytes = (HW + slab) * (sizeof(S) + (indices ? sizeof(int) : 0)) + rows * sizeof(int) + 64;
  if (bytes <= (size_t)STACK_SCRATCH_BYTES) {
    size_t at = 0;
    w.dk = reinterpret_cast<S*>(stack);
    at += (HW * sizeof(S) + 7) & ~(size_t)7;
    w.hk = reinterpret_cast<S*>(stack + at);
    at += (slab * sizeof(S) + 7) & ~(size_t)7;
    w.htaps = reinterpret_cast<int*>(stack + at);
    at += rows * sizeof(int);
    w.dp = indices ? reinterpret_cast<int*>(stack + at) : nullptr;
    at += HW * sizeof(int);
    w.hp = indices ? reinterpret_cast<int*>(stack + at) : nullptr;
  } else {
    w.dk = ops_cpu::scratch<S, 0>(HW);
    w.hk = ops_cpu::scratch<S, 1>(slab);
    w.dp = indices ? ops_cpu::scratch<int, 2>(HW) : nullptr;
    w.hp = indices ? ops_cpu::scratch<int, 3>(slab) : nullptr;
    w.htaps = ops_cpu::scratch<int, 5>(rows);
  }
  for (int oh = 0; oh < g.Ho; ++oh) taps(oh * g.sh - g.ph, g.kh, g.dh, g.H, w.htaps[2 * oh], w.htaps[2 * oh + 1]);
  return w;
}

// The pads of the slab's rows never change: filled once per call.
template <typename T> inline void fill_pads(const Geom& g, const Work<typename Key<T>::S>& w, bool indices) {
  typedef typename Key<T>::S S;
  const S neg_inf = (S)(Key<T>::inf() | std::numeric_limits<S>::min());
  const S empty = indices ? std::numeric_limits<S>::min() : key_of<S>(neg_inf, Key<T>::inf());
  if (w.wp == g.W) return;
  for (int oh = 0; oh < g.Ho; ++oh) {
    for (int c = 0; c < w.wp; ++c) {
      if (c >= g.pw && c < g.pw + g.W) continue;
      w.hk[oh * w.wp + c] = empty;
      if (indices) w.hp[oh * w.wp + c] = -1;
    }
  }
}

// Whether a float or double plane of n elements holds a NaN (a vectorized scan of the bits).
template <typename T> inline bool has_nan(const T* x, long long n) {
  typedef typename Key<T>::S S;
  typedef typename Key<T>::A A;
  const A* xs = reinterpret_cast<const A*>(x);
  const S top = std::numeric_limits<S>::max(), inf = Key<T>::inf();
  S worst = 0;
  for (long long i = 0; i < n; ++i) {
    const S mag = (S)(xs[i] & top);
    worst = mag > worst ? mag : worst;
  }
  return worst > inf;
}

// One plane of a float or double without NaN, window by window (taps in scan order (d, h, w), unrolled: the
// window is a template argument), comparing the values themselves (no keys: without NaN, float order is the
// keys' order; ties keep the first maximum). For planes whose rows are too short for the passes' vector loops
// and small windows that barely overlap (see SCAN_MAX_W).
template <typename T, int MODE, int KD, int KH, int KW>
inline void forward_plane_scan(const T* x, T* y, int* yi, const Geom& g) {
  const int HW = g.H * g.W, step_d = g.dd * HW, step_h = g.dh * g.W;
  long long o = 0;
  for (int od = 0; od < g.Do; ++od)
    for (int oh = 0; oh < g.Ho; ++oh) {
      const T* row = x + od * g.sd * HW + oh * g.sh * g.W;
      for (int ow = 0; ow < g.Wo; ++ow, ++o) {
        const T* win = row + ow * g.sw;
        T best = win[0];
        int pos = 0;
        for (int i = 0; i < KD; ++i)
          for (int j = 0; j < KH; ++j)
            for (int k = 0; k < KW; ++k) {
              const int at = i * step_d + j * step_h + k * g.dw;
              const T v = win[at];
              pos = v > best ? at : pos;
              best = v > best ? v : best;
            }
        if (MODE & 1) y[o] = win[pos];  // the first of equal maxima, with its sign
        if (MODE & 2) yi[o] = (int)(win - x) + pos;
      }
    }
}

// Every window inside the input: no padding, and the last window of each dim ends at or before its edge.
inline bool windows_inside(const Geom& g) {
  return g.pd == 0 && g.ph == 0 && g.pw == 0 && (g.Do - 1) * g.sd + (g.kd - 1) * g.dd < g.D &&
         (g.Ho - 1) * g.sh + (g.kh - 1) * g.dh < g.H && (g.Wo - 1) * g.sw + (g.kw - 1) * g.dw < g.W;
}

// The scan takes the 2x2x2 and 3x3x3 windows at strides of 2 or more on planes of rows shorter than SCAN_MAX_W
// elements. Callgrind, float32 values, instructions per call, passes -> scan: (1,1,4,4,4) k2s2 1312 -> 793
// (jittor's own kernel: 1287); (2,3,6,6,7) k2s2 18228 -> 8443; (2,3,6,6,6) k3s3 11976 -> 7543; (2,3,7,7,7)
// k3s2 25284 -> 18823. The passes stay ahead at stride 1 ((2,3,6,6,6) k2s1 26358 against 34039, k3s1 19344
// against 35023) and for run-time windows (a k(2,1,2)s1 scan: 120607 against 25488).
const int SCAN_MAX_W = 8;

template <typename T, int MODE>
void forward(const T* x, T* y, int* yi, long long planes, const Geom& g) {
  typedef typename Key<T>::S S;
  const long long plane_in = (long long)g.D * g.H * g.W, plane_out = (long long)g.Do * g.Ho * g.Wo;
  const int window = g.kd * 100 + g.kh * 10 + g.kw;
  const bool scan = sizeof(S) >= 4 && g.W < SCAN_MAX_W && (window == 222 || window == 333) && g.sd >= 2 &&
                    g.sh >= 2 && g.sw >= 2 && windows_inside(g);
  alignas(64) unsigned char stack[STACK_SCRATCH_BYTES];
  bool ready = false;  // the passes' scratch, made for the first plane that needs them
  Work<S> w;
  for (long long p = 0; p < planes; ++p) {
    const T* xp = x + p * plane_in;
    int* yip = (MODE & 2) ? yi + p * plane_out : nullptr;
    if (scan && !has_nan(xp, plane_in)) {
      T* yp = y + p * plane_out;
      if (window == 222) forward_plane_scan<T, MODE, 2, 2, 2>(xp, yp, yip, g);
      else forward_plane_scan<T, MODE, 3, 3, 3>(xp, yp, yip, g);
      continue;
    }
    if (!ready) {
      w = make_work<S>(g, (MODE & 2) != 0, stack);
      fill_pads<T>(g, w, (MODE & 2) != 0);
      ready = true;
    }
    forward_plane<T, MODE>(xp, y + p * plane_out, yip, g, w);
  }
}

// dx from the saved indices (int32 positions in each plane, -1 for a window without elements). ADD: windows
// overlap (an element may be several windows' argmax); otherwise each element takes at most one dy.
template <typename T, bool ADD>
void backward_indices(const int* idx, const T* dy, T* dx, long long planes, long long plane_in,
                      long long plane_out) {
  typedef typename ops_cpu::Acc<T>::type Acc;
  const bool WIDE = sizeof(Acc) > sizeof(T);  // 16-bit types: sum in a float plane, round once
  if (!(ADD && WIDE)) std::memset((void*)dx, 0, sizeof(T) * planes * plane_in);
  Acc* acc = (ADD && WIDE) ? ops_cpu::scratch<Acc, 0>(plane_in) : nullptr;
  for (long long p = 0; p < planes; ++p) {
    const int* ip = idx + p * plane_out;
    const T* gp = dy + p * plane_out;
    T* xp = dx + p * plane_in;
    if (!ADD) {
      for (long long o = 0; o < plane_out; ++o)
        if (ip[o] >= 0) xp[ip[o]] = gp[o];
    } else if (!WIDE) {
      for (long long o = 0; o < plane_out; ++o)
        if (ip[o] >= 0) xp[ip[o]] = (T)(ops_cpu::to_acc(xp[ip[o]]) + ops_cpu::to_acc(gp[o]));
    } else {
      std::memset((void*)acc, 0, sizeof(Acc) * plane_in);
      for (long long o = 0; o < plane_out; ++o)
        if (ip[o] >= 0) acc[ip[o]] += ops_cpu::to_acc(gp[o]);
      for (long long i = 0; i < plane_in; ++i) xp[i] = ops_cpu::from_acc<T>(acc[i]);
    }
  }
}

}  // namespace pool3d_cpu
