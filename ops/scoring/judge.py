"""The verdict: one output compared with what the float64 reference says it must be. NumPy only.

The grading worker never runs this: it hands its outputs back as files and the parent process judges them, so
nothing a graded module changes in its own process reaches the verdict.

Rules (``Expected.kind``):
* ``exact``: the dtype's values bit for bit (NaN matches any NaN). Used where the op copies or selects values
  (permute, broadcast, max_pool3d values and indices) and for integer and bool results. ``signed_zero``: -0.0
  and 0.0 differ, for ops that copy values (a copy keeps the sign).
* ``faithful``: one rounding of an exactly known result (an IEEE add of two values of the dtype): ``value``
  is the correctly rounded result in the output dtype and ``bound`` the sign of (exact - value) per element
  (int8); an output passes where it is that value or the dtype's neighbour on the exact result's side
  (faithful rounding: a conversion that truncates is one off), NaN where the reference has NaN, the same
  infinities. Compared as integers in the dtype's own bits, a chunk at a time: a few passes over the
  output's bytes, where ``rounded`` makes a dozen over float64 copies.
* ``rounded``: NaN where the reference has NaN, the same infinities, and every finite value within
  ``bound`` (a scalar or a per-element array) of the reference. Families derive the bound from the arithmetic:
  one unit in the last place of the output dtype plus the accumulated rounding of a sum, scaled per element
  by the sum's own terms (see ``sum_bound``).
Shape and dtype must match exactly (``dtypes`` lists the accepted dtypes).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple, Union

import numpy as np

# Significand bits (with the implicit one) of each float dtype; unit roundoff u = 2^-p.
SIGNIFICAND_BITS = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}
# A sum of n terms accumulated one after another in a float with unit roundoff u has a rounding error that
# behaves like a random walk: each step rounds by up to u |partial sum|, so its standard deviation is about
# u sqrt(n) sqrt(S^2 / 9 + L^2 / 18) for a final sum S and terms of 2-norm L (partial sums of random data
# follow a Brownian bridge from 0 to S). A bridge that strays far before it comes back to a small S rounds
# more than that average: ``sum_bound`` allows SUM_SIGMAS x u sqrt(n) sqrt(S^2 / 9 + L^2 / 6) (a plain
# float32 loop over 128 to 4096 random terms stayed within half of it in 2 x 10^5 sums, where 6 x the
# average deviation was exceeded), with n capped at SUM_BLOCK: a plain float32 loop passes up to 4096
# terms; longer reductions must accumulate in blocks, pairwise or in a tree (as PyTorch, NumPy and these
# ops do), whose error stays within that of 4096 terms. A 1e-2 error in one element of a float32 sum of
# 10^5 to 2.6 x 10^5 terms in [-1, 1] is outside the bound.
SUM_SIGMAS = 8.0
SUM_BLOCK = 4096


@dataclass
class Expected:
    value: np.ndarray  # float64 for floats (NaN/Inf as the reference says), the exact dtype otherwise
    dtypes: Tuple[str, ...]  # accepted output dtypes; the first is the one reported as expected
    kind: str = "exact"  # "exact", "faithful" or "rounded"
    # rounded: allowed |error| per finite element; faithful: the sides (sign of exact - value, int8), or a
    # function giving them at given flat indices (computed only where an output differs from the value)
    bound: Union[float, np.ndarray, Callable[[np.ndarray], np.ndarray], None] = None
    signed_zero: bool = False  # exact floats: -0.0 and 0.0 differ

    def __post_init__(self):
        if self.kind not in ("exact", "faithful", "rounded"):
            raise ValueError(f"kind must be 'exact', 'faithful' or 'rounded', got {self.kind!r}")
        if self.kind != "exact" and self.bound is None:
            raise ValueError(f"a {self.kind} expectation needs a bound")

    def take(self, positions: np.ndarray) -> "Expected":
        """What the elements at the flat ``positions`` must be (a 1-D expectation of len(positions))."""
        value = np.asarray(self.value)
        at = np.unravel_index(positions, value.shape)
        bound = self.bound
        if callable(bound):
            whole = bound

            def bound(flat):
                return whole(positions[flat])
        elif bound is not None and np.ndim(bound):
            bound = np.broadcast_to(bound, value.shape)[at]
        return Expected(value[at], self.dtypes, self.kind, bound, self.signed_zero)


def host_values(a: np.ndarray, dtype: str) -> np.ndarray:
    """The values of a handed-back output of jittor dtype ``dtype``: bfloat16 bits (uint16, as the worker writes
    them) as float32, which holds each bfloat16 exactly; any other array as it is."""
    if dtype == "bfloat16" and a.dtype == np.uint16:
        return (a.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return a


def unit_roundoff(dtype: str) -> float:
    return 2.0 ** -SIGNIFICAND_BITS[dtype]


# Elements per block of the element-wise bounds below: their temporaries stay in the allocator's reuse (a fresh
# 200 MB temporary costs ~20 ns an element in page faults on a 2-core machine: np.abs of 25M float64 values
# took 0.5 s, in blocks 0.03), and in the caches.
BOUND_BLOCK = 1 << 20
_MIN_EXP = {"float16": -14, "bfloat16": -126, "float32": -126, "float64": -1022}


def _blockwise(fn, out: np.ndarray, *arrays: np.ndarray) -> np.ndarray:
    """``out`` (flat view written) = fn(*blocks) over BOUND_BLOCK elements of the flat ``arrays`` at a time."""
    flats = [np.asarray(a, dtype=np.float64).reshape(-1) for a in arrays]
    flat_out = out.reshape(-1)
    for start in range(0, flat_out.size, BOUND_BLOCK):
        flat_out[start:start + BOUND_BLOCK] = fn(*(f[start:start + BOUND_BLOCK] for f in flats))
    return out


def _ulp_block(a: np.ndarray, p: int, min_exp: int) -> np.ndarray:
    usable = np.isfinite(a) & (a != 0)
    exponent = ((a.view(np.int64) >> 52) & 0x7FF) - 1023  # floor(log2 |a|) of a normal float64
    np.maximum(np.where(usable, exponent, min_exp), min_exp, out=exponent)
    return np.ldexp(1.0, exponent - (p - 1))


def ulp(values: np.ndarray, dtype: str) -> np.ndarray:
    """The spacing of ``dtype``'s floats at |values| (at least the smallest normal's spacing)."""
    p, min_exp = SIGNIFICAND_BITS[dtype], _MIN_EXP[dtype]
    values = np.asarray(values, dtype=np.float64)
    return _blockwise(lambda a: _ulp_block(a, p, min_exp), np.empty(values.shape), values)


def sum_bound(want: np.ndarray, l2: np.ndarray, n: int, dtype: str, acc_dtype: str = "float32",
              out_ulps: float = 1.0) -> np.ndarray:
    """The allowed error of a sum of ``n`` terms (per output element: final value ``want``, 2-norm of its
    terms ``l2``) accumulated in ``acc_dtype`` and stored in ``dtype``: ``out_ulps`` units in the last place
    of the output plus the accumulation's random walk (see SUM_SIGMAS)."""
    p, min_exp = SIGNIFICAND_BITS[dtype], _MIN_EXP[dtype]
    scale = SUM_SIGMAS * unit_roundoff(acc_dtype) * np.sqrt(min(max(n, 1), SUM_BLOCK))

    def block(w, norm):
        w = np.where(np.isfinite(w), w, 0.0)
        norm = np.where(np.isfinite(norm), norm, 0.0)
        walk = np.sqrt(w * w / 9.0 + norm * norm / 6.0)
        return out_ulps * _ulp_block(w, p, min_exp) + scale * walk

    want = np.asarray(want, dtype=np.float64)
    l2 = np.broadcast_to(np.asarray(l2, dtype=np.float64), want.shape)
    return _blockwise(block, np.empty(want.shape), want, l2)


