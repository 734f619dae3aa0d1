"""The grader's compile pass on the CPU with the toy family: a worker that dies in a batch costs that batch
only, the cases a finished pass built are remembered for the same code, kernels that do not compile are remembered."""
import json
import os

import pytest

import ops
from ops._jittor import jt
from ops.scoring import compile_pass, compile_record
from ops.scoring.compile_driver import warm_compile


def forget(ids):
    """Drop ``ids`` from the kernel folder's records of cases built (an earlier test run may have left them)."""
    path = os.path.join(jt.flags.cache_path, "jit", compile_record.COMPILED_FILE)
    code = compile_pass.fingerprint(ops)
    if os.path.exists(path):
        with open(path) as f:
            known = json.load(f)
        for key, kept in known.items():
            if key.partition("/")[0] == code and isinstance(kept, dict):
                kept["cases"] = [c for c in kept["cases"] if c not in ids]
        with open(path, "w") as f:
            json.dump(known, f)


def test_the_parent_finds_the_kernel_folder_and_version_without_jittor(tmp_path, monkeypatch):
    """compile_record's answers from jittor_utils are jittor's own on this machine's build; for CUDA, the
    cu* folder whose record was written last, none where no pass wrote one."""
    import jittor_utils

    from ops.scoring import compile_record
    assert compile_record.jittor_version() == jt.__version__
    if not jt.has_cuda:
        assert compile_record.kernel_folder("cpu") == os.path.join(jt.flags.cache_path, "jit")
    monkeypatch.setattr(jittor_utils, "cache_path", str(tmp_path))
    assert compile_record.kernel_folder("cuda") is None
    for i, name in enumerate(("cu13.0_sm_90", "cu12.8_sm_80")):
        folder = tmp_path / name / "jit"
        folder.mkdir(parents=True)
        (folder / compile_record.COMPILED_FILE).write_text("{}")
        os.utime(folder / compile_record.COMPILED_FILE, (1e9 + i, 1e9 + i))
    assert compile_record.kernel_folder("cuda") == str(tmp_path / "cu12.8_sm_80" / "jit")


def test_a_worker_that_dies_in_a_batch_costs_that_batch_only(toy_worker_env, tmp_path):
    ids = ["toy/fwd/ok", "toy/fwd/crash", "toy/fwd/after"]
    forget(ids)
    done = warm_compile(ids, device="cpu", impl="ops", budget_s=300, limit_bytes=1, scratch=str(tmp_path))
    assert done["crashed"] == [["toy/fwd/crash"]]  # one case per batch (limit_bytes=1): only its batch is lost
    assert [b["items"] for b in done["batches"]] == [1, 1]  # ok, then after, in a second worker
    assert not done["finished"]


def test_cases_built_before_are_not_built_again(toy_worker_env, tmp_path):
    ids = ["toy/fwd/ok", "toy/bwd/ok", "toy/fwd/after"]
    forget(ids)

    def warm(some):
        return warm_compile(some, device="cpu", impl="ops", budget_s=300, limit_bytes=1 << 30, scratch=str(tmp_path))

    first = warm(ids[:2])
    assert first["finished"] and first["graphs"] >= 2 and "skipped" not in first
    batch = first["batches"][0]
    assert batch["syncs"] >= 2 and batch["failed_syncs"] == 0 and batch["failed_syncs_s"] == 0.0
    assert warm(ids[:2])["skipped"].startswith("compiled before")
    more = warm(ids)  # one case not built yet: only its graphs are
    assert more["finished"] and "skipped" not in more and 1 <= more["graphs"] < first["graphs"]
    assert warm(ids[1:])["skipped"].startswith("compiled before")


