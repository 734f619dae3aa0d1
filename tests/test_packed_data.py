"""A CUDA launch's parameters travel as one packed ``data`` key (ops/_launch.py ``pack_named``, read by ``OpsData``
in common.cuh, which fails naming a name the kernel reads and the launch did not pass): the packing, the reader
run on the host, and every family's CUDA sources built inside a stand-in for jittor's CodeOp::jit_run and run
there on the host with their real ``data``, up to the kernel launch (which fails without a GPU)."""
import json
import subprocess

import numpy as np
import pytest

import ops
from ops import _codegen, _launch, broadcast, pool3d
from ops import permutation as permute
from ops import time_mix as timex
from nvcc_util import PRELUDE, nvcc_path



def cuda_launches():
    """(name, launch, input dtypes and shapes of its forward) for a CUDA launch of every family and launcher kind
    that has data."""
    f32, f16 = "float32", "float16"
    x5 = (4, 8, 9, 10, 11)
    pool_both = pool3d.plan(x5, f32, pool3d.normalize_params(3, 1), True, True, True).launch
    pool_values = pool3d.plan(x5, f32, pool3d.normalize_params(2), False, False, True).launch
    perm = permute._permute_plan((64, 48), f32, (1, 0), False, True).launch
    perm_nd = permute._permute_plan((6, 5, 7, 3), f32, (3, 1, 0, 2), False, True).launch
    perm_split = permute._permute_plan((8, 24, 40, 16, 64), f16, (3, 1, 4, 2, 0), False, True).launch
    tadd = permute._transpose_add_plan((64, 48), f32, (1, 0), False, True).launch
    fwd = broadcast._plan((5, 1, 1), f32, (5, 128, 128), False, True).launch
    reduce = broadcast.pass_launch(broadcast.select_grad_config((5, 1, 1), (5, 128, 128), f32).passes[0], True)
    col = broadcast.pass_launch(broadcast.select_grad_config((1, 128, 1), (64, 128, 64), f32).passes[0], True)
    shape = (2, 3, 40)
    grad_w = timex.grad_w_launch(timex.select_config(shape, "grad_w"), shape, f32, True)
    cfg = timex.select_config(shape, "forward", tensor_cores=timex.TC_AUTO, dtype=f32)
    timex_fwd = timex.forward_launch(cfg, shape, f32, 1e-5, False, True)
    return [("pool both", pool_both, [f32], [x5]), ("pool values", pool_values, [f32], [x5]),
            ("permute", perm, [f32], [(64, 48)]), ("permute nd", perm_nd, [f32], [(6, 5, 7, 3)]),
            ("permute split", perm_split, [f16], [(8, 24, 40, 16, 64)]),
            ("transpose_add", tadd, [f32, f32], [(64, 48), (48, 64)]),
            ("broadcast", fwd, [f32], [(5, 1, 1)]), ("broadcast pass", reduce, [f32], [(5, 128, 128)]),
            ("broadcast col pass", col, [f32], [(64, 128, 64)]),
            ("timex forward", timex_fwd, [f32, f32], [shape[1:], shape]),
            ("timex grad_w", grad_w, [f32, f32], [shape, shape])]


def test_parameters_are_packed_and_read_back():
    data = {"A": 64, "tiles_a": 3, "bd0": -2, "v": 52, "eps": 1e-05, "w": 0.1}
    packed = _launch.pack_named(data)
    assert list(packed) == ["$A=64,tiles_a=3,bd0=-2,v=52,eps=1e-05,w=0.1"]
    assert _launch.unpack_named(packed) == data
    with pytest.raises(ValueError, match="name"):
        _launch.pack_named({"a=b": 1})
    for bad in (float("nan"), float("inf"), "3", None):
        with pytest.raises(TypeError, match=r"data\['x'\]"):
            _launch.pack_named({"x": bad})
    with pytest.raises(ValueError, match="at most"):
        _launch.pack_named({f"k{i}": i for i in range(_launch.PACKED_MAX + 1)})


