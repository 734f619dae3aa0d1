// broadcast.cuh: expand_as / broadcast_to kernels (ops/broadcast.py renders the calls).
//
// Every kernel sees a SIMPLIFIED pattern (ops.broadcast.simplify_broadcast): size-1 dims dropped and
// neighbouring dims of the same kind (kept / broadcast) merged, so shapes alternate kept and broadcast groups.
//
// Forward  (ops_bcast_forward):    out[e] = in[offset(e)], one 16-byte store per thread-step, any dtype
//                                   (moved as opaque bytes).
// Backward (ops_bcast_row_reduce): out[r*S + s] = sum of in[r*C + c] over segment s of row r.
//          (ops_bcast_row_split):  out[r] = the same S segment sums added in s order, in one launch.
//          (ops_bcast_col_reduce): out[(n*S + s)*J + j] = sum of in[(n*M + m)*J + j] over segment s of m.
// A backward pass chain (row/col passes, splits with partial sums) is planned in Python. No atomics: every
// sum has a fixed order that depends only on the shape, the config and the address of `in` modulo 16 bytes.
// Index type I is int (fast division by OpsDiv, index_math.h) below 2^31 elements, long long above.
#pragma once
#include <string>

// A min that cannot meet jittor's or CUDA's overload sets.
template <typename I> __device__ __forceinline__ I ops_bcast_min(I a, I b) { return a < b ? a : b; }

// ---- accumulation types -------------------------------------------------------------------------------------
template <typename A, typename T> __device__ __forceinline__ A ops_bcast_to_acc(T v) { return (A)ops_to_float(v); }
template <> __device__ __forceinline__ double ops_bcast_to_acc<double, double>(double v) { return v; }
template <typename T, typename A> __device__ __forceinline__ T ops_bcast_from_acc(A v) {
  return ops_from_float<T>((float)v);
}
template <> __device__ __forceinline__ double ops_bcast_from_acc<double, double>(double v) { return v; }

// acc += the 16 / sizeof(T) elements of one 16-byte chunk, in element order.
template <typename T, typename A> __device__ __forceinline__ void ops_bcast_add_chunk(A& acc, const uint4& raw) {
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int k = 0; k < (int)(16 / sizeof(T)); ++k) acc += ops_bcast_to_acc<A>(e[k]);
}

// =============================================================================================================
// Forward. Output element e has N-d coordinates over dims[0..ND-1] (row-major); its source is
// in[sum_i coord_i * in_stride[i]] with in_stride 0 on broadcast groups. INNER_BCAST: the innermost group is
// broadcast (in_stride[ND-1] == 0), else kept (in_stride[ND-1] == 1).
// Contract: out is 16-byte aligned at element 0 (a fresh jittor allocation); `in` may have any alignment.
// =============================================================================================================
template <int ND, typename I> struct OpsBcastFwdParams {
  OpsDiv<I> dim[ND];
  I in_stride[ND];
};

// Source offset of output element e; `inner` receives e's coordinate along the innermost group.
template <int ND, typename I>
__device__ __forceinline__ I ops_bcast_src_offset(const OpsBcastFwdParams<ND, I>& p, I e, I& inner) {
  I off = 0;
  inner = e;
#pragma unroll
  for (int i = ND - 1; i >= 1; --i) {
    const I q = p.dim[i].div(e);
    const I c = e - q * p.dim[i].value();
    if (i == ND - 1) inner = c;
    off += c * p.in_stride[i];
    e = q;
  }
  return off + e * p.in_stride[0];
}

