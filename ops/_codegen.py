"""CUDA source assembly: shared snippets from ``cuda_snippets/``, dtype names, template rendering.

jittor keys its kernel cache on the header and source text (not on compile flags), so snippets are passed
as text in ``cuda_header`` rather than through ``-I``: an edited ``.cuh`` then always recompiles.
"""
from __future__ import annotations

import functools
import string
from pathlib import Path
from typing import Iterable

_HERE = Path(__file__).resolve().parent
# Installed: ops/cuda_snippets (setup.cfg maps the top-level folder there). Source tree: ../cuda_snippets.
_SNIPPET_DIRS = (_HERE / "cuda_snippets", _HERE.parent / "cuda_snippets")

# jittor dtype name -> C type name usable in both CPU and CUDA sources (jittor defines float16/bfloat16).
CTYPES = {
    "bool": "bool", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t",
    "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
    "float16": "float16", "bfloat16": "bfloat16", "float32": "float32", "float64": "float64",
}
ITEMSIZE = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "float16": 2, "bfloat16": 2,
            "int32": 4, "uint32": 4, "float32": 4, "int64": 8, "uint64": 8, "float64": 8}
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
INT32_LIMIT = 2**31 - 1


def snippet_dir() -> Path:
    for d in _SNIPPET_DIRS:
        if (d / "common.cuh").is_file():
            return d
    raise FileNotFoundError(f"cuda_snippets not found in {[str(d) for d in _SNIPPET_DIRS]}: broken install")


@functools.lru_cache(maxsize=None)
def snippet(name: str) -> str:
    """Text of ``cuda_snippets/<name>``: ``<name>.cuh`` for a bare name (the CUDA snippets), the file itself
    for a name with an extension (``cpu_common.h``, the CPU sources' helpers)."""
    return (snippet_dir() / (name if "." in name else f"{name}.cuh")).read_text()


def cpu_common() -> str:
    """The helpers every CPU source includes (``cuda_snippets/cpu_common.h``): bfloat16 rounded to nearest even
    as on the GPU, NaN tests on the bits (jittor's CPU code is built with -Ofast)."""
    return snippet("cpu_common.h")


def header(names: Iterable[str]) -> str:
    """The snippets concatenated in order, each once, for ``cuda_header``."""
    seen, parts = set(), []
    for name in names:
        if name not in seen:
            seen.add(name)
            parts.append(snippet(name))
    return "\n".join(parts)


def render(template: str, **values) -> str:
    """Fill ``${NAME}`` placeholders; a missing value is an error, never an empty string."""
    return string.Template(template).substitute({k: str(v) for k, v in values.items()})


def dtype_name(var_or_dtype) -> str:
    """jittor dtype name of a Var or dtype ('float32', 'bfloat16', ...)."""
    d = getattr(var_or_dtype, "dtype", var_or_dtype)
    return str(d)


def index_type(numel: int) -> str:
    """int32 indexing while every offset fits, int64 above 2^31 - 1 elements."""
    return "int" if numel <= INT32_LIMIT else "long long"
