"""Fast, deterministic jittor operators with CUDA kernels and CPU paths.

Importing ``ops`` configures and imports jittor (``ops._jittor``: offline, CPU-only and CUDA 13 machines).
The operators load on first use, so one family's import cost is paid only by its users.
"""
import importlib

from ._jittor import has_cuda, jt  # noqa: F401  (bootstrap jittor first)

_EXPORTS = {
    "max_pool3d": "pool3d", "MaxPool3d": "pool3d",
    "permute": "permute", "transpose": "permute", "transpose_add": "permute",
    "Permute": "permute", "TransposeAdd": "permute",
    "expand_as": "broadcast", "broadcast_to": "broadcast", "ExpandAs": "broadcast",
    "timex": "timex", "TimeX": "timex",
}

__all__ = sorted(_EXPORTS) + ["has_cuda"]
__version__ = "0.1.0"  # keep in step with setup.cfg


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ops' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