def test_the_parent_skips_the_pass_without_a_worker_where_every_case_was_built(toy_worker_env, tmp_path,
                                                                              monkeypatch):
    """The parent finds the graded module without importing it and fingerprints it as the worker does: after a
    finished pass the next run starts no worker; a module it cannot place (dotted, missing) leaves the question
    to the worker."""
    from ops.scoring import compile_driver
    ids = ["toy/fwd/ok", "toy/bwd/ok"]
    forget(ids + ["toy/fwd/after"])
    assert not compile_driver.compiled_before(ids, "ops", None, "cpu")
    assert warm_compile(ids, device="cpu", impl="ops", budget_s=300, limit_bytes=1 << 30,
                        scratch=str(tmp_path))["finished"]
    assert compile_driver.compiled_before(ids, "ops", None, "cpu")
    assert compile_driver.compiled_before(ids, "ops", [], "cpu")
    assert not compile_driver.compiled_before(ids + ["toy/fwd/after"], "ops", None, "cpu")
    assert not compile_driver.compiled_before(ids, "ops.scoring", None, "cpu")
    assert not compile_driver.compiled_before(ids, "no_such_module_here", None, "cpu")
    assert compile_pass.code_fingerprint("ops", ops.__file__) == compile_pass.fingerprint(ops)
    assert compile_pass.code_fingerprint("toy_family", "") != compile_pass.fingerprint(ops)

    def no_worker(**kwargs):
        raise AssertionError("a worker was started")
    monkeypatch.setattr(compile_driver, "Worker", no_worker)
    skipped = warm_compile(ids, device="cpu", impl="ops", budget_s=300, limit_bytes=1 << 30, scratch=str(tmp_path))
    assert skipped["finished"] and skipped["graphs"] == 0 and skipped["skipped"].startswith("compiled before")


def test_a_run_without_references_builds_and_remembers_ours_alone(toy_worker_env, tmp_path):
    """A run that times no reference (a class child against stored tiers) builds only the graded module's graphs
    and remembers them as such: a later run with the references builds theirs, and a run without them after a
    full pass builds nothing."""
    ids = ["toy/fwd/ok", "toy/bwd/ok"]
    forget(ids)

    def warm(references):
        return warm_compile(ids, device="cpu", impl="ops", budget_s=300, limit_bytes=1 << 30, scratch=str(tmp_path),
                            references=references)

    alone = warm([])
    assert alone["finished"] and "skipped" not in alone
    full = warm(["naive", "jittor"])
    assert "skipped" not in full and full["graphs"] > alone["graphs"]
    assert warm([])["skipped"].startswith("compiled before")
    assert warm(["naive"])["skipped"].startswith("compiled before")


def test_failing_compiles_are_remembered_by_key(toy_worker_env):
    from ops.scoring.spec import case
    c = case("toy", "memo", "fwd", [(4,)], "float16", devices=("cpu",), behaviour="ok")
    key = compile_pass.compile_key(c, "jittor")
    assert key == "toy/jittor/float16/fwd"
    compile_pass.remember_failed_compile(key, c.id, "RuntimeError: Compile operator(1/1) failed")
    compile_pass.remember_failed_compile(key, "toy/fwd/other", "another")  # the first failure stays
    assert compile_pass.failed_compiles()[key]["case"] == c.id
    assert compile_pass.is_compile_failure(RuntimeError("Compile fused operator(3/9) failed: ..."))
    assert not compile_pass.is_compile_failure(RuntimeError("size of var should be larger than kernel_size"))


def test_each_case_is_built_with_its_own_familys_forward():
    """A batch builds its graphs after the loop that collected them has moved on: each case's graph must still
    come from its own family (a late-bound closure built every case of a batch with the last family's)."""
    import toy_family
    from ops.scoring.spec import case

    built = []

    class Recording(toy_family.ToyFamily):
        def forward(self, c, api, xs):
            built.append((self.name, c.family))
            return super().forward(c, api, xs)

    families = [Recording(name, [case(name, "ok", "fwd", [(64,)], "float32", devices=("cpu",), behaviour="ok")])
                for name in ("toy_a", "toy_b", "toy_c")]
    jt.flags.use_cuda = 0
    graphs = compile_pass.warm_graphs([(f, f.cases[0]) for f in families], ops, limit_bytes=1 << 30)
    assert sorted(built) == [("toy_a", "toy_a"), ("toy_b", "toy_b"), ("toy_c", "toy_c")]
    assert graphs == 6  # ours and the naive composite of each; the toys have no jittor built-in


