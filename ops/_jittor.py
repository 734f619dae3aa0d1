"""The only module that imports and configures jittor.

jittor 1.3.11 needs help on two kinds of machine this package runs on:

* offline machines: at import it downloads oneDNN (``use_mkl``), cuTT (``use_cutt``), CUTLASS
  (``use_cutlass``) and NCCL (``use_nccl``) and dies without a network;
* machines with ``nvcc`` but no GPU: it then fails to load ``libcudart`` unless ``nvcc_path=""``;
* CUDA 13 GPU machines: its ``extern/cuda/inc/helper_cuda.h`` reads ``cudaDeviceProp::computeMode`` and
  ``::clockRate``, both removed in CUDA 13, so its core and its cuBLAS/cub/cuRAND extensions fail to build;
  it compiles CUDA as C++14 while CUDA 13's cub/thrust (CCCL 3) require C++17; its loader looks for cuDNN 8
  and aborts the import where cuDNN 9 is all there is, and it finds NCCL only by downloading it. The bootstrap
  keeps jittor's own loader to cuBLAS and cuRAND (``conv_opt=1``), then builds jittor's cudnn extension
  against a cuDNN 9 it finds (``load_cudnn``: without its RNN ops, which call functions cuDNN 9 removed), and
  points jittor at an NCCL it finds (``nccl_include_path``/``nccl_lib_path``); ``ops._cuda_libs`` finds both
  and keeps the links they need in jittor's cache folder;
* NumPy 2: jittor 1.3.11 declares ``numpy<2`` and its C bridge reads NumPy 1.x array structs, so under
  NumPy 2 every array crossing into or out of jittor is silently garbage (seen on an H100, 2026-11-22).
  The bootstrap refuses to go on rather than return wrong numbers.

``plan_defaults`` decides which jittor environment variables to set (never one the user set; those a parent
process's bootstrap set, listed in ``OPS_JITTOR_SET``, are not the user's: ``users_env``), and
``patch_helper_cuda`` rewrites the two removed reads in jittor's own header, once, keeping the original
beside it. ``OPS_JITTOR_BOOTSTRAP=0`` turns all of this off; ``OPS_PATCH_JITTOR_CUDA13=0`` only the patch,
``OPS_JITTOR_CUDNN=0`` only the cuDNN 9 build, ``OPS_JITTOR_NCCL=0`` only NCCL. A ``conv_opt`` or ``use_nccl``
the user set wins over both.

jittor reads its environment when it is imported, so all this works only when ``ops`` is imported first; when
jittor was imported before, ``import ops`` says so on stderr (``jittor_first_message``) if the bootstrap would
have set something. jittor's first import builds its core for minutes without a word; the bootstrap prints one
line first (``core_build_message``).
"""
from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import re
import sys
import sysconfig
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Tuple

from . import _cuda_libs
from ._machine import Machine, parse_nvcc_version, probe_machine  # noqa: F401  (the bootstrap's probe)

BOOTSTRAP_SWITCH = "OPS_JITTOR_BOOTSTRAP"
PATCH_SWITCH = "OPS_PATCH_JITTOR_CUDA13"
CUDNN_SWITCH = "OPS_JITTOR_CUDNN"
NCCL_SWITCH = "OPS_JITTOR_NCCL"
NCCL_VARS = ("use_nccl", "nccl_include_path", "nccl_lib_path")
SET_MARK = "OPS_JITTOR_SET"  # JSON {name: value} of the variables the bootstrap set (children inherit them)

# Each of these makes jittor download something at import when left at its default.
OFFLINE_DEFAULTS = {"use_mkl": "0", "use_cutt": "0", "use_cutlass": "0", "use_nccl": "0"}

PATCH_MARKER = "// ops: patched for CUDA >= 13"
_REMOVED_FIELDS = {
    # cudaDeviceProp::computeMode was removed in CUDA 13; every device is in the default mode there.
    "deviceProp.computeMode": "cudaComputeModeDefault",
    # cudaDeviceProp::clockRate was removed in CUDA 13; it only ranks devices by peak FLOP/s here,
    # so a constant keeps the ranking by SM count and cores per SM.
    "deviceProp.clockRate": "1",
}


def _switch_on(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "1").strip().lower() not in ("0", "false", "no", "off")


