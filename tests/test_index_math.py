"""index_math.h (the divider every CUDA kernel uses) built with the host compiler and checked against NumPy's
// and % on edge divisors and dividends and on random ones, for both index types."""
import re
import shutil
import subprocess

import numpy as np
import pytest

from ops import _codegen

CXX = shutil.which("g++") or shutil.which("c++")

# Reads "d n" lines; prints "q r" from OpsDiv<int> (when both fit in int) and from OpsDiv<long long>.
PROGRAM = r"""
#include <cstdio>
int main() {
  long long d, n;
  while (std::scanf("%lld %lld", &d, &n) == 2) {
    const OpsDiv<long long> wide = OpsDiv<long long>::make(d);
    long long rw, qw = ops_divmod(wide, n, rw);
    long long qi = -1, ri = -1;
    if (d <= 2147483647LL && n <= 2147483647LL) {
      const OpsDiv<int> narrow = OpsDiv<int>::make(d);
      int r;
      qi = ops_divmod(narrow, (int)n, r);
      ri = r;
      if (narrow.value() != d) qi = -2;
    }
    std::printf("%lld %lld %lld %lld\n", qi, ri, qw, rw);
  }
  return 0;
}
"""

INT_MAX = 2**31 - 1
EDGE_DIVISORS = [1, 2, 3, 5, 7, 31, 32, 33, 255, 256, 257, 641, 65535, 65536, 65537, 2**30 - 1, 2**30,
                 2**30 + 1, 2**31 - 3, 2**31 - 2, INT_MAX]


def _cases(rng):
    d_list, n_list = [], []
    for d in EDGE_DIVISORS:
        for n in {0, 1, 2, 3, 7, d - 1, d, d + 1, 2 * d - 1, 2 * d, 3 * d + 1, INT_MAX - 1, INT_MAX,
                  INT_MAX - INT_MAX % d, INT_MAX - INT_MAX % d - 1}:
            if 0 <= n <= INT_MAX:
                d_list.append(d)
                n_list.append(n)
    # random divisors over every magnitude, random dividends below 2^31
    for bits in range(1, 32):
        d = rng.integers(1 << (bits - 1), min(1 << bits, INT_MAX + 1), size=400)
        d_list.extend(d.tolist())
        n_list.extend(rng.integers(0, INT_MAX + 1, size=400).tolist())
        # dividends near multiples of d: where a rounding error of the magic number would show first
        k = rng.integers(0, INT_MAX // d + 1)
        n = np.clip(k * d + rng.integers(-1, 2, size=400), 0, INT_MAX)
        d_list.extend(d.tolist())
        n_list.extend(n.tolist())
    # the long long divider beyond 2^31
    d_list += [3, 7, INT_MAX, 2**31, 2**40 + 3]
    n_list += [2**31, 2**33 + 5, 2**40, 2**45 + 1, 2**50]
    return np.array(d_list, dtype=np.int64), np.array(n_list, dtype=np.int64)


@pytest.fixture(scope="module")
def divider(tmp_path_factory):
    if CXX is None:
        pytest.skip("no host C++ compiler")
    folder = tmp_path_factory.mktemp("index_math")
    src, exe = folder / "div.cpp", folder / "div"
    src.write_text(_codegen.header(["index_math.h"]) + PROGRAM)
    build = subprocess.run([CXX, "-O2", "-std=c++17", str(src), "-o", str(exe)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    return exe


def test_divider_matches_numpy_floor_division_and_remainder(divider):
    d, n = _cases(np.random.default_rng(38))
    run = subprocess.run([str(divider)], input="".join(f"{a} {b}\n" for a, b in zip(d, n)), capture_output=True,
                         text=True, check=True)
    got = np.array(run.stdout.split(), dtype=np.int64).reshape(-1, 4)
    narrow = (d <= INT_MAX) & (n <= INT_MAX)
    assert narrow.sum() > 20000 and (~narrow).sum() == 5
    np.testing.assert_array_equal(got[narrow, 0], n[narrow] // d[narrow])
    np.testing.assert_array_equal(got[narrow, 1], n[narrow] % d[narrow])
    np.testing.assert_array_equal(got[:, 2], n // d)
    np.testing.assert_array_equal(got[:, 3], n % d)


def test_every_cuda_snippet_divides_with_the_shared_divider():
    assert "struct OpsDivisor" in _codegen.snippet("index_math.h")
    assert _codegen.snippet_path("index_math.h") in _codegen.depends("common")
    for name in ("common", "broadcast", "permute", "pool3d", "pool3d_gather", "timex"):
        text = _codegen.snippet(name)
        # (they may use OpsDiv; none defines a divider of its own)
        assert not re.search(r"struct\s+\w*Div", text) and not re.search(r"\w*Div\w*\s*\(unsigned", text), name