def _as_float64(got: np.ndarray) -> np.ndarray:
    return got.astype(np.float64, copy=False)


def judge(got: np.ndarray, got_dtype: str, exp: Expected,
          origin: Tuple[int, ...] = ()) -> Tuple[bool, Optional[float], str]:
    """(ok, max abs error over comparable elements or a count of differing elements, why). ``origin``: where
    ``got`` starts in the whole output (a block of rows judged alone), added to the index a failure names."""
    want = np.asarray(exp.value)
    if tuple(got.shape) != tuple(want.shape):
        return False, None, f"shape {tuple(got.shape)} != expected {tuple(want.shape)}"
    if got_dtype not in exp.dtypes:
        return False, None, f"dtype {got_dtype} != expected {exp.dtypes[0]}"
    if want.dtype.kind not in "fc":
        bad = np.count_nonzero(got != want)
        return _verdict_count(bad, got, want, origin)
    if exp.kind == "exact":
        return _judge_exact(got, want, exp.signed_zero, origin)
    if exp.kind == "faithful":
        side = exp.bound if callable(exp.bound) else np.asarray(exp.bound)
        return _judge_faithful(got, got_dtype, want, side, origin)
    g, w = _as_float64(got), want.astype(np.float64, copy=False)
    nan_g, nan_w = np.isnan(g), np.isnan(w)
    if not np.array_equal(nan_g, nan_w):
        return _first(nan_g != nan_w, g, w, "NaN where the reference has none" if (nan_g & ~nan_w).any()
                      else "a number where the reference has NaN", origin)
    inf_w = np.isinf(w)
    inf_differ = (np.isinf(g) | inf_w) & (g != w)
    if inf_differ.any():
        return _first(inf_differ, g, w, f"{int(inf_differ.sum())} infinities differ", origin)
    finite = ~(nan_w | inf_w)
    err = np.where(finite, np.abs(g - np.where(finite, w, 0.0)), 0.0)
    bad = err > exp.bound
    max_err = float(err.max()) if err.size else 0.0
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        bound = exp.bound[idx] if np.ndim(exp.bound) else exp.bound
        return False, max_err, (f"{int(bad.sum())} elements off, first at {_shifted(idx, origin)}: got {g[idx]!r}, "
                                f"want {w[idx]!r} (allowed {float(bound):.3g})")
    return True, max_err, ""


