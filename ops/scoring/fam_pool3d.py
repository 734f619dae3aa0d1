"""max_pool3d cases for get_score.py and the tests, with float64 NumPy references.

Bytes moved (the fewest an implementation must move):
  forward:  x read once + values written once (indices, if an implementation keeps them, are its own cost);
  backward: dx written + dy read + x read (the argmax must come from somewhere: x is the least an
            implementation can read to know it; saved indices are an alternative of similar size).
"""
from __future__ import annotations

import math
import sys
import threading
import weakref
from typing import Tuple

import numpy as np

from .judge import Expected, sum_bound
from .spec import DEFAULT_TOLERANCE, EDGE, Case, Family, KnownCompileFailure, ReferenceSkipped, case

NAME = "max_pool3d"
_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def _triple(v) -> Tuple[int, int, int]:
    return (v,) * 3 if isinstance(v, int) else tuple(v)


def case_params(c: Case) -> dict:
    """The case's keyword arguments for max_pool3d (kernel_size, stride, padding, dilation, ceil_mode)."""
    p = c.p
    return {"kernel_size": p["kernel_size"], "stride": p.get("stride"), "padding": p.get("padding", 0),
            "dilation": p.get("dilation", 1), "ceil_mode": p.get("ceil_mode", False)}


def returns_indices(c: Case) -> bool:
    """Forward cases that also return the argmax (int32 or int64 flat positions, as PyTorch's)."""
    return bool(c.p.get("return_indices", False))


def _out_size(n, k, s, p, d, ceil_mode):
    span = n + 2 * p - d * (k - 1) - 1
    if span < 0:
        return 0
    out = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1
    return out


def jittor_cuda_backward_reads_outside(shape, kernel_size, stride, padding, ceil_mode) -> bool:
    """Whether jittor's CUDA max_pool3d backward (1.3.11, ``pool.py``) reads outside its buffers for this
    geometry: its gradient kernel loops over the input's extent, not the output's, and indexes the output
    and its gradient with those loop indices. A window that starts past the last output but still overlaps
    the input is then compared and added from elements of the next row or plane, or, at the end of the
    buffer, from unmapped memory: wrong gradients, and an illegal address that ends the CUDA context. With
    kernel = stride and divisible extents those windows are empty and nothing is read."""
    k, p = _triple(kernel_size), _triple(padding)
    s = k if stride is None else _triple(stride)
    for n, kk, ss, pp in zip(shape[-3:], k, s, p):
        out = (n + 2 * pp - kk + (ss - 1 if ceil_mode else 0)) // ss + 1  # jittor's own output size
        if out < n and out * ss - pp < n:
            return True
    return False


# Output elements per block of reference_pool's work (its running maximum and the flags of one window
# element: ~10 MB, in the caches).
_REFERENCE_BLOCK = 1 << 20


