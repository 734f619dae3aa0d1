"""Inputs no timed call has seen before, and samples of the outputs: what keeps a graded module from answering a
timed call without computing it.

Every timed call's inputs are a fresh copy of one of the case's input sets in which about half of the elements have
their bit pattern flipped: the sign of a float (NaN, infinities and zeros keep their kind), every bit of an integer,
a bool's value. Which elements is decided by a hash of the call's number, two 32-bit keys and the element's
position (``cuda_snippets/grader_fresh*.h``; the same bits here in NumPy, ``flip_numpy``): the copies are made on
the device before the clock starts, in one kernel for up to ``MAX_COPIES`` calls, and the parent recomputes the
inputs of any call it checks from the set, the keys and the number. A value's magnitude is kept, so the inputs
keep the case's ranges, ties and special values. A cache, whatever it is keyed by, has never seen a timed call's
inputs: it can only return a wrong answer.

``samples`` copies a few elements of each output (``SAMPLES`` at positions fixed per case): two timed calls whose
samples agree bit for bit are checked by the parent, which finds a module that handed out one answer twice (or
memory it never wrote) without being told which calls it will look at.
"""
from __future__ import annotations

import functools
from typing import List, Sequence, Tuple

import numpy as np

from .. import _codegen

MAX_COPIES = 8  # copies (calls) a launch makes; grader_fresh.cuh's FRESH_MAX_COPIES
SAMPLES = 64  # elements sampled of each output: 64 random sign bits where an output holds only copies
_GOLDEN = 0x9E3779B1
_M32 = 0xFFFFFFFF

# dtype -> (C type of its bits, NumPy view of the bits (a host array of a bfloat16 case is float32), flip mask,
# the low significand bits a small array's normal floats also have flipped, the exponent's bits)
_BITS = {
    "bool": ("uint8_t", np.uint8, 1, 0, 0),
    "int8": ("uint8_t", np.uint8, 0xFF, 0, 0), "uint8": ("uint8_t", np.uint8, 0xFF, 0, 0),
    "int16": ("uint16_t", np.uint16, 0xFFFF, 0, 0), "uint16": ("uint16_t", np.uint16, 0xFFFF, 0, 0),
    "int32": ("uint32_t", np.uint32, _M32, 0, 0), "uint32": ("uint32_t", np.uint32, _M32, 0, 0),
    "int64": ("uint64_t", np.uint64, (1 << 64) - 1, 0, 0), "uint64": ("uint64_t", np.uint64, (1 << 64) - 1, 0, 0),
    "float16": ("uint16_t", np.uint16, 1 << 15, 0x7F, 0x7C00),
    "bfloat16": ("uint16_t", np.uint32, 1 << 15, 0x1F, 0x7F80),  # device bits: 16; host: float32's top 16
    "float32": ("uint32_t", np.uint32, 1 << 31, 0xFFFFF, 0x7F800000),
    "float64": ("uint64_t", np.uint64, 1 << 63, _M32, 0x7FF0000000000000),
}
# Arrays of fewer elements than this (a scalar broadcast, a 5x1x1 expand): their signs alone give too few
# different inputs (2^5 for 5 elements: calls would repeat), so a call flips low significand bits too (of a normal
# float only: its exponent, and so its range, stay; 21 bits of one float32 scalar: 2M inputs).
RICH_ELEMENTS = 64


def _literal(dtype: str, value: int) -> str:
    return f"({_BITS[dtype][0]}){value:#x}ull"


_CPU_HEADERS = ("grader_hash.h", "grader_fresh_cpu.h")
_CUDA_HEADERS = ("grader_hash.h", "grader_fresh")


@functools.lru_cache(maxsize=None)
def _fresh_sources(dtype: str, count: int) -> Tuple[str, str, str, str]:
    """(cpu_header, cpu_src, cuda_header, cuda_src) of the op making ``count`` copies of a flat ``dtype`` set."""
    ctype, _, mask, low, expo = _BITS[dtype]
    outs = ", ".join(f"out{j}_p" for j in range(count))
    call = (f"void* outs[{count}] = {{{outs}}}; ops_grader::fresh_copies<{ctype}>(in0_p, (size_t)in0->num, outs, "
            f'{count}, (uint32_t)data["k0"], (uint32_t)data["k1"], (uint32_t)data["first"], {_literal(dtype, mask)}, '
            f'{_literal(dtype, low)}, {_literal(dtype, expo)}, (int)data["rich"]);')
    return (_codegen.include(_CPU_HEADERS), call, _codegen.include(_CUDA_HEADERS),
            call + "\nCHECK(cudaSuccess == cudaPeekAtLastError());")