_BITS = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def _judge_exact(got: np.ndarray, want: np.ndarray, signed_zero: bool, origin=()):
    """Exact floats, compared as bit patterns in the output's own dtype (a few passes over the output's
    bytes rather than a dozen over float64 copies: a 128 MB output takes a fraction of a second). The values
    a copy or a selection must give are values of that dtype; a reference that holds any other value (it
    cannot be matched exactly) is reported as such."""
    w = want.astype(got.dtype, copy=False)
    if w.dtype != want.dtype and not np.array_equal(w, want, equal_nan=True):
        return False, None, "the reference holds values the output dtype cannot represent"
    bits = _BITS[got.dtype.itemsize]
    g_flat = np.ascontiguousarray(got).reshape(-1)
    w_flat = np.ascontiguousarray(w).reshape(-1)
    candidates = np.flatnonzero(g_flat.view(bits) != w_flat.view(bits))
    if candidates.size == 0:
        return True, 0.0, ""
    g_c, w_c = g_flat[candidates], w_flat[candidates]
    same = np.isnan(g_c) & np.isnan(w_c)  # NaN matches any NaN, whatever its payload or sign
    if not signed_zero:
        same |= g_c == w_c  # 0.0 and -0.0
    if same.all():
        return True, 0.0, ""
    bad = candidates[~same]
    if np.isnan(g_c[~same]).any() or np.isnan(w_c[~same]).any():
        nan_g, nan_w = np.isnan(g_flat[bad]), np.isnan(w_flat[bad])
        at = bad[np.argmax(nan_g != nan_w)]
        why = "NaN where the reference has none" if (nan_g & ~nan_w).any() else "a number where the reference has NaN"
    else:
        at, why = bad[0], f"{bad.size} elements differ (exact op)"
    idx = tuple(int(i) for i in np.unravel_index(at, got.shape))
    g64, w64 = g_c[~same].astype(np.float64), w_c[~same].astype(np.float64)
    finite = np.isfinite(g64) & np.isfinite(w64)
    err = float(np.abs(g64[finite] - w64[finite]).max()) if finite.any() else None
    return False, err, f"{why}, first at {_shifted(idx, origin)}: got {got[idx]!r}, want {w[idx]!r}"


# Elements per chunk of the faithful judge (its temporaries: a few int64 arrays of this length, 32 MB each).
FAITHFUL_CHUNK = 1 << 22


