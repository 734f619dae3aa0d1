"""How many CUDA translation units (jittor kernel compiles) the GPU case table needs, counted on the CPU through the
CUDA branches of the plans: jittor compiles one kernel per distinct (input and output dtypes and ranks, header,
source) of a code op, so that tuple is what is counted."""
import sys
from collections import Counter

import ops  # noqa: F401
from ops.scoring import fam_permute as FP
from ops.scoring import fam_pool3d as FPOOL
from ops.scoring.families import load_families

pool3d, permute, broadcast, timex = (sys.modules[f"ops.{m}"] for m in ("pool3d", "permute", "broadcast", "timex"))

# The GPU table's budget (the grader's whole run compiles at most this many of our kernels).
MAX_COMPILES = 40


def _key(launch, inputs):
    """jittor's kernel key of ``launch`` run on ``inputs`` ((dtype, rank) each)."""
    outs = [(launch.dtypes, len(launch.shapes))] if launch.single else \
        [(d, len(s)) for d, s in zip(launch.dtypes, launch.shapes)]
    kw = launch.kwargs
    return (tuple(inputs), tuple(outs), kw.get("cuda_header", ""), kw["cuda_src"])


def _grad_keys(launch, inputs):
    """The keys of a launch's grad sources: jittor runs each on (inputs, dy, the outputs) with the header."""
    outs = [(launch.dtypes, len(launch.shapes))] if launch.single else \
        [(d, len(s)) for d, s in zip(launch.dtypes, launch.shapes)]
    dy = outs[0]
    return [(tuple(inputs) + (dy,) + tuple(outs), (inputs[i],), launch.kwargs.get("cuda_header", ""), src)
            for i, src in enumerate(launch.kwargs.get("cuda_grad_src", []))]


def case_keys(fam, case):
    """The kernel keys one GPU case compiles: its forward (under no_grad for a forward case, as the grader times
    it), and for a backward case the forward with grad and every launch of the backward."""
    bwd = case.direction == "bwd"
    dt = case.dtype
    if fam.name == "max_pool3d":
        params = pool3d.normalize_params(**FPOOL.case_params(case))
        p = pool3d.plan(tuple(case.shapes[0]), dt, params, FPOOL.returns_indices(case), bwd, True)
        keys = [_key(p.launch, [(dt, 5)])]
        return keys + (_grad_keys(p.launch, [(dt, 5)]) if bwd else [])
    if fam.name == "permute":
        perm = FP._perm(case)
        if case.p.get("op") == "transpose_add":
            p = permute._transpose_add_plan(tuple(case.shapes[0]), dt, perm, bwd, True)
            keys = [_key(p.launch, [(dt, 1), (dt, 1)])]
        else:
            p = permute._permute_plan(tuple(case.shapes[0]), dt, perm, bwd, True)
            keys = [_key(p.launch, [(dt, 1)])]
        if bwd:
            keys.append(_key(p.backward_plan().launch, [(dt, 1)]))
        return keys
    if fam.name == "expand_as":
        x_shape, out_shape = tuple(case.shapes[0]), tuple(case.p["out"])
        p = broadcast._plan(x_shape, dt, out_shape, bwd, True)
        keys = [_key(p.launch, [(dt, len(x_shape))])]
        if bwd:
            for rp in broadcast.select_grad_config(x_shape, out_shape, dt).passes:
                keys.append(_key(broadcast.pass_launch(rp, True), [(rp.in_dtype, 1)]))
        return keys
    if fam.name == "timex":
        shape = tuple(case.shapes[1])
        cfg = timex.select_config(shape, "forward", tensor_cores=timex.TC_AUTO, dtype=dt)
        keys = [_key(timex.forward_launch(cfg, shape, dt, 0.0, False, True), [(dt, 2), (dt, 3)])]
        if bwd:
            keys.append(_key(timex.grad_w_launch(timex.select_config(shape, "grad_w"), shape, dt, True),
                             [(dt, 3), (dt, 3)]))
        return keys
    raise AssertionError(f"unknown family {fam.name}")


def gpu_table_compiles():
    """{family: Counter of kernel keys} over every GPU case of the table."""
    out = {}
    for fam in load_families():
        keys = Counter()
        for case in fam.all_cases():
            if "cuda" in case.devices:
                keys.update(case_keys(fam, case))
        out[fam.name] = keys
    return out


def test_the_gpu_table_needs_few_compiles():
    by_family = gpu_table_compiles()
    counts = {name: len(keys) for name, keys in by_family.items()}
    total = sum(counts.values())
    print(f"distinct kernel compiles of the GPU table: {total} {counts}")
    assert total <= MAX_COMPILES, counts
    cases = sum(1 for fam in load_families() for c in fam.all_cases() if "cuda" in c.devices)
    assert cases >= 3 * total  # each compile serves several cases


def test_a_model_of_many_layers_compiles_once_per_dtype_and_direction():
    """Layers of every size and window share their translation units: one forward (values, or values and
    indices), one backward per dtype, whatever the shapes and pooling parameters."""
    keys = set()
    layers = [((8, 16, 32, 64, 64), (2, 2, 0)), ((8, 32, 16, 32, 32), (3, 1, 1)), ((8, 64, 16, 16, 16), (3, 2, 1)),
              ((2, 64, 9, 15, 15), (5, 2, 2)), ((4, 8, 8, 8, 8), (8, 8, 0))]
    for shape, (k, s, p) in layers:
        params = pool3d.normalize_params(k, s, p)
        plan = pool3d.plan(shape, "float32", params, False, True, True)
        keys.add(_key(plan.launch, [("float32", 5)]))
        keys.update(_grad_keys(plan.launch, [("float32", 5)]))
    assert len(keys) == 2
    for shape, perm in [((4, 64, 128), (0, 2, 1)), ((8, 16, 12, 64), (0, 2, 1, 3)), ((512, 1024), (1, 0)),
                        ((3, 5, 7, 9, 11), (4, 2, 0, 1, 3))]:
        plan = permute._permute_plan(shape, "float32", perm, False, True)
        keys.add(_key(plan.launch, [("float32", 1)]))
    assert len(keys) == 3
