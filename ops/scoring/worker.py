"""The grading worker: runs and times the implementations of one case at a time, on inputs the parent made.

The parent (``ops.scoring.worker_proxy``) starts it, sends one JSON command per line on stdin, and reads ``@@``-prefixed
lines on stdout; the worker's stderr (compiler output, tracebacks) goes to a log file the parent keeps. The
worker judges nothing: our outputs go back as .npy files in the case's folder.

Protocol (stdout): ``@@env {...}`` once (or ``@@impl_error <why>`` and exit status 3 where the graded module does
not import), then ``@@ready`` whenever it waits for a command; per case ``@@start <id>``, ``@@variant <the
dispatcher's choice>``, ``@@phase <name>`` before each step that may hang or fail (``check``, ``ours``, a
reference's name, ``rounds``, ``extra``), ``@@outputs {tag: files}`` (the check call's, then the checked timed
calls'), ``@@checks {"calls": {tag: [set, call number]}, "repeats": [...], "samples": [...], "sampled": n}``
(``harness.Watch``),
``@@timing <name> {...}`` for each implementation, ``@@done <id>``. Command: {"case": id, "dir": folder, "seed":
the case's seed (its calls' keys and the draws of checked calls), "spares": the folder of spare files
(``spare``), "references": [...], "nbytes": n, "tiers": [GB/s x3] or null, "repeats": r, "ours_is_ops": bool}.
A ``{"warm": [ids...], "limit_bytes": n, "whole": bool}`` command compiles instead (``compile_pass``):
``@@warmstart {...}`` before each batch's syncs, ``@@warmbatch {...}`` after, ``@@warmed {...}`` at the end; only
the cases not built before under the same code, and their record kept where ``whole`` (no worker crashed before).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import sys
import time
import traceback


def emit(kind: str, payload="") -> None:
    text = payload if isinstance(payload, str) else json.dumps(payload)
    sys.stdout.write(f"@@{kind} {text}\n" if text else f"@@{kind}\n")
    sys.stdout.flush()


def measure_copy_gbps(jt) -> float:
    """Device-to-device (or host) copy bandwidth in GB/s, bytes read plus bytes written (kernel time)."""
    from .harness import Graph, copy_bytes, profile_kernels

    n = (1 << 28) if jt.flags.use_cuda else (1 << 25)  # 1 GiB on the GPU, 128 MiB on the host
    x = jt.ones((n,), "float32")
    x.sync()
    copy = Graph(lambda: [copy_bytes(x, "float32")])
    profile_kernels(copy, 0, 0)
    ms = min(profile_kernels(copy, 0, 3) for _ in range(3))
    return 2 * 4 * n / (ms * 1e-3) / 1e9


def device_name(device: str) -> str:
    """The reports' name of ``device``: the GPU's (nvidia-smi) or the CPU's; asked without jittor, in the parent
    too."""
    if device == "cuda":
        import subprocess
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
                                 capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        return out or "CUDA GPU"
    import platform
    return platform.processor() or platform.machine() or "CPU"


def run_case(fam, case, api, cmd, pristine=None) -> None:
    """One case: the check call, our warm-up, each reference's warm-up, interleaved rounds on fresh inputs; our
    checked outputs as the rounds go."""
    import numpy as np

    from . import compile_pass, compile_record, fresh
    from . import harness as H
    from .grading import TIER_FRACTION, WRONG_FLAG, Timing
    from .spec import ReferenceSkipped

    try:  # the dispatcher's choice, asked where the case runs (the device decides it)
        emit("variant", fam.variant(case, api if cmd.get("ours_is_ops") else None))
    except Exception as err:
        emit("variant", f"? ({str(err)[:40]})")
    case_dir = cmd["dir"]
    manifest = H.load_sets(case_dir)
    emit("phase", "inputs")
    sets = [H.InputSet.from_files(case_dir, entry) for entry in manifest["sets"]]
    timed, seed = manifest["timed"], cmd["seed"]

    if pristine is not None:
        pristine.resume()  # the module's own changes, taken away while the last case's references were timed
    emit("phase", "check")
    ours_impl = H.JittorImpl(case, compile_pass.ours_forward(fam, api), sets)
    reading = pristine.reading if pristine is not None else contextlib.nullcontext
    try:
        outs = ours_impl.call(0, ours_impl.prepare(0))
        with reading():
            files = {"check": H.save_outputs(case_dir, "check", outs, cmd.get("spares"))}
    except Exception as err:
        emit("timing", {"name": "ours", "timing": dataclasses.asdict(Timing(error=H.short_error(err)))})
        return
    del outs
    emit("outputs", files)

    def fresh_inputs(impl, which: int):
        if not isinstance(impl, H.JittorImpl):
            return None  # PyTorch, which is not graded: the timed sets in turn
        return H.FreshInputs(impl, fresh.input_keys(seed, which, len(impl.varied(timed[0]))))

    def save(tag, outputs):
        return H.save_outputs(case_dir, tag, outputs, cmd.get("spares"))

    emit("phase", "ours")
    # which calls are checked and sampled: drawn in this process, per round, from the case's seed
    watch = H.Watch(np.random.default_rng([seed, 0x0C4E]), save)
    ours = H.Meter("ours", ours_impl, timed, fresh_inputs(ours_impl, 0), watch,
                   pristine.resume if pristine is not None else (lambda: None), reading)
    try:
        ours.warm()
    except Exception as err:
        emit("timing", {"name": "ours", "timing": dataclasses.asdict(Timing(error=H.short_error(err)))})
        return

    guard = pristine.restore if pristine is not None else (lambda: None)
    meters = []
    known_failures = compile_pass.failed_compiles()  # a kernel that did not compile is not tried again
    for which, name in enumerate(cmd["references"], start=1):
        key = compile_pass.compile_key(case, name)
        failed = None
        emit("phase", name)  # a failure's timing follows in the same phase: the parent keeps its log with it
        if key in known_failures:
            known = known_failures[key]
            where = "" if known.get("case") == case.id else f"as in {known.get('case')}; "
            failed = Timing(error=f"{known.get('reason', 'compile failed')} ({where}remembered in "
                                  f"{compile_record.FAILED_COMPILES_FILE})", log=known.get("log") or None)
        else:
            try:
                guard()
                impl = H.build_reference(fam, case, name, sets)
                # looked at as ours is (off the clock), so that both are timed alike
                looks = H.Watch(np.random.default_rng([seed, which, 0x0C4E]), None, like=watch)
                meter = H.Meter(name, impl, timed, fresh_inputs(impl, which), looks, guard)
                meter.warm()
                meters.append(meter)
            except ReferenceSkipped as why:
                failed = Timing(error=f"skipped: {why}")
            except Exception as err:
                failed = Timing(error=H.short_error(err))
                if compile_pass.is_compile_failure(err):
                    compile_pass.remember_failed_compile(key, case.id, failed.error)
        if failed is not None:
            emit("timing", {"name": name, "timing": dataclasses.asdict(failed)})

    emit("phase", "rounds")
    fast = [m for m in meters if not m.slow and not m.unclean]
    judged_wrong = os.path.join(case_dir, WRONG_FLAG)  # written by the parent (see Runner.run_case)
    done = 0
    for attempt in range(cmd["repeats"]):
        for m in [ours] + fast:
            m.round()
        done += 1
        if os.path.exists(judged_wrong):
            break
        if done >= H.MIN_ROUNDS and not H.near_a_tier(ours, fast, cmd["nbytes"], cmd.get("tiers"), TIER_FRACTION,
                                                      H.FAR_FROM_TIER):
            break
    # Near a tier's boundary a few percent of noise decides the points: take more rounds there.
    extra = 0
    while extra < 2 * cmd["repeats"] and not os.path.exists(judged_wrong) and \
            H.near_a_tier(ours, fast, cmd["nbytes"], cmd.get("tiers"), TIER_FRACTION):
        if extra == 0:
            emit("phase", "extra")
        for m in [ours] + fast:
            m.round()
        extra += 1

    with reading():
        watch.finish()
    emit("outputs", watch.files)
    emit("checks", {"calls": watch.checks, "repeats": watch.repeats, "samples": watch.sampled_checks,
                    "sampled": watch.samples})
    emit("timing", {"name": "ours", "timing": dataclasses.asdict(ours.timing())})
    for m in meters:
        timing = m.timing()
        emit("timing", {"name": m.name, "timing": dataclasses.asdict(timing)})


IMPORT_FAILED = 3  # the worker's exit status when the graded module does not import


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", required=True,
                    help="JSON: device, impl, copy, log, isolation (applied by the parent's boot line, "
                         "worker_proxy.worker_command, before this imports)")
    args = ap.parse_args(argv)
    job = json.loads(args.job)

    import ctypes
    import resource

    import numpy as np

    from .isolation import Pristine, interpreter_settings, torch_pristine

    from .._jittor import jt
    from .families import load_families

    if job["device"] == "cuda" and not jt.has_cuda:  # the parent left this check to the worker: no jittor there
        emit("device_error", "--device cuda, but jittor has no CUDA here")
        sys.stdout.flush()
        os._exit(IMPORT_FAILED)
    jt.flags.use_cuda = 1 if job["device"] == "cuda" else 0
    from . import compile_pass, compile_record
    compile_pass.LOG_PATH = job.get("log")
    # as they are before the graded module runs: put back before each reference is timed and while ours' outputs
    # are read (sampled, handed back)
    guarded = [time, resource, ctypes, np, np.lib.format, jt, jt.nn, jt.Var, jt.profiler] + [m for m in (
        sys.modules.get("jittor.pool"), sys.modules.get("jittor.misc")) if m is not None]
    settings = interpreter_settings()
    if job.get("torch"):  # imported first, so that the graded module cannot change PyTorch before it is seen
        try:
            import torch
        except Exception:
            torch = None
        if torch is not None:
            objects, torch_settings = torch_pristine(torch)
            guarded += objects
            settings += torch_settings
    pristine = Pristine(guarded, jt.flags, settings)
    try:
        api = importlib.import_module(job["impl"])
    except BaseException as err:  # noqa: B036  (SystemExit in a module's import is its failure to import too)
        emit("impl_error", f"{type(err).__name__}: {err}".splitlines()[0][:300])
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(IMPORT_FAILED)
    by_id = {c.id: (fam, c) for fam in load_families() for c in fam.all_cases()}
    env = {"device": job["device"], "name": device_name(job["device"])}
    if job.get("copy"):
        from . import harness as H
        env["copy_gbps"] = measure_copy_gbps(jt)
        # how inputs come in and bfloat16 outputs go back on this machine (the JSON's env keeps it)
        env["direct_upload"] = bool(jt.flags.use_cuda) and H.direct_upload_works()
        env["bfloat16_bits"] = H.bfloat16_bits_work()
    emit("env", env)
    emit("ready")
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        if "warm" in cmd:
            started = time.monotonic()
            code = compile_pass.fingerprint(api)
            names = compile_record.pass_names(cmd.get("references"))
            built_before = compile_pass.compiled_cases(code, names)
            todo = [c for c in cmd["warm"] if c not in built_before]
            if not todo:
                emit("warmed", {"graphs": 0, "skipped": f"compiled before ({compile_record.COMPILED_FILE})"})
            else:
                built = compile_pass.warm_graphs([by_id[c] for c in todo], api, cmd["limit_bytes"],
                                                 report=lambda kind, figures: emit("warm" + kind, figures),
                                                 names=names)
                if cmd.get("whole"):  # a pass after a crash is not known to have built every graph it was given
                    compile_pass.remember_compiled(code, todo, names)
                emit("warmed", {"graphs": built, "seconds": round(time.monotonic() - started, 1)})
        else:
            fam, case = by_id[cmd["case"]]
            emit("start", case.id)
            run_case(fam, case, api, cmd, pristine)
            emit("done", case.id)
            jt.gc()
        emit("ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
