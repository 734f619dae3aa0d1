import collections
import os
import signal
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests' own helpers (reference.py, nvcc_util.py)


def _import_ops_alone():
    """Import ops (and jittor) with no other pytest worker importing at the same time: jittor rewrites its
    generated sources at every import, and a worker reading them half-written fails to start ("Source read
    failed: .../gen/pyjt_jit_op_maker.cc"), even with jittor's own file lock on."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        import ops  # noqa: F401
        return
    import fcntl
    import tempfile
    with open(os.path.join(tempfile.gettempdir(), "ops-pytest-import.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            import ops  # noqa: F401,F811
        finally:  # explicitly: processes jittor forks during the import share the descriptor, and its lock
            fcntl.flock(lock, fcntl.LOCK_UN)


_import_ops_alone()
import ops  # noqa: E402,F401  (bootstraps jittor)
from ops._jittor import has_cuda, jt  # noqa: E402

# jittor's core ends the process, without a word, when a child dies of a signal other than SIGTERM (its handler is
# for its own dataset workers): a test whose subprocess is killed (a timeout, a SIGKILL) would end the whole run
# with no report. The default lets such a test fail on its own.
signal.signal(signal.SIGCHLD, signal.SIG_DFL)

if os.environ.get("OPS_RECORD_CALLS"):  # tests/call_record.py: before the test modules import ops' functions
    import call_record  # noqa: E402
    call_record.install(os.environ["OPS_RECORD_CALLS"])
# Record-only runs stop each test at its first op call: the CUDA tests run to it on a machine without CUDA too.
RECORD_ONLY = os.environ.get("OPS_RECORD_CALLS") and os.environ.get("OPS_RECORD_ONLY") == "1"
if RECORD_ONLY and not has_cuda():
    call_record.pretend_cuda()


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU (jittor has_cuda is false here)")
    skip_nvcc = pytest.mark.skip(reason="needs nvcc on the PATH")
    from nvcc_util import nvcc_path
    for item in items:
        if "cuda" in item.keywords and not has_cuda() and not RECORD_ONLY:
            item.add_marker(skip_cuda)
        if "nvcc" in item.keywords and not nvcc_path():
            item.add_marker(skip_nvcc)


def pytest_terminal_summary(terminalreporter):
    """The skipped tests in one line per reason (setup.cfg's -rfE leaves them out of pytest's own summary)."""
    reasons = collections.Counter()
    for report in terminalreporter.stats.get("skipped", []):
        text = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reasons[text[len("Skipped: "):] if text.startswith("Skipped: ") else text] += 1
    for reason, count in reasons.most_common():
        terminalreporter.write_line(f"skipped {count}: {reason}")


@pytest.fixture
def rng(request):
    """Fresh random data every run; the seed is printed with a failure (OPS_TEST_SEED=N reproduces it)."""
    seed = int(os.environ.get("OPS_TEST_SEED", np.random.SeedSequence().entropy % 2**32))
    request.node.user_properties.append(("seed", seed))
    print(f"random seed: {seed}")
    return np.random.default_rng(seed)


@pytest.fixture
def on_gpu():
    """The test runs with jittor on the GPU (for files of ``cuda`` tests: ``usefixtures("on_gpu")``)."""
    jt.flags.use_cuda = 1
    yield
    jt.flags.use_cuda = 0


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def device(request):
    """Runs a test once on the CPU path and once (marked ``cuda``) on the GPU path."""
    previous = jt.flags.use_cuda
    jt.flags.use_cuda = 1 if request.param == "cuda" else 0
    yield request.param
    jt.flags.use_cuda = previous


# The A/B switches of the dispatchers: the tests pin the defaults, so a switch left set in the shell must not
# change what they check; tests of a switch set it themselves (the ``switches`` fixture).
AB_SWITCHES = ("OPS_TIMEX_MMA",)


@pytest.fixture(autouse=True)
def default_dispatch(monkeypatch):
    for name in AB_SWITCHES:
        monkeypatch.delenv(name, raising=False)
    ops._launch.reload_switches()


class Switches:
    """Sets and clears ``OPS_*`` switches for one test: the environment (undone after the test) and
    ``reload_switches()``, as an A/B script does."""

    def __init__(self, monkeypatch):
        self._mp = monkeypatch

    def setenv(self, name, value):
        self._mp.setenv(name, value)
        ops._launch.reload_switches()

    def delenv(self, name, raising=True):
        self._mp.delenv(name, raising=raising)
        ops._launch.reload_switches()


@pytest.fixture
def switches(monkeypatch):
    return Switches(monkeypatch)


@pytest.fixture
def toy_worker_env(monkeypatch):
    """The grader's worker processes see the toy family (tests/toy_family.py) and run on the CPU."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.setenv("OPS_SCORING_FAMILY_MODULES", "toy_family")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.join(root, "tests"), root,
                                                      os.environ.get("PYTHONPATH", "")]))
    jt.flags.use_cuda = 0
