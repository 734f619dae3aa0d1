"""Time the max_pool3d backward kernels of the grader's GPU cases without jittor, as jittor builds them.

``python tests/pool3d_bwd_ab.py [--snippets DIR ...] [-k WORD]`` compiles, for each snippets directory (default:
the package's ``cuda_snippets``), one standalone CUDA program per dtype from the header jittor compiles
(``pool3d.cuda_header``: the snippets and the generated menus, with jittor's nvcc flags) and runs it. For every
backward case of the grader's GPU table it calls the menu entry the dispatcher picks, with inputs that hold ties,
argmax indices made on the host (the first maximum in (d, h, w) order) and a random dy; it prints the kernel time
(the best of 5 runs of 100 launches, CUDA events) and whether dx has the bits of a host sum in (od, oh, ow) order
(the gather's and ``bwd_disjoint``'s order; ``bwd_runs`` sums a run of windows first, so it shows its largest
difference). Two directories side by side are an A/B of a kernel change: same inputs, same menus, and the kernels
compiled inside their menu, which is other code than one kernel instantiated alone.

Making the sources needs the package (jittor built, no GPU); the programs need only a GPU. ``--build-only --keep
DIR`` builds them anywhere with nvcc, and ``--run DIR`` runs them on the GPU machine with no jittor import, so a
fresh GPU machine does not first spend the 70-105 s of jittor's core build. Edit a copy of ``cuda_snippets`` and
pass both directories.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nvcc_util import PRELUDE  # noqa: E402  float16 as CUDA's __half, as jittor's CUDA ops have it

# The host program: the menu of one dtype, then a table of the layers (filled in below).
_MAIN = r"""
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

typedef @T@ T;
typedef @A@ A;  // the accumulator of a sum on the host, as the kernels' Pool3dAcc
static float to_float(float v) { return v; }
static float to_float(double v) { return (float)v; }
static float to_float(__half v) { return __half2float(v); }
static float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class X> X from_float(float v) { return (X)v; }
template <> __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <class X> X from_acc(A v) { return from_float<X>((float)v); }
template <> double from_acc<double>(A v) { return (double)v; }

struct Layer { const char* name; int v; long long planes; Pool3dGeom g; };