@dataclass(frozen=True)
class CudaLibs:
    """The cuDNN 9 and NCCL the bootstrap gives jittor on a GPU machine (None: none found, or not wanted)."""

    cudnn: Optional[_cuda_libs.Library] = None  # built against and loaded after jittor's import (load_cudnn)
    nccl: Optional[_cuda_libs.Library] = None
    nccl_links: Optional[str] = None  # the folder holding libnccl.so, which jittor's NCCL setup asserts
    cudnn_wanted: bool = False  # a cuDNN was looked for (GPU, switches on, conv_opt not the user's)


NO_NCCL_MESSAGE = ("ops: no NCCL found, so jittor's MPI data parallel runs without it (all-reduce through the "
                   "host); pip install 'jittor-fast-ops[cuda]' or set NCCL_HOME")


def nccl_wanted(env: Mapping[str, str]) -> bool:
    return _switch_on(env, NCCL_SWITCH) and not any(k in env for k in NCCL_VARS)


def find_cuda_libs(env: Mapping[str, str], machine: Machine, search_path=None) -> CudaLibs:
    """The cuDNN 9 and NCCL to use where the user left jittor's choice to the bootstrap: cuDNN unless the user
    set ``conv_opt``, NCCL unless they set any of ``use_nccl``, ``nccl_include_path``, ``nccl_lib_path``."""
    if machine.gpu_count == 0 or not _switch_on(env, BOOTSTRAP_SWITCH) or env.get("nvcc_path", None) == "":
        return CudaLibs()
    search_path = sys.path if search_path is None else search_path
    cudnn = nccl = None
    cudnn_wanted = _switch_on(env, CUDNN_SWITCH) and "conv_opt" not in env
    if cudnn_wanted:
        cudnn = _cuda_libs.find_cudnn(env, search_path)
    if nccl_wanted(env):
        nccl = _cuda_libs.find_nccl(env, search_path)
    return CudaLibs(cudnn=cudnn, nccl=nccl, cudnn_wanted=cudnn_wanted)


def plan_defaults(env: Mapping[str, str], machine: Machine, libs: CudaLibs = CudaLibs()) -> dict:
    """jittor environment variables to set before its import; a variable already in ``env`` is left alone."""
    if not _switch_on(env, BOOTSTRAP_SWITCH):
        return {}
    wanted = dict(OFFLINE_DEFAULTS)
    wanted["log_silent"] = "1"  # jittor prints a dozen info lines per import otherwise
    if machine.gpu_count == 0:
        wanted["nvcc_path"] = ""  # an nvcc without a GPU makes jittor fail on libcudart
    else:
        # jittor's own loader wants cuDNN 8 and aborts the import without it: it loads cuBLAS and cuRAND only,
        # and load_cudnn builds jittor's cudnn extension against a cuDNN 9 after the import
        wanted["conv_opt"] = "1"
        if libs.nccl is not None and libs.nccl_links:
            del wanted["use_nccl"]
            wanted["nccl_include_path"] = libs.nccl.include_dir
            wanted["nccl_lib_path"] = libs.nccl_links
    if any(k in env for k in NCCL_VARS):  # the user configured NCCL: never switch it off behind their back
        wanted.pop("use_nccl", None)
    return {k: v for k, v in wanted.items() if k not in env}


def header_needs_patch(text: str) -> bool:
    return PATCH_MARKER not in text and any(field in text for field in _REMOVED_FIELDS)


def patch_header_text(text: str) -> str:
    for field, replacement in _REMOVED_FIELDS.items():
        text = re.sub(re.escape(field) + r"\b", replacement, text)
    return PATCH_MARKER + " (computeMode, clockRate removed); original in helper_cuda.h.orig\n" + text


def should_patch(env: Mapping[str, str], machine: Machine) -> bool:
    """The CUDA 13 header fix applies when jittor will build CUDA code with nvcc 13 or newer."""
    if not (_switch_on(env, BOOTSTRAP_SWITCH) and _switch_on(env, PATCH_SWITCH)):
        return False
    if env.get("nvcc_path", None) == "":
        return False
    return machine.gpu_count > 0 and machine.nvcc_version is not None and machine.nvcc_version >= (13, 0)