template <typename E, int ND, bool INNER_BCAST, typename I, int BLOCK, int UNROLL>
__global__ void __launch_bounds__(BLOCK)
ops_bcast_fwd_kernel(const E* __restrict__ in, E* __restrict__ out, I numel, OpsBcastFwdParams<ND, I> p) {
  constexpr int VEC = 16 / sizeof(E);
  typedef OpsVec<E, VEC> V;
  const I nvec = numel / VEC;
  const I inner_size = p.dim[ND - 1].value();
  const I first = (I)blockIdx.x * (BLOCK * UNROLL) + (I)threadIdx.x;
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const I v = first + u * BLOCK;
    if (v >= nvec) break;
    const I e0 = v * VEC;
    I c;
    const I off = ops_bcast_src_offset<ND, I>(p, e0, c);
    if (c + VEC <= inner_size) {  // the whole vector lies inside one innermost run: one 16-byte store
      V val;
      if (INNER_BCAST) {
        const E x = in[off];
#pragma unroll
        for (int k = 0; k < VEC; ++k) val.v[k] = x;
      } else if ((reinterpret_cast<uintptr_t>(in + off) & 15) == 0) {
        *reinterpret_cast<uint4*>(&val) = __ldg(reinterpret_cast<const uint4*>(in + off));
      } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) val.v[k] = in[off + k];
      }
      reinterpret_cast<uint4*>(out)[v] = *reinterpret_cast<const uint4*>(&val);
    } else if (inner_size >= VEC) {
      // The vector crosses one run boundary: elements [0, split) end this run, [split, VEC) start the next
      // one at e0 + split. Still one 16-byte store. (Was one element at a time, each with its own offset
      // arithmetic: with 807-long fp16 rows a third of the warps took that path, 77% of the copy roofline on
      // the H100 against 93% for float32 rows; 86% this way, 2026-11-23 night.)
      const int split = (int)(inner_size - c);
      I c2;
      const I off2 = ops_bcast_src_offset<ND, I>(p, e0 + split, c2);
      V val;
      if (INNER_BCAST) {
        const E xa = in[off], xb = in[off2];
#pragma unroll
        for (int k = 0; k < VEC; ++k) val.v[k] = k < split ? xa : xb;
      } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          if (k < split) {
            val.v[k] = in[off + k];
          } else {
            val.v[k] = in[off2 + (k - split)];
          }
        }
      }
      reinterpret_cast<uint4*>(out)[v] = *reinterpret_cast<const uint4*>(&val);
    } else {  // innermost runs shorter than a vector: a vector may span several runs; one element at a time
#pragma unroll 1
      for (int k = 0; k < VEC; ++k) {
        I ck;
        out[e0 + k] = in[ops_bcast_src_offset<ND, I>(p, e0 + k, ck)];
      }
    }
  }
  // the last numel % VEC elements, one per thread of block 0
  const I tail = numel - nvec * VEC;
  if (blockIdx.x == 0 && (I)threadIdx.x < tail) {
    const I e = nvec * VEC + (I)threadIdx.x;
    I ck;
    out[e] = in[ops_bcast_src_offset<ND, I>(p, e, ck)];
  }
}

// grid = max(1, ceil((numel / VEC) / (BLOCK * UNROLL))), computed by ops.broadcast.select_config.
template <typename T, int ND, bool INNER_BCAST, typename I, int BLOCK, int UNROLL>
void ops_bcast_forward(const T* in, T* out, long long numel, const long long* dims, const long long* in_strides,
                       long long grid) {
  typedef OpsBytes<sizeof(T)> E;
  OpsBcastFwdParams<ND, I> p;
  for (int i = 0; i < ND; ++i) {
    p.dim[i] = OpsDiv<I>::make(dims[i]);
    p.in_stride[i] = (I)in_strides[i];
  }
  ops_bcast_fwd_kernel<E, ND, INNER_BCAST, I, BLOCK, UNROLL><<<(unsigned int)grid, BLOCK>>>(
      reinterpret_cast<const E*>(in), reinterpret_cast<E*>(out), (I)numel, p);
  OPS_CHECK_LAUNCH();
}

