"""The public calls a test run makes, recorded and replayed: how ``tests/warm_cuda.py`` learns which kernels the
CUDA tests compile (``tests/cuda_calls.jsonl`` and ``tests/cuda_test_calls.jsonl``; after changing the tests,
``python tests/call_record.py`` records both again on any machine, a GPU not needed, in a few minutes).

jittor compiles one kernel per code op's (input and output dtypes and ranks, header, source), and the tests call
every op with many dtypes and ranks. Met one at a time by parallel pytest workers, those compiles wait for each
other on jittor's cache lock (one nvcc of a menu takes 5-15 s); compiled up front in one ``jt.sync`` they run in
parallel. The CPU half of the tests runs the same bodies with the same shapes and dtypes as the CUDA half (the
``device`` fixture), so recording its calls (``OPS_RECORD_CALLS=<file>``, installed by ``conftest.py``) and
replaying them with CUDA on compiles what the CUDA half will meet. The CUDA-only tests (GPU-sized cases, forced
kernel variants) have no CPU half: they are run in record-only mode (``OPS_RECORD_ONLY=1``: each test stops at its
first op call, which is recorded), on a machine without a GPU too (``RecordingFlags`` takes their
``jt.flags.use_cuda = 1``), into ``tests/cuda_test_calls.jsonl``.
"""
import json
import os
from typing import Callable, Dict, List, Tuple

import numpy as np

import ops
from ops import _launch, registry
from ops._jittor import jt

RECORD_ENV = "OPS_RECORD_CALLS"
ONLY_ENV = "OPS_RECORD_ONLY"
MAX_ELEMENTS = 1 << 24  # calls on more input elements are not replayed by default
HERE = os.path.dirname(os.path.abspath(__file__))
RECORDING = os.path.join(HERE, "cuda_calls.jsonl")
CUDA_TESTS_RECORDING = os.path.join(HERE, "cuda_test_calls.jsonl")  # first calls of the CUDA tests
# Test files whose CUDA tests call no op in the test process (get_score.py runs, jittor's own kernels).
NO_OP_CALLS = ("test_grader_cheats.py", "test_grader_references.py", "test_jittor_cuda.py")


def public() -> Dict[str, Tuple[str, ...]]:
    """{implementation module: its public functions} of the registry's families: the calls recorded."""
    return {r.module: r.functions for r in registry.families() if r.functions}


def recorded_files() -> List[str]:
    """The test files whose CPU half (the ``device`` fixture's "cpu") runs the bodies the CUDA half runs."""
    return [f for r in registry.families() for f in r.tests]


class Unrecordable(Exception):
    pass


def encode(value):
    """A JSON form of a call argument: Vars by shape and dtype, sequences and scalars as they are."""
    if isinstance(value, jt.Var):
        return {"var": list(value.shape), "dtype": str(value.dtype)}
    if isinstance(value, (list, tuple)):
        return {"seq": [encode(v) for v in value], "tuple": isinstance(value, tuple)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.integer):
        return int(value)
    raise Unrecordable(type(value).__name__)


def _elements(encoded) -> int:
    if isinstance(encoded, dict) and "var" in encoded:
        return int(np.prod(encoded["var"]))
    if isinstance(encoded, dict):
        return sum(_elements(v) for v in encoded["seq"])
    return 0


class RecordedOnly(Exception):
    """Raised instead of running a call in record-only mode (``OPS_RECORD_ONLY=1``): the test stops at its first
    call of an op, which is all a record of the CUDA-only tests needs (its gradient is replayed with it)."""