def patch_helper_cuda(jittor_dir: Path) -> str:
    """Rewrite jittor's helper_cuda.h for CUDA 13 in place (idempotent). Returns what was done.

    Raises OSError when the file cannot be written.
    """
    header = jittor_dir / "extern" / "cuda" / "inc" / "helper_cuda.h"
    text = header.read_text()
    if not header_needs_patch(text):
        return ""
    backup = header.with_name("helper_cuda.h.orig")
    if not backup.exists():
        backup.write_text(text)
    header.write_text(patch_header_text(text))
    return (f"ops: patched {header} for CUDA 13 (computeMode/clockRate reads replaced; original kept as "
            f"{backup.name}); set {PATCH_SWITCH}=0 to skip")


def _jittor_dir() -> Optional[Path]:
    spec = importlib.util.find_spec("jittor")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def core_built(cache_path: str, cuda: bool = False) -> bool:
    """jittor's core library is in its cache: ``jittor_core<EXT_SUFFIX>`` in ``cache_path`` (the folder
    jittor_utils names), or, for a CUDA build, in its ``cu<nvcc version>_sm_<archs>`` subfolder, where
    jittor moves its cache path once it has found nvcc."""
    name = "jittor_core" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")
    if not cuda:
        return os.path.isfile(os.path.join(cache_path, name))
    try:
        subfolders = [d for d in os.listdir(cache_path) if d.startswith("cu")]
    except OSError:
        return False
    return any(os.path.isfile(os.path.join(cache_path, d, name)) for d in subfolders)


def core_build_message(cache_path: str, cores: int, cuda: bool) -> str:
    """The line printed before jittor builds its core. Measured: 3 min 53 s on 2 cores (CPU build), 35 s on
    16 (CPU), ~90 s on 16 with CUDA; modelled as 450 s / cores + 10 s, plus 60 s with CUDA."""
    seconds = 450 / max(1, cores) + 10 + (60 if cuda else 0)
    about = f"{round(seconds / 60)} minutes" if seconds >= 120 else f"{int(round(seconds, -1))} s"
    return (f"ops: jittor is building its core{' with CUDA' if cuda else ''} (first import only): about {about} on "
            f"{cores} cores, silent\nops: jittor's cache: {cache_path}")


def _jittor_cache_path() -> Optional[str]:
    """jittor's cache folder, from jittor_utils (the helper package jittor imports first: finding its compiler
    and the cache path, not building anything); None where that fails."""
    try:
        import jittor_utils
        return jittor_utils.cache_path
    except Exception:  # the message is a courtesy: never fail the import over it
        return None


def link_nccl(libs: CudaLibs, cache_path: Optional[str]) -> Tuple[CudaLibs, str]:
    """The links jittor's NCCL setup needs (it asserts an unversioned libnccl.so); without them, no NCCL."""
    if libs.nccl is None:
        return libs, ""
    without = CudaLibs(cudnn=libs.cudnn, cudnn_wanted=libs.cudnn_wanted)
    if not cache_path:
        return without, "ops: jittor's cache folder is unknown, so jittor runs without NCCL"
    folder = _cuda_libs.links_dir(cache_path, libs.nccl)
    try:
        _cuda_libs.ensure_links(folder, libs.nccl)
    except OSError as err:
        return without, f"ops: NCCL {libs.nccl.version_text} found but {folder} cannot be written ({err}); " \
                        f"jittor runs without NCCL"
    return CudaLibs(cudnn=libs.cudnn, nccl=libs.nccl, nccl_links=folder, cudnn_wanted=libs.cudnn_wanted), ""


def users_env(env: Mapping[str, str]) -> dict:
    """``env`` as its user set it: without the variables an ancestor process's bootstrap set (``SET_MARK``) and
    nobody changed since. A child inherits its parent's ``conv_opt=1``, which is no user's choice: taken as one,
    it would keep the child's jittor (a pytest worker's, a grader worker's) off cuDNN."""
    view = dict(env)
    try:
        inherited = json.loads(env.get(SET_MARK, "{}"))
    except ValueError:
        inherited = {}
    if isinstance(inherited, dict):
        for name, value in inherited.items():
            if view.get(name) == value:
                del view[name]
    view.pop(SET_MARK, None)
    return view


