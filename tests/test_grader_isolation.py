"""What keeps a graded module from outliving the grader, writing its files or reaching its timing
(``ops.scoring.isolation``), and the discarding of timing rounds in which something compiled (``harness.Meter``)."""
import os
import subprocess
import sys
import textwrap
import time

import pytest

from ops._jittor import jt
from ops.scoring import harness, isolation

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ops.scoring.isolation by its path: standard library only, no jittor (whose pool of compilers, started before
# the Landlock of this process, could not be signalled by it)
LOAD = f"""
import importlib.util
spec = importlib.util.spec_from_file_location("isolation", {os.path.join(ROOT, "ops", "scoring", "isolation.py")!r})
isolation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(isolation)
"""


def run_python(code: str, **kwargs):
    return subprocess.run([sys.executable, "-c", LOAD + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, **kwargs)


@pytest.mark.skipif(isolation.landlock_abi() < 1, reason="no Landlock in this kernel")
def test_landlock_leaves_only_the_writable_folders_writable(tmp_path):
    allowed, other = tmp_path / "allowed", tmp_path / "other"
    allowed.mkdir()
    other.mkdir()
    proc = run_python(f"""
        import subprocess
        assert isolation.restrict_writes([{str(allowed)!r}, "/dev/null"]) == ""
        open({str(allowed / "a.txt")!r}, "w").write("yes")
        for path in ({str(other / "b.txt")!r}, {str(tmp_path / "c.txt")!r}):
            try:
                open(path, "w").write("no")
                print("wrote", path)
            except PermissionError:
                pass
        # what it starts inherits it
        subprocess.run(["sh", "-c", "echo no > {other / "d.txt"}"], stderr=subprocess.DEVNULL)
        open("/dev/null", "w").write("fine")
        """)
    assert proc.returncode == 0, proc.stderr
    assert "wrote" not in proc.stdout
    assert (allowed / "a.txt").read_text() == "yes"
    assert not any(p.exists() for p in (other / "b.txt", tmp_path / "c.txt", other / "d.txt"))


def test_what_a_worker_leaves_is_reaped_by_the_subreaper(tmp_path):
    """A double fork and setsid: the orphan ends up the subreaper's child, and reap kills it; a process of the
    grader's own taken before (``spare``) is left alone."""
    marker = tmp_path / "alive"
    leaver = tmp_path / "leaver.py"
    leaver.write_text(textwrap.dedent(f"""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                for _ in range(600):
                    open({str(marker)!r}, "w").write(str(time.time()))
                    time.sleep(0.05)
                os._exit(0)
            os._exit(0)
        """))
    proc = run_python(f"""
        import os, subprocess, sys, time
        assert isolation.become_subreaper()
        own = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        spare = isolation.descendants(os.getpid())
        subprocess.run([sys.executable, {str(leaver)!r}])
        time.sleep(0.5)
        print("left", len(isolation.descendants(os.getpid(), spare)))
        print("killed", isolation.reap(spare))
        print("after", len(isolation.descendants(os.getpid(), spare)), own.poll() is None)
        own.kill()
        """)
    assert proc.returncode == 0, proc.stderr
    assert "left 1" in proc.stdout and "killed 1" in proc.stdout and "after 0 True" in proc.stdout
    written = marker.read_text()
    time.sleep(0.5)
    assert marker.read_text() == written  # nobody writes it any more


def test_the_isolation_line_says_what_the_workers_have(tmp_path, monkeypatch):
    monkeypatch.setenv("OPS_GRADER_ISOLATION", "none")
    iso = isolation.Isolation(str(tmp_path), protected=[str(tmp_path / "r.json")])
    assert iso.mode == "none" and iso.job() == {"landlock": None} and iso.command(["x"]) == ["x"]
    assert iso.describe().startswith("isolation: none")
    assert iso.environment({"A": "1"})["TMPDIR"] == os.path.join(os.path.realpath(str(tmp_path)), "tmp")
    if isolation.landlock_abi() >= 1:
        monkeypatch.setenv("OPS_GRADER_ISOLATION", "landlock")
        iso = isolation.Isolation(str(tmp_path), protected=[str(tmp_path / "r.json"), "/elsewhere/r.md"])
        assert iso.mode == "landlock" and os.path.realpath(str(tmp_path)) in iso.job()["landlock"]
        assert iso.exposed() == [os.path.realpath(str(tmp_path / "r.json"))]  # inside the scratch folder


def test_pristine_puts_back_patched_attributes_and_flags():
    import time as time_module
    real_clock, real_reindex = time_module.perf_counter, jt.Var.reindex
    level = jt.flags.log_silent
    pristine = isolation.Pristine([time_module, jt.Var], jt.flags)
    try:
        time_module.perf_counter = lambda: 0.0
        jt.Var.reindex = lambda self, *a, **k: None
        jt.flags.log_silent = 1 - level
        assert pristine.restore() == 3
        assert time_module.perf_counter is real_clock and jt.Var.reindex is real_reindex
        assert jt.flags.log_silent == level and pristine.restore() == 0
    finally:
        time_module.perf_counter, jt.Var.reindex, jt.flags.log_silent = real_clock, real_reindex, level


def test_pristine_takes_a_classs_new_attributes_and_gives_the_module_its_changes_back():
    """A method added to jt.Var hides nothing of jittor's there, but one added to a subclass hides what it
    inherits: both go while the references run, and come back (with changed flags and settings) on resume."""
    class Base:
        def reindex(self):
            return "base"

    class Sub(Base):
        pass

    setting = {"threads": 4}
    pristine = isolation.Pristine([Sub], jt.flags, [(lambda: setting["threads"],
                                                     lambda v: setting.__setitem__("threads", v))])
    level = jt.flags.log_silent
    mine = lambda self: "mine"  # noqa: E731
    try:
        Sub.reindex, Sub.extra, setting["threads"] = mine, 1, 1
        jt.flags.log_silent = 1 - level
        assert pristine.restore() == 4
        assert Sub().reindex() == "base" and not hasattr(Sub, "extra") and setting["threads"] == 4
        assert jt.flags.log_silent == level
        pristine.restore()  # a second reference: what the module had is kept from the first
        pristine.resume()
        assert Sub.reindex is mine and Sub.extra == 1 and setting["threads"] == 1
        assert jt.flags.log_silent == 1 - level
        pristine.resume()  # nothing taken since: nothing changes
        assert Sub.reindex is mine
    finally:
        jt.flags.log_silent = level


def test_pristine_keeps_what_the_grader_changed_between_restore_and_resume():
    """Between a restore and the next resume only the grader runs (a reference's first call sets up PyTorch's
    CUDA state, say): what it changed or added stays; the module's changes still come and go."""
    class Lazy:
        initialized = False

    setting = {"threads": 4}
    pristine = isolation.Pristine([Lazy], None, [(lambda: setting["threads"],
                                                  lambda v: setting.__setitem__("threads", v))])
    Lazy.patched = "module's"
    pristine.restore()
    assert not hasattr(Lazy, "patched")
    Lazy.initialized, Lazy.cache, setting["threads"] = True, {}, 8  # the grader's turn
    pristine.resume()
    assert Lazy.patched == "module's" and Lazy.initialized is True and setting["threads"] == 8
    assert pristine.restore() == 1  # only the module's attribute goes
    assert Lazy.initialized is True and isinstance(Lazy.cache, dict) and setting["threads"] == 8
    pristine.resume()
    assert Lazy.patched == "module's"


class _Compiling(harness.JittorImpl):
    """A jittor implementation whose first ``dirty`` calls run a child process, as jittor compiling a kernel does;
    a call takes 0.2 ms."""

    def __init__(self, dirty):
        self.dirty, self.calls = dirty, 0

    def prepare(self, k):
        return None

    def call(self, k, prepared):
        self.calls += 1
        if self.calls <= self.dirty:
            subprocess.run(["true"])
        harness_spin(0.0002)
        return []


def harness_spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_rounds_in_which_a_child_process_ran_are_discarded_and_run_again():
    clean_later = harness.Meter("naive", _Compiling(dirty=3), timed=[0])
    clean_later.warm()  # its first calls compile: the estimate comes from the first clean one
    assert clean_later.impl.calls == 4 and not clean_later.unclean
    clean_later.impl.dirty = clean_later.impl.calls + 1  # the next round's first call compiles again
    assert clean_later.round() and clean_later.discarded == 1 and len(clean_later.wall) == 1
    timing = clean_later.timing()
    assert timing.ok and timing.discarded == 1
    never = harness.Meter("jittor", _Compiling(dirty=10 ** 6), timed=[0])
    never.warm()
    assert never.unclean
    never.impl.dirty = 10 ** 6
    assert not never.round() and never.discarded == harness.ROUND_ATTEMPTS and not never.wall
    assert not never.timing().ok and "not measured" in never.timing().error


def test_landlock_widens_or_steps_aside_for_the_cuda_driver(tmp_path, monkeypatch):
    """On a GPU run the grader first checks that a Landlocked process can still use CUDA: where the listed
    device files are not enough it lets workers write all of /dev, and where even that stops the driver it runs
    them without Landlock and says why."""
    from ops.scoring import isolation as iso
    monkeypatch.setattr(iso, "landlock_abi", lambda: 6)
    monkeypatch.setattr(iso, "shutil", type("NoBwrap", (), {"which": staticmethod(lambda name: None)}))
    for answers, mode, extra, words in (([True], "landlock", [], "device files;"),
                                        ([False, True], "landlock", ["/dev"], "all of /dev"),
                                        ([False, False], "none", [], "Landlock stops this machine's CUDA driver")):
        calls = iter(answers)
        monkeypatch.setattr(iso, "cuda_works_under", lambda writable: next(calls))
        got = iso.Isolation(str(tmp_path), cuda=True)
        assert (got.mode, got.extra) == (mode, extra) and words in got.describe(), got.describe()
        assert next(calls, None) is None  # asked exactly as often as needed
    monkeypatch.setattr(iso, "cuda_works_under", lambda writable: pytest.fail("a CPU run needs no probe"))
    assert iso.Isolation(str(tmp_path)).mode == "landlock"


def test_the_cuda_probe_fails_without_a_gpu():
    from ops.scoring import isolation as iso
    from ops._jittor import has_cuda
    if has_cuda():
        pytest.skip("a GPU machine")
    assert not iso.cuda_works_under(["/tmp"])
