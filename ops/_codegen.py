"""Source assembly: shared snippets from ``cuda_snippets/``, generated menus, dtype names, template rendering.

jittor keys its kernel cache on the header and source text (not on compile flags), and rebuilds that key from
the whole text on every execution (~0.16 ns per header byte, ~1.6 ns per source byte). So a header is a few
``#include`` lines of absolute paths, preceded by a comment holding each file's content hash: the key stays a
few hundred bytes, and an edited snippet still changes it (and recompiles). Text made by Python (the menus of
kernel instantiations one translation unit holds, :class:`Menu`) is written once to a file named by its hash
(:func:`generated`) and included the same way.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import string
import tempfile
from pathlib import Path
from typing import Iterable, Sequence, Tuple

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


def snippet_path(name: str) -> Path:
    """``cuda_snippets/<name>``, ``.cuh`` unless the name has an extension."""
    return snippet_dir() / (name if "." in name else f"{name}.cuh")


@functools.lru_cache(maxsize=None)
def snippet(name: str) -> str:
    """Text of ``cuda_snippets/<name>.cuh`` (or ``<name>`` with its extension)."""
    return snippet_path(name).read_text()


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:16]


# A snippet includes another snippet as `# include "name"` (the form jittor's include scan leaves to the compiler,
# which finds the file beside the including one).
_LOCAL_INCLUDE = re.compile(r'^# include "([\w.]+)"\n', re.M)


@functools.lru_cache(maxsize=None)
def depends(name: str) -> Tuple[Path, ...]:
    """The files of snippet ``name``: those it includes (``# include "..."``, recursively, each once, included
    ones first), then its own."""
    paths = []
    for dep in _LOCAL_INCLUDE.findall(snippet(name)):
        paths.extend(depends(dep))
    paths.append(snippet_path(name))
    return tuple(dict.fromkeys(paths))


@functools.lru_cache(maxsize=None)
def snippet_digest(name: str) -> str:
    """The content hash of snippet ``name`` and every snippet it includes: an edit of any changes it."""
    return _digest("".join(snippet(p.name) for p in depends(name)))


# jittor adds its float16/bfloat16 definitions after the last #include of a source that mentions float16; the
# snippets' CPU code names jittor::float16/bfloat16, so the header includes them first itself.
_FP16_INCLUDE = '#include "type/fp16_compute.h"'


@functools.lru_cache(maxsize=None)
def _include_line(path: str, digest: str) -> str:
    return f'#include "{path}"  // {digest}'


@functools.lru_cache(maxsize=None)
def include(names: Tuple[str, ...], extra: Tuple[str, ...] = ()) -> str:
    """A header including the snippets ``names`` (in order, each once) and then the ``extra`` lines (from
    :func:`generated`); each line carries its file's content hash, so the text changes when a file does."""
    lines = [_FP16_INCLUDE]
    for name in dict.fromkeys(names):
        lines.append(_include_line(str(snippet_path(name)), snippet_digest(name)))
    lines.extend(extra)
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=None)
def cpu_include(name: str) -> str:
    """The CPU header of a family: one ``#include`` of its ``cuda_snippets/<name>``, which includes
    ``cpu_common.h`` (and jittor's float16 definitions) itself, marked with the hash of all of them. One line, not
    three: jittor rebuilds and hashes the kernel key from the header on every run, and a 170-byte header cost
    ~0.07 us more a call than a 70-byte one in a loop of 4 us broadcasts (2-core CPU machine, 2026-11-27)."""
    return _include_line(str(snippet_path(name)), snippet_digest(name)) + "\n"


def _generated_dir() -> Path:
    from ._jittor import jt
    return Path(jt.flags.cache_path) / "ops_generated"


@functools.lru_cache(maxsize=None)
def generated(name: str, text: str) -> str:
    """The ``#include`` line of ``text`` written to ``<jittor cache>/ops_generated/<name>-<hash>.cuh`` (written
    once per content: a process that finds the file uses it; a new one is written under a temporary name and
    renamed, so a concurrent reader never sees half a file)."""
    digest = _digest(text)
    folder = _generated_dir()
    path = folder / f"{name}-{digest}.cuh"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    return _include_line(str(path), digest)


class Menu:
    """The kernel instantiations one translation unit holds, in order: a generated host function switches on
    an entry's index (passed at run time through ``data``) and calls that entry's launcher.

    ``entries`` are hashable keys chosen by the family; ``call(entry)`` gives the C++ call of one entry (the
    function's parameters by name). :meth:`render` writes the function; :meth:`index` maps a key to its case.
    """

    def __init__(self, entries: Sequence, call):
        self.entries = tuple(dict.fromkeys(entries))
        self._index = {e: i for i, e in enumerate(self.entries)}
        self._call = call

    def index(self, entry) -> int:
        return self._index[entry]

    def __contains__(self, entry) -> bool:
        return entry in self._index

    def render(self, head: str, what: str) -> str:
        """``head``: the function's template line and signature up to its opening brace, with an ``int v``
        parameter; ``what``: the op's name for the error of an unknown index."""
        cases = "\n".join(f"    case {i}: {self._call(e)}; return;" for i, e in enumerate(self.entries))
        return (f"{head} {{\n  switch (v) {{\n{cases}\n  }}\n"
                f'  LOGf << "{what}: no kernel " << v << " in this menu";\n}}\n')


def header(names: Iterable[str]) -> str:
    """The snippets concatenated in order, each once, those they include (``# include``) inlined before them, for
    a ``cuda_header`` or a test's compile: text that needs no include path."""
    seen, parts = set(), []
    for name in names:
        for path in depends(name):
            if path not in seen:
                seen.add(path)
                parts.append(_LOCAL_INCLUDE.sub("", snippet(path.name)))
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