def bootstrap(env=os.environ) -> Machine:
    """Set jittor's defaults in ``env`` and apply the CUDA 13 fix where needed; call before importing jittor.
    The decisions read the user's variables only (``users_env``); ``SET_MARK`` records what this one set."""
    global LIBS
    user = users_env(env)
    machine = probe_machine(user)
    libs = find_cuda_libs(user, machine)
    if libs.nccl is not None:
        libs, message = link_nccl(libs, _jittor_cache_path())
        if message:
            print(message, file=sys.stderr)
    elif machine.gpu_count and "OMPI_COMM_WORLD_SIZE" in user and nccl_wanted(user):
        print(NO_NCCL_MESSAGE, file=sys.stderr)
    LIBS = libs
    ours = plan_defaults(user, machine, libs)
    jittor_dir = _jittor_dir()
    if jittor_dir is not None and should_patch(user, machine):
        try:
            message = patch_helper_cuda(jittor_dir)
        except OSError as err:
            message = (f"ops: jittor's {jittor_dir}/extern/cuda/inc/helper_cuda.h needs a CUDA 13 fix but cannot "
                       f"be written ({err}); running jittor on the CPU. Reinstall jittor somewhere writable, "
                       f"or set nvcc_path to force a CUDA build.")
            if "nvcc_path" not in user:  # a user-set nvcc_path wins, even here
                ours["nvcc_path"] = ""
        if message:
            print(message, file=sys.stderr)
    if _switch_on(user, BOOTSTRAP_SWITCH):
        for name in set(env) - set(user) - set(ours) - {SET_MARK}:  # an ancestor's choice not made here
            del env[name]
        env.update(ours)
        env[SET_MARK] = json.dumps(ours, sort_keys=True)
        cache_path = _jittor_cache_path()
        cuda = machine.gpu_count > 0 and env.get("nvcc_path", None) != ""
        if cache_path and not core_built(cache_path, cuda):
            print(core_build_message(cache_path, os.cpu_count() or 1, cuda), file=sys.stderr)
    return machine


def jittor_first_message(env: Mapping[str, str], machine: Machine) -> str:
    """What to tell a user who imported jittor before ops ('' when the bootstrap would have set nothing that
    matters: log_silent alone is cosmetic)."""
    missed = {k: v for k, v in plan_defaults(env, machine).items() if k != "log_silent"}
    patch = should_patch(env, machine)
    if not (missed or patch):
        return ""
    what = [" ".join(f"{k}={v!r}" for k, v in missed.items()) + " not set"] if missed else []
    if patch:
        what.append("jittor's helper_cuda.h not checked for the CUDA 13 fix")
    return (f"ops: jittor was imported before ops, so ops could not configure it ({'; '.join(what)}). To have "
            f"them, import ops before jittor (or set these variables before jittor's import); see README.md, "
            f"'Running on a GPU machine'.")


LIBS = CudaLibs()
if "jittor" not in sys.modules:
    MACHINE = bootstrap()
    PROBED = MACHINE
else:  # imported after the user imported jittor themselves: their configuration stands; say what it lacks
    MACHINE = None
    PROBED = probe_machine(os.environ) if _switch_on(os.environ, BOOTSTRAP_SWITCH) else None
    _message = jittor_first_message(os.environ, PROBED) if PROBED else ""
    if _message:
        print(_message, file=sys.stderr)


def check_numpy(version: str) -> None:
    """jittor 1.3.11 misreads NumPy 2 arrays (wrong element size): refuse instead of computing garbage."""
    if int(version.split(".")[0]) >= 2:
        raise ImportError(
            f"ops: jittor 1.3.11 needs numpy<2 but numpy {version} is installed: its C bridge reads NumPy 1.x "
            f"array structs, so every transfer would be silently wrong. Install numpy<2 "
            f"(pip install 'numpy<2'), as jittor's own requirements say.")


def cuda_std_fix(nvcc_flags: str) -> str:
    """CUDA 13's cub/thrust refuse C++14 ('CUB requires at least C++17'); jittor passes -std=c++14."""
    return nvcc_flags.replace("-std=c++14", "-std=c++17")


import numpy as _np  # noqa: E402

