"""Finding cuDNN 9 and NCCL for jittor 1.3.11, and the folder of links jittor's build needs to use them.

jittor 1.3.11 looks for cuDNN 8 only (its loader dlopens ``libcudnn_{ops,cnn}_{infer,train}.so``, which cuDNN 9
split differently) and for NCCL only where ``nccl_include_path``/``nccl_lib_path`` name it, or by downloading
and building NCCL 2.8 at import. Both ship as wheels (``nvidia-cudnn-cu13``, ``nvidia-nccl-cu13``, PyTorch's
dependencies) that hold versioned libraries only (``libcudnn.so.9``, ``libnccl.so.2``), while a linker (``-lcudnn``)
and jittor's NCCL loader want the unversioned name. This module finds a cuDNN 9 and an NCCL 2 (wheels on
``sys.path``, ``CUDNN_PATH``/``CUDNN_HOME``/``NCCL_HOME``, system folders) and keeps a folder of links with the
unversioned names inside jittor's cache folder; it never writes anywhere else. Nothing here imports jittor.
"""
from __future__ import annotations

import hashlib
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence, Tuple

_ARCH = "aarch64" if platform.machine() in ("aarch64", "arm64") else "x86_64"
SYSTEM_INCLUDES = ("/usr/include", f"/usr/include/{_ARCH}-linux-gnu", "/usr/local/cuda/include")
SYSTEM_LIBS = (f"/usr/lib/{_ARCH}-linux-gnu", "/usr/local/cuda/lib64", "/usr/lib64", "/usr/lib")
LINKS_FOLDER = "ops_cuda_libs"  # under jittor's cache folder


@dataclass(frozen=True)
class Library:
    """One installation of cuDNN or NCCL: the folders to compile and link against, and where it came from."""

    name: str  # "cudnn" or "nccl"
    version: Tuple[int, int, int]
    include_dir: str
    lib_dir: str
    library: str  # the versioned main library, e.g. .../libcudnn.so.9
    origin: str  # for messages: "wheel", "CUDNN_PATH", "system", ...

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))


@dataclass(frozen=True)
class _Kind:
    name: str
    header: str  # the header whose defines give the version
    version_keys: Tuple[str, str, str]
    min_major: int
    wheel_dirs: Tuple[str, ...]  # under site-packages
    env_roots: Tuple[str, ...]


CUDNN = _Kind("cudnn", "cudnn_version.h", ("CUDNN_MAJOR", "CUDNN_MINOR", "CUDNN_PATCHLEVEL"), 9,
              ("nvidia/cudnn", "nvidia/cu13", "nvidia/cu12"), ("CUDNN_PATH", "CUDNN_HOME"))
NCCL = _Kind("nccl", "nccl.h", ("NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH"), 2,
             ("nvidia/nccl", "nvidia/cu13", "nvidia/cu12"), ("NCCL_HOME",))


def read_version(text: str, keys: Sequence[str]) -> Optional[Tuple[int, int, int]]:
    """(major, minor, patch) from a header's ``#define KEY n`` lines; None without a major."""
    numbers = []
    for key in keys:
        match = re.search(r"^\s*#\s*define\s+" + key + r"\s+(\d+)", text, re.MULTILINE)
        numbers.append(int(match.group(1)) if match else None)
    if numbers[0] is None:
        return None
    return tuple(n or 0 for n in numbers)  # type: ignore[return-value]


def _header_version(kind: _Kind, include_dir: str) -> Optional[Tuple[int, int, int]]:
    try:
        text = Path(include_dir, kind.header).read_text(errors="replace")
    except OSError:
        return None
    return read_version(text, kind.version_keys)


def _main_library(kind: _Kind, lib_dir: str, major: int) -> Optional[str]:
    """``lib<name>.so.<major>``, or the newest ``lib<name>.so.<major>.*`` where only those are there."""
    exact = os.path.join(lib_dir, f"lib{kind.name}.so.{major}")
    if os.path.isfile(exact):
        return exact
    try:
        names = sorted(n for n in os.listdir(lib_dir) if n.startswith(f"lib{kind.name}.so.{major}."))
    except OSError:
        return None
    return os.path.join(lib_dir, names[-1]) if names else None


def _candidates(kind: _Kind, env: Mapping[str, str], search_path: Iterable[str],
                includes: Sequence[str], libs: Sequence[str]):
    """(include_dir, lib_dirs, origin) in the order they are preferred: what the user names, wheels, the system."""
    for var in kind.env_roots:
        root = env.get(var)
        if root:
            yield os.path.join(root, "include"), (os.path.join(root, "lib"), os.path.join(root, "lib64")), var
    for entry in search_path:
        for sub in kind.wheel_dirs:
            root = os.path.join(entry or ".", sub)
            yield os.path.join(root, "include"), (os.path.join(root, "lib"),), "wheel"
    for include in includes:
        yield include, tuple(libs), "system"


def find(kind: _Kind, env: Mapping[str, str], search_path: Iterable[str],
         includes: Sequence[str] = SYSTEM_INCLUDES, libs: Sequence[str] = SYSTEM_LIBS) -> Optional[Library]:
    """The first installation of ``kind`` whose header says a supported major version and whose library of
    that major version is beside it."""
    for include_dir, lib_dirs, origin in _candidates(kind, env, search_path, includes, libs):
        version = _header_version(kind, include_dir)
        if version is None or version[0] < kind.min_major:
            continue
        for lib_dir in lib_dirs:
            library = _main_library(kind, lib_dir, version[0])
            if library:
                return Library(kind.name, version, include_dir, lib_dir, library, origin)
    return None


def find_cudnn(env: Mapping[str, str], search_path: Iterable[str], **system) -> Optional[Library]:
    return find(CUDNN, env, search_path, **system)


def find_nccl(env: Mapping[str, str], search_path: Iterable[str], **system) -> Optional[Library]:
    return find(NCCL, env, search_path, **system)


def sub_libraries(lib: Library) -> list:
    """cuDNN 9's sub-libraries beside its main library (graph, ops, cnn, adv, engines, heuristic): it dlopens
    them by name at run time, so they are loaded first, graph before the rest (the others need it)."""
    major = lib.version[0]
    try:
        names = os.listdir(lib.lib_dir)
    except OSError:
        return []
    found = sorted(n for n in names if n.startswith(f"lib{lib.name}_") and n.endswith(f".so.{major}"))
    found.sort(key=lambda n: "graph" not in n)
    return [os.path.join(lib.lib_dir, n) for n in found]


def links_dir(cache_path: str, lib: Library) -> str:
    """The folder of links for ``lib`` in jittor's cache: named by version and by where the library lives, so
    that another installation gets another folder (and jittor, whose build commands name it, rebuilds)."""
    where = hashlib.sha1(os.path.realpath(lib.lib_dir).encode()).hexdigest()[:10]
    return os.path.join(cache_path, LINKS_FOLDER, f"{lib.name}-{lib.version_text}-{where}")


def ensure_links(folder: str, lib: Library) -> bool:
    """``lib<name>.so`` in ``folder`` pointing at the versioned library; True where it wrote anything.
    Idempotent; a link is replaced atomically. Raises OSError where the folder cannot be written."""
    link = os.path.join(folder, f"lib{lib.name}.so")
    if os.path.islink(link) and os.readlink(link) == lib.library:
        return False
    os.makedirs(folder, exist_ok=True)
    temporary = f"{link}.{os.getpid()}.tmp"
    if os.path.lexists(temporary):
        os.unlink(temporary)
    os.symlink(lib.library, temporary)
    os.replace(temporary, link)
    return True
