"""What the bootstrap needs to know about this machine (``ops._jittor``): GPUs through the CUDA driver and nvcc.
No jittor: the grader's parent asks too, to pin its workers to the same build of jittor."""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Mapping, Optional, Tuple


@dataclass(frozen=True)
class Machine:
    """What the bootstrap needs to know about this machine."""

    gpu_count: int
    nvcc: Optional[str]
    nvcc_version: Optional[Tuple[int, int]]


def count_gpus() -> int:
    """GPUs visible through the CUDA driver; 0 when there is no driver (no libcuda) or no device."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def find_nvcc(env: Mapping[str, str]) -> Optional[str]:
    if env.get("nvcc_path"):
        return env["nvcc_path"]
    return shutil.which("nvcc") or next(
        (p for p in ("/usr/local/cuda/bin/nvcc", "/usr/bin/nvcc", "/opt/cuda/bin/nvcc") if os.path.exists(p)), None)


def parse_nvcc_version(text: str) -> Optional[Tuple[int, int]]:
    match = re.search(r"release (\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def probe_machine(env: Mapping[str, str]) -> Machine:
    nvcc = find_nvcc(env)
    version = None
    if nvcc:
        try:
            out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
            version = parse_nvcc_version(out)
        except (OSError, subprocess.SubprocessError):
            version = None
    return Machine(gpu_count=count_gpus(), nvcc=nvcc, nvcc_version=version)