check_numpy(_np.__version__)
with warnings.catch_warnings():
    # jittor 1.3.11's sources hold docstrings with invalid escape sequences: Python 3.12 warns about each
    # (six lines on stderr) whenever it compiles them, i.e. on every import where its .pyc files are missing.
    warnings.filterwarnings("ignore", category=SyntaxWarning)
    import jittor as jt  # noqa: E402  (must follow the bootstrap)

if PROBED is not None and should_patch(os.environ, PROBED) and getattr(jt, "has_cuda", 0):  # a flag: set it anyway
    jt.flags.nvcc_flags = cuda_std_fix(jt.flags.nvcc_flags)

NO_CUDNN_MESSAGE = ("ops: no cuDNN 9 found, so jittor's convolutions run on its own kernels (100x slower in a 3-D "
                    "CNN); pip install 'jittor-fast-ops[cuda]' or set CUDNN_PATH; conv_opt=1 hides this line")
BUILD_FAILED = "cudnn-build-failed.txt"  # in the links folder: the reason, so that later imports do not retry


def cudnn_sources(jittor_dir: Path) -> list:
    """jittor's cudnn extension without its RNN files: they call cudnnSetRNNDescriptor_v6, cudnnGetRNNParamsSize
    and other functions cuDNN 9 removed (headers included: jittor compiles every file it is given)."""
    root = jittor_dir / "extern" / "cuda" / "cudnn"
    return sorted(str(p) for p in root.rglob("*") if p.is_file() and not p.name.startswith("cudnn_rnn"))


# jittor's cuDNN convolutions give the convolution descriptor the output's data type as its compute type. cuDNN
# has no bfloat16 compute (bfloat16 data runs only as PSEUDO_BFLOAT16, float compute) and supports half compute
# for few engines: float for both, as PyTorch's convolution descriptors do.
CONV_COMPUTE_TYPE = ("CUDNN_CROSS_CORRELATION, getDataType<Ty>()",
                     "CUDNN_CROSS_CORRELATION, (getDataType<Ty>() == CUDNN_DATA_HALF || getDataType<Ty>() == "
                     "CUDNN_DATA_BFLOAT16 ? CUDNN_DATA_FLOAT : getDataType<Ty>())")
# They also remember the algorithm cuDNN found for a convolution in a map keyed by its sizes alone, so an algorithm
# found for float32 data would run for bfloat16 data of the same sizes, which it need not support: the key gets
# the three data types.
CONV_ALGO_KEY = ('<< groups << ".";',
                 '<< groups << "," << (int)getDataType<Tx>() << "," << (int)getDataType<Tw>() << "," '
                 '<< (int)getDataType<Ty>() << ".";')
CONV_EDITS = {"convolution descriptor": CONV_COMPUTE_TYPE, "algorithm key": CONV_ALGO_KEY}
PATCHED_OPS = "cudnn-ops"  # in the links folder: the convolution ops with float compute


def conv_op_copy(text: str) -> Optional[str]:
    """A convolution op's source with float compute for half and bfloat16 data and its algorithms remembered by
    data type too (``CONV_EDITS``), or None for a source without jittor's convolution descriptor (the other
    cudnn files)."""
    if CONV_COMPUTE_TYPE[0] not in text:
        return None
    for name, (old, new) in CONV_EDITS.items():
        count = text.count(old)
        if count != 1:
            raise ValueError(f"expected one {name}, found {count}")
        text = text.replace(old, new)
    return text


def cudnn_build_sources(jittor_dir: Path, folder: str) -> list:
    """``cudnn_sources``, where each convolution op (its ``_op.cc`` and ``_op.h``: jittor's JIT reads the source
    that lies beside the header) is a copy in ``folder``/cudnn-ops (``conv_op_copy``), written only where its
    text differs. jittor's installed files stay as they are."""
    sources = cudnn_sources(jittor_dir)
    out_dir = Path(folder) / PATCHED_OPS
    moved = {}
    for path in sources:
        if path.endswith("_op.cc"):
            patched = conv_op_copy(Path(path).read_text())
            if patched is not None:
                header = path[:-3] + ".h"
                moved[path] = patched
                moved[header] = Path(header).read_text()
    for path, text in moved.items():
        copy = out_dir / Path(path).name
        if not copy.exists() or copy.read_text() != text:
            out_dir.mkdir(parents=True, exist_ok=True)
            copy.write_text(text)
    return [str(out_dir / Path(p).name) if p in moved else p for p in sources]