static int run(const Layer& L, std::mt19937& rng) {
  const Pool3dGeom& g = L.g;
  const long long pin = (long long)g.D * g.H * g.W, pout = (long long)g.Do * g.Ho * g.Wo;
  std::uniform_int_distribution<int> tie(-3, 3);
  std::normal_distribution<float> normal;
  std::vector<float> x(L.planes * pin);
  for (auto& v : x) v = to_float(from_float<T>((rng() & 1) ? (float)tie(rng) : normal(rng)));  // half ties
  std::vector<int> idx(L.planes * pout);
  std::vector<T> dy(L.planes * pout);
  std::vector<A> sum(L.planes * pin, (A)0);
  for (long long p = 0; p < L.planes; ++p)
    for (int od = 0; od < g.Do; ++od)
      for (int oh = 0; oh < g.Ho; ++oh)
        for (int ow = 0; ow < g.Wo; ++ow) {
          float best = 0.0f;
          int arg = -1;
          for (int a = 0; a < g.kd; ++a)
            for (int b = 0; b < g.kh; ++b)
              for (int c = 0; c < g.kw; ++c) {
                const int d = od * g.sd - g.pd + a * g.dd, h = oh * g.sh - g.ph + b * g.dh,
                          w = ow * g.sw - g.pw + c * g.dw;
                if (d < 0 || d >= g.D || h < 0 || h >= g.H || w < 0 || w >= g.W) continue;
                const int at = (d * g.H + h) * g.W + w;
                if (arg < 0 || x[p * pin + at] > best) best = x[p * pin + at], arg = at;
              }
          const long long o = p * pout + ((long long)od * g.Ho + oh) * g.Wo + ow;
          idx[o] = arg;
          dy[o] = from_float<T>(normal(rng));
          if (arg >= 0) sum[p * pin + arg] = sum[p * pin + arg] + (A)to_float(dy[o]);
        }
  int* d_idx;
  T *d_dy, *d_dx;
  cudaMalloc(&d_idx, idx.size() * sizeof(int));
  cudaMalloc(&d_dy, dy.size() * sizeof(T));
  cudaMalloc(&d_dx, sum.size() * sizeof(T));
  cudaMemcpy(d_idx, idx.data(), idx.size() * sizeof(int), cudaMemcpyHostToDevice);
  cudaMemcpy(d_dy, dy.data(), dy.size() * sizeof(T), cudaMemcpyHostToDevice);
  cudaMemset(d_dx, 0xff, sum.size() * sizeof(T));  // NaN everywhere: an element left unwritten shows
  auto launch = [&]() { pool3d_bwd_gather_menu<T, int>(L.v, d_idx, d_dy, d_dx, g, L.planes); };
  launch();
  if (cudaDeviceSynchronize() != cudaSuccess) {
    std::printf("%s: launch failed: %s\n", L.name, cudaGetErrorString(cudaGetLastError()));
    return 1;
  }
  std::vector<T> dx(sum.size());
  cudaMemcpy(dx.data(), d_dx, dx.size() * sizeof(T), cudaMemcpyDeviceToHost);
  long long differ = 0;
  double worst = 0.0;
  for (size_t i = 0; i < dx.size(); ++i) {
    const T want = from_acc<T>(sum[i]);
    if (std::memcmp(&want, &dx[i], sizeof(T)) != 0) {
      ++differ;
      const double gap = std::fabs((double)to_float(dx[i]) - (double)to_float(want));
      worst = std::isnan(gap) ? INFINITY : (gap > worst ? gap : worst);
    }
  }
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < 10; ++i) launch();
  float best = 1e30f;
  for (int round = 0; round < 5; ++round) {
    cudaEventRecord(start);
    for (int i = 0; i < 100; ++i) launch();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    best = ms / 100 < best ? ms / 100 : best;
  }
  if (differ) {
    std::printf("%s\t%.4f\tdiffers from the host sum on %lld elements, by at most %.3g\n", L.name, best, differ, worst);
  } else {
    std::printf("%s\t%.4f\tthe host sum's bits\n", L.name, best);
  }
  cudaFree(d_idx);
  cudaFree(d_dy);
  cudaFree(d_dx);
  return 0;
}

int main() {
  static const Layer layers[] = {
@LAYERS@
  };
  std::mt19937 rng(20261130);
  int failed = 0;
  for (const Layer& L : layers) failed += run(L, rng);
  return failed;
}
"""
MANIFEST = "programs.txt"  # a build's programs: "head<TAB>file" per line, for --run
_TYPES = {"float32": ("float", "float"), "float64": ("double", "double"), "float16": ("__half", "float"),
          "bfloat16": ("__nv_bfloat16", "float")}


def _layers(word: str):
    """The grader's GPU backward cases of max_pool3d (``word`` in the id, where given): (case, params, config)."""
    from ops import pool3d as P
    from ops.scoring import fam_pool3d as F
    out = []
    for c in F.FAMILY.cases:
        if c.direction != "bwd" or "cuda" not in c.devices or (word and word not in c.id):
            continue
        params = P.normalize_params(**F.case_params(c))
        cfg = P.select_config(c.shapes[0], c.dtype, params, "bwd", on_cuda=True)
        out.append((c, params, cfg))
    return out


def _layer_line(c, params, cfg) -> str:
    from ops import pool3d as P
    shape = c.shapes[0]
    spatial = tuple(shape[-3:])
    outs = P.output_shape(spatial, params)
    planes = 1
    for n in shape[:-3]:
        planes *= n
    geom = [*spatial, *outs, *params.kernel, *params.stride, *params.padding, *params.dilation]
    name = f"{c.name} {cfg.variant}"
    return f'    {{"{name}", {P.menu_index(cfg, c.dtype)}, {planes}LL, {{{", ".join(map(str, geom))}}}}},'


