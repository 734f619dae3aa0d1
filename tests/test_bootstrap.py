"""The jittor bootstrap's decisions (ops._jittor), checked without a GPU."""
import pytest

from ops import _jittor as boot

NO_GPU = boot.Machine(gpu_count=0, nvcc="/usr/local/bin/nvcc", nvcc_version=(13, 0))
CUDA13 = boot.Machine(gpu_count=1, nvcc="/usr/local/cuda/bin/nvcc", nvcc_version=(13, 0))
CUDA12 = boot.Machine(gpu_count=2, nvcc="/usr/local/cuda/bin/nvcc", nvcc_version=(12, 4))

HEADER = """inline int pick() {
  cudaDeviceProp deviceProp;
  if (deviceProp.computeMode == cudaComputeModeProhibited) return -1;
  uint64_t perf = (uint64_t)deviceProp.multiProcessorCount * deviceProp.clockRate;
  int clockRateX = 0;
  return (int)perf + clockRateX;
}
"""


def test_offline_defaults_everywhere():
    for machine in (NO_GPU, CUDA13, CUDA12):
        plan = boot.plan_defaults({}, machine)
        for key in ("use_mkl", "use_cutt", "use_cutlass", "use_nccl"):
            assert plan[key] == "0"
        assert plan["log_silent"] == "1"


def test_no_gpu_forces_cpu_build():
    assert boot.plan_defaults({}, NO_GPU)["nvcc_path"] == ""
    assert "conv_opt" not in boot.plan_defaults({}, NO_GPU)


def test_gpu_keeps_nvcc_and_skips_cudnn():
    plan = boot.plan_defaults({}, CUDA13)
    assert "nvcc_path" not in plan
    assert plan["conv_opt"] == "1"


def test_user_settings_win():
    env = {"use_mkl": "1", "nvcc_path": "/opt/cuda/bin/nvcc", "log_silent": "0", "conv_opt": "0"}
    plan = boot.plan_defaults(env, NO_GPU)
    assert not set(plan) & set(env)
    assert plan["use_cutt"] == "0"


@pytest.mark.parametrize("value", ["0", "false", "off", "no"])
def test_bootstrap_switch_turns_everything_off(value):
    env = {boot.BOOTSTRAP_SWITCH: value}
    assert boot.plan_defaults(env, CUDA13) == {}
    assert not boot.should_patch(env, CUDA13)


def test_patch_applies_only_for_cuda13_with_gpu():
    assert boot.should_patch({}, CUDA13)
    assert not boot.should_patch({}, CUDA12)
    assert not boot.should_patch({}, NO_GPU)
    assert not boot.should_patch({boot.PATCH_SWITCH: "0"}, CUDA13)
    assert not boot.should_patch({"nvcc_path": ""}, CUDA13)


def test_header_patch_replaces_removed_fields_only():
    patched = boot.patch_header_text(HEADER)
    assert "deviceProp.computeMode" not in patched and "deviceProp.clockRate" not in patched
    assert "cudaComputeModeDefault == cudaComputeModeProhibited" in patched
    assert "multiProcessorCount * 1;" in patched
    assert "clockRateX" in patched  # identifiers that merely start with the field name stay
    assert not boot.header_needs_patch(patched)
    assert boot.header_needs_patch(HEADER)


def test_patch_is_idempotent_and_keeps_original(tmp_path):
    inc = tmp_path / "extern" / "cuda" / "inc"
    inc.mkdir(parents=True)
    (inc / "helper_cuda.h").write_text(HEADER)
    message = boot.patch_helper_cuda(tmp_path)
    assert "helper_cuda.h" in message and boot.PATCH_SWITCH in message
    assert (inc / "helper_cuda.h.orig").read_text() == HEADER
    once = (inc / "helper_cuda.h").read_text()
    assert boot.patch_helper_cuda(tmp_path) == ""
    assert (inc / "helper_cuda.h").read_text() == once