// The same launch with the groups read from the tensors' shapes, so the host reads no `data` entry (each costs
// ~0.23 us per call on the GPU machine, H100 2026-11-23): `out` has the simplified dims, `in` the same dims with
// 1 on every broadcast group. Grid: as ops.broadcast.select_config computes it.
template <typename T, int ND, bool INNER_BCAST, typename I, int BLOCK, int UNROLL>
void ops_bcast_forward_shaped(const T* in, T* out, long long numel, const long long* dims,
                              const long long* in_dims) {
  long long strides[ND];
  long long run = 1;
  for (int i = ND - 1; i >= 0; --i) {
    strides[i] = in_dims[i] == 1 ? 0 : run;
    run *= in_dims[i];
  }
  const long long vecs = ops_ceil_div(numel / (long long)(16 / sizeof(T)), (long long)(BLOCK * UNROLL));
  ops_bcast_forward<T, ND, INNER_BCAST, I, BLOCK, UNROLL>(in, out, numel, dims, strides, vecs > 0 ? vecs : 1);
}

// The forward with the simplified groups from jittor's `data` (d0.., s0.., grid): the menu of ops/broadcast.py
// calls this for its (ND, INNER_BCAST) entries.
template <typename T, int ND, bool INNER_BCAST, typename I, int BLOCK, int UNROLL, class Map>
void ops_bcast_forward_data(const T* in, T* out, long long numel, Map& data) {
  long long dims[ND], strides[ND];
  for (int i = 0; i < ND; ++i) {
    dims[i] = (long long)data["d" + std::to_string(i)];
    strides[i] = (long long)data["s" + std::to_string(i)];
  }
  ops_bcast_forward<T, ND, INNER_BCAST, I, BLOCK, UNROLL>(in, out, numel, dims, strides, (long long)data["grid"]);
}

// =============================================================================================================
// Backward, row pass: in is [R, C]; row r is cut into S segments of L elements (the last may be shorter);
// a group of G lanes (G = 4 or 32: 256 / G segments per block; G = 256: one segment per block) sums one
// segment into out[r*S + s] (S == 1: out[r]). Lane order: the segment's unaligned head elements, then its
// 16-byte chunks (chunk k to lane k % G, ascending), then its tail elements; then a fixed xor-shuffle tree,
// then (G = 256) the 8 warp sums in warp order.
// =============================================================================================================
template <typename A, int G, int BLOCK>
__device__ __forceinline__ A ops_bcast_group_sum(A v, A* warp_sums) {
#pragma unroll
  for (int o = (G < 32 ? G : 32) / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (G > 32) {
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x / 32] = v;
    __syncthreads();
    v = warp_sums[0];
#pragma unroll
    for (int w = 1; w < BLOCK / 32; ++w) v += warp_sums[w];
  }
  return v;
}

