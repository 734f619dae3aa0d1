"""The grading child process: runs cases one by one and prints one ``@@``-prefixed JSON line per event.

get_score.py runs this in a subprocess so that a case that hangs or kills its process (a bad kernel) costs
that case only: the parent sees the missing result, marks the case, and starts a new worker after it.
Protocol (stdout): ``@@env {...}`` once, then per case ``@@start <id>``, ``@@partial {...}`` after ours and
after each reference, and ``@@result {...}``.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import time


def emit(kind: str, payload) -> None:
    sys.stdout.write(f"@@{kind} {payload if isinstance(payload, str) else json.dumps(payload)}\n")
    sys.stdout.flush()


def measure_copy_gbps(jt) -> float:
    """Device-to-device (or host) copy bandwidth in GB/s, bytes read plus bytes written."""
    from .harness import time_jittor

    n = (1 << 28) if jt.flags.use_cuda else (1 << 25)  # 1 GiB on the GPU, 128 MiB on the host
    x = jt.ones((n,), "float32")
    x.sync()

    def copy():
        return [jt.code(x.shape, x.dtype, [x],
                        cuda_src="cudaMemcpyAsync(out0_p, in0_p, in0->size, cudaMemcpyDeviceToDevice);",
                        cpu_src="std::memcpy(out0_p, in0_p, in0->size);", cpu_header="#include <cstring>")]
    return 2 * 4 * n / (time_jittor(copy) * 1e-3) / 1e9


def device_name(jt) -> str:
    if jt.flags.use_cuda:
        import subprocess
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
                                 capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        return out or "CUDA GPU"
    import platform
    return platform.processor() or platform.machine() or "CPU"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", required=True, help="JSON: device, impl, seed, cases, references, copy")
    args = ap.parse_args(argv)
    job = json.loads(args.job)

    from .._jittor import jt
    from .families import load_families
    from . import harness
    from .harness import run_case, warm_cases

    jt.flags.use_cuda = 1 if job["device"] == "cuda" else 0
    harness.REPEATS = job.get("repeats", harness.REPEATS)
    api = importlib.import_module(job["impl"])
    by_id = {c.id: (fam, c) for fam in load_families() for c in fam.cases}
    if job.get("warm"):
        built = warm_cases([by_id[c] for c in job["cases"]], api, job["seed"])
        emit("warm", {"graphs": built})
        return 0
    env = {"device": job["device"], "name": device_name(jt)}
    if job.get("copy"):
        env["copy_gbps"] = measure_copy_gbps(jt)
    emit("env", env)
    for case_id in job["cases"]:
        fam, case = by_id[case_id]
        emit("start", case_id)
        started = time.monotonic()
        result = run_case(fam, case, api, job["seed"], job["references"],
                          on_ours=lambda partial: emit("partial", dataclasses.asdict(partial)))
        result.seconds = round(time.monotonic() - started, 2)
        emit("result", dataclasses.asdict(result))
        jt.gc()
    return 0


if __name__ == "__main__":
    sys.exit(main())
