// pool3d_cpu.h: the MaxPool3D CPU path (jt.code cpu_src of ops/pool3d.py): the CUDA kernels' index math as
// loop nests (flat work-item index split into plane, z, y, x; the same window scan and NaN rule; the same tile,
// scatter and gather algorithms). Compare values are float (double for float64); NaN tests read the bits
// because jittor compiles CPU code with -Ofast. Every size and parameter comes from the shapes and `data`: one
// compile per dtype and algorithm. Needs pool3d_gather.cuh included before it (ops/pool3d.py does).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
namespace pool3d_cpu {
template <typename T> struct Acc { typedef float type; };
template <> struct Acc<double> { typedef double type; };
inline bool isnan_bits(float v) { uint32_t b; std::memcpy(&b, &v, 4); return (b << 1) > 0xff000000u; }
inline bool isnan_bits(double v) { uint64_t b; std::memcpy(&b, &v, 8); return (b << 1) > 0xffe0000000000000ull; }
inline float neg_inf() { const uint32_t b = 0xff800000u; float f; std::memcpy(&f, &b, 4); return f; }
template <typename T> inline T from_acc(typename Acc<T>::type v) { return T(v); }
// jittor's CPU bfloat16 truncates; round to nearest even like the GPU's __float2bfloat16_rn.
template <> inline jittor::bfloat16 from_acc<jittor::bfloat16>(float v) {
  uint32_t b; std::memcpy(&b, &v, 4);
  jittor::bfloat16 r(0.0f);
  r.x = isnan_bits(v) ? (uint16_t)((b >> 16) | 0x40u) : (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
  return r;
}

struct Geom {
  long long D, H, W, Do, Ho, Wo;
  int kd, kh, kw, sd, sh, sw, pd, ph, pw, dd, dh, dw;
};
template <typename Map>
inline Geom geom(long long D, long long H, long long W, long long Do, long long Ho, long long Wo, Map& data) {
  Geom g;
  g.D = D; g.H = H; g.W = W; g.Do = Do; g.Ho = Ho; g.Wo = Wo;
  g.kd = (int)data["kd"]; g.kh = (int)data["kh"]; g.kw = (int)data["kw"];
  g.sd = (int)data["sd"]; g.sh = (int)data["sh"]; g.sw = (int)data["sw"];
  g.pd = (int)data["pd"]; g.ph = (int)data["ph"]; g.pw = (int)data["pw"];
  g.dd = (int)data["dd"]; g.dh = (int)data["dh"]; g.dw = (int)data["dw"];
  return g;
}
inline void split(long long i, long long nx, long long ny, long long nz, long long& plane, long long& z,
                  long long& y, long long& x) {
  const long long q0 = i / nx, q1 = q0 / ny;
  x = i - q0 * nx; y = q0 - q1 * ny; plane = q1 / nz; z = q1 - plane * nz;
}

// The window's argmax position in the plane, -1 for a window without elements.
template <typename T>
inline long long window_argmax(const T* plane, const Geom& g, long long od, long long oh, long long ow) {
  typedef typename Acc<T>::type A;
  const long long d0 = od * g.sd - g.pd, h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
  A best = 0;
  long long pos = -1;
  for (int i = 0; i < g.kd; ++i) {
    const long long d = d0 + (long long)i * g.dd;
    if (d < 0 || d >= g.D) continue;
    for (int j = 0; j < g.kh; ++j) {
      const long long h = h0 + (long long)j * g.dh;
      if (h < 0 || h >= g.H) continue;
      const long long row = (d * g.H + h) * g.W;
      for (int k = 0; k < g.kw; ++k) {
        const long long w = w0 + (long long)k * g.dw;
        if (w < 0 || w >= g.W) continue;
        const A c = (A)plane[row + w];
        if (pos < 0 || isnan_bits(c) || (!isnan_bits(best) && c > best)) { best = c; pos = row + w; }
      }
    }
  }
  return pos;
}

template <typename T, int MODE>
void forward(const T* x, T* y, int* yi, long long planes, const Geom& g) {
  const long long plane_in = g.D * g.H * g.W, total = planes * g.Do * g.Ho * g.Wo;
  for (long long o = 0; o < total; ++o) {
    long long plane, od, oh, ow;
    split(o, g.Wo, g.Ho, g.Do, plane, od, oh, ow);
    const T* xp = x + plane * plane_in;
    const long long pos = window_argmax(xp, g, od, oh, ow);
    if (MODE & 1) y[o] = pos >= 0 ? xp[pos] : T(neg_inf());
    if (MODE & 2) yi[o] = (int)pos;
  }
}

// TILE: the windows partition dx; each writes what it owns, the last window of a dim up to the input's edge
// (ceil_mode's partial windows stop short, floor mode's also own the remainder, which no window holds: 0).
// Otherwise windows are disjoint: zero dx, then write dy at each argmax.
template <typename T, bool TILE>
void backward_window(const T* x, const T* dy, T* dx, long long planes, const Geom& g) {
  const long long plane_in = g.D * g.H * g.W, total = planes * g.Do * g.Ho * g.Wo;
  if (!TILE) std::memset((void*)dx, 0, sizeof(T) * planes * plane_in);
  for (long long o = 0; o < total; ++o) {
    long long plane, od, oh, ow;
    split(o, g.Wo, g.Ho, g.Do, plane, od, oh, ow);
    const long long pos = window_argmax(x + plane * plane_in, g, od, oh, ow);
    T* dp = dx + plane * plane_in;
    if (TILE) {
      const long long d0 = od * g.kd, h0 = oh * g.kh, w0 = ow * g.kw;
      const long long ed = od == g.Do - 1 ? g.D - d0 : g.kd, eh = oh == g.Ho - 1 ? g.H - h0 : g.kh;
      const long long ew = ow == g.Wo - 1 ? g.W - w0 : g.kw;
      for (long long i = 0; i < ed; ++i)
        for (long long j = 0; j < eh; ++j)
          for (long long k = 0; k < ew; ++k) {
            const long long p = ((d0 + i) * g.H + h0 + j) * g.W + w0 + k;
            dp[p] = p == pos ? dy[o] : T(0.0f);
          }
    } else if (pos >= 0) {
      dp[pos] = dy[o];
    }
  }
}

// Each input element sums, in (od, oh, ow) order, dy of the windows that hold it and chose it: the CUDA
// kernel's work items (runs of RUN elements of a row, pool3d_gather.cuh) one after another.
template <typename T> struct GatherLoad {
  typename Acc<T>::type operator()(const T* p) const { return (typename Acc<T>::type)*p; }
};
template <typename T, int RUN>
void backward_gather(const int* idx, const T* dy, T* dx, long long planes, const Geom& g) {
  typedef typename Acc<T>::type A;
  const Pool3dWinR win = {g.kd, g.kh, g.kw, g.sd, g.sh, g.sw, g.dd, g.dh, g.dw};
  const Pool3dGatherDims gd = {(int)g.H, (int)g.W, (int)g.Do, (int)g.Ho, (int)g.Wo, g.pd, g.ph, g.pw};
  const long long plane_in = g.D * g.H * g.W, plane_out = g.Do * g.Ho * g.Wo;
  for (long long p = 0; p < planes; ++p)
    for (int id = 0; id < (int)g.D; ++id)
      for (int ih = 0; ih < (int)g.H; ++ih)
        for (int w0 = 0; w0 < (int)g.W; w0 += RUN) {
          const int n = std::min(RUN, (int)g.W - w0);
          A acc[RUN];
          pool3d_gather_run<A, RUN>(win, gd, idx + p * plane_out, dy + p * plane_out, id, ih, w0, n, acc,
                                    GatherLoad<T>());
          T* dp = dx + p * plane_in + ((long long)id * g.H + ih) * g.W + w0;
          for (int r = 0; r < n; ++r) dp[r] = from_acc<T>(acc[r]);
        }
}
}  // namespace pool3d_cpu
