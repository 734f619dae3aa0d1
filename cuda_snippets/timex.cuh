// timex.cuh: RWKV time-mix (causal depthwise convolution), forward, grad_k and grad_w.
//
//   out[b,c,t]  = eps + sum_{u<=t} w[c, T-1-(t-u)] * k[b,c,u]           (fwd)
//   gk[b,c,u]   =       sum_{t>=u} w[c, T-1-(t-u)] * g[b,c,t]           (= fwd on time-reversed g, reversed)
//   gw[c,T-1-s] = sum_b sum_{t>=s} g[b,c,t] * k[b,c,t-s]                (lag s; reduced over b in the op)
//
// Contract (ops/time_mix.py select_config builds the parameters; it is the only caller):
//   * any B, C, T >= 1; T is tiled, so there is no limit on T beyond int32 positions;
//   * fwd: tile = 8 * threads / lanes_b and a multiple of 32; lanes_b in {1, 2, 4}; TM in {1, 2, 4};
//   * grad_w: tile = 16 * threads / lanes_b and a multiple of 32; lanes_b in {1, 2, 4, 8};
//   * threads a multiple of 32, at most TIMEX_FWD_MAX_THREADS / TIMEX_GW_MAX_THREADS (the launch bounds);
//     smem_bytes as select_config computes it.
// Accumulation is float32 for every input type; nothing is atomic; every output element is written once by
// one thread in a fixed order, so results are bit-identical run to run.
//
// The same per-block phase functions (stage -> compute -> store) run on the GPU, one thread each with
// __syncthreads() between phases, and on the CPU, where timex_*_host emulates a block by running each phase
// for every thread in turn (what a barrier guarantees). The CPU path is therefore the GPU index math.
#pragma once
// Includes stay unconditional: jittor inserts its JIT defines (in0_type, index_t...) after the last #include
// of the source, so an #include inside an #if branch hides them from the other branch.
#include <vector>

// Launch bounds (ops/time_mix.py keeps every launch within them): the largest forward block is a 1024-long
// tile with 4 batch lanes (512 threads), the largest grad_w block a 512-long tile with 8 lanes (256 threads).
// Tighter than 1024 so that ptxas may use up to 128 / 255 registers instead of 64.
#define TIMEX_FWD_MAX_THREADS 512
#define TIMEX_GW_MAX_THREADS 256

#ifdef __CUDACC__
#define TIMEX_FN __device__ __forceinline__
#define TIMEX_UNROLL _Pragma("unroll")
typedef float4 timex_f4;
template <typename T> TIMEX_FN float timex_load(const T* p) { return ops_to_float(*p); }
template <typename T> TIMEX_FN void timex_store(T* p, float v) { *p = ops_from_float<T>(v); }
#else
#define TIMEX_FN static inline
#define TIMEX_UNROLL
struct alignas(16) timex_f4 { float x, y, z, w; };
template <typename T> inline float timex_load(const T* p) { return (float)(*p); }
template <typename T> inline void timex_store(T* p, float v) { *p = ops_cpu_from<T>(v); }  // cpu_common.h
#endif

// 16-byte shared-memory load; every caller's offset is a multiple of 4 floats from a 16-byte aligned base.
TIMEX_FN timex_f4 timex_ld4(const float* p) { return *reinterpret_cast<const timex_f4*>(p); }

// ---------------------------------------------------------------------------------------------------------
// Forward (and grad_k with reverse = 1).
//
// Block (c, batch group, t-tile ti) computes out[b0 .. b0+BR) x [ti*tile, ti*tile + tile), BR = lanes_b * TM.
// It walks the u-chunks ui = 0..ti of the same length; chunk ui < ti is a full square, chunk ti the triangle.
// Shared memory per chunk: ks[BR][tile + 4] = k rows (zero past T and past B; row stride = 4 mod 32 words so
// the lanes_b rows read together sit in distinct banks) and ws[2 * tile] = w by lag, ws[j] = w[c, T-1-lag]
// with lag = (ti - ui - 1) * tile + j, zero outside [0, T); the terms u > t of the triangle's diagonal step are
// left out by selection (timex_fwd_step), since 0 * k is NaN for a k of Inf or NaN.
// Thread tid: batch lane bl = tid % lanes_b (rows bl + lanes_b * m, m < TM), t-lane tl = tid / lanes_b, which
// owns the 4-output groups tl and G-1-tl (G = tile / 4): in the triangle they take tl + 1 and G - tl steps,
// G + 1 together, so all threads of a block finish together. One step = 4 u values: TM 16-byte k loads (the
// lanes of a warp share them), one 16-byte w load (a 7-value sliding window in registers), 16 * TM FMAs.
// ---------------------------------------------------------------------------------------------------------
// The launch geometry both tiled kernels (forward, grad_w) take from `data` (ops/time_mix.py: KernelConfig.data).
struct TimexTiling {
  int B, C, T;
  int tile;     // t-tile (forward: u-chunk length; grad_w: s-tile = v-chunk length)
  int lanes_b;  // batch lanes per warp-row of threads (grad_w: batch rows per group)
  int ntiles;   // ceil(T / tile)
  int threads;  // forward: lanes_b * tile / 8; grad_w: lanes_b * tile / 16
  int smem_bytes;
};

template <class Map> inline void timex_read_tiling(TimexTiling& p, int B, int C, int T, Map& d) {
  p.B = B; p.C = C; p.T = T;
  p.tile = (int)d["tile"]; p.lanes_b = (int)d["lanes_b"]; p.ntiles = (int)d["ntiles"];
  p.threads = (int)d["threads"]; p.smem_bytes = (int)d["smem_bytes"];
}

struct TimexFwdParams : TimexTiling {
  int groups_b;  // batch groups: ceil(B / (lanes_b * TM))
  int reverse;   // 1: read k and write out time-reversed (grad_k)
  float eps;
};

template <class Map> inline TimexFwdParams timex_fwd_params(int B, int C, int T, Map& d) {
  TimexFwdParams p;
  timex_read_tiling(p, B, C, T, d);
  p.groups_b = (int)d["groups_b"]; p.reverse = (int)d["reverse"]; p.eps = (float)d["eps"];
  return p;
}

template <int TM> struct TimexFwdAcc { float a[2][TM][4]; };

// Block index -> (channel, first batch row, t-tile). The last t-tile (the most chunks) has the lowest
// blockIdx.y, so the heaviest blocks start first and the light ones fill the tail.
template <int TM>
TIMEX_FN void timex_fwd_block(const TimexFwdParams& p, int bx, int by, int& c, int& b0, int& ti) {
  c = bx / p.groups_b;
  b0 = (bx - c * p.groups_b) * p.lanes_b * TM;
  ti = p.ntiles - 1 - by;
}

template <int TM> TIMEX_FN void timex_fwd_zero(TimexFwdAcc<TM>& acc) {
  TIMEX_UNROLL for (int h = 0; h < 2; ++h)
    TIMEX_UNROLL for (int m = 0; m < TM; ++m)
      TIMEX_UNROLL for (int i = 0; i < 4; ++i) acc.a[h][m][i] = 0.f;
}

