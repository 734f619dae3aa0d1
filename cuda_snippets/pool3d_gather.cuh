// pool3d_gather.cuh: the MaxPool3D backward for overlapping windows (bwd_gather), shared by the CUDA kernel
// and the CPU path so that the CPU tests exercise the GPU's index math.
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

#ifdef __CUDACC__
#define POOL3D_GATHER_FN __host__ __device__ __forceinline__
#define POOL3D_GATHER_UNROLL _Pragma("unroll")
#else
#define POOL3D_GATHER_FN static inline
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

// Sums into acc[0 .. n) the dy of every window whose saved argmax is one of the run's n elements.
// ip, gp: the plane's saved indices and dy; LOAD converts one dy value to A.
template <typename A, int RUN, typename T, class Win, class Load>
POOL3D_GATHER_FN void pool3d_gather_run(const Win& win, const Pool3dGatherDims& g, const int* ip, const T* gp,
                                        int id, int ih, int w0, int n, A (&acc)[RUN], Load load) {
  POOL3D_GATHER_UNROLL
  for (int r = 0; r < RUN; ++r) acc[r] = A(0);
  const int td = id + g.pd, th = ih + g.ph, tw = w0 + g.pw;
  const int pos0 = (id * g.H + ih) * g.W + w0;
  int d_lo, d_hi, h_lo, h_hi, w_lo, w_hi;
  pool3d_gather_range(td, td, win.kd, win.sd, win.dd, g.Do, d_lo, d_hi);
  pool3d_gather_range(th, th, win.kh, win.sh, win.dh, g.Ho, h_lo, h_hi);
  pool3d_gather_range(tw, tw + n - 1, win.kw, win.sw, win.dw, g.Wo, w_lo, w_hi);
  for (int od = d_lo; od <= d_hi; ++od) {
    if (win.dd != 1 && (td - od * win.sd) % win.dd != 0) continue;
    for (int oh = h_lo; oh <= h_hi; ++oh) {
      if (win.dh != 1 && (th - oh * win.sh) % win.dh != 0) continue;
      const int orow = (od * g.Ho + oh) * g.Wo;
      for (int ow = w_lo; ow <= w_hi; ++ow) {
        const int r = ip[orow + ow] - pos0;
        if ((unsigned int)r >= (unsigned int)n) continue;
        const A v = load(gp + orow + ow);
        POOL3D_GATHER_UNROLL
        for (int q = 0; q < RUN; ++q) {
          if (q == r) acc[q] = acc[q] + v;
        }
      }
    }
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

template <typename T> struct Pool3dGatherLoad {
  __device__ __forceinline__ typename Pool3dAcc<T>::type operator()(const T* p) const { return pool3d_acc(*p); }
};

// Writes run `item` (plane, id, ih, run) of dx: the gathered sums of its up to RUN elements; vec_ok (the
// launch's W % RUN == 0 and an aligned dx): every run is whole and RUN-aligned, stored as one vector.
template <typename T, typename I, class Win, int RUN>
__device__ __forceinline__ void pool3d_gather_item(I item, const int* __restrict__ idx, const T* __restrict__ dy,
                                                   T* __restrict__ dx, const Pool3dArgs<I>& a,
                                                   const Pool3dGatherDims& gd, bool vec_ok, const Win& win) {
  I plane;
  int id, ih, run;
  pool3d_split(a, item, plane, id, ih, run);
  const int w0 = run * RUN;
  const int n = pool3d_min(RUN, gd.W - w0);
  typedef typename Pool3dAcc<T>::type A;
  A acc[RUN];
  pool3d_gather_run<A, RUN>(win, gd, idx + plane * a.plane_out, dy + plane * a.plane_out, id, ih, w0, n, acc,
                            Pool3dGatherLoad<T>());
  T* __restrict__ dp = dx + plane * a.plane_in + (I)(id * gd.H + ih) * gd.W + w0;
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

// One thread per run of RUN elements of an input row.
template <typename T, typename I, class Win, int RUN, int BLOCK>
__global__ void __launch_bounds__(BLOCK) pool3d_bwd_gather(const int* __restrict__ idx, const T* __restrict__ dy,
                                                           T* __restrict__ dx, const Pool3dArgs<I> a,
                                                           const Pool3dGatherDims gd, const bool vec_ok,
                                                           const Win win) {
  const I item = (I)blockIdx.x * BLOCK + threadIdx.x;
  if (item >= a.total) return;
  pool3d_gather_item<T, I, Win, RUN>(item, idx, dy, dx, a, gd, vec_ok, win);
}

// The sparse gather, for windows that overlap so much that most of the windows a run reads do not point into
// it (k8s1: each element lies in 512 windows, and few elements are any window's maximum). Three passes,
// each deterministic: (1) every window flags the run holding its argmax (a byte; racing writers write the
// same 1); (2) a thread per run zeroes an unflagged run, or lists a flagged one; (3) a thread per listed run
// gathers it exactly as pool3d_bwd_gather does. The list's order depends on the scheduling, but each run's sum
// does not: every run is summed by one thread in the gather's fixed order, so dx is bit-identical to the dense
// gather's.
template <typename I, int RUN, int BLOCK>
__global__ void __launch_bounds__(BLOCK) pool3d_flag_runs(const int* __restrict__ idx, unsigned char* __restrict__ flags,
                                                          const I outputs, const Pool3dDiv<I> plane_out,
                                                          const Pool3dDiv<int> width, const int rows,
                                                          const int runs_per_row) {
  const I o = (I)blockIdx.x * BLOCK + threadIdx.x;
  if (o >= outputs) return;
  const int p = idx[o];
  if (p < 0) return;  // a window of padding only
  const I plane = plane_out.div(o);
  const int row = width.div(p);
  const int w = p - row * width.value();
  flags[((I)plane * rows + row) * runs_per_row + w / RUN] = 1;
}

template <typename T, typename I, int RUN, int BLOCK>
__global__ void __launch_bounds__(BLOCK) pool3d_list_runs(const unsigned char* __restrict__ flags, T* __restrict__ dx,
                                                          I* __restrict__ list, unsigned int* __restrict__ listed,
                                                          const Pool3dArgs<I> a, const int W, const bool vec_ok) {
  const I item = (I)blockIdx.x * BLOCK + threadIdx.x;
  const bool flagged = item < a.total && flags[item];
  const unsigned int lanes = __ballot_sync(0xffffffffu, flagged);
  if (lanes) {  // one atomic a warp; the order of the list does not reach dx
    const int lane = threadIdx.x & 31, leader = __ffs(lanes) - 1;
    unsigned int base = 0;
    if (lane == leader) base = atomicAdd(listed, (unsigned int)__popc(lanes));
    base = __shfl_sync(0xffffffffu, base, leader);
    if (flagged) list[base + __popc(lanes & ((1u << lane) - 1))] = item;
  }
  if (item >= a.total || flagged) return;
  I plane;
  int id, ih, run;
  pool3d_split(a, item, plane, id, ih, run);
  const int w0 = run * RUN;
  T* __restrict__ dp = dx + plane * a.plane_in + (I)(id * a.g.H + ih) * W + w0;
  if (vec_ok) {
    OpsVec<T, RUN> v;
#pragma unroll
    for (int r = 0; r < RUN; ++r) v.v[r] = pool3d_zero<T>();
    *reinterpret_cast<OpsVec<T, RUN>*>(dp) = v;
  } else {
    const int n = pool3d_min(RUN, W - w0);
    for (int r = 0; r < n; ++r) dp[r] = pool3d_zero<T>();
  }
}

template <typename T, typename I, class Win, int RUN, int BLOCK>
__global__ void __launch_bounds__(BLOCK) pool3d_gather_listed(const I* __restrict__ list,
                                                              const unsigned int* __restrict__ listed,
                                                              const int* __restrict__ idx, const T* __restrict__ dy,
                                                              T* __restrict__ dx, const Pool3dArgs<I> a,
                                                              const Pool3dGatherDims gd, const bool vec_ok,
                                                              const Win win) {
  const unsigned int i = blockIdx.x * BLOCK + threadIdx.x;
  if (i >= *listed) return;
  pool3d_gather_item<T, I, Win, RUN>(list[i], idx, dy, dx, a, gd, vec_ok, win);
}

// Device scratch of the sparse gather (flags, list, count), kept for the process and grown when a launch
// needs more: a cudaMalloc per launch would synchronize the device.
inline void* pool3d_scratch(size_t bytes) {
  static void* buffer = 0;
  static size_t capacity = 0;
  if (bytes > capacity) {
    if (buffer) CHECK(cudaSuccess == cudaFree(buffer));
    capacity = bytes + bytes / 4;
    CHECK(cudaSuccess == cudaMalloc(&buffer, capacity));
  }
  return buffer;
}

// The launcher: Win is a Pool3dWinC (compile-time window, checked against the geometry) or Pool3dWinR (the
// geometry's window at run time).
template <typename T, typename I, class Win, int RUN, int BLOCK>
void pool3d_bwd_gather_launch(const int* idx, const T* dy, T* dx, const Pool3dGeom& g, long long planes) {
  const Win win = pool3d_gather_window(g, Win());
  const Pool3dArgs<I> a = pool3d_args<I>(g, planes, ops_ceil_div(g.W, RUN), g.H, g.D);
  const Pool3dGatherDims gd = {g.H, g.W, g.Do, g.Ho, g.Wo, g.pd, g.ph, g.pw};
  const bool vec_ok = g.W % RUN == 0 && ((unsigned long long)dx) % (RUN * sizeof(T)) == 0;
  pool3d_bwd_gather<T, I, Win, RUN, BLOCK><<<pool3d_grid<I, BLOCK>(a), BLOCK>>>(idx, dy, dx, a, gd, vec_ok, win);
  OPS_CHECK_LAUNCH();
}

template <typename T, typename I, class Win, int RUN, int BLOCK>
void pool3d_bwd_sparse_launch(const int* idx, const T* dy, T* dx, const Pool3dGeom& g, long long planes) {
  const Win win = pool3d_gather_window(g, Win());
  const int runs_per_row = ops_ceil_div(g.W, RUN);
  const Pool3dArgs<I> a = pool3d_args<I>(g, planes, runs_per_row, g.H, g.D);
  const Pool3dGatherDims gd = {g.H, g.W, g.Do, g.Ho, g.Wo, g.pd, g.ph, g.pw};
  const bool vec_ok = g.W % RUN == 0 && ((unsigned long long)dx) % (RUN * sizeof(T)) == 0;
  const size_t flag_bytes = ((size_t)a.total + 15) / 16 * 16;
  char* scratch = (char*)pool3d_scratch(flag_bytes + 16 + (size_t)a.total * sizeof(I));
  unsigned char* flags = (unsigned char*)scratch;
  unsigned int* listed = (unsigned int*)(scratch + flag_bytes);
  I* list = (I*)(scratch + flag_bytes + 16);
  CHECK(cudaSuccess == cudaMemsetAsync(scratch, 0, flag_bytes + 16, 0));
  const I outputs = (I)(planes * a.plane_out);
  pool3d_flag_runs<I, RUN, BLOCK><<<(unsigned int)ops_ceil_div((long long)outputs, (long long)BLOCK), BLOCK>>>(
      idx, flags, outputs, Pool3dDiv<I>::make(a.plane_out), Pool3dDiv<int>::make(g.W), g.D * g.H, runs_per_row);
  OPS_CHECK_LAUNCH();
  pool3d_list_runs<T, I, RUN, BLOCK><<<pool3d_grid<I, BLOCK>(a), BLOCK>>>(flags, dx, list, listed, a, g.W, vec_ok);
  OPS_CHECK_LAUNCH();
  pool3d_gather_listed<T, I, Win, RUN, BLOCK><<<pool3d_grid<I, BLOCK>(a), BLOCK>>>(list, listed, idx, dy, dx, a, gd,
                                                                                    vec_ok, win);
  OPS_CHECK_LAUNCH();
}
#endif
