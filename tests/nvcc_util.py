"""Compile a package kernel header with the local nvcc (no GPU needed) to catch CUDA errors in CI.

jittor's CUDA build is only reachable on a GPU machine; this checks that every rendered header and launcher
instantiation at least compiles (to PTX) for sm_90, with jittor's dtype names and CHECK macro stood in for.
"""
import os
import shutil
import subprocess
import tempfile

PRELUDE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdint>
typedef __half float16;
typedef __nv_bfloat16 bfloat16;
typedef float float32;
typedef double float64;
#define CHECK(cond) do { if (!(cond)) { std::printf("CHECK failed: %s\n", #cond); } } while (0)
"""


def nvcc_path():
    return shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc")


def compile_check(header: str, body: str = "", arch: str = "sm_90"):
    """Compile ``header`` plus a host function holding ``body`` (launcher calls). Returns (ok, log)."""
    source = PRELUDE + header + "\nvoid ops_compile_check_entry() {\n" + body + "\n}\n"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "check.cu")
        with open(path, "w") as f:
            f.write(source)
        # -ptx: nvcc's front end parses the whole unit (host launchers too) and instantiates every kernel, so
        # every C++ error shows; ptxas and the host compiler are skipped (the GPU runs build the real thing).
        # Half the time of -c: the pool3d float32 menus 23 s against 43 s on a 2-core machine (2026-11-25).
        proc = subprocess.run([nvcc_path(), "-std=c++17", f"-arch={arch}", "--use_fast_math", "-ptx", path,
                               "-o", os.path.join(tmp, "check.ptx")], capture_output=True, text=True)
    return proc.returncode == 0, proc.stdout + proc.stderr


def run_host(header: str, main_body: str, arch: str = "sm_90"):
    """Build ``header`` plus ``int main() { main_body }`` into a host program and run it (its host code only: no
    GPU needed). Returns (ok, stdout or the compiler's log)."""
    source = PRELUDE + header + "\nint main() {\n" + main_body + "\nreturn 0;\n}\n"
    with tempfile.TemporaryDirectory() as tmp:
        path, exe = os.path.join(tmp, "host.cu"), os.path.join(tmp, "host")
        with open(path, "w") as f:
            f.write(source)
        proc = subprocess.run([nvcc_path(), "-std=c++17", f"-arch={arch}", path, "-o", exe], capture_output=True,
                              text=True)
        if proc.returncode != 0:
            return False, proc.stdout + proc.stderr
        run = subprocess.run([exe], capture_output=True, text=True, timeout=60)
    return run.returncode == 0, run.stdout + run.stderr