template <typename T, int TM, typename IT>
TIMEX_FN void timex_fwd_stage(float* sm, const T* w, const T* k, const TimexFwdParams& p, int c, int b0,
                              int ti, int ui, int tid, int nt) {
  const int TB = p.tile, BR = p.lanes_b * TM, KS = TB + 4;
  float* ks = sm;
  float* ws = sm + BR * KS;
  const int U0 = ui * TB;
  for (int r = 0; r < BR; ++r) {
    const int b = b0 + r;
    const bool valid = b < p.B;
    const T* krow = k + ((IT)(valid ? b : 0) * p.C + c) * p.T;
    for (int x = tid; x < TB; x += nt) {
      const int u = U0 + x;
      float v = 0.f;
      if (valid && u < p.T) v = timex_load(krow + (p.reverse ? p.T - 1 - u : u));
      ks[r * KS + x] = v;
    }
  }
  const int L0 = (ti - ui - 1) * TB;
  const T* wrow = w + (IT)c * p.T;
  for (int j = tid; j < 2 * TB; j += nt) {
    const int lag = L0 + j;
    ws[j] = (lag >= 0 && lag < p.T) ? timex_load(wrow + (p.T - 1 - lag)) : 0.f;
  }
}

// One u-step of a 4-output group: acc[m][i] += sum_j wv[3 + i - j] * k[m][j]. DIAGONAL: the triangle's last
// step (u and t in the same group), where the terms u > t (j > i) are left out by selection: their lags are
// negative (ws holds 0 there) but 0 * k is NaN for a k of Inf or NaN, which would reach earlier outputs.
template <int TM, bool DIAGONAL>
TIMEX_FN void timex_fwd_step(float (&acc)[TM][4], const float (&wv)[7], const float* kp, int row_stride) {
  TIMEX_UNROLL for (int m = 0; m < TM; ++m) {
    const timex_f4 kv4 = timex_ld4(kp + m * row_stride);
    const float kv[4] = {kv4.x, kv4.y, kv4.z, kv4.w};
    TIMEX_UNROLL for (int i = 0; i < 4; ++i)
      TIMEX_UNROLL for (int j = 0; j < 4; ++j)
        if (!DIAGONAL || j <= i) acc[m][i] += wv[3 + i - j] * kv[j];
  }
}

template <int TM>
TIMEX_FN void timex_fwd_compute(TimexFwdAcc<TM>& acc, const float* sm, const TimexFwdParams& p, int ti,
                                int ui, int tid) {
  const int TB = p.tile, LB = p.lanes_b, KS = TB + 4, G = TB / 4;
  const float* ks = sm;
  const float* ws = sm + LB * TM * KS;
  const int bl = tid % LB, tl = tid / LB;
  const float* kp = ks + bl * KS;
  TIMEX_UNROLL for (int h = 0; h < 2; ++h) {
    const int g = h == 0 ? tl : G - 1 - tl;
    if (ti * TB + 4 * g >= p.T) continue;  // the whole group lies past T
    const bool triangle = ti == ui;
    const int qend = triangle ? g : G;  // full steps; the triangle's diagonal step q = g follows
    // Output t = tg + i, input u = 4q + j (chunk-relative): lag offset (i - j) from ws[TB + 4(g - q)].
    const float* wp = ws + TB + 4 * g;
    timex_f4 hi = timex_ld4(wp);
    for (int q = 0; q < qend; ++q) {
      wp -= 4;
      const timex_f4 lo = timex_ld4(wp);
      const float wv[7] = {lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};  // wv[3 + i - j]
      timex_fwd_step<TM, false>(acc.a[h], wv, kp + 4 * q, LB * KS);
      hi = lo;
    }
    if (triangle) {  // hi = ws[TB .. TB + 4) here: lags 0..3; lo (negative lags) only feeds left-out terms
      const float wv[7] = {0.f, 0.f, 0.f, hi.x, hi.y, hi.z, hi.w};
      timex_fwd_step<TM, true>(acc.a[h], wv, kp + 4 * g, LB * KS);
    }
  }
}