def _write(path: str, entry: dict) -> None:
    line = (json.dumps(entry, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one write per line: lines of parallel workers never interleave
    finally:
        os.close(fd)


def _recorder(name: str, fn: Callable, path: str, only: bool) -> Callable:
    def entry(args, kwargs):
        return {"fn": name, "args": encode(list(args)), "kwargs": encode(sorted(kwargs.items())),
                "no_grad": bool(jt.flags.no_grad),
                "switches": {k: v for k, v in sorted(_launch._SWITCH_VALUES.items()) if v}}

    def recorded(*args, **kwargs):
        if only:
            _write(path, entry(args, kwargs))
            raise RecordedOnly(name)
        out = fn(*args, **kwargs)
        try:
            _write(path, entry(args, kwargs))
        except Unrecordable:
            pass
        return out
    recorded.__wrapped__ = fn
    return recorded


def install(path: str, patch: Callable = setattr) -> None:
    """Record every public call of this process to ``path`` (one JSON line each; call before the test modules
    import ``ops``' functions). ``patch``: how to replace a function (a test passes monkeypatch.setattr)."""
    import importlib
    for module, names in public().items():
        mod = importlib.import_module(module)
        for name in names:
            wrapped = _recorder(name, getattr(mod, name), path, os.environ.get(ONLY_ENV) == "1")
            patch(mod, name, wrapped)
            if getattr(ops, name, None) is not None:
                patch(ops, name, wrapped)


def load(path: str, max_elements: int = MAX_ELEMENTS) -> List[dict]:
    """The distinct recorded calls on at most ``max_elements`` input elements."""
    seen: Dict[str, dict] = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and line not in seen:
                entry = json.loads(line)
                if _elements(entry["args"]) <= max_elements:
                    seen[line] = entry
    return list(seen.values())


# Inputs larger than this are replayed on uninitialized memory (jt.empty): a replay compiles kernels, and the
# CUDA tests' GPU-sized calls (911M input elements in all) would otherwise be drawn on the host and copied over.
EMPTY_ABOVE = 1 << 20


def _decode(encoded, rng):
    if isinstance(encoded, dict) and "var" in encoded:
        shape, dtype = encoded["var"], encoded["dtype"]
        if int(np.prod(shape)) > EMPTY_ABOVE:
            return jt.empty(shape, dtype)
        if dtype == "bool":
            return jt.array(rng.integers(0, 2, shape).astype(bool))
        values = rng.integers(-3, 4, shape) if "int" in dtype else rng.uniform(-1, 1, shape)
        return jt.array(values.astype(np.float64 if dtype == "bfloat16" else dtype)).astype(dtype)
    if isinstance(encoded, dict):
        items = [_decode(v, rng) for v in encoded["seq"]]
        return tuple(items) if encoded["tuple"] else items
    return encoded


def _function(name: str) -> Callable:
    """The public function a recording names, unwrapped where a recorder is installed."""
    import importlib
    module = {fn: m for m, names in public().items() for fn in names}.get(name)
    if module is None:
        raise ValueError(f"recorded call of {name!r}, a function of no registered family")
    f = getattr(importlib.import_module(module), name)
    return getattr(f, "__wrapped__", f)


def replay(entries: List[dict], rng) -> List:
    """Each call again on fresh values under its grad mode and switches, with the gradient of its float outputs
    where grad was on: the Vars to sync (nothing has run yet). Calls that raise are left out."""
    outs = []
    for switches, group in _by_switches(entries).items():
        with _switched(dict(switches)):
            for entry in group:
                try:
                    outs += _replay_one(entry, rng)
                except Exception:
                    continue
    return outs


def _by_switches(entries):
    groups: Dict[tuple, list] = {}
    for e in entries:
        groups.setdefault(tuple(sorted(e["switches"].items())), []).append(e)
    return groups


class _switched:
    """The ``OPS_*`` switches set as recorded (the others unset), restored after."""

    def __init__(self, values: Dict[str, str]):
        self.values = values

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in _launch._SWITCH_VALUES}
        for k in _launch._SWITCH_VALUES:
            os.environ.pop(k, None)
        os.environ.update(self.values)
        _launch.reload_switches()

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _launch.reload_switches()


def _replay_one(entry: dict, rng) -> list:
    fn = _function(entry["fn"])
    args = _decode(entry["args"], rng)
    kwargs = dict(_decode(entry["kwargs"], rng))
    if entry["no_grad"]:
        with jt.no_grad():
            out = fn(*args, **kwargs)
        return list(out) if isinstance(out, (list, tuple)) else [out]
    out = fn(*args, **kwargs)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    floats = [o for o in outs if "float" in str(o.dtype)]
    xs = [a for a in args if isinstance(a, jt.Var) and "float" in str(a.dtype)]
    if floats and xs:
        loss = sum((o.float32() * o.float32()).sum() for o in floats)
        outs += jt.grad(loss, xs)
    return outs


class RecordingFlags:
    """jittor's flags, but ``use_cuda`` is held here: set to 1 on a machine without CUDA (where jittor refuses it),
    it reads back 1. Record-only runs of the CUDA tests install it as ``jt.flags`` (``conftest.py``): a test
    that turns CUDA on reaches its first op call, which is recorded, not run. ``cuda_archs``, which a build
    without CUDA lacks, reads as the H100's (the tests choose their tensor-core cases by it)."""

    ARCHS = [90]

    def __init__(self, flags):
        object.__setattr__(self, "_flags", flags)
        object.__setattr__(self, "_use_cuda", 0)

    def __getattr__(self, name):
        if name == "use_cuda":
            return self._use_cuda
        if name == "cuda_archs" and not hasattr(self._flags, name):
            return self.ARCHS
        return getattr(self._flags, name)

    def __setattr__(self, name, value):
        if name == "use_cuda":
            object.__setattr__(self, "_use_cuda", int(value))
        else:
            setattr(self._flags, name, value)


def pretend_cuda() -> None:
    """On a machine without CUDA, for a record-only run: ``jt.flags`` takes ``use_cuda = 1`` and the launch layer
    answers ``on_cuda()`` by it, so that the CUDA tests' dispatch checks before their first op call pass (the
    call itself is recorded, not run)."""
    jt.flags = RecordingFlags(jt.flags)
    _launch.flags = jt.flags
    _launch._HAS_CUDA = True


def _distinct_lines(raw: str, path: str) -> int:
    with open(raw) as f:
        lines = sorted({line for line in f if line.strip()})
    with open(path, "w") as f:
        f.writelines(lines)
    print(f"{len(lines)} distinct calls -> {path}")
    return len(lines)


def record(path: str = RECORDING, cuda_tests_path: str = CUDA_TESTS_RECORDING) -> int:
    """Run the CPU half of the op tests with recording on, then the CUDA tests in record-only mode; write the
    distinct calls of each, sorted, to ``path`` and ``cuda_tests_path``."""
    import subprocess
    import sys
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "calls.jsonl")
        env = dict(os.environ, **{RECORD_ENV: raw})
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:benchmark", "-m", "not cuda",
                               "-k", "cpu", *(os.path.join(HERE, f) for f in recorded_files())], env=env, cwd=HERE)
        if proc.returncode != 0:
            return proc.returncode
        _distinct_lines(raw, path)
        raw = os.path.join(tmp, "cuda_tests.jsonl")
        env = dict(os.environ, **{RECORD_ENV: raw, ONLY_ENV: "1"})
        # every test fails at its first op call (RecordedOnly): the return code says nothing
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:benchmark", "-m", "cuda", "--no-header",
                        "-o", "addopts=", *(f"--ignore={os.path.join(HERE, f)}" for f in NO_OP_CALLS), HERE],
                       env=env, cwd=HERE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not os.path.exists(raw):
            print("no CUDA test reached an op call")
            return 1
        _distinct_lines(raw, cuda_tests_path)
    return 0


if __name__ == "__main__":
    raise SystemExit(record())
