"""Finding cuDNN 9 and NCCL and giving them to jittor (ops._cuda_libs, ops._jittor), on fake folder trees."""
import json
import os

import pytest

from ops import _cuda_libs as cl
from ops import _jittor as boot

CUDA13 = boot.Machine(gpu_count=2, nvcc="/usr/local/cuda/bin/nvcc", nvcc_version=(13, 0))
NO_GPU = boot.Machine(gpu_count=0, nvcc=None, nvcc_version=None)
CUDNN_LIBS = ("libcudnn.so.9", "libcudnn_graph.so.9", "libcudnn_ops.so.9", "libcudnn_cnn.so.9",
              "libcudnn_engines_precompiled.so.9")


def cudnn_tree(root, major=9, minor=19, libs=CUDNN_LIBS, lib="lib"):
    (root / "include").mkdir(parents=True)
    (root / "include" / "cudnn_version.h").write_text(
        f"#ifndef CUDNN_VERSION_H_\n#define CUDNN_MAJOR {major}\n#define CUDNN_MINOR {minor}\n"
        f"#define CUDNN_PATCHLEVEL 0\n#define CUDNN_VERSION (CUDNN_MAJOR * 10000)\n#endif\n")
    (root / lib).mkdir()
    for name in libs:
        (root / lib / name).write_bytes(b"\x7fELF")
    return root


def nccl_tree(root, version=(2, 27, 7)):
    (root / "include").mkdir(parents=True)
    (root / "include" / "nccl.h").write_text(
        "#define NCCL_MAJOR {}\n#define NCCL_MINOR {}\n#define NCCL_PATCH {}\n".format(*version))
    (root / "lib").mkdir()
    (root / "lib" / "libnccl.so.2").write_bytes(b"\x7fELF")
    return root


def wheel_site(site):
    """A site-packages folder ``site`` with the cuDNN and NCCL wheels' trees under nvidia/."""
    cudnn_tree(site / "nvidia" / "cudnn")
    nccl_tree(site / "nvidia" / "nccl")
    return site


def snapshot(root):
    """Every path below root with its kind and content (links by target), to see what a call wrote."""
    seen = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            seen[path] = os.readlink(path) if os.path.islink(path) else (
                None if os.path.isdir(path) else open(path, "rb").read())
    return seen


def test_version_from_header_defines():
    assert cl.read_version("#define CUDNN_MAJOR 9\n# define CUDNN_MINOR 19\n#define CUDNN_PATCHLEVEL 1\n",
                           cl.CUDNN.version_keys) == (9, 19, 1)
    assert cl.read_version("#define CUDNN_MAJOR 9\n", cl.CUDNN.version_keys) == (9, 0, 0)
    assert cl.read_version("#define CUDNN_MAJORITY 9\n", cl.CUDNN.version_keys) is None


def test_wheel_layout_is_found_on_the_search_path(tmp_path):
    site = wheel_site(tmp_path / "site")
    found = cl.find_cudnn({}, [str(tmp_path / "elsewhere"), str(site)], includes=(), libs=())
    assert found == cl.Library("cudnn", (9, 19, 0), str(site / "nvidia/cudnn/include"),
                               str(site / "nvidia/cudnn/lib"), str(site / "nvidia/cudnn/lib/libcudnn.so.9"), "wheel")
    nccl = cl.find_nccl({}, [str(site)], includes=(), libs=())
    assert nccl.version == (2, 27, 7) and nccl.library.endswith("nvidia/nccl/lib/libnccl.so.2")


def test_system_layout_and_env_roots(tmp_path):
    usr = tmp_path / "usr"
    (usr / "include").mkdir(parents=True)
    cudnn_tree(tmp_path / "sys")  # header and libraries in separate system folders, as Debian's packages have them
    os.replace(tmp_path / "sys" / "include" / "cudnn_version.h", usr / "include" / "cudnn_version.h")
    system = dict(includes=[str(usr / "include")], libs=[str(tmp_path / "nolib"), str(tmp_path / "sys" / "lib")])
    found = cl.find_cudnn({}, [], **system)
    assert found.origin == "system" and found.lib_dir == str(tmp_path / "sys" / "lib")
    mine = cudnn_tree(tmp_path / "mine", minor=2, lib="lib64")
    chosen = cl.find_cudnn({"CUDNN_PATH": str(mine)}, [], **system)  # what the user names comes first
    assert chosen.origin == "CUDNN_PATH" and chosen.version == (9, 2, 0) and chosen.lib_dir == str(mine / "lib64")


