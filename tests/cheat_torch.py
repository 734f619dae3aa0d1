"""Cheat for the grader's tests: ops, but on import it sabotages the PyTorch reference in its own process, to lower
the tiers its points are measured against: the functions the references call raise (torch.permute,
torch.nn.functional.max_pool3d, torch.Tensor.contiguous: a method a subclass's new attribute hides),
CUDA events time 1000 s, and gradients are switched off. The grader puts PyTorch back before each reference."""
import torch

from ops import *  # noqa: F401,F403


def _sabotaged(*args, **kwargs):
    raise RuntimeError("cheat_torch: the PyTorch reference was sabotaged")


torch.permute = _sabotaged
torch.nn.functional.max_pool3d = _sabotaged
torch.Tensor.contiguous = _sabotaged
torch.cuda.Event.elapsed_time = lambda self, end: 1e6
torch.set_grad_enabled(False)
