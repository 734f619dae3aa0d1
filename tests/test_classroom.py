"""Class grading (ops/scoring/classroom.py): shards, GPUs, rows from the grader's JSON, the class reports."""
import csv
import json

import pytest

from ops.scoring import classroom as C


def report(impl, points, whys=(), tiers="t.json", sha="a" * 40, device="NVIDIA H100"):
    """A grader JSON of one submission: one case per entry of ``points``, wrong where ``whys`` says why."""
    results = []
    for i, p in enumerate(points):
        why = whys[i] if i < len(whys) else ""
        results.append({"case_id": f"{'permute' if i % 2 else 'max_pool3d'}/fwd/c{i}", "points": p,
                        "correct": not why, "why": why})
    return {"env": {"name": device}, "meta": {"impl": impl, "tiers": tiers, "tiers_sha1": sha, "seconds": 12.5},
            "results": results}


def test_shards_split_a_class_disjointly():
    impls = [f"s{i}" for i in range(10)]
    assert C.parse_shard(None) == (0, 1) and C.parse_shard("2/4") == (2, 4) and C.parse_shard(" 0 / 1 ") == (0, 1)
    parts = [C.shard(impls, i, 3) for i in range(3)]
    assert sorted(sum(parts, [])) == sorted(impls) and parts[1] == ["s1", "s4", "s7"]
    for bad in ("4/4", "1/0", "a/b", "1", "-1/3"):
        with pytest.raises(ValueError, match="--shard"):
            C.parse_shard(bad)


def test_gpus_default_to_every_visible_one():
    assert C.parse_gpus(None, 2) == [0, 1] and C.parse_gpus(None, 0) == []
    assert C.parse_gpus("1", 2) == [1] and C.parse_gpus("1,0", 2) == [1, 0]
    for bad in ("2", "0,0", "x", ""):
        with pytest.raises(ValueError, match="--gpus"):
            C.parse_gpus(bad, 2)


def test_row_status_from_the_cases():
    ok = C.row_from_json("a", report("a", [100, 70, 40]), 3.0)
    assert (ok.status, ok.points, ok.max_points, ok.correct, ok.cases) == ("ok", 210, 300, 3, 3)
    assert ok.families == {"max_pool3d": 140, "permute": 70}
    wrong = C.row_from_json("b", report("b", [100, 0], ["", "values differ at 3 of 10 elements"]), 3.0)
    assert wrong.status == "wrong" and wrong.correct == 1 and "values differ" in wrong.why
    for why in ("crashed: worker exited with code -11", "hung: no result in 600 s (in timing)", "raised: boom"):
        row = C.row_from_json("c", report("c", [0, 0], ["values differ", why]), 3.0)
        assert row.status == "crashed", why