def _rnn_without_cudnn(rnn_base) -> None:
    """jittor's LSTM/GRU/RNN take their cuDNN path whenever ``jt.cudnn`` is set, and that path calls the RNN op
    left out of the cuDNN 9 build: run their execute with ``jt.cudnn`` hidden, so they take jittor's own loop."""
    execute = rnn_base.execute
    if getattr(execute, "_ops_without_cudnn", False):
        return

    def without_cudnn(self, *args, **kwargs):
        cudnn, jt.cudnn = jt.cudnn, None
        try:
            return execute(self, *args, **kwargs)
        finally:
            jt.cudnn = cudnn
    without_cudnn.__doc__, without_cudnn.__wrapped__ = execute.__doc__, execute
    without_cudnn._ops_without_cudnn = True
    rnn_base.execute = without_cudnn


def load_cudnn(lib: _cuda_libs.Library, cache_path: str) -> str:
    """Build jittor's cudnn extension against ``lib`` (cuDNN 9) and hand it to jittor, as its own loader would
    for cuDNN 8; returns the line to print ('' when there is nothing new to say). Writes only in jittor's cache
    folder: the extension (jittor's custom_ops folder) and a folder of links (libcudnn.so for the linker) that
    also holds the convolution ops' sources with float compute (``cudnn_build_sources``)."""
    folder = _cuda_libs.links_dir(cache_path, lib)
    failed = os.path.join(folder, BUILD_FAILED)
    if os.path.exists(failed):
        return (f"ops: jittor's cudnn extension did not build against cuDNN {lib.version_text} ({failed}); "
                f"convolutions run on jittor's own kernels; delete that file to try again")
    try:
        new = _cuda_libs.ensure_links(folder, lib)
        for path in [lib.library] + _cuda_libs.sub_libraries(lib):  # cuDNN dlopens these by name
            ctypes.CDLL(path, os.RTLD_GLOBAL | os.RTLD_LAZY)
        jittor_dir = Path(jt.__file__).parent
        flags = (f' -I"{jittor_dir}/extern/cuda/inc" -I"{jittor_dir}/extern/cuda/cudnn/inc" -I"{lib.include_dir}" '
                 f'-lcudnn -L"{folder}" -L"{os.path.join(jt.compiler.cache_path, "cuda")}" -llibcuda_extern ')
        module = jt.compiler.compile_custom_ops(cudnn_build_sources(jittor_dir, folder), return_module=True,
                                                 extra_flags=flags)
    except Exception as err:  # any failure leaves jittor as it was: conv_opt=1, its own convolutions
        reason = " ".join(str(err).split())[:2000]
        try:
            Path(failed).write_text(reason + "\n")
        except OSError:
            pass
        return (f"ops: jittor's cudnn extension did not build against cuDNN {lib.version_text} "
                f"({reason[:200]}); convolutions run on jittor's own kernels")
    jt.cudnn = jt.compile_extern.cudnn = module
    jt.compile_extern.cudnn_ops = module.ops
    _rnn_without_cudnn(jt.nn.RNNBase)
    if not new:
        return ""
    return (f"ops: jittor's convolutions run on cuDNN {lib.version_text} ({lib.origin}: {lib.lib_dir}); its "
            f"LSTM/GRU/RNN on its own kernels; {CUDNN_SWITCH}=0 turns this off")


CUDNN_LOADED = False
_cache = _jittor_cache_path() if getattr(jt, "has_cuda", 0) and LIBS.cudnn is not None else None
if _cache:
    _message = load_cudnn(LIBS.cudnn, _cache)
    CUDNN_LOADED = jt.cudnn is not None
    if _message:
        print(_message, file=sys.stderr)
elif getattr(jt, "has_cuda", 0) and LIBS.cudnn_wanted:
    print(NO_CUDNN_MESSAGE, file=sys.stderr)

__all__ = ["jt", "has_cuda", "MACHINE"]


def has_cuda() -> bool:
    """True when jittor was built with CUDA and can run CUDA code here."""
    return bool(getattr(jt, "has_cuda", 0))