def test_placeholders_and_handed_back_outputs_are_what_the_worker_makes():
    """Placeholders have the inputs' shapes and dtypes (bfloat16 made from float32, as to_jittor makes it:
    that cast compiles too); ours' bfloat16 outputs get the copy of their bits the worker hands them back as."""
    import numpy as np
    from ops.scoring.harness import InputSet

    jt.flags.use_cuda = 0
    s = InputSet.placeholders([np.zeros((3, 4), np.float32), np.zeros((5,), np.int8)], ["bfloat16", "int8"],
                              [np.zeros((2, 2), np.float32)], "bfloat16")
    assert [(tuple(v.shape), str(v.dtype)) for v in s.xs + s.dys] == [((3, 4), "bfloat16"), ((5,), "int8"),
                                                                      ((2, 2), "bfloat16")]
    assert s.arrays == [] and s.grad_arrays == []
    outs = [jt.zeros((2, 3), "bfloat16"), jt.zeros((4,), "float32")]
    back = compile_pass.handed_back(outs)
    assert back[:2] == outs and len(back) == 3 and str(back[2].dtype) == "uint16" and tuple(back[2].shape) == (6,)


def test_the_grader_kernels_of_the_timed_calls_are_built_for_every_varied_dtype(monkeypatch):
    """The copies each timed call gets (``fresh``): one kernel per dtype the calls vary and per count of copies, in
    the pass rather than in a case's warm-up; the samples' kernels only where outputs are sampled on the device."""
    from ops.scoring import fresh
    from ops.scoring.families import load_families

    by_id = {c.id: (f, c) for f in load_families() for c in f.all_cases()}
    items = [by_id[i] for i in ("permute/fwd/cpu_10_int8", "max_pool3d/bwd/cpu_k3s2p1_bf16", "timex/fwd/cpu_B3_C4_T37")]
    made = []
    monkeypatch.setattr(fresh, "fresh_copies", lambda x, dtype, keys, first, count: made.append((dtype, count)) or [x])
    jt.flags.use_cuda = 0
    graphs = compile_pass.grader_graphs(items)
    assert sorted(made) == [(d, n) for d in ("bfloat16", "float32", "int8") for n in (1, fresh.MAX_COPIES)]
    assert len(graphs) == len(made)  # no sampling kernel on the CPU: its outputs are read where they lie


def test_failing_groups_are_bisected_and_their_syncs_counted(monkeypatch):
    """A sync that fails is retried in halves down to the failing group, which is reported; the stats count
    every sync and the failed ones."""
    bad = {"b", "d"}
    synced = []

    def fake_sync(vs):
        synced.append(list(vs))
        if bad & set(vs):
            raise RuntimeError("Compile operator(1/1) failed")
    monkeypatch.setattr(compile_pass.jt, "sync", fake_sync)
    failures, stats = [], compile_pass.SyncStats()
    groups = [(k, f"case-{k}", [k]) for k in "abcdef"]
    compile_pass._sync_groups(groups, lambda key, case_id, err: failures.append(key), stats)
    assert failures == ["b", "d"]
    assert stats.syncs == len(synced) and stats.failed == sum(1 for vs in synced if bad & set(vs))
    assert stats.failed >= 3 and stats.figures()["failed_syncs"] == stats.failed


@pytest.mark.parametrize("error, remembered", [
    ('Compile operator(1/1) failed: more than one instance of overloaded function "jittor::max"', True),
    ("Compile operator(1/1) failed: something else", False),  # not the known bug: the batches find out
    (None, False),  # the probe compiles: nothing assumed
])
def test_a_known_failure_is_probed_once_and_skips_its_keys(monkeypatch, tmp_path, error, remembered):
    from ops.scoring.fam_pool3d import FAMILY as pool

    monkeypatch.setattr(compile_pass, "_folder", lambda: str(tmp_path))
    synced = []

    def fake_sync(vs):
        synced.append(len(vs))
        if error:
            raise RuntimeError(error)
    monkeypatch.setattr(compile_pass.jt, "sync", fake_sync)
    jt.flags.use_cuda = 0
    items = [(pool, c) for c in pool.all_cases() if c.dtype in ("float16", "bfloat16") and "cpu" in c.devices]
    keys = {compile_pass.compile_key(c, "jittor") for _, c in items}
    assert keys & set(pool.known_compile_failures()[0].keys)
    failed, stats = {}, compile_pass.SyncStats()
    records = compile_pass.probe_known_failures(items, failed, stats)
    assert len(records) == 1 and records[0]["failed"] == remembered and 1 <= len(synced) <= 2  # inputs, graph
    named = keys & set(pool.known_compile_failures()[0].keys)
    assert set(failed) == (named if remembered else set())
    assert set(compile_pass.failed_compiles()) == set(failed)
    if remembered:  # known now: no second probe
        assert compile_pass.probe_known_failures(items, compile_pass.failed_compiles(), stats) == []