def test_cudnn8_a_header_alone_or_nothing_is_not_found(tmp_path):
    cudnn_tree(tmp_path / "old" / "nvidia" / "cudnn", major=8, libs=("libcudnn.so.8",))
    cudnn_tree(tmp_path / "headers" / "nvidia" / "cudnn", libs=())
    search = [str(tmp_path / "old"), str(tmp_path / "headers"), str(tmp_path / "empty")]
    assert cl.find_cudnn({"CUDNN_HOME": str(tmp_path / "missing")}, search, includes=(), libs=()) is None
    assert cl.find_nccl({}, search, includes=(), libs=()) is None


def test_versioned_library_names_only(tmp_path):
    root = cudnn_tree(tmp_path / "w" / "nvidia" / "cudnn", libs=("libcudnn.so.9.19.0", "libcudnn.so.9.1.0"))
    assert cl.find_cudnn({}, [str(tmp_path / "w")], includes=(), libs=()).library == \
        str(root / "lib" / "libcudnn.so.9.19.0")


def test_sub_libraries_graph_first(tmp_path):
    lib = cl.find_cudnn({}, [str(cudnn_tree(tmp_path / "nvidia" / "cudnn").parent.parent)], includes=(), libs=())
    names = [os.path.basename(p) for p in cl.sub_libraries(lib)]
    assert names[0] == "libcudnn_graph.so.9"
    assert sorted(names) == sorted(n for n in CUDNN_LIBS if n.startswith("libcudnn_"))


def test_links_are_idempotent_and_only_in_the_cache(tmp_path):
    site = tmp_path / "site"
    cudnn_tree(site / "nvidia" / "cudnn")
    lib = cl.find_cudnn({}, [str(site)], includes=(), libs=())
    cache = tmp_path / "cache"
    cache.mkdir()
    before = snapshot(tmp_path)
    folder = cl.links_dir(str(cache), lib)
    assert folder.startswith(str(cache / cl.LINKS_FOLDER)) and "cudnn-9.19.0-" in folder
    assert cl.ensure_links(folder, lib)
    assert os.readlink(os.path.join(folder, "libcudnn.so")) == lib.library
    assert not cl.ensure_links(folder, lib)
    written = {p for p in snapshot(tmp_path).keys() - before.keys()}
    assert written and all(p.startswith(str(cache)) for p in written)
    assert {p: v for p, v in snapshot(tmp_path).items() if p in before} == before
    moved = cl.Library(**{**lib.__dict__, "library": lib.library + ".moved"})
    assert cl.ensure_links(folder, moved) and os.readlink(os.path.join(folder, "libcudnn.so")) == moved.library
    other = cl.Library(**{**lib.__dict__, "lib_dir": str(tmp_path / "other")})
    assert cl.links_dir(str(cache), other) != folder  # another installation, another folder


def test_plan_gives_jittor_the_nccl_it_found(tmp_path):
    nccl = cl.find_nccl({}, [str(nccl_tree(tmp_path / "nvidia" / "nccl").parent.parent)], includes=(), libs=())
    libs = boot.CudaLibs(nccl=nccl, nccl_links="/cache/links")
    plan = boot.plan_defaults({}, CUDA13, libs)
    assert "use_nccl" not in plan and plan["conv_opt"] == "1"
    assert plan["nccl_include_path"] == nccl.include_dir and plan["nccl_lib_path"] == "/cache/links"
    assert boot.plan_defaults({}, CUDA13)["use_nccl"] == "0"  # none found: no download at import
    assert boot.plan_defaults({}, NO_GPU, libs)["use_nccl"] == "0"
    own = boot.plan_defaults({"nccl_include_path": "/x", "nccl_lib_path": "/y"}, CUDA13)
    assert not {"use_nccl", "nccl_include_path", "nccl_lib_path"} & set(own)  # the user's NCCL stands


