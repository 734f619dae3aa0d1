"""A CUDA launch's integer parameters travel as one packed ``data`` key (ops/_launch.py ``pack_named``, read by
``OpsData`` in common.cuh): the packing, the reader run on the host, and every family's CUDA sources compiled
inside a stand-in for jittor's CodeOp::jit_run."""
import os
import subprocess
import sys
import tempfile

import pytest

import ops
from ops import _codegen, _launch
from nvcc_util import PRELUDE, nvcc_path

pool3d, permute, broadcast, timex = (sys.modules[f"ops.{m}"] for m in ("pool3d", "permute", "broadcast", "timex"))


def cuda_launches():
    """(name, launch, input dtypes of its forward) for a CUDA launch of every family and kind that has data."""
    f32 = "float32"
    params = pool3d.normalize_params(3, 1)
    pool_both = pool3d.plan((4, 8, 9, 10, 11), f32, params, True, True, True).launch
    pool_values = pool3d.plan((4, 8, 9, 10, 11), f32, pool3d.normalize_params(2), False, False, True).launch
    perm = permute._permute_plan((64, 48), f32, (1, 0), False, True).launch
    tadd = permute._transpose_add_plan((64, 48), f32, (1, 0), False, True).launch
    fwd = broadcast._plan((5, 1, 1), f32, (5, 128, 128), False, True).launch
    passes = broadcast.select_grad_config((5, 1, 1), (5, 128, 128), f32).passes
    reduce = broadcast.pass_launch(passes[0], True)
    grad_w = timex.grad_w_launch(timex.select_config((2, 3, 40), "grad_w"), (2, 3, 40), f32, True)
    return [("pool both", pool_both, [f32]), ("pool values", pool_values, [f32]), ("permute", perm, [f32]),
            ("transpose_add", tadd, [f32, f32]), ("broadcast", fwd, [f32]), ("broadcast pass", reduce, [f32]),
            ("timex grad_w", grad_w, [f32, f32])]


def test_integer_parameters_are_packed_and_read_back():
    data = {"A": 64, "tiles_a": 3, "bd0": -2, "v": 52}
    packed = _launch.pack_named(data)
    assert list(packed) == ["$A=64,tiles_a=3,bd0=-2,v=52"]
    assert _launch.unpack_named(packed) == data
    with pytest.raises(ValueError, match="name"):
        _launch.pack_named({"a=b": 1})
    with pytest.raises(ValueError, match="at most"):
        _launch.pack_named({f"k{i}": i for i in range(_launch.PACKED_MAX + 1)})


@pytest.mark.parametrize("name, launch, dtypes", cuda_launches(), ids=lambda v: v if isinstance(v, str) else "")
def test_cuda_launches_carry_one_packed_key_and_read_it_through_opsdata(name, launch, dtypes):
    (key,) = launch.kwargs["data"]
    assert key.startswith("$") and _launch.unpack_named(launch.kwargs["data"])
    for src in [launch.kwargs["cuda_src"]] + launch.kwargs.get("cuda_grad_src", []):
        assert "const OpsData data(this->data);" in src


def test_the_switch_turns_the_packing_off(switches):
    switches.setenv(_launch.PACKED_SWITCH, "0")
    launch = permute._permute_plan((64, 48), "float32", (1, 0), False, True).launch
    assert "A" in launch.kwargs["data"] and "OpsData" not in launch.kwargs["cuda_src"]


def test_cpu_launches_and_float_parameters_stay_as_they_are():
    cpu = permute._permute_plan((5, 6, 7, 8), "float32", (0, 2, 1, 3), False, False).launch
    assert not any(k.startswith("$") for k in cpu.kwargs.get("data", {}))
    shape = (2, 3, 40)
    cfg = timex.select_config(shape, "forward", tensor_cores=timex.TC_AUTO, dtype="float32")
    forward = timex.forward_launch(cfg, shape, "float32", 0.0, False, True)  # eps: a float
    assert forward.kwargs["data"]["eps"] == 0.0 and "OpsData" not in forward.kwargs["cuda_src"]


HOST_CHECK = r"""
#include <cstdio>
#include <unordered_map>
#include <string>
int main() {
  std::unordered_map<std::string, double> map;
  map["other"] = 7.0;
  map["$A=64,tiles_a=3,bd0=-2,v=52"] = 0.0;
  const OpsData data(map);
  const bool ok = data["A"] == 64 && data["tiles_a"] == 3 && data[std::string("bd") + "0"] == -2 &&
                  data["v"] == 52 && data["tiles"] == 0 && data["B"] == 0 && data["other"] == 0 && data.n == 4;
  std::printf(ok ? "ok\n" : "wrong\n");
  return ok ? 0 : 1;
}
"""


@pytest.mark.nvcc
def test_opsdata_reads_the_packed_key_on_the_host(tmp_path):
    src = tmp_path / "host.cu"
    src.write_text(PRELUDE + _codegen.header(["common"]) + HOST_CHECK)
    exe = tmp_path / "host"
    build = subprocess.run([nvcc_path(), "-std=c++17", str(src), "-o", str(exe)], capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr


def _jit_run_stand_in(launch, dtypes, src) -> str:
    """jittor's CodeOp::jit_run as far as a source sees it: the op's `data` map member, in<i>/out<i> Vars with
    num, pointers of their types, shapes as index_t values."""
    out_dtypes = [launch.dtypes] if launch.single else launch.dtypes
    lines = ["typedef long long index_t;", "struct OpsFakeVar { long long num; };",
             "struct OpsFakeOp { std::unordered_map<std::string, double> data; void jit_run(); };",
             "void OpsFakeOp::jit_run() {"]
    # a grad source sees (inputs, dout, outputs) as inputs: every dtype there is one of these
    ins = dtypes + [out_dtypes[0]] + out_dtypes
    for prefix, types in (("in", ins), ("out", out_dtypes)):
        for i, dt in enumerate(types):
            ctype = {"float32": "float", "int32": "int", "int64": "long long"}.get(dt, dt)
            lines += [f"  typedef {ctype} {prefix}{i}_type;", f"  OpsFakeVar {prefix}{i}_v{{}};",
                      f"  OpsFakeVar* {prefix}{i} = &{prefix}{i}_v;",
                      f"  {prefix}{i}_type* __restrict__ {prefix}{i}_p = nullptr;"]
            lines += [f"  index_t {prefix}{i}_shape{j} = 1;" for j in range(10)]
    return "\n".join(lines) + "\n" + src + "\n}\n"


@pytest.mark.nvcc
@pytest.mark.parametrize("name, launch, dtypes", cuda_launches(), ids=lambda v: v if isinstance(v, str) else "")
def test_cuda_sources_compile_with_the_packed_data(name, launch, dtypes):
    header = "\n".join(line for line in launch.kwargs["cuda_header"].splitlines() if "type/fp16_compute.h" not in line)
    for i, src in enumerate([launch.kwargs["cuda_src"]] + launch.kwargs.get("cuda_grad_src", [])):
        text = (PRELUDE + "#include <iostream>\n#include <unordered_map>\n#include <string>\n#define LOGf std::cerr\n"
                + header + "\n" + _jit_run_stand_in(launch, dtypes, src))
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "jit_run.cu")
            with open(path, "w") as f:
                f.write(text)
            proc = subprocess.run([nvcc_path(), "-std=c++17", "-arch=sm_90", "-ptx", path, "-o",
                                   os.path.join(tmp, "out.ptx")], capture_output=True, text=True)
        assert proc.returncode == 0, (name, i, (proc.stdout + proc.stderr)[-4000:])