def test_row_of_a_run_without_its_json(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("get_score.py: --impl x cannot be imported: ModuleNotFoundError: No module named 'x'\n")
    missing = str(tmp_path / "x.json")
    row = C.row_from_run("x", C.IMPORT_ERROR_EXIT, missing, str(log), 1.0, False)
    assert row.status == "import error" and "cannot be imported" in row.why and row.cases == 0
    assert C.row_from_run("x", -9, missing, str(log), 1.0, False).status == "crashed"
    assert C.row_from_run("x", None, missing, str(log), 99.0, True).status == "timeout"
    (tmp_path / "x.json").write_text(json.dumps(report("x", [100])))  # a partial report of a killed run
    assert C.row_from_run("x", -15, str(tmp_path / "x.json"), str(log), 99.0, True).status == "timeout"
    assert C.row_from_run("x", 0, str(tmp_path / "x.json"), str(log), 9.0, False).status == "ok"


def test_csv_and_markdown(tmp_path):
    rows = [C.row_from_json("low", report("low", [40, 0], ["", "values differ"]), 5.0),
            C.row_from_json("high", report("high", [100, 100]), 7.0),
            C.row_from_run("gone", C.IMPORT_ERROR_EXIT, str(tmp_path / "none.json"), str(tmp_path / "none.log"), 0.2,
                           False)]
    path = tmp_path / "class.csv"
    C.write_csv(str(path), rows)
    with open(path) as f:
        table = list(csv.reader(f))
    assert tuple(table[0]) == C.CSV_COLUMNS
    assert table[1:] == [["low", "40", "200", "1", "2", "5.0", "wrong"], ["high", "200", "200", "2", "2", "7.0", "ok"],
                         ["gone", "0", "0", "0", "0", "0.2", "import error"]]
    md = C.render_markdown(rows, "class")
    lines = [line for line in md.splitlines() if line.startswith("| ")]
    assert "max_pool3d" in lines[0] and "permute" in lines[0]
    assert [line.split(" | ")[1] for line in lines[1:]] == ["`high`", "`low`", "`gone`"]  # by points
    assert all(len(line) <= 120 for line in C.render_terminal(rows).splitlines())


def test_from_json_refuses_mixed_tiers_devices_and_duplicates(tmp_path):
    def write(name, data):
        path = tmp_path / name
        path.write_text(json.dumps(data))
        return str(path)
    a, b = write("a.json", report("a", [100])), write("b.json", report("b", [40]))
    rows = C.rows_from_json_files([a, b])
    assert [r.impl for r in rows] == ["a", "b"]
    with pytest.raises(ValueError, match="different tiers"):
        C.rows_from_json_files([a, write("c.json", report("c", [70], sha="b" * 40))])
    with pytest.raises(ValueError, match="different devices"):
        C.rows_from_json_files([a, write("d.json", report("d", [70], device="NVIDIA H200"))])
    with pytest.raises(ValueError, match="more than one file grades a"):
        C.rows_from_json_files([a, write("a2.json", report("a", [70]))])


def test_children_get_the_class_options(tmp_path):
    import argparse
    args = argparse.Namespace(device="cpu", op=["permute"], keyword="f16", direction=None, references=["naive"],
                              no_torch=True, seed=3, timeout=60.0, reference_timeout=60.0, repeats=5, no_warm=False)
    argv = C.child_argv(args, "pkg.mod", "t.json", str(tmp_path))
    assert argv[argv.index("--impl") + 1] == "pkg.mod" and argv[argv.index("--tiers") + 1] == "t.json"
    assert argv[argv.index("--json") + 1] == str(tmp_path / "pkg.mod.json")
    for flag, value in (("--device", "cpu"), ("--op", "permute"), ("-k", "f16"), ("--seed", "3"),
                        ("--references", "naive")):
        assert argv[argv.index(flag) + 1] == value
    assert "--no-torch" in argv and "--no-warm" not in argv and "--direction" not in argv
    args.references = None  # by default a child against the tiers times no reference
    argv = C.child_argv(args, "pkg.mod", "t.json", str(tmp_path))
    assert argv[argv.index("--references") + 1] == ""
    assert "--references" not in C.child_argv(args, "ops", None, str(tmp_path), save_tiers="t.json")


def test_cpu_lists_parse_and_split_by_physical_core(monkeypatch):
    from ops.scoring import args as A
    assert A.parse_cpus(f"{A.allowed_cpus()[0]}") == [A.allowed_cpus()[0]]
    for bad in ("a", "3-1", "0,,1", str(max(A.allowed_cpus()) + 1)):
        with pytest.raises(ValueError, match="--cpus"):
            A.parse_cpus(bad)
    assert A.format_cpus([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    # 8 hardware threads of 4 cores, numbered as Linux numbers them (core i's second thread is i + 4)
    monkeypatch.setattr(A, "_siblings", lambda cpu: f"{cpu % 4},{cpu % 4 + 4}")
    assert A.split_cpus(range(8), 2) == [[0, 1, 4, 5], [2, 3, 6, 7]]  # never one core's two threads apart
    assert A.split_cpus(range(8), 3) == [[0, 1, 4, 5], [2, 6], [3, 7]]
    assert A.split_cpus(range(8), 9) == [[0, 4], [1, 5], [2, 6], [3, 7]]  # no empty share


def test_cpus_pins_the_run_and_the_processes_it_starts():
    import subprocess
    import sys
    from ops.scoring import args as A
    one = A.allowed_cpus()[-1]
    code = ("import os, subprocess, sys; from ops.scoring.args import parse_args; parse_args(['--cpus', sys.argv[1]]);"
            "print(sorted(os.sched_getaffinity(0)), subprocess.run([sys.executable, '-c', 'import os; "
            "print(sorted(os.sched_getaffinity(0)))'], capture_output=True, text=True).stdout.strip())")
    out = subprocess.run([sys.executable, "-c", code, str(one)], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == [f"[{one}]", f"[{one}]"], out.stderr


def test_a_class_on_several_gpus_gives_each_child_its_share_of_the_cores(tmp_path, monkeypatch):
    import argparse
    from ops.scoring import args as A
    monkeypatch.setattr(C, "allowed_cpus", lambda: list(range(8)))
    monkeypatch.setattr(A, "_siblings", lambda cpu: str(cpu))
    grader = C.Grader(argparse.Namespace(), str(tmp_path), [0, 1], None)
    assert grader.cpu_shares == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert C.Grader(argparse.Namespace(), str(tmp_path), [0], None).cpu_shares == []  # one GPU: the whole host
    args = argparse.Namespace(device="cuda", references=None)
    argv = C.child_argv(args, "m", "t.json", str(tmp_path), cpus=grader.cpu_shares[1])
    assert argv[argv.index("--cpus") + 1] == "4-7"
    assert "--cpus" not in C.child_argv(args, "m", "t.json", str(tmp_path))


def _run_class(tmp_path, *argv, env=None):
    """get_score.py on the CPU's f16 permute cases; ``env``: variables to set (PYTHONPATH goes after the root's)."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    extra = dict(env or {})
    path = os.pathsep.join([root, os.path.join(root, "tests"), extra.pop("PYTHONPATH", ""),
                            os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, **extra)
    return subprocess.run([sys.executable, os.path.join(root, "get_score.py"), "--device", "cpu", "--op", "permute",
                           "-k", "f16", "--no-torch", *argv], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=900)


def test_an_interrupted_class_reports_the_submissions_it_finished(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.path.join(root, "tests"),
                                                       os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, os.path.join(root, "get_score.py"), "--device", "cpu", "--op", "permute",
                             "-k", "f16", "--direction", "fwd", "--no-torch", "--impl", "ops", "class_hang", "class_slow", "--csv",
                             str(tmp_path / "c.csv"), "--class-dir", str(tmp_path / "class")],
                            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if line.startswith("ops: "):  # ops graded; class_hang starts next and never finishes
                break
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130
    with open(tmp_path / "c.csv") as f:
        assert [r["impl"] for r in csv.DictReader(f)] == ["ops"]
    assert "interrupted" in (tmp_path / "class" / "class.md").read_text()
    assert not (tmp_path / "class" / "class_slow.log").exists()  # nothing starts after the signal


def marked_processes(mark):
    """The live processes whose environment holds ``mark`` (all that a run given it started): [(pid, argv)]."""
    import os
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark.encode() not in f.read():
                    continue
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                found.append((int(pid), f.read().replace(b"\0", b" ").decode(errors="replace")))
        except OSError:
            pass
    return found


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="reads /proc")
def test_a_killed_class_grader_leaves_no_process(tmp_path):
    """SIGKILL, which the class grader cannot handle, while a submission's worker hangs in its import: the child
    grader is sent SIGTERM by the kernel (its parent ended), stops its worker and exits."""
    import os
    import signal
    import subprocess
    import sys
    import time
    import uuid
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    mark = "class-test-" + uuid.uuid4().hex
    env = dict(os.environ, CLASS_TEST_MARK=mark,
               PYTHONPATH=os.pathsep.join([root, os.path.join(root, "tests"), os.environ.get("PYTHONPATH", "")]))
    # jittor's SIGCHLD handler ends this process when a child dies of a signal
    handler = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    proc = subprocess.Popen([sys.executable, os.path.join(root, "get_score.py"), "--device", "cpu", "--op", "permute",
                             "-k", "cpu_10_int8", "--direction", "fwd", "--no-torch", "--references", "naive",
                             "--impl", "class_hang", "--class-dir", str(tmp_path / "class")],
                            env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not any("class_hang" in argv and "--job" in argv for _, argv in marked_processes(mark)):
            assert proc.poll() is None and time.monotonic() < deadline, "no worker importing class_hang"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 60
        while marked_processes(mark) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marked_processes(mark) == []
    finally:
        for pid, _ in marked_processes(mark):
            os.kill(pid, signal.SIGKILL)
        signal.signal(signal.SIGCHLD, handler)


ORPHAN_SCRIPT = """
import os, sys, time
from ops.scoring import classroom as C
# a child grader killed before it stopped its worker, which runs on in a session of its own
C.child_argv = lambda *a, **k: [sys.executable, "-c", "import os, time\\nif os.fork() == 0:\\n    os.setsid()\\n"
                                "    time.sleep(300)\\nos._exit(9)"]
grader = C.Grader(object(), sys.argv[1], [None], None)
row = grader._run("orphaning", None, None)
print(grader.subreaper, row.status)
"""


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="reads /proc")
def test_what_a_killed_child_grader_left_is_killed_as_it_ends(tmp_path):
    import inspect
    import os
    import subprocess
    import sys
    import uuid
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    mark = "class-test-" + uuid.uuid4().hex
    env = dict(os.environ, CLASS_TEST_MARK=mark, OPS_GRADER_PARENT="1",  # as get_score.py: no jittor in it
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    script = ORPHAN_SCRIPT + f"print(len([p for p, _ in marked_processes({mark!r}) if p != os.getpid()]))"
    script = "\n".join([inspect.getsource(marked_processes), script])
    try:
        proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        subreaper, left = proc.stdout.split("\n")[:2]
        assert subreaper == "True crashed" and left == "0"
    finally:
        for pid, _ in marked_processes(mark):
            os.kill(pid, 9)


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="reads /proc")
def test_a_submission_that_kills_its_grader_costs_itself_only(tmp_path):
    """class_killer sends SIGKILL to the process that imports it (refused where Landlock scopes signals, Linux
    6.12+), then sleeps: its row is not ok, the next submission is graded, and no process of the run is left."""
    import os
    import uuid
    mark = "class-test-" + uuid.uuid4().hex
    try:
        proc = _run_class(tmp_path, "--impl", "class_killer", "ops", "--direction", "fwd", "--csv",
                          str(tmp_path / "c.csv"), "--class-dir", str(tmp_path / "class"),
                          env={"CLASS_TEST_MARK": mark})
        left = marked_processes(mark)
    finally:
        for pid, _ in marked_processes(mark):
            os.kill(pid, 9)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "c.csv") as f:
        rows = {r["impl"]: r for r in csv.DictReader(f)}
    assert rows["class_killer"]["status"] != "ok" and rows["ops"]["status"] == "ok"
    assert left == []


def test_a_hanging_submission_times_out_alone(tmp_path):
    started = __import__("time").monotonic()
    proc = _run_class(tmp_path, "--impl", "class_hang", "--submission-timeout", "10", "--csv", str(tmp_path / "c.csv"),
                      "--class-dir", str(tmp_path / "class"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "c.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert row["impl"] == "class_hang" and row["status"] == "timeout" and 10 <= float(row["seconds"]) < 60
    assert __import__("time").monotonic() - started < 300


def test_a_class_on_the_cpu(tmp_path):
    """The command of the class-grading bar: ops and a wrong module (and one that does not import), two rows of
    the CSV's columns besides, ops all correct, the others not; every submission's reports in the class folder."""
    out = tmp_path / "class"
    proc = _run_class(tmp_path, "--impl", "ops", "class_wrong", "class_broken", "--csv", str(tmp_path / "class.csv"),
                      "--class-dir", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "class.csv") as f:
        rows = {r["impl"]: r for r in csv.DictReader(f)}
    assert list(rows) == ["ops", "class_wrong", "class_broken"]
    assert rows["ops"]["status"] == "ok" and rows["ops"]["correct"] == rows["ops"]["cases"] != "0"
    assert int(rows["ops"]["max_points"]) == 100 * int(rows["ops"]["cases"])  # (its points are timing: not tested)
    assert rows["class_wrong"]["status"] == "wrong" and rows["class_wrong"]["correct"] == "0"
    assert rows["class_broken"]["status"] == "import error" and rows["class_broken"]["cases"] == "0"
    for name in ("ops.json", "ops.md", "class_wrong.json", "class_wrong.md", "class_broken.log", "tiers.json",
                 "class.md"):
        assert (out / name).exists(), name
    assert all(len(line) <= 120 for line in proc.stdout.splitlines())

    def rounds(impl):
        with open(out / f"{impl}.json") as f:
            return sum(len(r["ours"]["rounds"]) for r in json.load(f)["results"])
    assert 0 < rounds("class_wrong") < rounds("ops")  # a case judged wrong stops timing early


def test_no_grader_parent_imports_jittor(tmp_path):
    """With --device given, get_score.py's process and a class's children make inputs and judge without jittor
    (its import takes 6-7 s on a GPU machine, under a lock over jittor's whole cache): a start-up hook that fails
    every jittor import where OPS_GRADER_PARENT is set (tests/parent_without_jittor) leaves a run and a class
    graded as usual; only the workers, started without the variable, import it."""
    import os
    hook = os.path.join(os.path.dirname(os.path.abspath(__file__)), "parent_without_jittor")
    env = {"PYTHONPATH": os.pathsep.join([hook, os.environ.get("PYTHONPATH", "")]), "OPS_GRADER_PARENT": "1"}
    proc = _run_class(tmp_path, "--direction", "fwd", "--impl", "ops", "class_wrong", "--csv",
                      str(tmp_path / "c.csv"), "--class-dir", str(tmp_path / "class"), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "c.csv") as f:
        rows = {r["impl"]: r for r in csv.DictReader(f)}
    assert rows["ops"]["status"] == "ok" and rows["ops"]["correct"] == rows["ops"]["cases"] != "0"
    assert rows["class_wrong"]["status"] == "wrong"
    solo = _run_class(tmp_path, "--direction", "fwd", "--json", str(tmp_path / "solo.json"), env=env)
    assert solo.returncode == 0, solo.stderr[-3000:]
    listed = _run_class(tmp_path, "--direction", "fwd", "--list", env=env)
    assert listed.returncode == 0 and listed.stdout.split()


def test_the_parents_threads_scale_with_the_cores_it_may_use(monkeypatch):
    from ops.scoring import budget
    for cores, want in ((32, 5), (16, 5), (8, 2), (1, 1)):
        monkeypatch.setattr(budget.os, "sched_getaffinity", lambda pid, n=cores: set(range(n)))
        assert budget.scaled(budget.JUDGES) == want
    assert budget.scaled(16) == 1  # (1 core)


def test_a_class_against_tiers_missing_a_selected_case_is_refused(tmp_path):
    """The children time no reference, so a case without a stored tier would give every submission 0 points:
    the run stops with a usage error before any child starts (an interrupted --save-tiers run leaves such a
    file)."""
    ids = _run_class(tmp_path, "--direction", "fwd", "--list").stdout.split()
    assert len(ids) >= 2
    tiers = tmp_path / "tiers.json"
    for held in ({}, {i: [1.0, 2.0, 3.0] for i in ids[1:]}):
        tiers.write_text(json.dumps({"device": "cpu", "tiers_gbps": held}))
        proc = _run_class(tmp_path, "--direction", "fwd", "--impl", "ops", "class_slow", "--tiers", str(tiers),
                          "--class-dir", str(tmp_path / "class"))
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert f"no tiers for {len(ids) - len(held)} of the {len(ids)} selected" in proc.stderr
        assert ids[0] in proc.stderr
        assert not (tmp_path / "class" / "ops.log").exists()
