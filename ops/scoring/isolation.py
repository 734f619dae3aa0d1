"""What keeps a graded module's process from outliving the grader or writing its files: one place for every worker.

The graded module runs in a worker process (``ops.scoring.worker``); the parent (get_score.py) trusts nothing it
writes but the verdict files it judges. Here:

* ``Isolation`` (the parent): how a worker is started and what it may write. Where bubblewrap (``bwrap``) runs,
  the worker runs in its own PID namespace (everything it starts dies with it) on a read-only view of the
  machine, writable only where it must write: the run's scratch folder and the compilers' caches, with a /tmp
  and a /dev/shm of its own. Where it does not, the worker restricts itself with Landlock (Linux 5.13 and later,
  no privileges needed): the same folders and /dev/shm writable, nothing else. ``describe`` is the one line the
  run prints and records.
* ``become_subreaper`` and ``reap`` (the parent): every process a worker leaves behind (a double fork and
  ``setsid`` included) becomes the parent's child rather than init's, and is killed before the reports are
  written.
* ``worker_setup`` (the worker, first thing, before it imports ``ops`` and jittor): the Landlock half.
* ``Pristine`` (the worker): attributes of ``time``, ``resource`` and jittor (its modules, ``Var``, its flags)
  as they were before the graded module was imported, put back before each reference is timed.

Linux only; elsewhere every part says what it could not do and the run goes on without it.
"""
from __future__ import annotations

import contextlib
import ctypes
import itertools
import operator
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Callable, Dict, Iterable, List, Sequence, Tuple

_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_CHILD_SUBREAPER = 36
_SYS_LANDLOCK = {"create_ruleset": 444, "add_rule": 445, "restrict_self": 446}  # the same on x86_64 and arm64