def test_read_only_install_falls_back_to_cpu_with_a_message(tmp_path, monkeypatch, capsys):
    inc = tmp_path / "extern" / "cuda" / "inc"
    inc.mkdir(parents=True)
    (inc / "helper_cuda.h").write_text(HEADER)
    inc.chmod(0o555)
    (inc / "helper_cuda.h").chmod(0o444)
    monkeypatch.setattr(boot, "probe_machine", lambda env: CUDA13)
    monkeypatch.setattr(boot, "_jittor_dir", lambda: tmp_path)
    env = {}
    try:
        writable = boot.os.access(inc / "helper_cuda.h", boot.os.W_OK)
        boot.bootstrap(env)
    finally:
        inc.chmod(0o755)
        (inc / "helper_cuda.h").chmod(0o644)
    if writable:  # running as root: the file could be written, so it was patched
        assert (inc / "helper_cuda.h.orig").exists()
    else:
        assert env["nvcc_path"] == ""
        assert "cannot be written" in capsys.readouterr().err


def test_nvcc_version_parsing():
    text = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\n"
    assert boot.parse_nvcc_version(text) == (13, 0)
    assert boot.parse_nvcc_version("garbage") is None


def test_numpy2_is_refused_with_a_clear_message():
    boot.check_numpy("1.26.4")
    with pytest.raises(ImportError, match="numpy<2"):
        boot.check_numpy("2.5.2")


def test_cuda13_compiles_cuda_as_cpp17():
    flags = ' -Wall -std=c++14 -Xcompiler -fPIC -x cu'
    assert boot.cuda_std_fix(flags) == ' -Wall -std=c++17 -Xcompiler -fPIC -x cu'


def test_host_opt_is_the_default_and_marks_the_source(switches):
    """CUDA launches build their host half with -O2 through a FLAGS compile option, and carry a mark in the source:
    jittor keys compiled ops on the text only, so the flagged build must not share a key with a plain one."""
    from ops import _launch
    plain = _launch.Launch((3,), "float32", cuda=False, src="x;")
    assert plain.options is None and plain.kwargs == {"cpu_src": "x;"}
    cuda = _launch.Launch((3,), "float32", cuda=True, src="k<<<1, 1>>>();", header="// h\n")
    assert cuda.options == {"FLAGS: -Xcompiler -O2 ": 1}
    assert cuda.kwargs["cuda_src"] != "k<<<1, 1>>>();" and cuda.kwargs["cuda_src"].endswith("k<<<1, 1>>>();")
    assert cuda.kwargs["cuda_header"] == "// h\n" and "cpu_src" not in cuda.kwargs
    switches.setenv(_launch.HOST_OPT_SWITCH, "0")
    off = _launch.Launch((3,), "float32", cuda=True, src="k<<<1, 1>>>();")
    assert off.options is None and off.kwargs["cuda_src"] == "k<<<1, 1>>>();"


def test_code_applies_compile_options_to_the_first_output():
    """The mechanism the switch relies on: a FLAGS compile option reaches the compiler of a code op (CPU here)."""
    import numpy as np
    x = boot.jt.array(np.ones(3, "float32"))
    y = boot.jt.code((3,), "float32", [x], cpu_src="// ops test: flag probe\n"
                     "for (int i = 0; i < 3; ++i) out0_p[i] = in0_p[i] * OPS_TEST_FLAG;")
    y.compile_options = {"FLAGS: -DOPS_TEST_FLAG=7 ": 1}
    assert y.numpy().tolist() == [7.0, 7.0, 7.0]