def test_what_is_looked_for_follows_switches_and_user_settings(tmp_path):
    site = wheel_site(tmp_path / "site")
    path = [str(site)]
    libs = boot.find_cuda_libs({}, CUDA13, path)
    assert libs.cudnn and libs.nccl and libs.cudnn_wanted
    assert boot.find_cuda_libs({}, NO_GPU, path) == boot.CudaLibs()
    assert boot.find_cuda_libs({"nvcc_path": ""}, CUDA13, path) == boot.CudaLibs()
    assert boot.find_cuda_libs({boot.BOOTSTRAP_SWITCH: "0"}, CUDA13, path) == boot.CudaLibs()
    for env in ({"conv_opt": "1"}, {"conv_opt": "0"}, {boot.CUDNN_SWITCH: "0"}):
        got = boot.find_cuda_libs(env, CUDA13, path)
        assert got.cudnn is None and not got.cudnn_wanted and got.nccl is not None
    for env in ({"use_nccl": "1"}, {"nccl_lib_path": "/x"}, {boot.NCCL_SWITCH: "off"}):
        got = boot.find_cuda_libs(env, CUDA13, path)
        assert got.nccl is None and got.cudnn is not None


def fake_gpu_host(tmp_path, monkeypatch):
    """A CUDA 13 machine whose sys.path holds the cuDNN and NCCL wheels, jittor's cache in ``tmp_path``."""
    site, cache = wheel_site(tmp_path / "site"), tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setattr(boot, "probe_machine", lambda env: CUDA13)
    monkeypatch.setattr(boot, "_jittor_dir", lambda: None)
    monkeypatch.setattr(boot, "_jittor_cache_path", lambda: str(cache))
    monkeypatch.setattr(boot.sys, "path", [str(site)])
    monkeypatch.setattr(boot, "LIBS", boot.CudaLibs())
    return cache


def test_bootstrap_writes_links_in_jittors_cache_only(tmp_path, monkeypatch, capsys):
    cache = fake_gpu_host(tmp_path, monkeypatch)
    before = snapshot(tmp_path)
    env = {}
    boot.bootstrap(env)
    assert boot.LIBS.cudnn is not None and boot.LIBS.nccl is not None
    assert env["conv_opt"] == "1" and "use_nccl" not in env
    assert os.readlink(os.path.join(env["nccl_lib_path"], "libnccl.so")) == boot.LIBS.nccl.library
    written = snapshot(tmp_path).keys() - before.keys()
    assert written and all(p.startswith(str(cache)) for p in written)
    err = capsys.readouterr().err
    assert "cuDNN" not in err and "NCCL" not in err


def test_a_child_process_inherits_the_bootstraps_variables_not_a_users_choice(tmp_path, monkeypatch):
    """A process started by one that imported ops (a pytest or grader worker, a training script's child) finds
    the parent's conv_opt=1 in its environment: it is the bootstrap's, so the child gets cuDNN too. A variable
    the user set (or changed after the parent's bootstrap) still wins, and the parent's choices the child does
    not make (use_nccl=0 where the child finds NCCL) are removed."""
    fake_gpu_host(tmp_path, monkeypatch)
    parent = {}
    boot.bootstrap(parent)
    assert parent["conv_opt"] == "1" and boot.SET_MARK in parent
    child = dict(parent)
    boot.bootstrap(child)
    assert boot.LIBS.cudnn is not None and boot.LIBS.nccl is not None and child == parent
    inherited_no_nccl = dict(parent, use_nccl="0", **{boot.SET_MARK: json.dumps(dict(
        json.loads(parent[boot.SET_MARK]), use_nccl="0"))})
    boot.bootstrap(inherited_no_nccl)
    assert "use_nccl" not in inherited_no_nccl and boot.LIBS.nccl is not None
    users = dict(parent, conv_opt="0")  # changed after the parent's bootstrap: the user's
    boot.bootstrap(users)
    assert boot.LIBS.cudnn is None and users["conv_opt"] == "0"
    assert boot.users_env({boot.SET_MARK: "not json", "conv_opt": "1"}) == {"conv_opt": "1"}


def test_unwritable_cache_means_no_nccl_and_one_line(tmp_path):
    nccl = cl.find_nccl({}, [str(nccl_tree(tmp_path / "nvidia" / "nccl").parent.parent)], includes=(), libs=())
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a cache path below a file cannot be created, also for root
    libs, message = boot.link_nccl(boot.CudaLibs(nccl=nccl, cudnn_wanted=True), str(blocker / "cache"))
    assert libs == boot.CudaLibs(cudnn_wanted=True)
    assert message.startswith("ops: NCCL 2.27.7 found but") and "jittor runs without NCCL" in message
    assert "use_nccl" in boot.plan_defaults({}, CUDA13, libs)