def fresh_copies(x, dtype: str, keys: Tuple[int, int], first: int, count: int) -> list:
    """``count`` new Vars of ``x``'s shape and ``dtype``: the inputs of calls ``first`` .. ``first + count - 1``
    under ``keys`` (not run: sync them). ``count`` is 1 or ``MAX_COPIES`` (one compiled kernel each)."""
    if count not in (1, MAX_COPIES):
        raise ValueError(f"count must be 1 or {MAX_COPIES}, got {count}")
    from .._jittor import jt  # here, not at the top: the grader's parent imports this module without jittor
    shape = tuple(x.shape)
    flat = x if len(shape) == 1 else jt.ops.reshape(x, (x.numel(),))
    cpu_header, cpu_src, cuda_header, cuda_src = _fresh_sources(dtype, count)
    outs = jt.code([flat.shape] * count, [dtype] * count, [flat], cpu_header=cpu_header, cpu_src=cpu_src,
                   cuda_header=cuda_header, cuda_src=cuda_src,
                   data={"k0": float(keys[0]), "k1": float(keys[1]), "first": float(first & _M32),
                         "rich": float(x.numel() < RICH_ELEMENTS)})
    return outs if len(shape) == 1 else [jt.ops.reshape(o, shape) for o in outs]  # (Var.reshape: 2x the cost)


@functools.lru_cache(maxsize=None)
def _sample_sources(count: int, itemsize: int) -> Tuple[str, str, str, str]:
    ins = ", ".join(f"in{j + 1}_p" for j in range(count))
    call = (f"const void* ins[{count}] = {{{ins}}}; ops_grader::sample_bytes(ins, {count}, {itemsize}, "
            f"(const int32_t*)in0_p, (int)in0->num, (uint8_t*)out0_p);")
    return (_codegen.include(_CPU_HEADERS), call, _codegen.include(_CUDA_HEADERS),
            call + "\nCHECK(cudaSuccess == cudaPeekAtLastError());")


def sample_op(outs: Sequence, positions):
    """A uint8 Var (len(outs), SAMPLES * itemsize): the bytes of each of ``outs`` (Vars of one dtype and shape;
    1 or ``MAX_COPIES`` of them) at ``positions`` (an int32 Var of flat indices)."""
    count = len(outs)
    if count not in (1, MAX_COPIES):
        raise ValueError(f"outs must hold 1 or {MAX_COPIES} Vars, got {count}")
    dtype = str(outs[0].dtype)
    itemsize = 2 if dtype == "bfloat16" else np.dtype(_BITS[dtype][1]).itemsize
    from .._jittor import jt
    flats = [o.reshape((max(1, o.numel()),)) for o in outs]
    cpu_header, cpu_src, cuda_header, cuda_src = _sample_sources(count, itemsize)
    return jt.code((count, int(positions.shape[0]) * itemsize), "uint8", [positions] + flats, cpu_header=cpu_header,
                   cpu_src=cpu_src, cuda_header=cuda_header, cuda_src=cuda_src)