def test_core_build_is_announced_only_when_the_core_is_missing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(boot, "probe_machine", lambda env: NO_GPU)
    monkeypatch.setattr(boot, "_jittor_dir", lambda: None)
    monkeypatch.setattr(boot, "_jittor_cache_path", lambda: str(tmp_path))
    assert not boot.core_built(str(tmp_path))
    boot.bootstrap({})
    err = capsys.readouterr().err
    assert "ops: jittor is building its core (first import only): about" in err
    assert f"\nops: jittor's cache: {tmp_path}\n" in err
    assert err.count("\n") == 2 and len(err.splitlines()[0]) <= 120
    (tmp_path / ("jittor_core" + boot.sysconfig.get_config_var("EXT_SUFFIX"))).write_bytes(b"")
    assert boot.core_built(str(tmp_path))
    boot.bootstrap({})
    assert capsys.readouterr().err == ""
    boot.bootstrap({boot.BOOTSTRAP_SWITCH: "0"})  # the bootstrap off: no probing of jittor's cache either
    assert capsys.readouterr().err == ""


def test_cuda_core_is_looked_for_in_jittors_cuda_subfolder(tmp_path):
    """With nvcc, jittor builds its core in cache_path/cu<version>_sm_<archs>/, not in cache_path."""
    name = "jittor_core" + boot.sysconfig.get_config_var("EXT_SUFFIX")
    (tmp_path / name).write_bytes(b"")  # a CPU core only
    assert boot.core_built(str(tmp_path)) and not boot.core_built(str(tmp_path), cuda=True)
    (tmp_path / "cu13.0.88_sm_90").mkdir()
    assert not boot.core_built(str(tmp_path), cuda=True)
    (tmp_path / "cu13.0.88_sm_90" / name).write_bytes(b"")
    assert boot.core_built(str(tmp_path), cuda=True)
    assert not boot.core_built(str(tmp_path / "missing"), cuda=True)


def test_core_build_estimate_follows_cores_and_cuda():
    assert "about 4 minutes on 2 cores" in boot.core_build_message("/c", 2, False)  # measured 3 min 53 s
    assert "about 40 s on 16 cores" in boot.core_build_message("/c", 16, False)  # measured 35 s
    assert "with CUDA (first import only)" in boot.core_build_message("/c", 16, True)
    assert "about 100 s on 16 cores" in boot.core_build_message("/c", 16, True)  # measured ~90 s


def test_jittor_imported_first_names_what_was_not_set():
    message = boot.jittor_first_message({}, NO_GPU)
    assert message.startswith("ops: jittor was imported before ops, so ops could not configure it")
    assert "nvcc_path=''" in message and "use_mkl='0'" in message and "import ops before jittor" in message
    assert "helper_cuda.h" in boot.jittor_first_message({}, CUDA13)
    everything = {"use_mkl": "0", "use_cutt": "0", "use_cutlass": "0", "use_nccl": "0", "nvcc_path": ""}
    assert boot.jittor_first_message(everything, NO_GPU) == ""  # log_silent alone is not worth a message
    assert boot.jittor_first_message({boot.BOOTSTRAP_SWITCH: "0"}, NO_GPU) == ""


def test_import_ops_after_jittor_says_so():
    """A fresh process: jittor first, configured as the bootstrap would but for use_nccl, then ops."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("use_nccl", boot.BOOTSTRAP_SWITCH)}
    env.update({k: v for k, v in boot.plan_defaults(env, boot.probe_machine(env)).items() if k != "use_nccl"})
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(boot.__file__)))
    proc = subprocess.run([sys.executable, "-c", "import jittor; import ops; print(ops.__file__)"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == os.path.join(env["PYTHONPATH"], "ops", "__init__.py")
    assert "ops: jittor was imported before ops" in proc.stderr and "use_nccl='0' not set" in proc.stderr


def test_a_killed_child_fails_only_its_test():
    """jittor's core ends a process whose child dies of a signal (conftest restores the default for the tests):
    a subprocess killed after jittor ran must leave this process, and the run, going."""
    import signal
    import subprocess
    import sys

    boot.jt.array([1.0, 2.0]).sum().sync()
    assert signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    child.kill()
    assert child.wait(timeout=30) == -signal.SIGKILL
