"""ops/registry.py: every reader of the family records (ops' exports, the grader's table, the recorded calls, the
compile-budget test, the bench) sees a family registered in one place, and none sees one that is not; the built-in
records name what exists (docs/contributing.md's steps)."""
import os
import subprocess
import sys

import numpy as np
import pytest

import call_record
import ops
import test_compiles
from ops import bench, registry
from ops._jittor import jt
from ops.scoring.families import load_families

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
SNIPPETS = os.path.join(ROOT, "cuda_snippets")


def listed_ids(family_modules=None):
    """The case ids of ``get_score.py --device cpu --list`` with ``OPS_SCORING_FAMILY_MODULES`` as given."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, ROOT, os.environ.get("PYTHONPATH", "")]))
    env.pop(registry.FAMILY_MODULES_ENV, None)
    if family_modules:
        env[registry.FAMILY_MODULES_ENV] = family_modules
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "get_score.py"), "--device", "cpu", "--list"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.split()


def bench_names():
    return [row[0] for row in bench.call_cases(jt, ops, np, None, False)]


def every_view():
    """(grader families, compile-budget families, bench rows, recorded functions) as this process sees them."""
    return ({f.name for f in load_families()}, set(test_compiles.gpu_table_compiles()), bench_names(),
            {fn for names in call_record.public().values() for fn in names})


def test_a_family_registered_in_one_place_reaches_every_reader(monkeypatch):
    monkeypatch.setenv(registry.FAMILY_MODULES_ENV, "toy_family")
    grader, compiles, rows, recorded = every_view()
    assert grader == compiles == {"toy"}
    assert rows == ["toy scale (4096,)"] and recorded == {"scale"}
    assert [i for i in listed_ids("toy_family") if i.startswith("toy/")][:2] == ["toy/fwd/ok", "toy/bwd/ok"]


def test_an_unregistered_family_reaches_no_reader(monkeypatch):
    monkeypatch.delenv(registry.FAMILY_MODULES_ENV, raising=False)
    grader, compiles, rows, recorded = every_view()
    builtin = {r.name for r in registry.BUILTIN}
    assert grader == compiles == builtin
    assert not any(name.startswith("toy") for name in rows) and "scale" not in recorded
    ids = listed_ids()
    assert ids and not any(i.startswith("toy/") for i in ids)
    assert {i.split("/")[0] for i in ids} == builtin


def test_the_toy_bench_rows_compute_what_jittor_computes(monkeypatch):
    monkeypatch.setenv(registry.FAMILY_MODULES_ENV, "toy_family")
    ((name, ours, theirs, torch_call),) = bench.call_cases(jt, ops, np, None, False)
    assert torch_call is None
    np.testing.assert_array_equal(ours().numpy(), theirs().numpy())


def use_family_module(tmp_path, monkeypatch, name, text):
    """The family modules are one module ``name`` of source ``text``, written under tmp_path."""
    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(registry.FAMILY_MODULES_ENV, name)


def test_a_grader_only_module_is_graded_but_has_no_bench_rows(tmp_path, monkeypatch):
    """A course's own cases (a module with FAMILY and no RECORD) still grade; they bring no bench rows."""
    use_family_module(tmp_path, monkeypatch, "course_cases", "from toy_family import FAMILY\n")
    (record,) = registry.families()
    assert (record.name, record.grader, record.functions, record.bench) == ("toy", "course_cases", (), "")
    assert [f.name for f in load_families()] == ["toy"] and bench_names() == []


def test_a_module_with_neither_record_nor_family_is_refused(tmp_path, monkeypatch):
    use_family_module(tmp_path, monkeypatch, "not_a_family", "X = 1\n")
    with pytest.raises(ValueError, match="not_a_family defines neither RECORD nor FAMILY"):
        registry.families()


def test_ops_exports_exactly_the_builtin_records_functions_and_layers(monkeypatch):
    monkeypatch.setenv(registry.FAMILY_MODULES_ENV, "toy_family")
    names = [n for r in registry.BUILTIN for n in r.functions + r.layers]
    assert ops.__all__ == names + ["has_cuda"] and "scale" not in registry.exports()
    for r in registry.BUILTIN:
        module = r.implementation()
        for n in r.functions + r.layers:
            assert getattr(ops, n) is getattr(module, n)
        assert all(isinstance(getattr(module, n), type) and issubclass(getattr(module, n), jt.Module)
                   for n in r.layers)


@pytest.mark.parametrize("record", registry.BUILTIN, ids=lambda r: r.name)
def test_each_builtin_record_names_what_exists(record):
    assert record.grader_family().name == record.name
    module = record.implementation()
    assert all(len(getattr(module, v)) > 1 for v in record.variants)
    assert record.snippets and all(os.path.isfile(os.path.join(SNIPPETS, s)) for s in record.snippets)
    assert record.tests and all(os.path.isfile(os.path.join(TESTS, t)) for t in record.tests)
    case_ops = {c.p.get("op") for c in record.grader_family().all_cases()}
    for fn, case_op in record.aliases.items():
        assert fn in record.functions and (case_op is None or case_op in case_ops)
    assert record.bench_calls() is not None