// One lane's share of row[lo, hi) in the order above (before the group's shuffle tree). Every load of a round
// is issued before the first add: the head and tail elements (at most VEC - 1 each) with the first chunks, then
// U chunks per round, predicated, so a row of up to U * G chunks costs one memory round trip. (Before: head,
// 4-chunk rounds, single-chunk rounds and tail one after another; on H100 [32,807,1]->[32,807,807] reached 79%
// of copy bandwidth in f32 and 68% in f16. Predicted with one round trip: ~88% and ~85%.)
template <typename T, typename A, int G, typename I>
__device__ __forceinline__ A ops_bcast_lane_sum(const T* __restrict__ row, I lo, I hi, int lane) {
  constexpr int VEC = 16 / sizeof(T);
  constexpr int EDGE = (VEC - 1 + G - 1) / G;  // head (or tail) elements per lane, at most
  // 4 independent 16-byte loads in flight per lane: with >= 8 resident warps per scheduler that is ~64 KB in
  // flight per SM, above the ~40 KB HBM latency x bandwidth needs on an H200 (predicted; to measure).
  constexpr int U = 4;
  const I mis = (I)((reinterpret_cast<uintptr_t>(row + lo) & 15) / sizeof(T));
  const I head = ops_bcast_min<I>(mis ? (I)VEC - mis : (I)0, hi - lo);
  const I a = lo + head;
  const I nv = (hi - a) / VEC;
  const I b = a + nv * VEC;
  A head_v[EDGE > 0 ? EDGE : 1], tail_v[EDGE > 0 ? EDGE : 1];
#pragma unroll
  for (int j = 0; j < EDGE; ++j) {
    const I h = lo + lane + (I)j * G, t = b + lane + (I)j * G;
    head_v[j] = h < a ? ops_bcast_to_acc<A>(row[h]) : (A)0;
    tail_v[j] = t < hi ? ops_bcast_to_acc<A>(row[t]) : (A)0;
  }
  A acc = 0;
#pragma unroll
  for (int j = 0; j < EDGE; ++j)
    if (lo + lane + (I)j * G < a) acc += head_v[j];
  const uint4* pv = reinterpret_cast<const uint4*>(row + a);
  for (I k = lane; k < nv; k += U * G) {
    uint4 t[U];
#pragma unroll
    for (int u = 0; u < U; ++u) t[u] = k + u * G < nv ? __ldg(pv + k + u * G) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (k + u * G < nv) ops_bcast_add_chunk<T>(acc, t[u]);
  }
#pragma unroll
  for (int j = 0; j < EDGE; ++j)
    if (b + lane + (I)j * G < hi) acc += tail_v[j];
  return acc;
}

template <typename T, typename OutT, typename A, int G, typename I>
__global__ void __launch_bounds__(256)
ops_bcast_row_reduce_kernel(const T* __restrict__ in, OutT* __restrict__ out, I R, I C, I S, I L) {
  constexpr int BLOCK = 256;
  __shared__ A warp_sums[BLOCK / 32];
  const int lane = threadIdx.x % G;
  const I task = (I)blockIdx.x * (BLOCK / G) + (I)(threadIdx.x / G);
  const bool active = task < R * S;
  const I r = active ? task / S : 0;
  const I s = active ? task - r * S : 0;
  const I lo = active ? s * L : 0;
  const I hi = active ? ops_bcast_min<I>(lo + L, C) : 0;
  A acc = ops_bcast_lane_sum<T, A, G, I>(in + r * C, lo, hi, lane);
  acc = ops_bcast_group_sum<A, G, BLOCK>(acc, warp_sums);
  if (active && lane == 0) out[task] = ops_bcast_from_acc<OutT>(acc);
}

// grid = ceil(R * S / (256 / G)), computed by ops.broadcast.select_grad_config.
template <typename T, typename OutT, typename A, int G, typename I>
void ops_bcast_row_reduce(const T* in, OutT* out, long long R, long long C, long long S, long long L,
                          long long grid) {
  ops_bcast_row_reduce_kernel<T, OutT, A, G, I><<<(unsigned int)grid, 256>>>(in, out, (I)R, (I)C, (I)S, (I)L);
  OPS_CHECK_LAUNCH();
}

// =============================================================================================================
// Backward, split row pass in one launch: in is [R, C] with R <= OPS_BCAST_SPLIT_MAX_ROWS; row r is cut into S
// segments of L elements. Block r * S + s sums segment s (256 lanes, the row pass's order) into
// partial[r * S + s]; the last of row r's blocks to finish adds the S partials (lane l takes s = l, l + 256, ...
// in order, then the block's tree) into out[r] and resets the row's counter for the next launch. The integer
// counter only elects that block: the sum's order never depends on which block finished last.
// Measured before (H100, [16,1,1]->[16,807,807] f32): the two-launch chain took 0.0195 ms, about 9 us of it the
// second launch and the gap between them.
// =============================================================================================================
#define OPS_BCAST_SPLIT_MAX_ROWS 512
static __device__ unsigned int ops_bcast_split_done[OPS_BCAST_SPLIT_MAX_ROWS];