@pytest.mark.parametrize("name, launch, dtypes, shapes", cuda_launches(),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_cuda_launches_carry_one_packed_key_and_read_it_through_opsdata(name, launch, dtypes, shapes):
    (key,) = launch.kwargs["data"]
    assert key.startswith("$") and _launch.unpack_named(launch.kwargs["data"])
    for src in [launch.kwargs["cuda_src"]] + launch.kwargs.get("cuda_grad_src", []):
        assert "const OpsData data(this->data);" in src


def test_float_parameters_travel_in_the_packed_key_exactly():
    shape = (2, 3, 40)
    cfg = timex.select_config(shape, "forward", tensor_cores=timex.TC_AUTO, dtype="float32")
    forward = timex.forward_launch(cfg, shape, "float32", 1 / 3, False, True)  # eps: a float
    assert _launch.unpack_named(forward.kwargs["data"])["eps"] == 1 / 3
    assert "const OpsData data(this->data);" in forward.kwargs["cuda_src"]


def test_cpu_launches_keep_their_fields_or_pack_names():
    """permute's CPU plan keeps its one-character fields (cpu_common.h: read_fields); timex's tiled CPU kernels
    read the names of their CUDA twins, packed the same way (cpu_common.h includes ops_data.h)."""
    cpu = permute._permute_plan((5, 6, 7, 8), "float32", (0, 2, 1, 3), False, False).launch
    assert not _launch.is_packed(cpu.kwargs.get("data", {}))
    shape = (2, 3, 40)
    cfg = timex.select_config(shape, "forward", single_max_t=0, tile=16)
    forward = timex.forward_launch(cfg, shape, "float32", 0.5, False, False)
    assert _launch.unpack_named(forward.kwargs["data"])["eps"] == 0.5
    assert forward.kwargs["cpu_src"].startswith("{ const OpsData data(this->data);")


HOST_CHECK = r"""
#include <cstdio>
#include <unordered_map>
#include <string>
int main() {
  std::unordered_map<std::string, double> map;
  map["other"] = 7.0;
  map["$A=64,tiles_a=3,bd0=-2,v=52,eps=1e-05,big=9007199254740992"] = 0.0;
  const OpsData data(map);
  const bool ok = data["A"] == 64 && data["tiles_a"] == 3 && data[std::string("bd") + "0"] == -2 &&
                  data.at("bd", 0) == -2 && data["v"] == 52 && data["eps"] == 1e-05 &&
                  data["big"] == 9007199254740992.0 && data.n == 6;
  std::printf(ok ? "ok\n" : "wrong\n");
  if (!ok) return 1;
  std::fflush(stdout);
  return (int)data[MISSING];  // fails naming the name
}
"""

# jittor's LOGf ends the op with its message; here it ends the program with status 3
FATAL = r"""
#include <iostream>
struct OpsFatal {
  ~OpsFatal() { std::cerr << std::endl; std::exit(3); }
  template <class T> OpsFatal& operator<<(const T& v) { std::cerr << v; return *this; }
};
#define LOGf OpsFatal()
"""


@pytest.mark.nvcc
@pytest.mark.parametrize("missing", ["tiles", "B", "other", "bd1"])
def test_opsdata_reads_the_packed_key_and_fails_naming_a_missing_name(tmp_path, missing):
    """Every packed value reads back; a name not in the key ("other" is a map entry of its own, outside the
    packed key) is a fatal error that names it, not a 0."""
    src = tmp_path / "host.cu"
    src.write_text(PRELUDE + FATAL + _codegen.header(["common"]) + f'#define MISSING "{missing}"\n' + HOST_CHECK)
    exe = tmp_path / "host"
    build = subprocess.run([nvcc_path(), "-std=c++17", str(src), "-o", str(exe)], capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.stdout.strip() == "ok", run.stdout + run.stderr
    assert run.returncode == 3 and f'data["{missing}"], which its launch did not pass' in run.stderr, run.stderr


def _jit_run_stand_in(launch, dtypes, shapes, src) -> str:
    """jittor's CodeOp::jit_run as far as a source sees it: the op's `data` map member holding the launch's data,
    in<i>/out<i> Vars with num, null pointers of their types, shapes as index_t values; and a main that runs it."""
    out_dtypes = [launch.dtypes] if launch.single else launch.dtypes
    out_shapes = [launch.shapes] if launch.single else launch.shapes
    lines = ["typedef long long index_t;", "struct OpsFakeVar { long long num; };",
             "struct OpsFakeOp { std::unordered_map<std::string, double> data; void jit_run(); };",
             "void OpsFakeOp::jit_run() {"]
    # a grad source sees (inputs, dout, outputs) as inputs and writes one input's gradient
    ins = list(zip(dtypes, shapes)) + [(out_dtypes[0], out_shapes[0])] + list(zip(out_dtypes, out_shapes))
    outs = list(zip(out_dtypes, out_shapes)) if src is launch.kwargs["cuda_src"] else ins[:len(dtypes)]
    for prefix, vars_ in (("in", ins), ("out", outs)):
        for i, (dt, shape) in enumerate(vars_):
            ctype = {"float32": "float", "int32": "int", "int64": "long long"}.get(dt, dt)
            lines += [f"  typedef {ctype} {prefix}{i}_type;", f"  OpsFakeVar {prefix}{i}_v{{{int(np.prod(shape))}}};",
                      f"  OpsFakeVar* {prefix}{i} = &{prefix}{i}_v;",
                      f"  {prefix}{i}_type* __restrict__ {prefix}{i}_p = nullptr;"]
            lines += [f"  index_t {prefix}{i}_shape{j} = {n};" for j, n in enumerate(tuple(shape) + (1,) * 10)][:10]
    entries = "".join(f"  op.data[{json.dumps(k)}] = {float(v)!r};\n" for k, v in launch.kwargs["data"].items())
    return ("\n".join(lines) + "\n" + src + "\n}\nint main() {\n  OpsFakeOp op;\n" + entries
            + '  op.jit_run();\n  std::printf("ran\\n");\n  return 0;\n}\n')


@pytest.mark.nvcc
@pytest.mark.parametrize("name, launch, dtypes, shapes", cuda_launches(),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_cuda_sources_build_and_read_every_name_they_need(name, launch, dtypes, shapes, tmp_path):
    """Each source (forward and grad) built with its header and run on the host with the launch's own data: the
    launcher reads every parameter it needs (a missing one ends the run naming it) up to the kernel launch, which
    fails here without a GPU (the stand-in's CHECK only prints)."""
    header = "\n".join(line for line in launch.kwargs["cuda_header"].splitlines() if "type/fp16_compute.h" not in line)
    for i, src in enumerate([launch.kwargs["cuda_src"]] + launch.kwargs.get("cuda_grad_src", [])):
        text = (PRELUDE + "#include <unordered_map>\n#include <string>\n" + FATAL
                + header + "\n" + _jit_run_stand_in(launch, dtypes, shapes, src))
        path, exe = tmp_path / f"jit_run{i}.cu", tmp_path / f"jit_run{i}"
        path.write_text(text)
        # compute_90 PTX only: no ptxas, the host half built and linked
        build = subprocess.run([nvcc_path(), "-std=c++17", "-arch=compute_90", "-code=compute_90", str(path), "-o",
                                str(exe)], capture_output=True, text=True)
        assert build.returncode == 0, (name, i, (build.stdout + build.stderr)[-4000:])
        run = subprocess.run([str(exe)], capture_output=True, text=True)
        assert run.returncode == 0 and run.stdout.strip().endswith("ran"), (name, i, run.stdout + run.stderr)