def test_failed_cudnn_build_is_remembered_and_said(tmp_path, monkeypatch):
    """A library that cannot be loaded (here a fake one) leaves jittor as it was, says why in one line, and is
    not tried again until the marker goes."""
    lib = cl.find_cudnn({}, [str(cudnn_tree(tmp_path / "site" / "nvidia" / "cudnn").parent.parent)],
                        includes=(), libs=())
    cudnn_before = boot.jt.cudnn
    message = boot.load_cudnn(lib, str(tmp_path / "cache"))
    assert message.startswith("ops: jittor's cudnn extension did not build against cuDNN 9.19.0 (")
    assert "\n" not in message and boot.jt.cudnn is cudnn_before
    marker = os.path.join(cl.links_dir(str(tmp_path / "cache"), lib), boot.BUILD_FAILED)
    assert os.path.isfile(marker)
    again = boot.load_cudnn(lib, str(tmp_path / "cache"))
    assert marker in again and "delete that file to try again" in again


def test_cudnn_sources_leave_out_the_rnn_files():
    from pathlib import Path
    sources = boot.cudnn_sources(Path(boot.jt.__file__).parent)
    names = {os.path.basename(p) for p in sources}
    assert {"cudnn_conv_op.cc", "cudnn_conv_op.h", "cudnn_conv3d_backward_w_op.cc", "cudnn_wrapper.h",
            "cudnn_wrapper.cc"} <= names
    assert not any("rnn" in n for n in names)


CONV_OPS = ("cudnn_conv", "cudnn_conv_backward_x", "cudnn_conv_backward_w", "cudnn_conv3d", "cudnn_conv3d_backward_x",
            "cudnn_conv3d_backward_w")


def test_the_convolution_ops_are_built_from_copies_with_float_compute(tmp_path):
    """Half and bfloat16 convolutions need float compute on cuDNN (no bfloat16 compute exists), and an algorithm
    found for one data type must not run for another: the six convolution ops build from copies in the cache's
    folder (source and header together: jittor's JIT reads the source beside the header), the rest from jittor's
    files, which stay unchanged; a second build writes nothing."""
    from pathlib import Path
    jittor_dir = Path(boot.jt.__file__).parent
    originals = {p: Path(p).read_text() for p in boot.cudnn_sources(jittor_dir)}
    sources = boot.cudnn_build_sources(jittor_dir, str(tmp_path))
    copies = [p for p in sources if p.startswith(str(tmp_path))]
    assert sorted(os.path.basename(p) for p in copies) == sorted(f"{op}_op.{ext}" for op in CONV_OPS
                                                               for ext in ("cc", "h"))
    assert len(sources) == len(originals)
    for path in copies:
        text = Path(path).read_text()
        if path.endswith(".cc"):
            for old, new in reversed(list(boot.CONV_EDITS.values())):
                assert text.count(new) == 1 and old not in text.replace(new, ""), (path, old)
                text = text.replace(new, old)
            original = jittor_dir / "extern" / "cuda" / "cudnn" / "ops" / os.path.basename(path)
            assert text == originals[str(original)]
    assert all(Path(p).read_text() == t for p, t in originals.items())
    stamps = {p: os.stat(p).st_mtime_ns for p in copies}
    assert boot.cudnn_build_sources(jittor_dir, str(tmp_path)) == sources
    assert {p: os.stat(p).st_mtime_ns for p in copies} == stamps
    assert boot.conv_op_copy("int x;") is None
    descriptor, key = (old for old, _ in boot.CONV_EDITS.values())
    with pytest.raises(ValueError, match="one convolution descriptor"):
        boot.conv_op_copy(descriptor + descriptor + key)
    with pytest.raises(ValueError, match="one algorithm key"):
        boot.conv_op_copy(descriptor)


def test_rnn_layers_run_with_cudnn_hidden(monkeypatch):
    seen = []

    class Layer:
        def execute(self, x, hx=None):
            """the layer's own docstring"""
            seen.append(boot.jt.cudnn)
            if x == "boom":
                raise ValueError(x)
            return x

    monkeypatch.setattr(boot.jt, "cudnn", "a cudnn module")
    boot._rnn_without_cudnn(Layer)
    boot._rnn_without_cudnn(Layer)  # twice: wrapped once
    assert Layer().execute(3) == 3 and seen == [None] and boot.jt.cudnn == "a cudnn module"
    with pytest.raises(ValueError):
        Layer().execute("boom")
    assert seen == [None, None] and boot.jt.cudnn == "a cudnn module"
    assert Layer.execute.__doc__ == "the layer's own docstring"