def _ordered(values: np.ndarray, dtype: str) -> np.ndarray:
    """The dtype's bit patterns as integers in the order of the values (-0.0 and 0.0 both 0; the next float up
    is one more): int32 for the 16-bit dtypes, int64 for the wider. bfloat16 arrives as float32 holding
    bfloat16 values: its upper 16 bits."""
    if dtype == "bfloat16":
        bits, width = (values.view(np.uint32) >> np.uint32(16)).astype(np.int32), 16
    else:
        width = 8 * values.dtype.itemsize
        bits = values.view(_BITS[values.dtype.itemsize]).astype(np.int32 if width == 16 else np.int64)
    if width == 64:  # int64 cannot hold the unsigned pattern: the sign is the int64's own
        negative = bits < 0
        bits &= np.int64(0x7FFFFFFFFFFFFFFF)
    else:
        negative = bits >= (1 << (width - 1))
        bits &= (1 << (width - 1)) - 1
    np.negative(bits, out=bits, where=negative)
    return bits


def _judge_faithful(got: np.ndarray, dtype: str, want: np.ndarray, side, origin=()):
    """``faithful``: ``got`` equals ``want`` (the correctly rounded result) or is its neighbour towards the
    exact result (``side``: the sign of exact - want, an array or a function of flat indices), chunk by chunk
    over the flat arrays. Elements whose bits equal ``want``'s pass at once; the rest are judged one by one
    (on an H100 table's 280M-element bfloat16 transpose_add all of a right output is the first kind)."""
    g_flat = np.ascontiguousarray(got).reshape(-1)
    w_flat = np.ascontiguousarray(want.astype(got.dtype, copy=False)).reshape(-1)
    bits = _BITS[g_flat.dtype.itemsize]
    if not callable(side):
        side_flat = np.broadcast_to(side, want.shape).reshape(-1)

        def side(flat):
            return side_flat[flat]
    bad_total, first, why, worst = 0, None, "", 0.0
    for start in range(0, g_flat.size, FAITHFUL_CHUNK):
        differ = start + np.flatnonzero(g_flat[start:start + FAITHFUL_CHUNK].view(bits)
                                        != w_flat[start:start + FAITHFUL_CHUNK].view(bits))
        if not differ.size:
            continue
        g, w = g_flat[differ], w_flat[differ]
        nan_g, nan_w = np.isnan(g), np.isnan(w)
        bad = nan_g != nan_w
        inf = np.isinf(g) | np.isinf(w)
        bad |= inf & (g != w) & ~(nan_g | nan_w)
        step = _ordered(g, dtype) - _ordered(w, dtype)
        finite = ~(nan_g | nan_w | inf)
        off = finite & (step != 0)
        far = off & (np.abs(step) > 1)  # more than one step from the rounded value: wrong whatever the side
        bad |= far
        near = off & ~far
        if near.any():  # the exact side only where it decides (~30 ns an element)
            bad[near] |= step[near] != side(differ[near])
        count = int(np.count_nonzero(bad))
        if count and first is None:
            k = int(np.argmax(bad))
            first = int(differ[k])
            if nan_g[k] != nan_w[k]:
                why = "NaN where the reference has none" if nan_g[k] else "a number where the reference has NaN"
            elif inf[k]:
                why = "infinities differ"
            else:
                why = "not the correctly rounded sum or its neighbour towards the exact one"
        bad_total += count
        if not count and off.any():  # the largest error of a passing output: over the elements one off only
            worst = max(worst, float(np.abs(g[off].astype(np.float64) - w[off].astype(np.float64)).max()))
    if first is None:
        return True, worst, ""
    idx = tuple(int(i) for i in np.unravel_index(first, got.shape))
    return False, float(bad_total), (f"{bad_total} elements off ({why}), first at {_shifted(idx, origin)}: "
                                     f"got {got[idx]!r}, want {w_flat[first]!r}")


def _shifted(idx: Tuple[int, ...], origin: Tuple[int, ...]) -> Tuple[int, ...]:
    return tuple(i + (origin[d] if d < len(origin) else 0) for d, i in enumerate(idx))


def _verdict_count(bad: int, got, want, origin=()):
    if bad == 0:
        return True, 0.0, ""
    idx = tuple(int(i) for i in np.argwhere(got != want)[0])
    return False, float(bad), (f"{bad} elements differ, first at {_shifted(idx, origin)}: got {got[idx]!r}, "
                               f"want {want[idx]!r}")


def _first(mask, g, w, why, origin=(), err=None):
    idx = tuple(int(i) for i in np.argwhere(mask)[0])
    return False, err, f"{why}, first at {_shifted(idx, origin)}: got {g[idx]!r}, want {w[idx]!r}"