# Landlock's filesystem rights that write (uapi/linux/landlock.h): by ABI version.
_WRITE_FILE, _REMOVE_DIR, _REMOVE_FILE = 1 << 1, 1 << 4, 1 << 5
_MAKE = (1 << 6) | (1 << 7) | (1 << 8) | (1 << 9) | (1 << 10) | (1 << 11) | (1 << 12)  # char, dir, reg, sock, ...
_REFER, _TRUNCATE = 1 << 13, 1 << 14
_FILE_RIGHTS = _WRITE_FILE | _TRUNCATE  # the rights a rule on a file (not a folder) may hold
_SCOPE_SIGNAL = 1 << 1  # ABI 6: no signals to processes outside the domain (the grader)


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where there is none (or no Linux)."""
    libc = _libc()
    if libc is None or not sys.platform.startswith("linux"):
        return 0
    version = libc.syscall(_SYS_LANDLOCK["create_ruleset"], None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(0, int(version))


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def restrict_writes(writable: Iterable[str]) -> str:
    """Landlock this process (and whatever it starts): it may write only beneath ``writable`` (folders or
    files; missing ones are skipped), and (ABI 6) signal no process outside. Returns "" or why it could not."""
    abi = landlock_abi()
    if abi < 1:
        return "Landlock is not available"
    libc = _libc()
    handled = _WRITE_FILE | _REMOVE_DIR | _REMOVE_FILE | _MAKE | (_REFER if abi >= 2 else 0) | (
        _TRUNCATE if abi >= 3 else 0)
    attr = _RulesetAttr(handled, 0, _SCOPE_SIGNAL if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24  # the struct as this ABI knows it
    ruleset = libc.syscall(_SYS_LANDLOCK["create_ruleset"], ctypes.byref(attr), ctypes.c_size_t(size),
                           ctypes.c_uint32(0))
    if ruleset < 0:
        return f"Landlock ruleset: {os.strerror(ctypes.get_errno())}"
    try:
        for path in dict.fromkeys(os.path.realpath(p) for p in writable):
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                rights = handled if os.path.isdir(path) else handled & _FILE_RIGHTS
                rule = _PathBeneath(rights, fd)
                if libc.syscall(_SYS_LANDLOCK["add_rule"], ctypes.c_int(ruleset), ctypes.c_int(1),
                                ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                    return f"Landlock rule for {path}: {os.strerror(ctypes.get_errno())}"
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return f"no_new_privs: {os.strerror(ctypes.get_errno())}"
        if libc.syscall(_SYS_LANDLOCK["restrict_self"], ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            return f"Landlock: {os.strerror(ctypes.get_errno())}"
    finally:
        os.close(ruleset)
    return ""


# A process Landlocked over ``writable`` that must still drive a GPU: initialize CUDA, make a context and
# allocate. Run by its own Python (this file loaded by its path: no jittor), so the grader itself stays free.
_CUDA_PROBE = (
    "import ctypes, importlib.util, sys\n"
    "spec = importlib.util.spec_from_file_location('_isolation', sys.argv[1])\n"
    "iso = importlib.util.module_from_spec(spec); spec.loader.exec_module(iso)\n"
    "if iso.restrict_writes(sys.argv[2:]): sys.exit(2)\n"
    "cuda = ctypes.CDLL('libcuda.so.1')\n"
    "dev, ctx, ptr, n = ctypes.c_int(0), ctypes.c_void_p(), ctypes.c_uint64(), ctypes.c_int(0)\n"
    "ok = (cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(n)) == 0 and n.value > 0\n"
    "      and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0\n"
    "      and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cuda.cuCtxSetCurrent(ctx) == 0\n"
    "      and cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 20)) == 0)\n"
    "sys.exit(0 if ok else 1)\n")


def cuda_works_under(writable: Sequence[str]) -> bool:
    """Whether a process Landlocked to write only beneath ``writable`` can still use the GPU (a driver may
    open or create files the list misses: device nodes made on first use, say)."""
    try:
        return subprocess.run([sys.executable, "-c", _CUDA_PROBE, os.path.abspath(__file__), *writable],
                              capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def become_subreaper() -> bool:
    """Make this process the reaper of its descendants' orphans (a process a worker double-forks away ends up
    its child, not init's). False where the system has no such thing."""
    libc = _libc()
    return bool(libc is not None and sys.platform.startswith("linux")
                and libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def descendants(pid: int, spare: Iterable[int] = ()) -> List[int]:
    """Every live process below ``pid`` (from /proc), but those in ``spare`` and theirs."""
    children: Dict[int, List[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if fields and fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(name))
    found, todo, spare = [], [pid], set(spare)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in spare:
                found.append(child)
                todo.append(child)
    return found


def reap(spare: Iterable[int] = (), timeout_s: float = 5.0, collect_all: bool = True) -> int:
    """Kill every process below this one but ``spare`` (processes of the grader's own, such as jittor's pool of
    compilers, taken before any worker started) and theirs, and collect them (with ``collect_all``, also every
    other finished child and orphan this subreaper inherited; without, only those killed, so that the spared
    children's exit statuses stay for their own waits); returns how many were killed."""
    killed, end, spare = 0, time.monotonic() + timeout_s, set(spare)
    while True:
        left = descendants(os.getpid(), spare)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        if collect_all:
            _collect(-1)
        else:
            for pid in left:
                _collect(pid)
        if not left or time.monotonic() > end:
            return killed
        time.sleep(0.02)


def _collect(pid: int) -> None:
    """Wait for whichever of ``pid`` (-1: any child) has ended, without blocking."""
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done == 0 or pid != -1:
            return


def signal_on_parent_exit(parent_pid: int, sig: int = signal.SIGTERM) -> bool:
    """Have the kernel send ``sig`` to this process when its parent ends (a class grader that is stopped or
    killed), so that a child grader never outlives it; False where ``parent_pid`` is no longer the parent (it
    ended before this ran)."""
    libc = _libc()
    if libc is not None and sys.platform.startswith("linux"):
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    return os.getppid() == parent_pid


def _bwrap_works(bwrap: str) -> bool:
    try:
        return subprocess.run([bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid",
                               "--die-with-parent", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _cache_folders() -> List[str]:
    """Where jittor, the CUDA driver and torch.compile keep compiled code: writable to a worker."""
    home = os.environ.get("JITTOR_HOME") or os.path.expanduser("~")
    return [os.path.join(home, ".cache"), os.path.join(os.path.expanduser("~"), ".cache"),
            os.path.join(os.path.expanduser("~"), ".nv"), os.path.join(os.path.expanduser("~"), ".triton")]


# Device files a worker opens for writing (GPU drivers open theirs read-write).
_DEVICE_FILES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/urandom", "/dev/random", "/dev/tty")


def _device_paths() -> List[str]:
    try:
        gpus = [os.path.join("/dev", d) for d in os.listdir("/dev") if d.startswith(("nvidia", "dri", "kfd"))]
    except OSError:
        gpus = []
    return list(_DEVICE_FILES) + gpus


class Isolation:
    """How the parent starts a worker for ``scratch`` (the run's folder of inputs, outputs and logs) and what
    that worker may write. ``mode``: "bwrap", "landlock" or "none" (decided once, by what the machine has;
    ``OPS_GRADER_ISOLATION`` may ask for less: "landlock" or "none")."""

    def __init__(self, scratch: str, protected: Sequence[str] = (), cuda: bool = False):
        self.scratch = os.path.realpath(scratch)
        self.tmp = os.path.join(self.scratch, "tmp")
        os.makedirs(self.tmp, exist_ok=True)
        self.protected = [os.path.realpath(p) for p in protected if p]
        wanted = os.environ.get("OPS_GRADER_ISOLATION", "bwrap")
        bwrap = shutil.which("bwrap") if wanted == "bwrap" else None
        self.mode = "bwrap" if bwrap and _bwrap_works(bwrap) else (
            "landlock" if wanted != "none" and landlock_abi() >= 1 else "none")
        self.bwrap = bwrap
        self.subreaper = False
        self.extra: List[str] = []  # more writable paths the GPU driver turned out to need
        self.why_none = ""
        if self.mode == "landlock" and cuda and not cuda_works_under(self.writable()):
            self.extra = ["/dev"]  # e.g. device nodes the driver makes on first use
            if not cuda_works_under(self.writable()):
                self.mode, self.extra = "none", []
                self.why_none = "Landlock stops this machine's CUDA driver"

    def writable(self) -> List[str]:
        """What a worker may write: the scratch folder, the compilers' caches, device files, /dev/shm (where
        Python's multiprocessing, which jittor's compilers use, makes its semaphores)."""
        return [self.scratch, "/dev/shm"] + _cache_folders() + _device_paths() + self.extra

    def command(self, argv: List[str]) -> List[str]:
        """``argv`` as the worker is started: inside bubblewrap where that is the mode."""
        if self.mode != "bwrap":
            return argv
        wrap = [self.bwrap, "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc",
                "--tmpfs", "/tmp", "--tmpfs", "/dev/shm", "--unshare-pid", "--die-with-parent", "--new-session"]
        for path in [self.scratch] + _cache_folders():
            if os.path.isdir(path):
                wrap += ["--bind", path, path]
        return wrap + ["--"] + argv

    def environment(self, env: Dict[str, str]) -> Dict[str, str]:
        """The worker's environment: its temporary files (compilers', Python's) in the scratch folder."""
        return dict(env, TMPDIR=self.tmp)

    def job(self) -> dict:
        """What the worker does itself (``worker_setup``): Landlock over these paths, unless bubblewrap did it."""
        return {"landlock": self.writable() if self.mode == "landlock" else None}

    def exposed(self) -> List[str]:
        """Protected paths (reports, tiers) a worker could still write: inside a writable folder."""
        if self.mode == "none":
            return list(self.protected)
        roots = [self.scratch] + [os.path.realpath(p) for p in _cache_folders()]
        if self.mode == "landlock":
            roots.append(os.path.realpath("/dev/shm"))
        return [p for p in self.protected if any(p == r or p.startswith(r + os.sep) for r in roots)]

    def describe(self) -> str:
        """One line: what isolation this run's workers have."""
        kill = ("processes they leave are killed before the reports are written" if self.subreaper else
                "processes they leave in their own process group are killed (no subreaper here)")
        if self.mode == "bwrap":
            where = "bubblewrap: own PID namespace, read-only files but the scratch folder and caches"
        elif self.mode == "landlock":
            where = ("Landlock: writes only to the scratch folder, /dev/shm, ~/.cache and device files"
                     + (" (all of /dev: the GPU driver needs it)" if self.extra else ""))
        else:
            where = ("none: the graded module can write any file this user can "
                     f"({self.why_none or 'no bubblewrap, no Landlock'})")
        exposed = self.exposed() if self.mode != "none" else []
        extra = f"; still writable to it: {', '.join(exposed)}" if exposed else ""
        return f"isolation: {where}; {kill}{extra}"


def worker_setup(job: dict) -> str:
    """The worker's first step: Landlock as ``Isolation.job`` asked. Returns "" or why not."""
    paths = job.get("landlock")
    return restrict_writes(paths) if paths else ""


_MISSING = object()


class Pristine:
    """Attributes of ``objects`` (modules, classes), the values of jittor's ``flags`` and of process-wide
    ``settings`` ((getter, setter) pairs: PyTorch's) as they are now, before the graded module is imported.
    ``restore`` puts back what the module changed, before each reference is timed: a module that replaces
    jittor's or PyTorch's functions (or slows them), or sets a flag, does not carry that into the references'
    times; ``resume`` gives the module its changes back before its own calls, so that code which adds methods to
    ``jt.Var`` (jittor's own idiom) keeps working."""

    def __init__(self, objects: Sequence, flags=None, settings: Sequence[Tuple[Callable, Callable]] = ()):
        self.saved = []  # (object, its attributes, their names, their values)
        for obj in objects:
            attrs = dict(vars(obj))
            self.saved.append((obj, attrs, list(attrs), list(attrs.values())))
        self.settings = []  # (getter, setter, value)
        for get, put in settings:
            try:
                self.settings.append((get, put, get()))
            except Exception:
                pass
        self.flags = flags
        self.flag_values = {}
        if flags is not None:
            for name in dir(flags):
                if name.startswith("_"):
                    continue
                try:
                    value = getattr(flags, name)
                except Exception:
                    continue
                if isinstance(value, (bool, int, float, str)):
                    self.flag_values[name] = value
        self.theirs = None  # what restore took away, until resume gives it back

    def restore(self) -> int:
        """Put back what changed (a class's new attributes removed, they hide what it inherits); returns how many
        attributes, flags and settings that was."""
        taken = {"attrs": [], "flags": {}, "settings": []}
        for obj, saved, names, values in self.saved:
            now = vars(obj)
            if not _differs(obj, now, saved, names, values):
                continue
            for name, value in saved.items():
                current = now.get(name, _MISSING)
                if current is not value and _set(obj, name, value):
                    taken["attrs"].append((obj, name, current))
            if isinstance(obj, type):
                for name in [n for n in now if n not in saved]:
                    current = now[name]
                    if _set(obj, name, _MISSING):
                        taken["attrs"].append((obj, name, current))
        for name, value in self.flag_values.items():
            try:
                current = getattr(self.flags, name)
                if current != value:
                    setattr(self.flags, name, value)
                    taken["flags"][name] = current
            except Exception:
                pass
        for get, put, value in self.settings:
            try:
                current = get()
                if current != value:
                    put(value)
                    taken["settings"].append((put, current))
            except Exception:
                pass
        changed = len(taken["attrs"]) + len(taken["flags"]) + len(taken["settings"])
        if self.theirs is None:  # (restored again before a resume: the first restore took the module's state)
            self.theirs = taken
        return changed

    @contextlib.contextmanager
    def reading(self):
        """The grader's own reads of the module's outputs (their samples, the checked calls' files): with
        everything as it was before the module was imported, so that no replaced accessor (``jt.Var.numpy``,
        ``raw_ptr``, NumPy's or ctypes' functions) computes an answer the call did not; the module's changes are
        given back after."""
        self.restore()
        try:
            yield
        finally:
            self.resume()

    def resume(self) -> None:
        """Give the graded module back what the last ``restore`` took away."""
        theirs, self.theirs = self.theirs, None
        if not theirs:
            return
        self._adopt(theirs)
        for obj, name, value in theirs["attrs"]:
            _set(obj, name, value)
        for name, value in theirs["flags"].items():
            try:
                setattr(self.flags, name, value)
            except Exception:
                pass
        for put, value in theirs["settings"]:
            try:
                put(value)
            except Exception:
                pass


    def _adopt(self, theirs: dict) -> None:
        """What changed since ``restore`` other than by it is the grader's own doing (PyTorch setting up CUDA at a
        reference's first call, say): it becomes what the next ``restore`` puts back."""
        taken = {(id(obj), name) for obj, name, _ in theirs["attrs"]}
        for i, (obj, saved, names, values) in enumerate(self.saved):
            now = vars(obj)
            if not _differs(obj, now, saved, names, values):
                continue
            for name in set(saved) | (set(now) if isinstance(obj, type) else set()):
                value = now.get(name, _MISSING)
                if (id(obj), name) in taken or saved.get(name, _MISSING) is value:
                    continue
                if value is _MISSING:
                    del saved[name]
                else:
                    saved[name] = value
            self.saved[i] = (obj, saved, list(saved), list(saved.values()))
        for name, value in list(self.flag_values.items()):
            try:
                current = getattr(self.flags, name)
            except Exception:
                continue
            if name not in theirs["flags"] and current != value:
                self.flag_values[name] = current
        putters = {id(put) for put, _ in theirs["settings"]}
        for j, (get, put, value) in enumerate(self.settings):
            try:
                current = get()
            except Exception:
                continue
            if id(put) not in putters and current != value:
                self.settings[j] = (get, put, current)


def _differs(obj, now, saved: dict, names: list, values: list) -> bool:
    """Whether ``obj``'s attributes ``now`` differ from ``saved`` (for a class, also by a new name). The scan runs
    in C: ~0.13 ms for torch's 1495 names against 0.54 ms for a Python loop on the 2-core machine."""
    return any(map(operator.is_not, map(now.get, names, itertools.repeat(_MISSING)), values)) or (
        isinstance(obj, type) and len(now) != len(saved))


def _set(obj, name: str, value) -> bool:
    """``setattr``, or ``delattr`` for ``_MISSING``; False where the object refuses."""
    try:
        if value is _MISSING:
            delattr(obj, name)
        else:
            setattr(obj, name, value)
        return True
    except (AttributeError, TypeError):
        return False


def interpreter_settings() -> List[Tuple[Callable, Callable]]:
    """The interpreter's process-wide hooks and switches a graded module could set to slow the references' Python
    (a profile or trace function that spins in their frames, a garbage collector run at every allocation), for
    ``Pristine``."""
    import gc
    import threading
    settings = [(sys.getprofile, sys.setprofile), (sys.gettrace, sys.settrace),
                (gc.get_threshold, lambda t: gc.set_threshold(*t)),
                (gc.isenabled, lambda on: gc.enable() if on else gc.disable()),
                (sys.getswitchinterval, sys.setswitchinterval)]
    if hasattr(threading, "getprofile"):  # Python 3.10+
        settings += [(threading.getprofile, threading.setprofile), (threading.gettrace, threading.settrace)]
    monitoring = getattr(sys, "monitoring", None)  # Python 3.12+: callbacks on every call, line or branch
    if monitoring is not None:
        for tool in range(6):
            settings.append(((lambda t=tool: monitoring.get_events(t)),
                             (lambda events, t=tool: monitoring.set_events(t, events))))
    return settings


def torch_pristine(torch) -> Tuple[List, List[Tuple[Callable, Callable]]]:
    """What of PyTorch a graded module could change in its process to slow the PyTorch reference or forge its
    time (CUDA events), for ``Pristine``: the modules and classes whose functions it calls, and the process-wide
    settings (threads, cuDNN's and TF32's switches, anomaly detection, grad mode, deterministic algorithms)."""
    objects = [torch, torch.Tensor, torch.autograd, torch.nn.functional, torch.cuda, torch.cuda.Event,
               torch.backends.cudnn]
    for name in ("_C", "_C._nn", "_C._VariableFunctions", "autograd.graph", "backends.cuda.matmul"):
        obj = torch
        for part in name.split("."):
            obj = getattr(obj, part, None)
        if obj is not None and hasattr(obj, "__dict__"):
            objects.append(obj)
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul

    def switch(owner, name):
        return (lambda: getattr(owner, name)), (lambda value: setattr(owner, name, value))

    settings = [(torch.get_num_threads, torch.set_num_threads),
                (torch.is_anomaly_enabled, torch.set_anomaly_enabled),
                (torch.is_grad_enabled, torch.set_grad_enabled),
                (torch.are_deterministic_algorithms_enabled, torch.use_deterministic_algorithms),
                (torch.get_default_dtype, torch.set_default_dtype),
                (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision)]
    settings += [switch(cudnn, n) for n in ("enabled", "benchmark", "deterministic", "allow_tf32")]
    settings += [switch(matmul, n) for n in ("allow_tf32", "allow_fp16_reduced_precision_reduction")]
    return objects, settings