template <typename T, typename OutT, typename A, typename I>
__global__ void __launch_bounds__(256)
ops_bcast_row_split_kernel(const T* __restrict__ in, OutT* __restrict__ out, A* __restrict__ partial, I C, I S,
                           I L) {
  constexpr int BLOCK = 256;
  __shared__ A warp_sums[BLOCK / 32];
  __shared__ bool is_last;
  const I r = (I)blockIdx.x / S;
  const I s = (I)blockIdx.x - r * S;
  const I lo = s * L;
  const I hi = ops_bcast_min<I>(lo + L, C);
  A acc = ops_bcast_lane_sum<T, A, BLOCK, I>(in + r * C, lo, hi, threadIdx.x);
  acc = ops_bcast_group_sum<A, BLOCK, BLOCK>(acc, warp_sums);
  if (threadIdx.x == 0) {
    partial[r * S + s] = acc;
    __threadfence();  // the partial is visible device-wide before the counter counts it
    is_last = atomicAdd(&ops_bcast_split_done[r], 1u) == (unsigned int)(S - 1);
  }
  __syncthreads();  // also: every lane has read warp_sums before the second tree writes them
  if (!is_last) return;
  __threadfence();
  A sum = 0;
  for (I k = threadIdx.x; k < S; k += BLOCK) sum += __ldcg(partial + r * S + k);  // L2: other blocks' writes
  sum = ops_bcast_group_sum<A, BLOCK, BLOCK>(sum, warp_sums);
  if (threadIdx.x == 0) {
    out[r] = ops_bcast_from_acc<OutT>(sum);
    ops_bcast_split_done[r] = 0;
  }
}

// grid = R * S, computed by ops.broadcast.select_grad_config (which keeps R <= OPS_BCAST_SPLIT_MAX_ROWS).
template <typename T, typename OutT, typename A, typename I>
void ops_bcast_row_split(const T* in, OutT* out, A* partial, long long C, long long S, long long L, long long grid) {
  ops_bcast_row_split_kernel<T, OutT, A, I><<<(unsigned int)grid, 256>>>(in, out, partial, (I)C, (I)S, (I)L);
  OPS_CHECK_LAUNCH();
}

