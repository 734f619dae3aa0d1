"""Fast, deterministic jittor operators with CUDA kernels and CPU paths.

Importing ``ops`` configures and imports jittor (``ops._jittor``: offline, CPU-only and CUDA 13 machines), then
exports each family's functions and layers as ``ops/registry.py`` lists them.
"""
import importlib as _importlib

from ._jittor import has_cuda, jt  # noqa: F401  (bootstrap jittor before anything else)
from .registry import exports as _exports


def _export():
    names = _exports()
    for name, module in names.items():
        globals()[name] = getattr(_importlib.import_module(module), name)
    return list(names)


__all__ = _export() + ["has_cuda"]
__version__ = "0.1.0"  # keep in step with setup.cfg