def reference_pool(x: np.ndarray, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """float64 values and int64 indices of PyTorch's max_pool3d on ``x`` (..., D, H, W).

    The definition: window elements are taken in (d, h, w) order; an element replaces the running maximum
    when the window had none yet, when it is NaN, or when it is larger and the maximum is not NaN. A window
    without elements gives -inf and index -1. Computed as that running maximum, one window element at a time
    over every window at once (padding = -inf, which replaces nothing), then:
    * a maximum still -inf (every element inside the input is -inf): the first element inside the input, or
      -1 when there is none.
    ``tests/test_pool3d.py`` checks this against the definition's loop written out.
    """
    k, p, dl = _triple(kernel_size), _triple(padding), _triple(dilation)
    s = k if stride is None else _triple(stride)
    x = np.asarray(x)
    if x.dtype != np.float64:
        x = x.astype(np.float32)  # exact for float16/bfloat16 data; max and argmax need no wider type
    lead, spatial = x.shape[:-3], x.shape[-3:]
    out = tuple(_out_size(n, *a, ceil_mode) for n, a in zip(spatial, zip(k, s, p, dl)))
    planes = x.reshape((-1,) + spatial)
    n_planes = planes.shape[0]
    span = tuple(di * (ki - 1) + 1 for ki, di in zip(k, dl))
    # Pad: left by p, right far enough for the last (possibly partial) window.
    right = [max(0, (o - 1) * si + sp - pi - n) for n, o, si, sp, pi in zip(spatial, out, s, span, p)]
    pad = [(0, 0)] + [(pi, r) for pi, r in zip(p, right)]
    xp = np.pad(planes, pad, constant_values=-np.inf)
    inside = np.pad(np.ones(spatial, dtype=bool), pad[1:])

    elements = list(np.ndindex(*k))  # (d, h, w) order

    def element(a, j):
        """Window element j of every window: a strided view of the padded array ``a`` (..., D, H, W)."""
        lo = [jj * di for jj, di in zip(elements[j], dl)]
        return a[(Ellipsis,) + tuple(slice(l0, l0 + (o - 1) * si + 1, si) for l0, o, si in zip(lo, out, s))]

    # position of window element j of output o: base[o] + offset[j] (pads map outside [0, D*H*W))
    H, W = spatial[1], spatial[2]
    od, oh, ow = np.meshgrid(*[np.arange(o) * si - pi for o, si, pi in zip(out, s, p)], indexing="ij")
    base = (od * H + oh) * W + ow
    offset = np.array([(jd * dl[0] * H + jh * dl[1]) * W + jw * dl[2] for jd, jh, jw in elements], dtype=np.int64)
    first_inside = np.full(out, -1, dtype=np.int64)  # index of each window's first element inside the input
    for j in reversed(range(len(elements))):
        np.copyto(first_inside, base + offset[j], where=element(inside, j))

    best = np.empty((n_planes,) + out, dtype=xp.dtype)
    which = np.zeros((n_planes,) + out, dtype=np.int16 if len(elements) < 1 << 15 else np.int64)
    has_nan = bool(np.isnan(planes).any())
    step = max(1, _REFERENCE_BLOCK // max(1, int(np.prod(out))))
    for p0 in range(0, n_planes, step):
        block = xp[p0:p0 + step]
        m, jb = best[p0:p0 + step], which[p0:p0 + step]
        np.copyto(m, element(block, 0))
        take = np.empty(m.shape, dtype=bool)
        for j in range(1, len(elements)):
            v = element(block, j)
            np.greater(v, m, out=take)  # False where the maximum is NaN
            if has_nan:
                take |= np.isnan(v)
            np.copyto(m, v, where=take)
            np.copyto(jb, j, where=take)
    arg = base[None] + offset[which]
    low = best == -np.inf  # every element inside is -inf (NaN compares unequal)
    arg = np.where(low, first_inside[None], arg)
    return best.astype(np.float64).reshape(lead + out), arg.reshape(lead + out)


_ARGMAX_KEPT = 4  # argmaxes kept: a backward case's input sets (2-4), shared by its judges' threads
_argmaxes: list = []  # (weak reference to x, kernel parameters, argmax), newest last
_argmax_lock = threading.Lock()


def argmax_of(x: np.ndarray, params: dict) -> np.ndarray:
    """``reference_pool(x, **params)``'s argmax, kept for the last few ``x``: a backward's timed calls vary dy
    only, so every call judged on one input set has the same argmax (the pool is most of a backward reference's
    time: ~2 s of a 128 MB case's)."""
    key = sorted(params.items())
    with _argmax_lock:
        for ref, kept_key, arg in _argmaxes:
            if ref() is x and kept_key == key:
                return arg
    arg = reference_pool(x, **params)[1]
    with _argmax_lock:
        _argmaxes.append((weakref.ref(x), key, arg))
        del _argmaxes[:-_ARGMAX_KEPT]
    return arg


def window_targets(x_shape, arg: np.ndarray) -> np.ndarray:
    """Each window's argmax as a flat index into x (windows in dy's order), -1 where the window holds nothing."""
    plane = int(np.prod(x_shape[-3:]))
    a = arg.reshape(-1, int(np.prod(arg.shape[-3:])))
    return np.where(a >= 0, np.arange(a.shape[0])[:, None] * plane + a, -1).reshape(-1)


def reference_grad(x_shape, arg: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """float64 dx: each dy goes to its window's argmax (summed where windows share one)."""
    target = window_targets(x_shape, arg)
    keep = target >= 0
    g = np.asarray(dy, dtype=np.float64).reshape(-1)
    return np.bincount(target[keep], weights=g[keep], minlength=int(np.prod(x_shape))).reshape(x_shape)


def _spatial_out(c: Case) -> Tuple[int, int, int]:
    """The case's output (Do, Ho, Wo)."""
    kp = case_params(c)
    k, p, dl = _triple(kp["kernel_size"]), _triple(kp["padding"]), _triple(kp["dilation"])
    s = k if kp["stride"] is None else _triple(kp["stride"])
    return tuple(_out_size(n, *a, kp["ceil_mode"]) for n, a in zip(c.shapes[0][-3:], zip(k, s, p, dl)))


def windows_per_input(c: Case) -> int:
    """The most windows one input element can belong to: along a dimension, window o holds input i when
    o * s - p + j * d == i for some 0 <= j < k, and the j that fit step by s / gcd(s, d)."""
    kp = case_params(c)
    k, dl = _triple(kp["kernel_size"]), _triple(kp["dilation"])
    s = k if kp["stride"] is None else _triple(kp["stride"])
    return int(np.prod([min(ki, -(-ki * math.gcd(si, di) // si)) for ki, si, di in zip(k, s, dl)]))


class MaxPool3dFamily(Family):
    def tolerance(self, c):
        """The dtype's defaults; a backward with overlapping windows adds its summation error: dx sums up to
        ``windows_per_input`` dy values (512 for k8s1) in float32 (float64 for float64 inputs), whose rounding
        error grows like unit roundoff x n for values in [-1, 1). Measured on the H100 (k8s1, 2026-11-23):
        2.6e-5 = 0.85 u n with n = 512; allowed: 4 u n."""
        rtol, atol = DEFAULT_TOLERANCE[c.dtype]
        if c.direction == "fwd":
            return rtol, atol
        unit = 2.0 ** -53 if c.dtype == "float64" else 2.0 ** -24
        return rtol, atol + 4 * unit * windows_per_input(c)

    def output_shapes(self, c):
        out = tuple(c.shapes[0][:-3]) + _spatial_out(c)
        return [out, out] if returns_indices(c) else [out]

    def expected(self, c, arrays, grads_out=None):
        """Forward: values and indices bit for bit (a max selects; -0.0 and 0.0 differ, as the op copies the
        chosen element). Backward: a copy of dy where no input element is in two windows, else sums of up to
        ``windows_per_input`` dy values (``sum_bound`` per element)."""
        if c.direction == "fwd":
            values, arg = reference_pool(arrays[0], **case_params(c))
            out = [Expected(values, (c.dtype,), signed_zero=True)]
            if returns_indices(c):
                out.append(Expected(arg, ("int64", "int32")))
            return out
        arg = argmax_of(arrays[0], case_params(c))
        dy = np.asarray(grads_out[0], dtype=np.float64)
        want = reference_grad(arrays[0].shape, arg, dy)
        return self._gradient(c, want, grads_out[0].dtype,
                              lambda: np.sqrt(reference_grad(arrays[0].shape, arg, dy * dy)))

    def _gradient(self, c, want, dy_dtype, l2):
        """dx's expectation: a copy of one dy or zero where no input element is in two windows (in dy's own
        dtype, which the judge compares bit for bit), else ``want`` within the bound of its sums (``l2()``: the
        2-norm of each element's terms, computed only then)."""
        n = windows_per_input(c)
        if n == 1:
            return [Expected(want.astype(dy_dtype), (c.dtype,))]
        acc = "float64" if c.dtype == "float64" else "float32"
        return [Expected(want, (c.dtype,), "rounded", sum_bound(want, l2(), n, c.dtype, acc))]

    def expected_at(self, c, arrays, grads_out, positions, varied_at):
        """A backward's dx at the sampled positions: the dy of the windows whose argmax (kept per input set) is
        one of them, as the call flipped it, summed per position; the bounds as ``expected`` gives them there."""
        if c.direction == "fwd":
            return None
        x = arrays[0]
        target = window_targets(x.shape, argmax_of(x, case_params(c)))
        pos = np.asarray(positions[0], dtype=np.int64)
        wanted = np.zeros(x.size + 1, dtype=bool)  # the last slot: windows with no element (-1)
        wanted[pos] = True
        windows = np.flatnonzero(wanted[target])
        slots, inverse = np.unique(pos, return_inverse=True)
        to_slot = np.searchsorted(slots, target[windows])
        dy = varied_at(0, windows).astype(np.float64)
        want = np.bincount(to_slot, weights=dy, minlength=slots.size)[inverse]
        return self._gradient(c, want, grads_out[0].dtype,
                               lambda: np.sqrt(np.bincount(to_slot, weights=dy * dy, minlength=slots.size))[inverse])

    def make_inputs(self, c, rng):
        arrays = super().make_inputs(c, rng)
        # float64 values that float32 holds exactly: jt.array(float64 array) rounds to float32 before the
        # harness casts back, which would otherwise differ from the reference by ~1e-8.
        return [a.astype(np.float32).astype(np.float64) if a.dtype == np.float64 else a for a in arrays]

    def reference_forward(self, c, arrays):
        return [reference_pool(arrays[0], **case_params(c))[0]]

    def reference_backward(self, c, arrays, grads_out):
        _, arg = reference_pool(arrays[0], **case_params(c))
        return [reference_grad(arrays[0].shape, arg, grads_out[0])]

    def forward(self, c, api, xs):
        if returns_indices(c):
            return list(api.max_pool3d(xs[0], **case_params(c), return_indices=True))
        return [api.max_pool3d(xs[0], **case_params(c))]

    def naive_forward(self, c, xs):
        """reindex to (..., Do, Ho, Wo, kd, kh, kw) with -inf outside, then max over the window dims."""
        x = xs[0]
        kp = case_params(c)
        k, p, dl = _triple(kp["kernel_size"]), _triple(kp["padding"]), _triple(kp["dilation"])
        s = k if kp["stride"] is None else _triple(kp["stride"])
        lead = len(x.shape) - 3
        out = tuple(_out_size(n, *a, kp["ceil_mode"]) for n, a in zip(x.shape[lead:], zip(k, s, p, dl)))
        shape = list(x.shape[:lead]) + list(out) + list(k)
        idx = [f"i{a}" for a in range(lead)]
        idx += [f"i{lead + a}*{s[a]}-{p[a]}+i{lead + 3 + a}*{dl[a]}" for a in range(3)]
        windows = x.reindex(shape, idx, overflow_value=float("-inf"))
        if not returns_indices(c):
            return [windows.max(dims=[lead + 3, lead + 4, lead + 5])]
        from .._jittor import jt

        # argmax over the flattened window, then the chosen element's flat position in its plane
        kvol = k[0] * k[1] * k[2]
        flat = windows.reshape(list(x.shape[:lead]) + list(out) + [kvol])
        j, m = jt.argmax(flat, dim=lead + 3)
        D, H, W = x.shape[lead:]
        plane = jt.index((D, H, W), dim=0) * (H * W) + jt.index((D, H, W), dim=1) * W + jt.index((D, H, W), dim=2)
        window = [f"i3/{k[1] * k[2]}", f"(i3/{k[2]})%{k[1]}", f"i3%{k[2]}"]  # (jd, jh, jw) of element i3
        pos = plane.reindex(list(out) + [kvol], [f"i{a}*{s[a]}-{p[a]}+({window[a]})*{dl[a]}" for a in range(3)],
                            overflow_value=-1)
        lead_idx = [f"i{a}" for a in range(lead)]
        out_idx = lead_idx + [f"i{lead + a}" for a in range(3)]
        chosen = pos.reindex(list(j.shape), out_idx[lead:] + [f"@e0({','.join(out_idx)})"], extras=[j])
        return [m, chosen]

    def jittor_forward(self, c, xs):
        from .._jittor import jt

        kp = case_params(c)
        if kp["dilation"] not in (1, (1, 1, 1)):
            raise RuntimeError("jittor's max_pool3d has no dilation")
        if returns_indices(c):
            raise ReferenceSkipped("jittor's max_pool3d hangs with return_indices=True")
        if c.direction == "bwd" and jt.flags.use_cuda and jittor_cuda_backward_reads_outside(
                c.shapes[0], kp["kernel_size"], kp["stride"], kp["padding"], kp["ceil_mode"]):
            raise ReferenceSkipped("jittor's CUDA max_pool3d backward reads outside its buffers here "
                                   "(wrong gradients; can fault the GPU)")
        return [jt.nn.max_pool3d(xs[0], kp["kernel_size"], kp["stride"], kp["padding"],
                                 ceil_mode=kp["ceil_mode"])]

    def known_compile_failures(self):
        """jittor 1.3.11's CUDA max_pool3d calls ``min``/``max`` on ints in a source that includes its float16
        header, whose float16 and bfloat16 overloads make the calls ambiguous for nvcc (CUDA 13): every 16-bit
        max_pool3d of jittor, forward and backward (whose graph holds the forward), fails to compile. Found
        inside the compile pass's large batches, the three keys of the table cost 16 failed syncs and 121 s of
        an empty-cache H100 pass (2026-11-27); one probe costs one failing compile."""
        probe = _c("probe_k2s2_f16_1x1x4x4x4", "fwd", (1, 1, 4, 4, 4), "float16", devices=("cuda", "cpu"),
                   kernel_size=2, stride=2)
        keys = tuple(f"{NAME}/jittor/{d}/{x}" for d in ("float16", "bfloat16") for x in ("fwd", "bwd"))
        return [KnownCompileFailure(probe, keys, 'more than one instance of overloaded function "jittor::',
                                    "jittor's 16-bit max_pool3d: ambiguous min/max overloads for ints")]

    def torch_forward(self, c, ts):
        import torch

        if returns_indices(c):
            return list(torch.nn.functional.max_pool3d(ts[0], **case_params(c), return_indices=True))
        return [torch.nn.functional.max_pool3d(ts[0], **case_params(c))]

    def bytes_moved(self, c):
        shape = c.shapes[0]
        out = _spatial_out(c)
        n_in = int(np.prod(shape))
        n_out = int(np.prod(shape[:-3])) * int(np.prod(out))
        size = _ITEMSIZE[c.dtype]
        if c.direction == "fwd":  # indices, where asked for, as int32 (the fewest bytes that hold them)
            return (n_in + n_out) * size + (4 * n_out if returns_indices(c) else 0)
        # The backward from the forward's saved int32 argmax (PyTorch's and ours): dy and the indices in, dx out.
        return n_in * size + n_out * (size + 4)

    def variant(self, c, api):
        if api is not sys.modules[__package__.split(".")[0]]:
            return "-"
        from ..pool3d import normalize_params, select_config
        params = normalize_params(**case_params(c))
        fwd = select_config(c.shapes[0], c.dtype, params, "fwd", indices=returns_indices(c))
        if c.direction == "fwd":
            return fwd.name
        return select_config(c.shapes[0], c.dtype, params, "bwd").name

    def cuda_launches(self, c):
        """See ``Family.cuda_launches``."""
        from .. import pool3d
        bwd = c.direction == "bwd"
        params = pool3d.normalize_params(**case_params(c))
        p = pool3d.plan(tuple(c.shapes[0]), c.dtype, params, returns_indices(c), bwd, True)
        return [(p.launch, [(c.dtype, 5)], bwd)]


def _c(name, direction, shape, dtype="float32", devices=("cuda",), **params):
    return case(NAME, name, direction, [shape], dtype, devices=devices, **params)


def _classics(direction):
    """The assignment's classics, timed forward and backward."""
    return [
        _c("k2s2_8x32x32x64x64", direction, (8, 32, 32, 64, 64), kernel_size=2, stride=2),
        _c("k3s1_4x32x32x32x32", direction, (4, 32, 32, 32, 32), kernel_size=3, stride=1),
        _c("k3s2p1_8x64x16x56x56", direction, (8, 64, 16, 56, 56), kernel_size=3, stride=2, padding=1),
        _c("k8s1_2x16x32x32x32", direction, (2, 16, 32, 32, 32), kernel_size=8, stride=1),
        _c("k8s8_64x64x8x8x8_out1", direction, (64, 64, 8, 8, 8), kernel_size=8, stride=8),
        _c("k2s2_f16_16x64x16x56x56", direction, (16, 64, 16, 56, 56), "float16", kernel_size=2, stride=2),
        _c("k2s2_tiny_1x1x4x4x4", direction, (1, 1, 4, 4, 4), kernel_size=2, stride=2),
    ]


_CUDA_FWD = _classics("fwd") + [
    # C = 64, D = H = W = 32
    _c("k2s2_4x64x32x32x32", "fwd", (4, 64, 32, 32, 32), kernel_size=2, stride=2),
    _c("k8s1_1x64x32x32x32", "fwd", (1, 64, 32, 32, 32), kernel_size=8, stride=1),
    _c("k8s8_8x64x32x32x32", "fwd", (8, 64, 32, 32, 32), kernel_size=8, stride=8),
    # outputs with h = w = 1
    _c("hw1_k2x8x8_16x32x32x8x8", "fwd", (16, 32, 32, 8, 8), kernel_size=(2, 8, 8), stride=(2, 8, 8)),
    _c("hw1_k3x4x4s1_8x32x64x4x4", "fwd", (8, 32, 64, 4, 4), kernel_size=(3, 4, 4), stride=(1, 4, 4)),
    # non-cubic kernels and strides
    _c("k1x3x3s1x2x2p0x1x1_8x32x16x64x64", "fwd", (8, 32, 16, 64, 64), kernel_size=(1, 3, 3),
       stride=(1, 2, 2), padding=(0, 1, 1)),
    _c("k2x3x3s2x1x1_4x32x32x48x48", "fwd", (4, 32, 32, 48, 48), kernel_size=(2, 3, 3), stride=(2, 1, 1)),
    # dilation
    _c("k3s1d2_4x32x32x32x32", "fwd", (4, 32, 32, 32, 32), kernel_size=3, stride=1, dilation=2),
    _c("k3s2p1d2_4x16x32x32x32", "fwd", (4, 16, 32, 32, 32), kernel_size=3, stride=2, padding=1, dilation=2),
    # ceil_mode
    _c("k2s2ceil_8x32x31x63x63", "fwd", (8, 32, 31, 63, 63), kernel_size=2, stride=2, ceil_mode=True),
    _c("k3s2ceil_4x32x33x33x33", "fwd", (4, 32, 33, 33, 33), kernel_size=3, stride=2, ceil_mode=True),
    # half types
    _c("k3s1_f16_4x32x32x32x32", "fwd", (4, 32, 32, 32, 32), "float16", kernel_size=3, stride=1),
    _c("k3s2p1_bf16_8x64x16x56x56", "fwd", (8, 64, 16, 56, 56), "bfloat16", kernel_size=3, stride=2, padding=1),
    _c("k8s8_f16_64x64x8x8x8", "fwd", (64, 64, 8, 8, 8), "float16", kernel_size=8, stride=8),
    _c("k2s2_bf16_16x64x16x56x56", "fwd", (16, 64, 16, 56, 56), "bfloat16", kernel_size=2, stride=2),
    # vector widths and generic kernel sizes
    _c("k2s2_oddW_8x32x32x63x63", "fwd", (8, 32, 32, 63, 63), kernel_size=2, stride=2),
    _c("k2s2_vec2_8x32x32x62x62", "fwd", (8, 32, 32, 62, 62), kernel_size=2, stride=2),
    _c("k5s2_4x32x32x32x32", "fwd", (4, 32, 32, 32, 32), kernel_size=5, stride=2),
    _c("k4s4_4x32x32x64x64", "fwd", (4, 32, 32, 64, 64), kernel_size=4, stride=4),
    _c("k3s3_4x32x33x33x33", "fwd", (4, 32, 33, 33, 33), kernel_size=3, stride=3),
    _c("k2s2_f64_4x32x32x64x64", "fwd", (4, 32, 32, 64, 64), "float64", kernel_size=2, stride=2),
    # 256 MB and more
    _c("k2s2_256MB_4x32x32x128x128", "fwd", (4, 32, 32, 128, 128), kernel_size=2, stride=2),
    _c("k2s2_bf16_256MB_8x32x32x128x128", "fwd", (8, 32, 32, 128, 128), "bfloat16", kernel_size=2, stride=2),
    _c("k3s2p1_256MB_4x32x32x128x128", "fwd", (4, 32, 32, 128, 128), kernel_size=3, stride=2, padding=1),
    # values and argmax indices
    _c("k2s2_idx_8x32x32x64x64", "fwd", (8, 32, 32, 64, 64), kernel_size=2, stride=2, return_indices=True),
]

_CUDA_BWD = _classics("bwd") + [
    _c("k2s2ceil_8x32x31x63x63", "bwd", (8, 32, 31, 63, 63), kernel_size=2, stride=2, ceil_mode=True),
    _c("hw1_k2x8x8_16x32x32x8x8", "bwd", (16, 32, 32, 8, 8), kernel_size=(2, 8, 8), stride=(2, 8, 8)),
    _c("hw1ceil_k2x8x8_16x32x33x8x8", "bwd", (16, 32, 33, 8, 8), kernel_size=(2, 8, 8), stride=(2, 8, 8),
       ceil_mode=True),
    # floor mode on odd sizes: trailing elements in no window (zeroed by the last windows of the tile kernels)
    _c("k2s2floor_8x32x31x63x63", "bwd", (8, 32, 31, 63, 63), kernel_size=2, stride=2),
    _c("hw1floor_k2x8x8_16x32x33x8x8", "bwd", (16, 32, 33, 8, 8), kernel_size=(2, 8, 8), stride=(2, 8, 8)),
    # disjoint windows with gaps between them: bwd_disjoint (each element dy of its one window, or 0)
    _c("k2s3_8x32x32x63x63", "bwd", (8, 32, 32, 63, 63), kernel_size=2, stride=3),
    _c("hw1gaps_k2x8x8s3x8x8_16x32x33x8x8", "bwd", (16, 32, 33, 8, 8), kernel_size=(2, 8, 8), stride=(3, 8, 8)),
    _c("k3s1d2_4x32x32x32x32", "bwd", (4, 32, 32, 32, 32), kernel_size=3, stride=1, dilation=2),
    _c("k1x3x3s1x2x2p0x1x1_bf16_8x32x16x64x64", "bwd", (8, 32, 16, 64, 64), "bfloat16", kernel_size=(1, 3, 3),
       stride=(1, 2, 2), padding=(0, 1, 1)),
    _c("k4s4_4x32x32x64x64", "bwd", (4, 32, 32, 64, 64), kernel_size=4, stride=4),
    _c("k2s2_256MB_4x32x32x128x128", "bwd", (4, 32, 32, 128, 128), kernel_size=2, stride=2),
]

_CPU = ("cpu",)
_CPU_CASES = [
    _c("cpu_k2s2", "fwd", (2, 3, 8, 10, 12), devices=_CPU, kernel_size=2, stride=2),
    _c("cpu_k3s1", "fwd", (2, 3, 9, 9, 9), devices=_CPU, kernel_size=3, stride=1),
    _c("cpu_k3s2p1", "fwd", (2, 4, 9, 12, 11), devices=_CPU, kernel_size=3, stride=2, padding=1),
    _c("cpu_k8s1", "fwd", (1, 2, 12, 12, 12), devices=_CPU, kernel_size=8, stride=1),
    _c("cpu_k8s8_out1", "fwd", (4, 8, 8, 8, 8), devices=_CPU, kernel_size=8, stride=8),
    _c("cpu_tiny", "fwd", (1, 1, 4, 4, 4), devices=_CPU, kernel_size=2, stride=2),
    _c("cpu_nonsquare_dil", "fwd", (2, 3, 10, 11, 12), devices=_CPU, kernel_size=(1, 3, 2), stride=(1, 2, 3),
       padding=(0, 1, 1), dilation=(1, 2, 1)),
    _c("cpu_ceil", "fwd", (2, 3, 7, 9, 11), devices=_CPU, kernel_size=3, stride=2, ceil_mode=True),
    _c("cpu_k2s2_f16", "fwd", (2, 3, 8, 10, 12), "float16", devices=_CPU, kernel_size=2, stride=2),
    _c("cpu_k3s1_idx", "fwd", (2, 3, 9, 9, 9), devices=_CPU, kernel_size=3, stride=1, return_indices=True),
    _c("cpu_k3s2p1_bf16", "fwd", (2, 4, 9, 12, 11), "bfloat16", devices=_CPU, kernel_size=3, stride=2, padding=1),
    _c("cpu_k2s2", "bwd", (2, 3, 8, 10, 12), devices=_CPU, kernel_size=2, stride=2),
    _c("cpu_k3s1", "bwd", (2, 3, 9, 9, 9), devices=_CPU, kernel_size=3, stride=1),
    _c("cpu_k3s2p1_bf16", "bwd", (2, 4, 9, 12, 11), "bfloat16", devices=_CPU, kernel_size=3, stride=2, padding=1),
    _c("cpu_ceil_tile", "bwd", (2, 3, 7, 9, 11), devices=_CPU, kernel_size=2, stride=2, ceil_mode=True),
    _c("cpu_floor_tile", "bwd", (2, 3, 7, 9, 11), devices=_CPU, kernel_size=2, stride=2),
    _c("cpu_gaps_scatter", "bwd", (2, 3, 8, 9, 11), devices=_CPU, kernel_size=2, stride=3),
]

# Ties, NaN (its value wins, at the last NaN's index), +-Inf and -0.0 (the first of equal maxima is kept, with
# its sign).
_EDGE = [
    _c("cpu_k2s2_edge_idx", "fwd", (2, 3, 8, 10, 12), devices=_CPU, kernel_size=2, stride=2, return_indices=True,
       values=EDGE),
    _c("cpu_k3s2p1_edge_idx", "fwd", (2, 4, 9, 12, 11), devices=_CPU, kernel_size=3, stride=2, padding=1,
       return_indices=True, values=EDGE),
    _c("cpu_ceil_edge_f16", "fwd", (2, 3, 7, 9, 11), "float16", devices=_CPU, kernel_size=3, stride=2,
       ceil_mode=True, values=EDGE),
    _c("cpu_k2s2_edge_bf16", "fwd", (2, 3, 8, 10, 12), "bfloat16", devices=_CPU, kernel_size=2, stride=2,
       values=EDGE),
    _c("cpu_k3s1_edge", "bwd", (2, 3, 9, 9, 9), devices=_CPU, kernel_size=3, stride=1, values=EDGE),
    _c("cpu_k2s2_edge", "bwd", (2, 3, 8, 10, 12), devices=_CPU, kernel_size=2, stride=2, values=EDGE),
    _c("k2s2_edge_idx_8x32x32x64x64", "fwd", (8, 32, 32, 64, 64), kernel_size=2, stride=2, return_indices=True,
       values=EDGE),
    _c("k3s2p1_edge_f16_8x64x16x56x56", "fwd", (8, 64, 16, 56, 56), "float16", kernel_size=3, stride=2, padding=1,
       values=EDGE),
    _c("k2s2ceil_edge_bf16_8x32x31x63x63", "fwd", (8, 32, 31, 63, 63), "bfloat16", kernel_size=2, stride=2,
       ceil_mode=True, values=EDGE),
    _c("k3s1_edge_4x32x32x32x32", "bwd", (4, 32, 32, 32, 32), kernel_size=3, stride=1, values=EDGE),
    _c("k2s2_edge_8x32x32x64x64", "bwd", (8, 32, 32, 64, 64), kernel_size=2, stride=2, values=EDGE),
]

FAMILY = MaxPool3dFamily(NAME, _CUDA_FWD + _CUDA_BWD + _CPU_CASES, _EDGE)
