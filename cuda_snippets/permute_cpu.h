// permute_cpu.h: the permute / transpose_add CPU path (jt.code cpu_src of ops/permute.py): the plan
// select_config made, walked by a loop nest (variant codes of _CPU_VARIANT). Every value comes from `data`, so
// there is one compile per dtype and op. bfloat16 sums are rounded to nearest even here (jittor's CPU bfloat16
// conversion truncates) to match the GPU's __float2bfloat16_rn.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

struct OpsCpuPlan {
  int variant, rank, batch_rank;
  long long chunk, count, bytes, tile;
  long long dims[8], src_stride[8];
  long long A, B, in_stride_b, out_stride_a, b_lo, in_stride_bh;
  long long batch_dim[8], batch_in[8], batch_out[8];
};

template <class Map> static long long ops_cpu_param(Map& data, const char* name, int i = -1) {
  char key[32];
  if (i < 0) snprintf(key, sizeof(key), "%s", name);
  else snprintf(key, sizeof(key), "%s%d", name, i);
  return (long long)data[key];
}

template <class Map> static OpsCpuPlan ops_cpu_plan(Map& data) {
  OpsCpuPlan p;
  p.variant = (int)ops_cpu_param(data, "variant");
  p.chunk = ops_cpu_param(data, "chunk");
  p.count = ops_cpu_param(data, "count");
  p.bytes = ops_cpu_param(data, "bytes");
  p.rank = p.batch_rank = 0;
  if (p.variant == 1) {
    p.rank = (int)ops_cpu_param(data, "rank");
    for (int k = 0; k < p.rank; ++k) {
      p.dims[k] = ops_cpu_param(data, "d", k);
      p.src_stride[k] = ops_cpu_param(data, "s", k);
    }
  } else if (p.variant == 2) {
    p.tile = ops_cpu_param(data, "tile");
    p.A = ops_cpu_param(data, "A");
    p.B = ops_cpu_param(data, "B");
    p.in_stride_b = ops_cpu_param(data, "isb");
    p.out_stride_a = ops_cpu_param(data, "osa");
    const bool split = ops_cpu_param(data, "split_b") != 0;  // B = the output's last two dims (b_lo: the last)
    p.b_lo = split ? ops_cpu_param(data, "bl") : p.B;
    p.in_stride_bh = split ? ops_cpu_param(data, "isbh") : 0;
    p.batch_rank = (int)ops_cpu_param(data, "batch_rank");
    for (int k = 0; k < p.batch_rank; ++k) {
      p.batch_dim[k] = ops_cpu_param(data, "bd", k);
      p.batch_in[k] = ops_cpu_param(data, "bi", k);
      p.batch_out[k] = ops_cpu_param(data, "bo", k);
    }
  }
  return p;
}

// move(o, i): output element o takes input element i (moved elements of p.chunk bytes).
template <class Move> static void ops_cpu_walk(const OpsCpuPlan& p, Move move) {
  if (p.variant == 2) {  // tiled: the (A, B) plane in CPU_TILE blocks, for every index of the batch dims
    std::vector<long long> row_in((size_t)p.tile);
    long long nbatch = 1;
    for (int k = 0; k < p.batch_rank; ++k) nbatch *= p.batch_dim[k];
    for (long long bt = 0; bt < nbatch; ++bt) {
      long long t = bt, sb = 0, db = 0;
      for (int k = p.batch_rank - 1; k >= 0; --k) {
        const long long c = t % p.batch_dim[k];
        t /= p.batch_dim[k];
        sb += c * p.batch_in[k];
        db += c * p.batch_out[k];
      }
      for (long long a0 = 0; a0 < p.A; a0 += p.tile) {
        const long long a1 = a0 + p.tile < p.A ? a0 + p.tile : p.A;
        for (long long b0 = 0; b0 < p.B; b0 += p.tile) {
          const long long b1 = b0 + p.tile < p.B ? b0 + p.tile : p.B;
          for (long long b = b0; b < b1; ++b)  // input offset of row b (split B: two input strides)
            row_in[b - b0] = sb + (b / p.b_lo) * p.in_stride_bh + (b % p.b_lo) * p.in_stride_b;
          for (long long a = a0; a < a1; ++a)
            for (long long b = b0; b < b1; ++b) move(db + a * p.out_stride_a + b, row_in[b - b0] + a);
        }
      }
    }
    return;
  }
  // N-d: output rows in order; the input offset of each row kept by an odometer over the outer dims
  const int last = p.rank - 1;
  const long long n = p.dims[last], step = p.src_stride[last];
  long long idx[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  long long off = 0;
  for (long long o = 0; o < p.count; o += n) {
    for (long long j = 0; j < n; ++j) move(o + j, off + j * step);
    for (int k = last - 1; k >= 0; --k) {
      if (++idx[k] < p.dims[k]) {
        off += p.src_stride[k];
        break;
      }
      off -= (p.dims[k] - 1) * p.src_stride[k];
      idx[k] = 0;
    }
  }
}

template <int C> static void ops_cpu_permute_chunks(const char* src, char* dst, const OpsCpuPlan& p) {
  ops_cpu_walk(p, [&](long long o, long long i) { std::memcpy(dst + o * C, src + i * C, C); });
}

static void ops_cpu_permute(const char* src, char* dst, const OpsCpuPlan& p) {
  if (p.variant == 0) {
    std::memcpy(dst, src, (size_t)p.bytes);
    return;
  }
  switch (p.chunk) {
    case 1: ops_cpu_permute_chunks<1>(src, dst, p); break;
    case 2: ops_cpu_permute_chunks<2>(src, dst, p); break;
    case 4: ops_cpu_permute_chunks<4>(src, dst, p); break;
    case 8: ops_cpu_permute_chunks<8>(src, dst, p); break;
    default: ops_cpu_permute_chunks<16>(src, dst, p); break;
  }
}

template <typename T> static inline T ops_cpu_add(T a, T b) { return (T)(a + b); }  // bool: a || b
static inline jittor::float16 ops_cpu_add(jittor::float16 a, jittor::float16 b) {
  return jittor::float16((float)a + (float)b);  // jittor's CPU float16 conversion rounds to nearest even
}
static inline jittor::bfloat16 ops_cpu_add(jittor::bfloat16 a, jittor::bfloat16 b) {
  const float f = (float)a + (float)b;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  jittor::bfloat16 r(0.f);
  r.x = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  return r;
}

template <typename T, int L> static void ops_cpu_transpose_add_lanes(const T* x, const T* y, T* dst,
                                                                     const OpsCpuPlan& p) {
  ops_cpu_walk(p, [&](long long o, long long i) {
    for (int l = 0; l < L; ++l) dst[o * L + l] = ops_cpu_add(x[i * L + l], y[o * L + l]);
  });
}

// chunk / sizeof(T) elements per moved element: 1, 2, 4, 8 or 16
template <typename T> static void ops_cpu_transpose_add(const T* x, const T* y, T* dst, const OpsCpuPlan& p) {
  switch (p.chunk / (long long)sizeof(T)) {
    case 1: ops_cpu_transpose_add_lanes<T, 1>(x, y, dst, p); break;
    case 2: ops_cpu_transpose_add_lanes<T, 2>(x, y, dst, p); break;
    case 4: ops_cpu_transpose_add_lanes<T, 4>(x, y, dst, p); break;
    case 8: ops_cpu_transpose_add_lanes<T, 8>(x, y, dst, p); break;
    default: ops_cpu_transpose_add_lanes<T, 16>(x, y, dst, p); break;
  }
}