// =============================================================================================================
// Backward, column pass: in is [N, M, J]; m is cut into S segments of Ms rows. A block (32 x 8 threads) owns
// one (column tile of 32 * VEC columns, n, s); thread (tx, ty) owns columns j0..j0+VEC-1 and rows
// m_lo + ty, m_lo + ty + 8, ... (ascending), then the 8 row-thread sums of a column are added in ty order.
// The order never depends on whether 16-byte loads were possible, so both load paths give the same bits.
// =============================================================================================================
template <typename T, typename OutT, typename A, typename I>
__global__ void __launch_bounds__(256)
ops_bcast_col_reduce_kernel(const T* __restrict__ in, OutT* __restrict__ out, I N, I M, I J, I S, I Ms, I tiles,
                            bool vec_ok) {
  constexpr int VEC = 16 / sizeof(T);
  // 32 column-threads: a warp's 16-byte loads cover 512 contiguous bytes of one row. 8 row-threads: 8x the
  // parallelism of a column tile without another pass, for one 8-term fixed-order sum in shared memory.
  // 4 loads in flight per thread, as in the row pass. (All predicted; to measure.)
  constexpr int BX = 32, BY = 8;
  constexpr int U = 4;
  __shared__ A part[BY][BX * VEC];
  const int tx = threadIdx.x % BX, ty = threadIdx.x / BX;
  I b = (I)blockIdx.x;
  const I tile = b % tiles;
  b /= tiles;
  const I n = b % N;
  const I s = b / N;
  const I j0 = (tile * BX + tx) * VEC;
  const I m_lo = s * Ms;
  const I m_hi = ops_bcast_min<I>(m_lo + Ms, M);
  const T* base = in + n * M * J + j0;
  A acc[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) acc[k] = 0;
  if (vec_ok) {  // J % VEC == 0 and `in` 16-byte aligned: every row's chunk at j0 is aligned
    if (j0 < J) {
      I m = m_lo + ty;
      for (; m + (U - 1) * BY < m_hi; m += U * BY) {
        uint4 t[U];
#pragma unroll
        for (int u = 0; u < U; ++u) t[u] = __ldg(reinterpret_cast<const uint4*>(base + (m + u * BY) * J));
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const T* e = reinterpret_cast<const T*>(&t[u]);
#pragma unroll
          for (int k = 0; k < VEC; ++k) acc[k] += ops_bcast_to_acc<A>(e[k]);
        }
      }
      for (; m < m_hi; m += BY) {
        const uint4 t = __ldg(reinterpret_cast<const uint4*>(base + m * J));
        const T* e = reinterpret_cast<const T*>(&t);
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc[k] += ops_bcast_to_acc<A>(e[k]);
      }
    }
  } else {  // element loads; columns past J read nothing and are never stored
    I m = m_lo + ty;
    for (; m + (U - 1) * BY < m_hi; m += U * BY) {
      A t[U][VEC];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const T* rowp = base + (m + u * BY) * J;
#pragma unroll
        for (int k = 0; k < VEC; ++k) t[u][k] = j0 + k < J ? ops_bcast_to_acc<A>(rowp[k]) : (A)0;
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc[k] += t[u][k];
    }
    for (; m < m_hi; m += BY) {
      const T* rowp = base + m * J;
#pragma unroll
      for (int k = 0; k < VEC; ++k)
        if (j0 + k < J) acc[k] += ops_bcast_to_acc<A>(rowp[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < VEC; ++k) part[ty][tx * VEC + k] = acc[k];
  __syncthreads();
  const int t = threadIdx.x;
  if (t < BX * VEC) {
    A sum = part[0][t];
#pragma unroll
    for (int y = 1; y < BY; ++y) sum += part[y][t];
    const I j = tile * (BX * VEC) + t;
    if (j < J) out[(n * S + s) * J + j] = ops_bcast_from_acc<OutT>(sum);
  }
}

// grid = tiles * N * S with tiles = ceil(J / (32 * VEC)), computed by ops.broadcast.select_grad_config.
template <typename T, typename OutT, typename A, typename I>
void ops_bcast_col_reduce(const T* in, OutT* out, long long N, long long M, long long J, long long S, long long Ms,
                          long long tiles, long long grid) {
  constexpr int VEC = 16 / sizeof(T);
  const bool vec_ok = (J % VEC == 0) && ((reinterpret_cast<uintptr_t>(in) & 15) == 0);
  ops_bcast_col_reduce_kernel<T, OutT, A, I><<<(unsigned int)grid, 256>>>(in, out, (I)N, (I)M, (I)J, (I)S, (I)Ms,
                                                                          (I)tiles, vec_ok);
  OPS_CHECK_LAUNCH();
}

// The single-output reduction passes with their sizes from jittor's `data` (the menu of ops/broadcast.py).
template <typename T, typename OutT, typename A, int G, typename I, class Map>
void ops_bcast_row_reduce_data(const T* in, OutT* out, Map& data) {
  ops_bcast_row_reduce<T, OutT, A, G, I>(in, out, (long long)data["R"], (long long)data["C"], (long long)data["S"],
                                         (long long)data["L"], (long long)data["grid"]);
}

template <typename T, typename OutT, typename A, typename I, class Map>
void ops_bcast_col_reduce_data(const T* in, OutT* out, Map& data) {
  ops_bcast_col_reduce<T, OutT, A, I>(in, out, (long long)data["N"], (long long)data["M"], (long long)data["J"],
                                      (long long)data["S"], (long long)data["Ms"], (long long)data["tiles"],
                                      (long long)data["grid"]);
}