def build(snippets: str, number: str, dtype: str, layers, work: str, arch: str) -> str:
    """Compile the program of one dtype's ``layers`` against ``snippets`` (the ``number``-th directory); its path."""
    from ops import _codegen
    from ops import pool3d as P
    header = P.cuda_header(_codegen.ITEMSIZE[dtype])
    here = str(_codegen.snippet_dir())
    # jittor's float16 header (and the logging its CHECK pulls in) gives way to the same types under their names
    header = header.replace(here + os.sep, os.path.abspath(snippets) + os.sep).replace(_codegen._FP16_INCLUDE, "")
    t, acc = _TYPES[dtype]
    main = _MAIN.replace("@T@", t).replace("@A@", acc).replace(
        "@LAYERS@", "\n".join(_layer_line(*layer) for layer in layers))
    source = (PRELUDE + "#include <iostream>\n#include <string>\n#include <unordered_map>\n#define LOGf std::cerr\n"
              + header + main)
    tag = f"{number}-{os.path.basename(os.path.abspath(snippets))}-{dtype}"
    path, exe = os.path.join(work, tag + ".cu"), os.path.join(work, tag)
    with open(path, "w") as f:
        f.write(source)
    cmd = ["nvcc", "-std=c++17", "-x", "cu", "--use_fast_math", "-w", f"-arch=compute_{arch}", f"-code=sm_{arch}",
           path, "-o", exe]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"nvcc failed for {tag}:\n{proc.stderr[-4000:]}")
    return exe


def run_programs(work: str) -> int:
    """Run the programs a build listed in ``work`` (no jittor needed) and print their times side by side."""
    with open(os.path.join(work, MANIFEST)) as f:
        programs = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    heads = list(dict.fromkeys(head for head, _ in programs))
    times = {}
    for head, exe in programs:
        run = subprocess.run([os.path.join(work, exe)], capture_output=True, text=True)
        if run.returncode != 0:
            print(f"{exe} failed:\n{run.stdout}{run.stderr}", file=sys.stderr)
            return 1
        for line in run.stdout.splitlines():
            name, ms, bits = line.split("\t")
            times.setdefault(name, {})[head] = (float(ms), bits)
    print("case (variant)\t" + "\t".join(f"{h} ms" for h in heads) + "\tdx")
    for name, by_head in times.items():
        runs = [by_head[h] for h in heads if h in by_head]
        cells = [f"{ms:.4f}" + (f" ({ms / runs[0][0]:.2f}x)" if i else "") for i, (ms, _) in enumerate(runs)]
        print(name + "\t" + "\t".join(cells) + "\t" + "; ".join(dict.fromkeys(b for _, b in runs)))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--snippets", action="append", help="a cuda_snippets directory (repeat for an A/B); "
                    "default: the package's")
    ap.add_argument("-k", dest="word", default="", help="only the cases whose id holds this")
    ap.add_argument("--arch", default="90", help="the GPU's compute capability without the dot (default 90)")
    ap.add_argument("--keep", help="build here and keep the sources and programs (default: a temporary folder)")
    ap.add_argument("--build-only", action="store_true", help="compile the programs, run nothing (no GPU needed)")
    ap.add_argument("--run", metavar="DIR", help="run the programs built in DIR (--build-only --keep DIR): no "
                    "jittor import, so a fresh GPU machine starts at once")
    args = ap.parse_args(argv)
    if args.run:
        return run_programs(args.run)
    if shutil.which("nvcc") is None:
        print("pool3d_bwd_ab: nvcc is not on PATH", file=sys.stderr)
        return 2
    from ops import _codegen
    dirs = args.snippets or [str(_codegen.snippet_dir())]
    layers = _layers(args.word)
    work = args.keep or tempfile.mkdtemp(prefix="pool3d_bwd_ab-")
    os.makedirs(work, exist_ok=True)
    manifest = []
    for i, snippets in enumerate(dirs):
        head = f"{i + 1}:{os.path.basename(os.path.abspath(snippets))}"
        for dtype in sorted({c.dtype for c, _, _ in layers}):
            picked = [layer for layer in layers if layer[0].dtype == dtype]
            manifest.append((head, os.path.basename(build(snippets, f"{i + 1}", dtype, picked, work, args.arch))))
    with open(os.path.join(work, MANIFEST), "w") as f:
        f.write("".join(f"{head}\t{exe}\n" for head, exe in manifest))
    if args.build_only:
        print(f"built {len(manifest)} programs in {work}")
        return 0
    return run_programs(work)


if __name__ == "__main__":
    sys.exit(main())
