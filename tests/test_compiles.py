"""How many CUDA translation units (jittor kernel compiles) the GPU case table needs, counted on the CPU through the
CUDA branches of the plans: jittor compiles one kernel per distinct (input and output dtypes and ranks, header,
source) of a code op, so that tuple is what is counted."""
from collections import Counter

from ops import permutation, pool3d
from ops.scoring.families import load_families

# The GPU table's budget (the grader's whole run compiles at most this many of our kernels).
MAX_COMPILES = 40


def _outputs(launch):
    return [(launch.dtypes, len(launch.shapes))] if launch.single else \
        [(d, len(s)) for d, s in zip(launch.dtypes, launch.shapes)]


def _key(launch, inputs):
    """jittor's kernel key of ``launch`` run on ``inputs`` ((dtype, rank) each)."""
    kw = launch.kwargs
    return (tuple(inputs), tuple(_outputs(launch)), kw.get("cuda_header", ""), kw["cuda_src"])


def _grad_keys(launch, inputs):
    """The keys of a launch's grad sources: jittor runs each on (inputs, dy, the outputs) with the header."""
    outs = _outputs(launch)
    return [(tuple(inputs) + (outs[0],) + tuple(outs), (inputs[i],), launch.kwargs.get("cuda_header", ""), src)
            for i, src in enumerate(launch.kwargs.get("cuda_grad_src", []))]


def case_keys(fam, case):
    """The kernel keys one GPU case compiles: those of the launches its family names (``cuda_launches``)."""
    launches = getattr(fam, "cuda_launches", None)
    assert launches is not None, f"family {fam.name} has CUDA cases but no cuda_launches"
    keys = []
    for launch, inputs, with_grads in launches(case):
        keys.append(_key(launch, inputs))
        keys += _grad_keys(launch, inputs) if with_grads else []
    return keys


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
        plan = permutation._permute_plan(shape, "float32", perm, False, True)
        keys.add(_key(plan.launch, [("float32", 1)]))
    assert len(keys) == 3
