"""Fast, deterministic jittor operators with CUDA kernels and CPU paths.

Importing ``ops`` configures and imports jittor (``ops._jittor``: offline, CPU-only and CUDA 13 machines).
"""
from ._jittor import has_cuda, jt  # noqa: F401  (bootstrap jittor before anything else)

# Imported eagerly, functions last: ``ops.permute`` and ``ops.timex`` must name the functions even after
# ``import ops.permute`` (a lazy export would lose to the submodule the import system binds there).
from .broadcast import ExpandAs, broadcast_to, expand_as  # noqa: E402
from .permute import Permute, TransposeAdd, permute, transpose, transpose_add  # noqa: E402
from .pool3d import MaxPool3d, max_pool3d  # noqa: E402
from .timex import TimeX, timex  # noqa: E402

__all__ = ["max_pool3d", "MaxPool3d", "permute", "transpose", "transpose_add", "Permute", "TransposeAdd",
           "expand_as", "broadcast_to", "ExpandAs", "timex", "TimeX", "has_cuda"]
__version__ = "0.1.0"  # keep in step with setup.cfg