template <typename T, int TM, typename IT>
TIMEX_FN void timex_fwd_store(const TimexFwdAcc<TM>& acc, T* out, const TimexFwdParams& p, int c, int b0,
                              int ti, int tid) {
  const int LB = p.lanes_b, G = p.tile / 4;
  const int bl = tid % LB, tl = tid / LB;
  TIMEX_UNROLL for (int h = 0; h < 2; ++h) {
    const int tg = ti * p.tile + 4 * (h == 0 ? tl : G - 1 - tl);
    TIMEX_UNROLL for (int m = 0; m < TM; ++m) {
      const int b = b0 + bl + LB * m;
      if (b >= p.B) continue;
      T* orow = out + ((IT)b * p.C + c) * p.T;
      TIMEX_UNROLL for (int i = 0; i < 4; ++i) {
        const int t = tg + i;
        if (t < p.T) timex_store(orow + (p.reverse ? p.T - 1 - t : t), acc.a[h][m][i] + p.eps);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// grad_w, in two kernels: partial[split][c][s] = sum over the split's batch rows, then
// gw[c][T-1-s] = sum over splits in order (grid-stride). No atomics.
//
// Block (c, split, s-tile si) walks its batch groups (lanes_b rows each) and, per group, the v-chunks
// vi = si..ntiles-1 (v = t of the formula); chunk si is the triangle (v >= s), later chunks are squares.
// Shared memory per (group, chunk): gs[lanes_b][tile + 4] = g rows (zero past T/B) and
// kw[lanes_b][2 * tile + 4] = k rows by position x = (vi - si - 1) * tile + j, zero outside [0, T).
// Thread tid: batch lane bl = tid % lanes_b (one row of the group), s-lane tl = tid / lanes_b owning the
// 8-lag groups tl and G-1-tl (G = tile / 8): triangle steps 2G - 2tl and 2tl + 2, 2G + 2 together.
// One step = 4 v values: one 16-byte g load, one 16-byte k load (an 11-value window in registers), 32 FMAs.
// At the end the lanes_b partial sums of each lag are added in lane order through shared memory.
// ---------------------------------------------------------------------------------------------------------
struct TimexGwParams : TimexTiling {
  int splits;            // batch splits (blocks per channel and s-tile)
  int groups_per_split;  // batch groups per split
};

template <class Map> inline TimexGwParams timex_gw_params(int B, int C, int T, Map& d) {
  TimexGwParams p;
  timex_read_tiling(p, B, C, T, d);
  p.splits = (int)d["splits"]; p.groups_per_split = (int)d["groups_per_split"];
  return p;
}

struct TimexGwAcc { float a[2][8]; };

TIMEX_FN void timex_gw_zero(TimexGwAcc& acc) {
  TIMEX_UNROLL for (int h = 0; h < 2; ++h)
    TIMEX_UNROLL for (int i = 0; i < 8; ++i) acc.a[h][i] = 0.f;
}

// Block index -> (channel, split, s-tile). s-tile 0 has the most chunks and the lowest blockIdx.y.
TIMEX_FN void timex_gw_block(const TimexGwParams& p, int bx, int by, int& c, int& sp, int& si) {
  c = bx / p.splits;
  sp = bx - c * p.splits;
  si = by;
}

template <typename T, typename IT>
TIMEX_FN void timex_gw_stage(float* sm, const T* k, const T* g, const TimexGwParams& p, int c, int b0, int si,
                             int vi, int tid, int nt) {
  const int SB = p.tile, LB = p.lanes_b, GS = SB + 4, KWS = 2 * SB + 4;
  float* gs = sm;
  float* kw = sm + LB * GS;
  const int V0 = vi * SB, L0 = (vi - si - 1) * SB;
  for (int r = 0; r < LB; ++r) {
    const int b = b0 + r;
    const bool valid = b < p.B;
    const IT row = ((IT)(valid ? b : 0) * p.C + c) * p.T;
    for (int x = tid; x < SB; x += nt) {
      const int v = V0 + x;
      gs[r * GS + x] = (valid && v < p.T) ? timex_load(g + row + v) : 0.f;
    }
    for (int j = tid; j < 2 * SB; j += nt) {
      const int x = L0 + j;
      kw[r * KWS + j] = (valid && x >= 0 && x < p.T) ? timex_load(k + row + x) : 0.f;
    }
  }
}

// One v-step of an 8-lag group: acc[i] += sum_j g[j] * k[8 + j - i] over the window f2 f1 f0 (k positions
// first + j - i), which then slides by 4. MASKED: a step holding terms outside the sum, k position < 0 (the
// triangle's first two steps) or v >= T (j >= vend, the step T ends in); they are left out by selection, not
// by the zeros staged there: 0 * k is NaN for a k of Inf or NaN, which would reach lags that never meet it.
template <bool MASKED>
TIMEX_FN void timex_gw_step(float (&acc)[8], timex_f4& f2, timex_f4& f1, const float*& kp, const float*& gp,
                            int first, int vend) {
  const timex_f4 f0 = timex_ld4(kp);
  const timex_f4 gv4 = timex_ld4(gp);
  const float kv[12] = {f2.x, f2.y, f2.z, f2.w, f1.x, f1.y, f1.z, f1.w, f0.x, f0.y, f0.z, f0.w};
  const float gv[4] = {gv4.x, gv4.y, gv4.z, gv4.w};
  TIMEX_UNROLL for (int i = 0; i < 8; ++i)
    TIMEX_UNROLL for (int j = 0; j < 4; ++j)
      if (!MASKED || (first + j - i >= 0 && j < vend)) acc[i] += gv[j] * kv[8 + j - i];
  f2 = f1;
  f1 = f0;
  kp += 4;
  gp += 4;
}

TIMEX_FN void timex_gw_compute(TimexGwAcc& acc, const float* sm, const TimexGwParams& p, int si, int vi,
                               int tid) {
  const int SB = p.tile, LB = p.lanes_b, GS = SB + 4, KWS = 2 * SB + 4, G = SB / 8;
  const float* gs = sm;
  const float* kw = sm + LB * GS;
  const int bl = tid % LB, tl = tid / LB;
  const int V0 = vi * SB;
  const int rest = (p.T - V0 + 3) / 4;
  const int qn = rest < SB / 4 ? rest : SB / 4;  // steps whose v lies before T
  const int whole = (p.T - V0) / 4;              // steps whose 4 v all lie before T
  TIMEX_UNROLL for (int h = 0; h < 2; ++h) {
    const int g = h == 0 ? tl : G - 1 - tl;
    if (si * SB + 8 * g >= p.T) continue;  // the whole group lies past T
    const int q0 = vi == si ? 2 * g : 0;     // triangle: v-steps from the group's own
    // Lag s = sg + i, v = 4q + j (chunk-relative): k position offset (j - i) from kw[SB + 4q - 8g], absolute
    // position (vi - si) * SB + 4 (q - 2g) + j - i.
    const float* kp = kw + bl * KWS + SB + 4 * q0 - 8 * g;
    const float* gp = gs + bl * GS + 4 * q0;
    // Masked steps are peeled off the loop (the triangle's first two, then the tail), so the lanes of a warp
    // do not diverge on them: predicted cost nil (as many FMA slots as before, a few predicates).
    const int q1 = vi == si ? (q0 + 2 < qn ? q0 + 2 : qn) : q0;
    const int q2 = whole < q1 ? q1 : whole < qn ? whole : qn;
    timex_f4 f2 = timex_ld4(kp - 8), f1 = timex_ld4(kp - 4);
    const int first0 = (vi - si) * SB - 8 * g, vend0 = p.T - V0;  // step q: first0 + 4q, vend0 - 4q
    int q = q0;
    for (; q < q1; ++q) timex_gw_step<true>(acc.a[h], f2, f1, kp, gp, first0 + 4 * q, vend0 - 4 * q);
    for (; q < q2; ++q) timex_gw_step<false>(acc.a[h], f2, f1, kp, gp, 0, 0);
    for (; q < qn; ++q) timex_gw_step<true>(acc.a[h], f2, f1, kp, gp, first0 + 4 * q, vend0 - 4 * q);
  }
}

// Phase 1 of the lane reduction: every thread parks its sums (red[16][threads], after a barrier).
TIMEX_FN void timex_gw_park(const TimexGwAcc& acc, float* red, int tid, int nt) {
  TIMEX_UNROLL for (int h = 0; h < 2; ++h)
    TIMEX_UNROLL for (int i = 0; i < 8; ++i) red[(h * 8 + i) * nt + tid] = acc.a[h][i];
}

// Phase 2: the lane-0 thread of each s-lane adds the lanes_b sums in lane order and writes the partial.
template <typename IT>
TIMEX_FN void timex_gw_flush(const float* red, float* partial, const TimexGwParams& p, int c, int sp, int si,
                             int tid, int nt) {
  const int LB = p.lanes_b, G = p.tile / 8;
  if (tid % LB != 0) return;
  const int tl = tid / LB;
  float* prow = partial + ((IT)sp * p.C + c) * p.T;
  TIMEX_UNROLL for (int h = 0; h < 2; ++h) {
    const int sg = si * p.tile + 8 * (h == 0 ? tl : G - 1 - tl);
    TIMEX_UNROLL for (int i = 0; i < 8; ++i) {
      if (sg + i >= p.T) continue;
      float s = 0.f;
      for (int l = 0; l < LB; ++l) s += red[(h * 8 + i) * nt + tid + l];
      prow[sg + i] = s;
    }
  }
}

template <typename T, typename IT>
TIMEX_FN void timex_gw_reduce_one(const float* partial, T* gw, const TimexGwParams& p, IT n) {
  const IT plane = (IT)p.C * p.T;
  const IT c = n / p.T;
  const int s = (int)(n - c * p.T);
  float sum = 0.f;
  for (int sp = 0; sp < p.splits; ++sp) sum += partial[sp * plane + n];
  timex_store(gw + c * p.T + (p.T - 1 - s), sum);
}

#ifdef __CUDACC__
// ---------------------------------------------------------------------------------------------------------
// CUDA kernels and launchers.
// ---------------------------------------------------------------------------------------------------------
// Above 48 KB of dynamic shared memory a kernel needs the opt-in (the single forward tiles of T > ~600 with
// 16 batch rows, grad_w's 512-long tiles with 8 rows). Raised once per kernel to the largest size seen, so
// the host call is not paid on every launch; ``raised`` is the calling launcher's own static (one per kernel).
template <typename Kernel> void timex_smem_opt_in(Kernel* kernel, int bytes, int& raised) {
  if (bytes > raised) {
    CHECK(cudaSuccess == cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    raised = bytes;
  }
}

template <typename T, int TM, typename IT>
__global__ void __launch_bounds__(TIMEX_FWD_MAX_THREADS)
timex_fwd_kernel(const T* __restrict__ w, const T* __restrict__ k, T* __restrict__ out, const TimexFwdParams p) {
  extern __shared__ float4 timex_smem[];
  float* sm = reinterpret_cast<float*>(timex_smem);
  int c, b0, ti;
  timex_fwd_block<TM>(p, blockIdx.x, blockIdx.y, c, b0, ti);
  TimexFwdAcc<TM> acc;
  timex_fwd_zero<TM>(acc);
  for (int ui = 0; ui <= ti; ++ui) {
    timex_fwd_stage<T, TM, IT>(sm, w, k, p, c, b0, ti, ui, threadIdx.x, blockDim.x);
    __syncthreads();
    timex_fwd_compute<TM>(acc, sm, p, ti, ui, threadIdx.x);
    __syncthreads();
  }
  timex_fwd_store<T, TM, IT>(acc, out, p, c, b0, ti, threadIdx.x);
}

template <typename T, int TM, typename IT>
void timex_fwd_launch(const T* w, const T* k, T* out, const TimexFwdParams& p) {
  static int raised = 48 * 1024;
  timex_smem_opt_in(timex_fwd_kernel<T, TM, IT>, p.smem_bytes, raised);
  const dim3 grid(p.C * p.groups_b, p.ntiles);
  timex_fwd_kernel<T, TM, IT><<<grid, p.threads, p.smem_bytes>>>(w, k, out, p);
  OPS_CHECK_LAUNCH();
}

template <typename T, typename IT>
__global__ void __launch_bounds__(TIMEX_GW_MAX_THREADS)
timex_gw_kernel(const T* __restrict__ k, const T* __restrict__ g, float* __restrict__ partial, const TimexGwParams p) {
  extern __shared__ float4 timex_smem[];
  float* sm = reinterpret_cast<float*>(timex_smem);
  int c, sp, si;
  timex_gw_block(p, blockIdx.x, blockIdx.y, c, sp, si);
  TimexGwAcc acc;
  timex_gw_zero(acc);
  const int ngroups = (p.B + p.lanes_b - 1) / p.lanes_b;
  const int gend = min(ngroups, (sp + 1) * p.groups_per_split);
  for (int bg = sp * p.groups_per_split; bg < gend; ++bg) {
    for (int vi = si; vi < p.ntiles; ++vi) {
      timex_gw_stage<T, IT>(sm, k, g, p, c, bg * p.lanes_b, si, vi, threadIdx.x, blockDim.x);
      __syncthreads();
      timex_gw_compute(acc, sm, p, si, vi, threadIdx.x);
      __syncthreads();
    }
  }
  timex_gw_park(acc, sm, threadIdx.x, blockDim.x);
  __syncthreads();
  timex_gw_flush<IT>(sm, partial, p, c, sp, si, threadIdx.x, blockDim.x);
}

template <typename T, typename IT>
__global__ void timex_gw_reduce_kernel(const float* __restrict__ partial, T* __restrict__ gw,
                                       const TimexGwParams p) {
  const IT n = (IT)p.C * p.T;
  for (IT i = (IT)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (IT)gridDim.x * blockDim.x)
    timex_gw_reduce_one<T, IT>(partial, gw, p, i);
}

// The split reduction reads splits * C * T floats once (memory-bound, a few us): 256 threads per block and
// a grid capped at 2048 blocks (~16 per SM of an H200), the grid-stride loop covering the rest, keep enough
// loads in flight without launching a block per 256 elements of huge C * T (predicted; to measure).
#define TIMEX_REDUCE_THREADS 256
#define TIMEX_REDUCE_MAX_BLOCKS 2048

template <typename T, typename IT>
void timex_gw_launch(const T* k, const T* g, T* gw, float* partial, const TimexGwParams& p) {
  static int raised = 48 * 1024;
  timex_smem_opt_in(timex_gw_kernel<T, IT>, p.smem_bytes, raised);
  const dim3 grid(p.C * p.splits, p.ntiles);
  timex_gw_kernel<T, IT><<<grid, p.threads, p.smem_bytes>>>(k, g, partial, p);
  OPS_CHECK_LAUNCH();
  const long long n = (long long)p.C * p.T;
  long long blocks = (n + TIMEX_REDUCE_THREADS - 1) / TIMEX_REDUCE_THREADS;
  if (blocks > TIMEX_REDUCE_MAX_BLOCKS) blocks = TIMEX_REDUCE_MAX_BLOCKS;
  timex_gw_reduce_kernel<T, IT><<<(unsigned int)blocks, TIMEX_REDUCE_THREADS>>>(partial, gw, p);
  OPS_CHECK_LAUNCH();
}


// ---------------------------------------------------------------------------------------------------------
// Tensor-core forward (fwd_mma; sm_80 and newer; CUDA only, the CPU runs fwd_single/fwd_tiled).
//
// Per channel the causal convolution is a product with a lower-triangular Toeplitz matrix:
//   out[t][b] = sum_u A[t][u] * k[b][u],   A[t][u] = wr[t - u] = w[c, T-1-(t-u)], zero for u > t,
// computed with mma.sync m16n8k8 TF32 (M = t, N = batch row, K = u), accumulated in float32. TF32 keeps 10
// mantissa bits: float16 and bfloat16 values are exact in it, so one mma per product is exact for them;
// float32 values are split x = big + small (both TF32) and each product is small*big + big*small + big*big
// (3xTF32; the dropped small*small term is ~2^-22 of the product), float32-level accuracy.
//
// Block (c, batch group, t-tile ti): 4 warps, t-tile of 128, BN = 8 * NT batch rows. Warp q owns the tile's
// t rows [32q, 32q + 32) (two m-tiles) for all BN rows (NT n-tiles). It walks the u-chunks ui = 0..ti of 128;
// in the diagonal chunk it stops after the k-steps that reach its own rows (u > t contributes zero there:
// A's zero entries come from the zero lags of wl; a diagonal chunk whose k holds an Inf or NaN, where 0 * Inf
// would not be zero, runs on the CUDA cores instead: timex_mma_exact_diagonal, timex_mma_exact_diagonal_add).
// Shared memory: wl[(ti + 2) * 128] = w by lag, wl[j] = wr[j - 128], zero for lags < 0 or >= T (an A entry
// is read straight from it: a warp's 32 lanes read 11 consecutive words, no bank conflict);
// ks[BN][128 + 4] = the k chunk (zero past T and past B; rows 4 words apart mod 32, so the fragment reads
// of 8 rows x 4 columns hit 32 distinct banks), reused after the last chunk to transpose the output tile
// for coalesced stores.
// ---------------------------------------------------------------------------------------------------------
#define TIMEX_MMA_TILE 128
#define TIMEX_MMA_THREADS 128
#define TIMEX_MMA_KS (TIMEX_MMA_TILE + 4)

__device__ __forceinline__ unsigned int timex_tf32(float x) {
  unsigned int r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// Inf or NaN, read from the bits (--use_fast_math lets the compiler fold isinf/isnan away).
__device__ __forceinline__ bool timex_nonfinite(float x) {
  return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
}

template <int N> __device__ __forceinline__ bool timex_any_nonfinite(const float (&v)[N]) {
  bool any = false;
  TIMEX_UNROLL for (int i = 0; i < N; ++i) any |= timex_nonfinite(v[i]);
  return any;
}

// One operand element as TF32: big (and, for float32 inputs, the TF32 rounding of the remainder). 3xTF32 adds
// the cross terms small * big' and big * small', so non-finite values need care for the products to be IEEE's:
//   * Inf: big = the largest TF32 value of its sign, small = the Inf. w * k then sums Inf * k_big (NaN only
//     for k = 0, as IEEE says), a finite term and max * k_big (finite, or an Inf of the same sign); with
//     big = Inf instead, Inf * small' = Inf * 0 would be NaN for every k exact in TF32;
//   * NaN: big = NaN (every product NaN);
//   * a finite x that rna rounds past the largest TF32 value: big = its truncation (finite), small = the rest.
template <bool SPLIT> struct TimexTf32 {
  unsigned int big, small;
  __device__ __forceinline__ explicit TimexTf32(float x) {
    // Selects on values computed anyway, not branches: this runs at every fragment read of fwd_mma (float32).
    const unsigned int xb = __float_as_uint(x);
    big = timex_tf32(x);
    if (SPLIT) big = timex_nonfinite(__uint_as_float(big)) && !timex_nonfinite(x) ? xb & 0xffffe000u : big;
    small = SPLIT ? timex_tf32(x - __uint_as_float(big)) : 0u;
    if (SPLIT) {
      const bool inf = (xb & 0x7fffffffu) == 0x7f800000u;
      small = timex_nonfinite(x) ? (inf ? xb : 0u) : small;
      big = inf ? (xb & 0x80000000u) | 0x7f7fe000u : big;
    }
  }
};

__device__ __forceinline__ void timex_mma(float (&d)[4], const unsigned int (&a)[4], const unsigned int (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();  // select_config picks fwd_mma only for sm_80 and newer
#endif
}

// d += A * B with TF32 operands; float32 (SPLIT): the 3xTF32 product small*big + big*small + big*big.
template <bool SPLIT>
__device__ __forceinline__ void timex_mma_product(float (&d)[4], const unsigned int (&ab)[4],
                                                  const unsigned int (&as)[4], const unsigned int (&bb)[2],
                                                  const unsigned int (&bs)[2]) {
  if (SPLIT) {
    timex_mma(d, as, bb);
    timex_mma(d, ab, bs);
  }
  timex_mma(d, ab, bb);
}

// Both tensor-core kernels end alike: the accumulator fragments are parked in shared memory (os: 8 * NT rows
// of KS floats, free by then; timex_mma_park), then, after a barrier, consecutive threads store consecutive t
// of each output row with eps added (timex_mma_write: thread tid reads column tid of os).
// C fragment: d0, d1 at (row g, columns 2 tig, 2 tig + 1), d2, d3 at row g + 8; rows are t, columns b.
template <int NT>
__device__ __forceinline__ void timex_mma_park(float* os, const float (&acc)[2][NT][4]) {
  constexpr int KS = TIMEX_MMA_KS;
  const int tid = threadIdx.x, lane = tid & 31, q = tid >> 5, g = lane >> 2, tig = lane & 3;
  TIMEX_UNROLL for (int m = 0; m < 2; ++m)
    TIMEX_UNROLL for (int n = 0; n < NT; ++n) {
      float* op = os + (8 * n + 2 * tig) * KS + 32 * q + 16 * m + g;
      op[0] = acc[m][n][0];
      op[KS] = acc[m][n][1];
      op[8] = acc[m][n][2];
      op[KS + 8] = acc[m][n][3];
    }
}

template <typename T, int NT, typename IT>
__device__ __forceinline__ void timex_mma_write(const float* os, T* __restrict__ out, const TimexFwdParams& p,
                                                int c, int b0, int ti) {
  constexpr int KS = TIMEX_MMA_KS;
  const int tid = threadIdx.x;
  const int t = ti * TIMEX_MMA_TILE + tid;
  if (t >= p.T) return;
  const int tt = p.reverse ? p.T - 1 - t : t;
  TIMEX_UNROLL for (int r = 0; r < 8 * NT; ++r) {
    const int b = b0 + r;
    if (b < p.B) out[((IT)b * p.C + c) * p.T + tt] = ops_from_float<T>(os[r * KS + tid] + p.eps);
  }
}

// The diagonal chunk (u-chunk = the block's t-tile) on the CUDA cores, for blocks whose staged k chunk holds
// an Inf or NaN: the tensor cores would multiply it by A's zeros (the lags u > t), and 0 * Inf = NaN would
// reach the outputs before it. Output (t, b) of the chunk (chunk-relative) is sum_{u <= t} A[t][u] * k[b][u]:
// the terms u > t are left out by selection. w_at(lag) and k_at(b, u) read the stage. Finite inputs never
// come here; what they pay is a bit test per staged k value of the diagonal chunk and a barrier with an OR
// instead of a plain one (predicted: under 1% of the kernel; to measure). A block that comes here spends
// about 64 * 8NT FMAs per thread on the CUDA cores (rolled loops, which keep the kernels' register counts).
template <class WAt, class KAt>
__device__ __forceinline__ float timex_diagonal_sum(const WAt& w_at, const KAt& k_at, int t, int b) {
  float sum = 0.f;
#pragma unroll 1
  for (int u = 0; u <= t; ++u) sum += w_at(t - u) * k_at(b, u);
  return sum;
}

// fwd_mma: the thread's own fragment elements (e = (m * NT + n) * 4 + i at t = 32q + 16m + g + 8 (i / 2),
// b = 8n + 2 tig + i % 2), each sum added to its accumulator by selection (which keeps acc in registers).
template <int NT, class WAt, class KAt>
__device__ __forceinline__ void timex_mma_exact_diagonal(float (&acc)[2][NT][4], const WAt& w_at, const KAt& k_at) {
  const int lane = threadIdx.x & 31, q = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
#pragma unroll 1
  for (int e = 0; e < 8 * NT; ++e) {
    const int m = e / (4 * NT), n = (e / 4) % NT, i = e % 4;
    const float sum = timex_diagonal_sum(w_at, k_at, 32 * q + 16 * m + g + 8 * (i >> 1), 8 * n + 2 * tig + (i & 1));
    TIMEX_UNROLL for (int mm = 0; mm < 2; ++mm)
      TIMEX_UNROLL for (int nn = 0; nn < NT; ++nn)
        TIMEX_UNROLL for (int ii = 0; ii < 4; ++ii)
          if ((mm * NT + nn) * 4 + ii == e) acc[mm][nn][ii] += sum;
  }
}

// fwd_mma3: added to column t = threadIdx.x of every row of the parked output tile os (acc is dead by then).
template <int BN, class WAt, class KAt>
__device__ __noinline__ void timex_mma_exact_diagonal_add(float* os, const WAt& w_at, const KAt& k_at) {
  const int t = threadIdx.x;
#pragma unroll 1
  for (int b = 0; b < BN; ++b) os[b * TIMEX_MMA_KS + t] += timex_diagonal_sum(w_at, k_at, t, b);
}

// Grid (C * batch groups, t-tiles) of TIMEX_MMA_THREADS; ``raised`` is the calling launcher's own static.
template <typename T, typename Kernel>
void timex_mma_start(Kernel* kernel, int& raised, const T* w, const T* k, T* out, const TimexFwdParams& p) {
  timex_smem_opt_in(kernel, p.smem_bytes, raised);
  kernel<<<dim3(p.C * p.groups_b, p.ntiles), TIMEX_MMA_THREADS, p.smem_bytes>>>(w, k, out, p);
  OPS_CHECK_LAUNCH();
}

template <typename T, int NT, typename IT>
__global__ void __launch_bounds__(TIMEX_MMA_THREADS)
timex_fwd_mma_kernel(const T* __restrict__ w, const T* __restrict__ k, T* __restrict__ out, const TimexFwdParams p) {
  constexpr int BT = TIMEX_MMA_TILE, KS = TIMEX_MMA_KS, BN = 8 * NT;
  constexpr bool SPLIT = sizeof(T) == 4;  // float32: 3xTF32; float16/bfloat16: exact in TF32
  extern __shared__ float4 timex_smem[];
  float* ks = reinterpret_cast<float*>(timex_smem);
  float* wl = ks + BN * KS;
  const int tid = threadIdx.x, lane = tid & 31, q = tid >> 5, g = lane >> 2, tig = lane & 3;
  const int c = blockIdx.x / p.groups_b;
  const int b0 = (blockIdx.x - c * p.groups_b) * BN;
  const int ti = p.ntiles - 1 - blockIdx.y;  // heaviest tiles first
  const int t0 = ti * BT;
  const T* wrow = w + (IT)c * p.T;
  for (int j = tid; j < (ti + 2) * BT; j += TIMEX_MMA_THREADS) {
    const int lag = j - BT;
    wl[j] = (lag >= 0 && lag < p.T) ? ops_to_float(wrow[p.T - 1 - lag]) : 0.f;
  }
  float acc[2][NT][4];
  TIMEX_UNROLL for (int m = 0; m < 2; ++m)
    TIMEX_UNROLL for (int n = 0; n < NT; ++n)
      TIMEX_UNROLL for (int i = 0; i < 4; ++i) acc[m][n][i] = 0.f;
  for (int ui = 0; ui <= ti; ++ui) {
    const int u0 = ui * BT;
    __syncthreads();  // the previous chunk's fragment reads are done
    bool nonfinite = false;
    TIMEX_UNROLL for (int r = 0; r < BN; ++r) {
      const int b = b0 + r, u = u0 + tid;
      float v = 0.f;
      if (b < p.B && u < p.T) v = ops_to_float(k[((IT)b * p.C + c) * p.T + (p.reverse ? p.T - 1 - u : u)]);
      ks[r * KS + tid] = v;
      if (ui == ti) nonfinite |= timex_nonfinite(v);  // only the diagonal chunk is checked
    }
    if (ui == ti) {  // the diagonal chunk: an Inf or NaN in it sends it to the CUDA cores
      if (__syncthreads_or(nonfinite)) {
        timex_mma_exact_diagonal<NT>(acc, [=](int lag) { return wl[lag + BT]; },
                                     [=](int b, int u) { return ks[b * KS + u]; });
        break;
      }
    } else {
      __syncthreads();
    }
    const int steps = ui == ti ? 4 * q + 4 : BT / 8;
    // wl index of A[t][u] for t = t0 + 32q + row, u = u0 + col: (t - u) + BT
    const int base = t0 - u0 + 32 * q + BT + g - tig;
    for (int s = 0; s < steps; ++s) {
      unsigned int bb[NT][2], bs[NT][2];
      TIMEX_UNROLL for (int n = 0; n < NT; ++n) {
        const float* kp = ks + (8 * n + g) * KS + 8 * s + tig;
        const TimexTf32<SPLIT> x0(kp[0]), x1(kp[4]);
        bb[n][0] = x0.big; bb[n][1] = x1.big; bs[n][0] = x0.small; bs[n][1] = x1.small;
      }
      TIMEX_UNROLL for (int m = 0; m < 2; ++m) {
        const float* ap = wl + base + 16 * m - 8 * s;
        const TimexTf32<SPLIT> a0(ap[0]), a1(ap[8]), a2(ap[-4]), a3(ap[4]);
        const unsigned int ab[4] = {a0.big, a1.big, a2.big, a3.big};
        const unsigned int as[4] = {a0.small, a1.small, a2.small, a3.small};
        TIMEX_UNROLL for (int n = 0; n < NT; ++n) timex_mma_product<SPLIT>(acc[m][n], ab, as, bb[n], bs[n]);
      }
    }
  }
  __syncthreads();
  timex_mma_park<NT>(ks, acc);
  __syncthreads();
  timex_mma_write<T, NT, IT>(ks, out, p, c, b0, ti);
}

template <typename T, int NT, typename IT>
void timex_fwd_mma_launch(const T* w, const T* k, T* out, const TimexFwdParams& p) {
  static int raised = 48 * 1024;
  timex_mma_start(timex_fwd_mma_kernel<T, NT, IT>, raised, w, k, out, p);
}

// ---------------------------------------------------------------------------------------------------------
// fwd_mma3's staging: fwd_mma reworked for accuracy at any T (errors 0.04-0.15 of the tolerance up to
// T = 8192, where fwd_mma's were up to 5x past T ~ 1024). The same block, warp and fragment geometry, and:
//   * each group of k-steps starts from a zeroed fragment, added to the float32 total with an FADD: the tensor
//     cores' unrounded accumulation only ever holds a few dozen products;
//   * operands are converted to TF32 once, when staged (big and small halves in shared memory for float32),
//     not by every warp at every fragment read;
//   * w is staged per chunk as the 256 lags the chunk needs, so shared memory does not grow with T;
//   * two stages: the next chunk's k and w values are loaded into registers while the tensor cores work on
//     the current one, then converted into the other stage (one barrier per chunk).
// Stage layout (32-bit words): kb[BN][KS], wb[256 + 8], then for float32 ks[BN][KS], ws[256 + 8] (smalls).
// wb[j] = wr[(ti - ui) * 128 - 128 + j], zero outside [0, T); A[t][u] = wb[(t - u) - (ti - ui) * 128 + 128].
// ---------------------------------------------------------------------------------------------------------
#define TIMEX_MMA2_WIN (2 * TIMEX_MMA_TILE + 8)

template <typename T, int NT> struct TimexMma2Stage {
  static constexpr int BN = 8 * NT;
  static constexpr int HALF = BN * TIMEX_MMA_KS + TIMEX_MMA2_WIN;  // words of the big (or only) halves
  static constexpr int WORDS = (sizeof(T) == 4 ? 2 : 1) * HALF;    // words of one stage
};

template <typename T, int NT, typename IT>
__device__ __forceinline__ void timex_mma2_fetch(float (&kv)[8 * NT], float (&wv)[2], const T* w, const T* k,
                                                  const TimexFwdParams& p, int c, int b0, int ti, int ui, int tid) {
  const int u = ui * TIMEX_MMA_TILE + tid;
  TIMEX_UNROLL for (int r = 0; r < 8 * NT; ++r) {
    const int b = b0 + r;
    kv[r] = (b < p.B && u < p.T) ? ops_to_float(k[((IT)b * p.C + c) * p.T + (p.reverse ? p.T - 1 - u : u)]) : 0.f;
  }
  const int lag0 = (ti - ui) * TIMEX_MMA_TILE - TIMEX_MMA_TILE;
  TIMEX_UNROLL for (int h = 0; h < 2; ++h) {
    const int lag = lag0 + tid + h * TIMEX_MMA_THREADS;
    wv[h] = (lag >= 0 && lag < p.T) ? ops_to_float(w[(IT)c * p.T + (p.T - 1 - lag)]) : 0.f;
  }
}

template <typename T, int NT>
__device__ __forceinline__ void timex_mma2_put(unsigned int* st, const float (&kv)[8 * NT], const float (&wv)[2],
                                                int tid) {
  constexpr int HALF = TimexMma2Stage<T, NT>::HALF;
  constexpr bool SPLIT = sizeof(T) == 4;
  unsigned int* wb = st + 8 * NT * TIMEX_MMA_KS;
  TIMEX_UNROLL for (int r = 0; r < 8 * NT; ++r) {
    const TimexTf32<SPLIT> x(kv[r]);
    st[r * TIMEX_MMA_KS + tid] = x.big;
    if (SPLIT) st[HALF + r * TIMEX_MMA_KS + tid] = x.small;
  }
  TIMEX_UNROLL for (int h = 0; h < 2; ++h) {
    const TimexTf32<SPLIT> x(wv[h]);
    wb[tid + h * TIMEX_MMA_THREADS] = x.big;
    if (SPLIT) wb[HALF + tid + h * TIMEX_MMA_THREADS] = x.small;
  }
}

// The B fragments (k values) of k-step s for every n-tile, read from a stage: the big halves and, for float32,
// the small ones.
template <typename T, int NT>
__device__ __forceinline__ void timex_mma2_b(const unsigned int* st, int s, int g, int tig, unsigned int (&bb)[NT][2],
                                             unsigned int (&bs)[NT][2]) {
  constexpr int HALF = TimexMma2Stage<T, NT>::HALF;
  constexpr bool SPLIT = sizeof(T) == 4;
  TIMEX_UNROLL for (int n = 0; n < NT; ++n) {
    const int o = (8 * n + g) * TIMEX_MMA_KS + 8 * s + tig;
    bb[n][0] = st[o];
    bb[n][1] = st[o + 4];
    bs[n][0] = SPLIT ? st[HALF + o] : 0u;
    bs[n][1] = SPLIT ? st[HALF + o + 4] : 0u;
  }
}

// fwd_mma3 (the default for float32, and for 16-bit past T = 1024). A[t][u] depends on t - u only, so a group
// of 4 k-steps of both row blocks reads 14 distinct A words per lane (a ladder, stride 4), read once for the
// group, and each fragment holds 4 k-steps (12 float32 / 4 16-bit mmas from zero) before the FADD: per k-step
// 3.5 + 16 words read and 8 FADDs (float32) against 16 + 16 and 32 when every step reads its own A words and
// adds its own fragment. Measured float32 B32 C768 T768 0.291 ms against 0.298 per step (H100, 2026-11-23).
template <typename T, int NT, typename IT>
__global__ void __launch_bounds__(TIMEX_MMA_THREADS)
timex_fwd_mma3_kernel(const T* __restrict__ w, const T* __restrict__ k, T* __restrict__ out, const TimexFwdParams p) {
  constexpr int BT = TIMEX_MMA_TILE, KS = TIMEX_MMA_KS, BN = 8 * NT;
  constexpr int HALF = TimexMma2Stage<T, NT>::HALF, WORDS = TimexMma2Stage<T, NT>::WORDS;
  constexpr bool SPLIT = sizeof(T) == 4;
  extern __shared__ float4 timex_smem[];
  unsigned int* sm = reinterpret_cast<unsigned int*>(timex_smem);
  const int tid = threadIdx.x, lane = tid & 31, q = tid >> 5, g = lane >> 2, tig = lane & 3;
  const int c = blockIdx.x / p.groups_b;
  const int b0 = (blockIdx.x - c * p.groups_b) * BN;
  const int ti = p.ntiles - 1 - blockIdx.y;  // heaviest tiles first
  float kv[BN], wv[2];
  timex_mma2_fetch<T, NT, IT>(kv, wv, w, k, p, c, b0, ti, 0, tid);
  timex_mma2_put<T, NT>(sm, kv, wv, tid);
  // exact: the diagonal chunk holds an Inf or NaN k and runs on the CUDA cores (timex_mma_exact_diagonal_add)
  bool exact = false;
  if (ti == 0) exact = __syncthreads_or(timex_any_nonfinite(kv));
  else __syncthreads();
  float acc[2][NT][4];
  TIMEX_UNROLL for (int m = 0; m < 2; ++m)
    TIMEX_UNROLL for (int n = 0; n < NT; ++n)
      TIMEX_UNROLL for (int i = 0; i < 4; ++i) acc[m][n][i] = 0.f;
  // wb index of A[t][u] for t = 32q + 16m + row, u = 8s + col (tile-relative): (row - col) + 32q + 16m - 8s + BT
  const int abase = 32 * q + BT + g - tig;
  for (int ui = 0; ui <= ti; ++ui) {
    if (ui < ti) timex_mma2_fetch<T, NT, IT>(kv, wv, w, k, p, c, b0, ti, ui + 1, tid);  // in flight meanwhile
    const unsigned int* st = sm + (ui & 1) * WORDS;
    const unsigned int* wb = st + BN * KS;
    // a multiple of 4; none for an exact diagonal chunk (it runs on the CUDA cores, below)
    const int steps = ui == ti ? (exact ? 0 : 4 * q + 4) : BT / 8;
    for (int s0 = 0; s0 < steps; s0 += 4) {
      // G[i] = wb[abase - 8 s0 - 28 + 4 i]: step s0 + e of row block m reads, as its own wb[a], wb[a + 8],
      // wb[a - 4], wb[a + 4] (a = abase + 16 m - 8 (s0 + e)), G[j + 1], G[j + 3], G[j], G[j + 2] with
      // j = 4 m + 6 - 2 e. G spans wb[abase - 8 s0 - 28 .. abase - 8 s0 + 24], inside [0, 256).
      const unsigned int* gp = wb + abase - 8 * s0 - 28;
      unsigned int gb[14], gs[14];
      TIMEX_UNROLL for (int i = 0; i < 14; ++i) {
        gb[i] = gp[4 * i];
        gs[i] = SPLIT ? gp[HALF + 4 * i] : 0u;
      }
      float part[2][NT][4];
      TIMEX_UNROLL for (int m = 0; m < 2; ++m)
        TIMEX_UNROLL for (int n = 0; n < NT; ++n)
          TIMEX_UNROLL for (int i = 0; i < 4; ++i) part[m][n][i] = 0.f;
      TIMEX_UNROLL for (int e = 0; e < 4; ++e) {
        unsigned int bb[NT][2], bs[NT][2];
        timex_mma2_b<T, NT>(st, s0 + e, g, tig, bb, bs);
        TIMEX_UNROLL for (int m = 0; m < 2; ++m) {
          const int j = 4 * m + 6 - 2 * e;
          const unsigned int ab[4] = {gb[j + 1], gb[j + 3], gb[j], gb[j + 2]};
          const unsigned int as[4] = {gs[j + 1], gs[j + 3], gs[j], gs[j + 2]};
          TIMEX_UNROLL for (int n = 0; n < NT; ++n) timex_mma_product<SPLIT>(part[m][n], ab, as, bb[n], bs[n]);
        }
      }
      TIMEX_UNROLL for (int m = 0; m < 2; ++m)
        TIMEX_UNROLL for (int n = 0; n < NT; ++n)
          TIMEX_UNROLL for (int i = 0; i < 4; ++i) acc[m][n][i] += part[m][n][i];
    }
    if (ui < ti) timex_mma2_put<T, NT>(sm + ((ui + 1) & 1) * WORDS, kv, wv, tid);
    // the next stage is written; this stage's reads are done
    if (ui + 1 == ti) exact = __syncthreads_or(timex_any_nonfinite(kv));
    else __syncthreads();
  }
  // The output tile goes through the stage the diagonal chunk did not use (chunk ti - 1's, or never used).
  float* os = reinterpret_cast<float*>(sm + ((ti + 1) & 1) * WORDS);
  timex_mma_park<NT>(os, acc);
  __syncthreads();
  if (exact) {  // added to column t = tid of the parked tile (this thread's to store) from the diagonal stage:
    const unsigned int* st = sm + (ti & 1) * WORDS;  // big + small halves (float32); wb[j] holds lag j - 128
    const unsigned int* wb = st + BN * KS;
    timex_mma_exact_diagonal_add<BN>(
        os,
        [=](int lag) { return __uint_as_float(wb[lag + BT]) + (SPLIT ? __uint_as_float(wb[HALF + lag + BT]) : 0.f); },
        [=](int b, int u) {
          return __uint_as_float(st[b * KS + u]) + (SPLIT ? __uint_as_float(st[HALF + b * KS + u]) : 0.f);
        });
  }
  timex_mma_write<T, NT, IT>(os, out, p, c, b0, ti);
}

template <typename T, int NT, typename IT>
void timex_fwd_mma3_launch(const T* w, const T* k, T* out, const TimexFwdParams& p) {
  static int raised = 48 * 1024;
  timex_mma_start(timex_fwd_mma3_kernel<T, NT, IT>, raised, w, k, out, p);
}

#else
// ---------------------------------------------------------------------------------------------------------
// CPU: the GPU blocks one after another, each phase run for every thread of the block before the next.
// ---------------------------------------------------------------------------------------------------------
template <typename T, int TM, typename IT>
void timex_fwd_host(const T* w, const T* k, T* out, const TimexFwdParams& p) {
  const int nt = p.threads;
  std::vector<timex_f4> smem((p.smem_bytes + 15) / 16);
  float* sm = reinterpret_cast<float*>(smem.data());
  std::vector<TimexFwdAcc<TM> > acc(nt);
  for (int by = 0; by < p.ntiles; ++by) {
    for (int bx = 0; bx < p.C * p.groups_b; ++bx) {
      int c, b0, ti;
      timex_fwd_block<TM>(p, bx, by, c, b0, ti);
      for (int tid = 0; tid < nt; ++tid) timex_fwd_zero<TM>(acc[tid]);
      for (int ui = 0; ui <= ti; ++ui) {
        for (int tid = 0; tid < nt; ++tid) timex_fwd_stage<T, TM, IT>(sm, w, k, p, c, b0, ti, ui, tid, nt);
        for (int tid = 0; tid < nt; ++tid) timex_fwd_compute<TM>(acc[tid], sm, p, ti, ui, tid);
      }
      for (int tid = 0; tid < nt; ++tid) timex_fwd_store<T, TM, IT>(acc[tid], out, p, c, b0, ti, tid);
    }
  }
}

// A float32 dot product of contiguous runs, accumulated over one or more add() calls: 32 partial sums (four
// 8-lane FMA chains: the FMA latency is hidden), the tails of the runs in a sum of their own, all in a fixed
// order, so results are bit-identical run to run.
struct TimexDot {
  float part[32] = {};
  float tail = 0.f;
  void add(const float* a, const float* b, int n) {
    int i = 0;
    for (; i + 32 <= n; i += 32)
      for (int j = 0; j < 32; ++j) part[j] += a[i + j] * b[i + j];
    for (; i < n; ++i) tail += a[i] * b[i];
  }
  float sum() {
    for (int w = 16; w > 0; w /= 2)
      for (int j = 0; j < w; ++j) part[j] += part[j + w];
    return part[0] + tail;
  }
};

// The CPU forward of ops' calls (the host emulation above is the GPU's index math, kept for the tests that check
// it): each output is one TimexDot of two contiguous runs, out[t] = eps + sum_{u<=t} w[c, T-1-t+u] * k[u]. The sum stops at u = t, so a NaN or Inf at step u reaches only
// outputs t >= u. `data` holds two entries, eps ("e") and reverse ("r", grad_k: k read and out written
// time-reversed); they are told apart by their keys' first letters while walking the map once (no key built
// and hashed per call: ~20 ns each, the whole of a (1, 1, 1) call).
template <typename T, class Map>
void timex_fwd_direct(const T* w, const T* k, T* out, int B, int C, int T_, Map& data) {
  float eps = 0.f;
  int reverse = 0;
  for (const auto& kv : data) {
    if (kv.first[0] == 'e') eps = (float)kv.second;
    else reverse = (int)kv.second;
  }
  float* wf = ops_cpu::scratch<float, 0>(T_);
  float* kf = ops_cpu::scratch<float, 1>(T_);
  for (int c = 0; c < C; ++c) {
    const T* wrow = w + (long long)c * T_;
    for (int i = 0; i < T_; ++i) wf[i] = ops_cpu::to_acc(wrow[i]);
    for (int b = 0; b < B; ++b) {
      const long long row = ((long long)b * C + c) * T_;
      for (int u = 0; u < T_; ++u) kf[u] = ops_cpu::to_acc(k[row + (reverse ? T_ - 1 - u : u)]);
      for (int t = 0; t < T_; ++t) {
        TimexDot dot;
        dot.add(wf + (T_ - 1 - t), kf, t + 1);  // w[c, T-1-t+u] * k[u], u <= t
        timex_store(out + row + (reverse ? T_ - 1 - t : t), dot.sum() + eps);
      }
    }
  }
}

// The CPU grad_w of ops' calls: gw[c, T-1-s] = sum_b sum_{t>=s} g[b,c,t] * k[b,c,t-s], each lag's sum one
// TimexDot over the batch rows in order.
template <typename T>
void timex_gw_direct(const T* k, const T* g, T* gw, int B, int C, int T_) {
  float* kf = ops_cpu::scratch<float, 0>((size_t)B * T_);
  float* gf = ops_cpu::scratch<float, 1>((size_t)B * T_);
  for (int c = 0; c < C; ++c) {
    for (int b = 0; b < B; ++b) {
      const long long row = ((long long)b * C + c) * T_;
      for (int t = 0; t < T_; ++t) {
        kf[(long long)b * T_ + t] = ops_cpu::to_acc(k[row + t]);
        gf[(long long)b * T_ + t] = ops_cpu::to_acc(g[row + t]);
      }
    }
    for (int s = 0; s < T_; ++s) {
      TimexDot dot;
      for (int b = 0; b < B; ++b)  // g[b, c, s + i] * k[b, c, i]
        dot.add(gf + (long long)b * T_ + s, kf + (long long)b * T_, T_ - s);
      timex_store(gw + (long long)c * T_ + (T_ - 1 - s), dot.sum());
    }
  }
}

template <typename T, typename IT>
void timex_gw_host(const T* k, const T* g, T* gw, float* partial, const TimexGwParams& p) {
  const int nt = p.threads;
  std::vector<timex_f4> smem((p.smem_bytes + 15) / 16);
  float* sm = reinterpret_cast<float*>(smem.data());
  std::vector<TimexGwAcc> acc(nt);
  const int ngroups = (p.B + p.lanes_b - 1) / p.lanes_b;
  for (int by = 0; by < p.ntiles; ++by) {
    for (int bx = 0; bx < p.C * p.splits; ++bx) {
      int c, sp, si;
      timex_gw_block(p, bx, by, c, sp, si);
      for (int tid = 0; tid < nt; ++tid) timex_gw_zero(acc[tid]);
      const int gend = ngroups < (sp + 1) * p.groups_per_split ? ngroups : (sp + 1) * p.groups_per_split;
      for (int bg = sp * p.groups_per_split; bg < gend; ++bg) {
        for (int vi = si; vi < p.ntiles; ++vi) {
          for (int tid = 0; tid < nt; ++tid) timex_gw_stage<T, IT>(sm, k, g, p, c, bg * p.lanes_b, si, vi, tid, nt);
          for (int tid = 0; tid < nt; ++tid) timex_gw_compute(acc[tid], sm, p, si, vi, tid);
        }
      }
      for (int tid = 0; tid < nt; ++tid) timex_gw_park(acc[tid], sm, tid, nt);
      for (int tid = 0; tid < nt; ++tid) timex_gw_flush<IT>(sm, partial, p, c, sp, si, tid, nt);
    }
  }
  const IT n = (IT)p.C * p.T;
  for (IT i = 0; i < n; ++i) timex_gw_reduce_one<T, IT>(partial, gw, p, i);
}
#endif