def sample_positions(shape: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """SAMPLES flat positions in an output of ``shape`` (int32; repeated where it has fewer elements)."""
    n = max(1, int(np.prod(shape)))
    return rng.integers(0, n, size=SAMPLES, dtype=np.int64).astype(np.int32)


# --- the same bits in NumPy (the parent's copy of a checked call's inputs) --------------------------------------

def _mix(h: np.ndarray) -> np.ndarray:
    """murmur3's finalizer on uint32 values, in place."""
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h


def _mix_int(v: int) -> int:
    return int(_mix(np.array([v & _M32], dtype=np.uint32))[0])


def call_key(keys: Tuple[int, int], call: int) -> int:
    """The 32-bit key of call ``call`` (grader_fresh's call_key)."""
    return _mix_int(_mix_int(keys[0] ^ _mix_int(call)) ^ keys[1])


# Elements per block of flip_bits (its temporaries: a few arrays of this many bytes).
_BLOCK = 1 << 22


def _block_words(blocks: np.ndarray, key: int) -> np.ndarray:
    """The flip word of each block of 32 flat elements (``blocks``: block numbers) under ``key``: bit i picks the
    block's element i (grader_fresh's hash)."""
    with np.errstate(over="ignore"):
        return _mix(blocks.astype(np.uint32) * np.uint32(_GOLDEN) + np.uint32(key))


def flip_bits(n: int, key: int, start: int = 0, stop: int = None) -> np.ndarray:
    """bool[stop - start]: which elements (of ``n``, flat) the call with ``key`` flips, from ``start``."""
    stop = n if stop is None else stop
    first_block, last_block = start // 32, (stop + 31) // 32
    h = _block_words(np.arange(first_block, last_block, dtype=np.uint32), key)
    bits = ((h[:, None] >> np.arange(32, dtype=np.uint32)) & np.uint32(1)).astype(bool).reshape(-1)
    return bits[start - first_block * 32:stop - first_block * 32]


def flip_numpy(arr: np.ndarray, dtype: str, keys: Tuple[int, int], call: int) -> np.ndarray:
    """A new array: ``arr`` (a host array of case dtype ``dtype``: bfloat16 as float32) as call ``call`` under
    ``keys`` sees it."""
    _, view, mask, low, _ = _BITS[dtype]
    shift = 16 if dtype == "bfloat16" else 0  # the float32 that holds a bfloat16: its bits 16 and up
    out = np.array(arr, copy=True, order="C")
    flat = out.reshape(-1).view(view)
    key = call_key(keys, call)
    pattern = view(mask << shift)
    for start in range(0, flat.size, _BLOCK):
        stop = min(flat.size, start + _BLOCK)
        picked = flip_bits(flat.size, key, start, stop)
        flat[start:stop] ^= np.where(picked, pattern, view(0))
    if flat.size < RICH_ELEMENTS and low:
        _flip_low_bits(flat, np.arange(flat.size), dtype, key)
    return out


def _flip_low_bits(bits: np.ndarray, positions: np.ndarray, dtype: str, key: int) -> None:
    """A small array's normal floats (``bits``: their bit patterns, at flat ``positions``) with the low
    significand bits the call's hash of each position picks flipped, in place (grader_hash.h: low_bits)."""
    _, view, _, low, expo = _BITS[dtype]
    shift = 16 if dtype == "bfloat16" else 0
    with np.errstate(over="ignore"):
        h = positions.astype(np.uint32) * np.uint32(0x27D4EB2F) ^ np.uint32(key)
    hashed = _mix(h).astype(np.uint16 if dtype in ("float16", "bfloat16") else view).astype(view)
    e = bits & view(expo << shift)
    normal = (e != 0) & (e != view(expo << shift))
    bits[normal] ^= ((hashed & view(low)) << view(shift))[normal]


def flip_at(arr: np.ndarray, dtype: str, keys: Tuple[int, int], call: int, idx: np.ndarray) -> np.ndarray:
    """``flip_numpy(arr, dtype, keys, call).reshape(-1)[idx]``, computed for those flat positions only (the
    judge's references of sampled elements)."""
    _, view, mask, low, _ = _BITS[dtype]
    shift = 16 if dtype == "bfloat16" else 0
    flat = np.asarray(arr).reshape(-1)
    idx = np.asarray(idx, dtype=np.int64).reshape(-1)
    values = np.array(flat[idx], copy=True)
    bits = values.view(view)
    key = call_key(keys, call)
    picked = ((_block_words(idx >> 5, key) >> (idx & 31).astype(np.uint32)) & np.uint32(1)).astype(bool)
    bits ^= np.where(picked, view(mask << shift), view(0))
    if flat.size < RICH_ELEMENTS and low:
        _flip_low_bits(bits, idx, dtype, key)
    return values


def call_number(k: int, count: int) -> int:
    """The number of the ``count``-th timed call on set ``k``: what its copies are flipped by (``call_key``)."""
    return (k << 24) | (count & 0xFFFFFF)


def call_label(number: int) -> int:
    """The count of a call number (its set is the high bits)."""
    return number & 0xFFFFFF


def input_keys(seed: int, impl: int, count: int) -> List[Tuple[int, int]]:
    """The (k0, k1) of each of an implementation's ``count`` varied arrays in a case with ``seed`` (``impl``: 0 for
    the graded module, 1 and up for the references, whose inputs only need to be fresh)."""
    drawn = np.random.default_rng([seed, impl, 0xF4E5]).integers(0, 1 << 32, size=(count, 2), dtype=np.uint64)
    return [(int(a), int(b)) for a, b in drawn]
