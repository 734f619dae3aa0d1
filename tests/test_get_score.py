"""get_score.py end to end on the CPU with the toy family: verdicts, isolation of crashes and hangs, outputs,
interruption, the command line's errors and help."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ops.scoring import grading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GET_SCORE = os.path.join(ROOT, "get_score.py")


def toy_env(**extra):
    return dict(os.environ, OPS_SCORING_FAMILY_MODULES="toy_family",
                PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "tests"), ROOT, os.environ.get("PYTHONPATH", "")]),
                **extra)


def toy_run(*args, timeout=600):
    return subprocess.run([sys.executable, GET_SCORE, "--device", "cpu", "--no-torch", "--no-progress", "--no-warm",
                           "--repeats", "2", *args], capture_output=True, text=True, env=toy_env(), timeout=timeout)


def test_grader_end_to_end_with_failures(tmp_path):
    out_json, out_md, tiers = tmp_path / "r.json", tmp_path / "r.md", tmp_path / "tiers.json"
    proc = toy_run("--timeout", "8", "--reference-timeout", "4", "--json", str(out_json), "--markdown",
                   str(out_md), "--save-tiers", str(tiers))
    assert proc.returncode == 1, proc.stderr[-3000:]  # cases failed
    data = json.loads(out_json.read_text())
    by_id = {r["case_id"]: r for r in data["results"]}
    ok = by_id["toy/fwd/ok"]
    assert ok["correct"] and ok["ours"]["ms"] > 0 and ok["checked"] >= 3  # the checked call and timed calls
    assert ok["ours"]["ms"] == pytest.approx(max(ok["ours"]["kernel_ms"], ok["ours"]["wall_ms"]))
    assert ok["ours"]["call_ms"] > 0 and len(ok["ours"]["rounds"]) >= 2
    assert by_id["toy/bwd/ok"]["correct"]
    assert by_id["toy/bwd/ok"]["refs"]["jittor"]["error"] == "skipped: too slow for toys"
    assert by_id["toy/fwd/ok"]["refs"]["jittor"]["error"].endswith("no built-in for toys")
    assert ok["variant"] == "scale" and ok["tiers"] and ok["refs"]["naive"]["ms"] > 0
    assert ok["points"] == grading.points_for(grading.gbps(ok["nbytes"], ok["ours"]["ms"]), ok["tiers"], True)
    assert ok["seconds"] > 0
    wrong = by_id["toy/fwd/wrong"]
    assert not wrong["correct"] and "checked call" in wrong["why"] and "elements off" in wrong["why"]
    assert "kernel exploded" in by_id["toy/fwd/raise"]["why"]
    assert by_id["toy/fwd/crash"]["why"] == "crashed: worker exited with code 3"
    assert by_id["toy/fwd/hang"]["why"].startswith("hung")
    assert by_id["toy/fwd/after"]["correct"]  # the worker was restarted after the hang
    refhang = by_id["toy/fwd/refhang"]  # a reference hung: it is skipped, our verdict and time stand
    assert refhang["correct"] and refhang["ours"]["ms"] > 0
    assert refhang["refs"]["naive"]["error"] == "skipped: no result in 4 s"
    assert data["env"]["copy_gbps"] > 0  # measured by the first worker, kept across restarts
    assert data["env"]["bfloat16_bits"] is True and data["env"]["direct_upload"] is False  # (no GPU: jt.array)
    assert sum(r["points"] for r in data["results"]) == data["summary"]["points"]
    assert all(by_id[c]["points"] == 0 for c in ("toy/fwd/wrong", "toy/fwd/raise", "toy/fwd/crash", "toy/fwd/hang"))
    md = out_md.read_text()
    assert "| toy/fwd/crash |" in md and "WRONG" in md and "points:" in md and "call us" in md
    assert json.loads(tiers.read_text())["tiers_gbps"]["toy/fwd/ok"]
    assert "toy/fwd/ok" in proc.stdout
    assert all(len(line) <= 120 for line in (proc.stdout + proc.stderr).splitlines())
    assert (proc.stdout + proc.stderr).count("PyTorch references off") == 1  # said once, when the run starts
    assert "Traceback" not in proc.stdout + proc.stderr  # the worker's stderr goes to its log, not here


def test_time_budget_reports_unrun_cases(tmp_path):
    out_json = tmp_path / "r.json"
    proc = toy_run("-k", "ok", "--budget", "0", "--json", str(out_json), timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]  # cases not run
    results = json.loads(out_json.read_text())["results"]
    assert len(results) == 2 and all(r["why"] == "not run: time budget spent" and r["points"] == 0 for r in results)


def test_a_terminated_run_still_writes_what_it_measured(tmp_path):
    """`timeout` sends SIGTERM: the finished cases are kept, the rest reported as not run, within seconds."""
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    proc = subprocess.Popen([sys.executable, GET_SCORE, "--device", "cpu", "--no-torch", "--no-progress",
                             "--no-warm", "--repeats", "2", "-k", "fwd/ok,fwd/hang", "--timeout", "600", "--json",
                             str(out_json), "--markdown", str(out_md)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=toy_env())
    deadline = time.monotonic() + 300
    for line in proc.stderr:  # the worker is now asleep in the hanging case
        if line.startswith("toy/fwd/ok: ok") or time.monotonic() > deadline:
            break
    time.sleep(1)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert time.monotonic() - signalled < 10
    assert proc.returncode == 130
    by_id = {r["case_id"]: r for r in json.loads(out_json.read_text())["results"]}
    assert by_id["toy/fwd/ok"]["correct"] and by_id["toy/fwd/ok"]["ours"]["ms"] > 0
    assert by_id["toy/fwd/hang"]["why"] == "not run: interrupted (SIGTERM)"
    assert "NOT RUN" in out_md.read_text()


def test_stored_tiers_missing_cases_and_another_device_are_reported(tmp_path):
    tiers = tmp_path / "tiers.json"
    tiers.write_text(json.dumps({"device": "Some Other GPU", "tiers_gbps": {"toy/fwd/ok": [1e-9, 2e-9, 3e-9]}}))
    out_json = tmp_path / "r.json"
    proc = toy_run("-k", "fwd/ok,fwd/after", "--tiers", str(tiers), "--json", str(out_json))
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = " ".join(proc.stderr.split())  # the warnings are wrapped to the terminal's 120 columns
    assert "'Some Other GPU'" in said and "no tiers for 1 of 2" in said
    by_id = {r["case_id"]: r for r in json.loads(out_json.read_text())["results"]}
    assert by_id["toy/fwd/ok"]["tiers_source"] == "stored" and by_id["toy/fwd/ok"]["points"] == 100
    assert by_id["toy/fwd/after"]["tiers_source"] == "this run (missing in --tiers)"
    assert "missing in --tiers" in proc.stdout


def test_help_answers_without_jittor():
    """--help parses before anything imports jittor (whose first import builds its core for minutes)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", GET_SCORE, "--help"], capture_output=True, text=True,
                          timeout=60, env=toy_env())
    assert proc.returncode == 0 and "--reference-timeout" in proc.stdout and "(default: 600.0)" in proc.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    assert imported and not {m for m in imported if m.split(".")[0] in ("jittor", "ops", "numpy")}


def test_help_states_each_default_once_and_never_none():
    """No "(default: None)" or "(default: False)" after an option whose help says what happens without it."""
    proc = subprocess.run([sys.executable, GET_SCORE, "--help"], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, COLUMNS="120"))
    assert proc.returncode == 0 and proc.stdout.startswith("usage: get_score.py")
    text = " ".join(proc.stdout.split())
    assert "(default: None)" not in text and "(default: False)" not in text
    for option in text.split(" --")[1:]:
        assert option.count("default") <= 1, option
    assert "transpose_add" in text and "broadcast_to" in text and "(default: 5)" in text


def test_the_installed_command_says_its_own_name(capsys):
    """``ops-get-score`` (setup.cfg's console script: get_score.run, as ``python get_score.py`` runs) names itself
    in its usage and errors, as cli.main does when called alone."""
    import importlib.util

    from ops.scoring import args as cli_args
    from ops.scoring.cli import main
    assert cli_args.build_parser("ops-get-score").format_usage().startswith("usage: ops-get-score ")
    spec = importlib.util.spec_from_file_location("get_score", GET_SCORE)
    command = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(command)
    for entry in (main, command.run):
        with pytest.raises(SystemExit) as stop:
            entry(["--op", "no_such_op"])
        assert stop.value.code == 2 and "ops-get-score: error: argument --op" in capsys.readouterr().err


def test_unknown_family_is_an_argument_error():
    proc = subprocess.run([sys.executable, GET_SCORE, "--op", "no_such_op"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "invalid choice: 'no_such_op'" in proc.stderr
    assert "max_pool3d" in proc.stderr and "timex" in proc.stderr and "transpose_add" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_op_takes_the_apis_function_names():
    from ops.scoring.args import resolve_ops
    assert resolve_ops(["transpose_add"]) == (["permute"], {"permute": {"transpose_add"}})
    assert resolve_ops(["transpose", "transpose_add", "timex"]) == (
        ["permute", "timex"], {"permute": {"permute", "transpose_add"}, "timex": None})
    assert resolve_ops(["transpose_add", "permute"]) == (["permute"], {"permute": None})
    assert resolve_ops(["broadcast_to"]) == (["expand_as"], {"expand_as": None})


def listed(*args):
    proc = subprocess.run([sys.executable, GET_SCORE, "--device", "cpu", "--list", *args], capture_output=True,
                          text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.split()


def test_op_by_function_lists_that_functions_cases():
    from ops.scoring.fam_permute import FAMILY
    ta = [c.id for c in FAMILY.all_cases() if "cpu" in c.devices and c.p.get("op") == "transpose_add"]
    assert ta and listed("--op", "transpose_add") == ta
    assert listed("--op", "broadcast_to") == listed("--op", "expand_as")
    everything = listed("--op", "permute")
    assert set(ta) < set(everything) and listed("--op", "transpose", "--op", "transpose_add") == everything


def test_plot_without_matplotlib_fails_before_running():
    pytest.importorskip("tqdm")
    try:
        import matplotlib  # noqa: F401
        pytest.skip("matplotlib is installed")
    except ImportError:
        pass
    started = time.monotonic()
    proc = toy_run("--plot", "x.png", timeout=120)
    assert proc.returncode == 2 and "--plot needs matplotlib" in proc.stderr and "pip install '.[plot]'" in proc.stderr
    assert "toy/fwd/ok" not in proc.stderr and time.monotonic() - started < 60


def test_family_names_of_the_parser_match_the_table():
    from ops import registry
    from ops.scoring.args import FAMILY_NAMES, OP_ALIASES
    assert tuple(r.grader_family().name for r in registry.BUILTIN) == FAMILY_NAMES
    assert OP_ALIASES == {"transpose": ("permute", "permute"), "transpose_add": ("permute", "transpose_add"),
                          "broadcast_to": ("expand_as", None)}


def test_a_reference_that_fails_to_compile_is_one_line_and_its_log_is_kept(tmp_path):
    """jittor's built-in max_pool3d backward does not compile for bfloat16 on the CPU: the table says so in one
    line, the compiler's output is in the JSON, and none of it reaches the terminal."""
    out_json = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, GET_SCORE, "--device", "cpu", "--no-progress", "--no-warm", "--repeats",
                           "1", "--op", "max_pool3d", "--direction", "bwd", "-k", "cpu_k3s2p1_bf16", "--references",
                           "jittor", "--json", str(out_json)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = json.loads(out_json.read_text())["results"][0]["refs"]["jittor"]
    assert ref["error"].startswith("compile failed: ") and "\n" not in ref["error"], ref["error"]
    assert "error" in ref["log"] and "\x1b[" not in ref["log"]
    assert "error:" not in proc.stdout + proc.stderr and "g++" not in proc.stdout + proc.stderr


def test_a_module_that_does_not_import_is_a_usage_error_of_one_line(tmp_path):
    out_json = tmp_path / "r.json"
    for warm in ((), ("--no-warm",)):  # found by the compile pass's worker, or by the first case's
        proc = subprocess.run([sys.executable, GET_SCORE, "--device", "cpu", "--no-torch", "--no-progress", *warm,
                               "-k", "ok", "--impl", "no_such_module_here", "--json", str(out_json)],
                              capture_output=True, text=True, env=toy_env(), timeout=300)
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout
        assert proc.stderr.count("\n") == 1 and "--impl no_such_module_here does not import" in proc.stderr
        assert "ModuleNotFoundError" in proc.stderr and not out_json.exists()


def test_device_cuda_without_cuda_is_a_usage_error_of_one_line(tmp_path):
    """The parent imports no jittor when --device is given: the worker finds that jittor has no CUDA, before any
    case runs, found by the compile pass's worker or by the first case's."""
    from ops import has_cuda
    if has_cuda():
        pytest.skip("jittor has CUDA here")
    for warm in ((), ("--no-warm",)):
        proc = subprocess.run([sys.executable, GET_SCORE, "--device", "cuda", "--no-torch", "--no-progress", *warm,
                               "--op", "permute", "-k", "021_f16", "--json", str(tmp_path / "r.json")],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout
        assert proc.stderr.count("\n") == 1 and "--device cuda, but jittor has no CUDA here" in proc.stderr, \
            proc.stderr[-2000:]
        assert not (tmp_path / "r.json").exists()


def test_exit_status_all_correct_and_under_fail_under(tmp_path):
    ok = toy_run("-k", "fwd/ok,fwd/after", "--references", "naive")
    assert ok.returncode == 0, ok.stderr[-3000:]
    under = toy_run("-k", "fwd/ok,fwd/after", "--references", "naive", "--fail-under", "201")
    assert under.returncode == 3, under.stderr[-3000:]


def test_a_usage_error_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, GET_SCORE, "--repeats", "0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--repeats must be at least 1" in proc.stderr


@pytest.mark.parametrize("content", [None, "", "[1, 2]", '{"tiers_gbps": {"toy/fwd/ok": [1, 2]}}'])
@pytest.mark.parametrize("impls", [["ops"], ["ops", "class_broken"]])
def test_a_tiers_file_that_cannot_be_read_is_a_usage_error(tmp_path, content, impls):
    """Before any worker starts, a class's children included: not a traceback per submission."""
    tiers = tmp_path / "tiers.json"
    if content is not None:
        tiers.write_text(content)
    proc = subprocess.run([sys.executable, GET_SCORE, "--device", "cpu", "--tiers", str(tiers), "--impl", *impls,
                           "--class-dir", str(tmp_path / "class")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and f"--tiers {tiers}" in proc.stderr, proc.stderr
    assert not (tmp_path / "class").exists()


def test_an_ops_module_in_the_working_directory_is_ignored_in_one_line(tmp_path):
    """A file ops.py where the grader runs would shadow the grader's own package in its workers: it is ignored
    (and said so), the cases run as ever."""
    (tmp_path / "ops.py").write_text("raise SystemExit('the wrong ops')\n")
    out_json = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, GET_SCORE, "--device", "cpu", "--no-torch", "--no-progress", "--no-warm",
                           "--repeats", "1", "-k", "fwd/ok", "--references", "naive", "--json", str(out_json)],
                          capture_output=True, text=True, env=toy_env(), timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    notes = [line for line in proc.stderr.splitlines() if "ops.py" in line]
    assert len(notes) == 1 and "ignored" in notes[0]
    assert json.loads(out_json.read_text())["results"][0]["correct"]


def test_a_run_that_measured_no_tier_writes_no_tiers_file(tmp_path):
    """An empty tiers file would grade every later run against nothing (a class's children time no reference):
    a run whose references were all left out (or that was stopped before any) writes none, and says so."""
    tiers = tmp_path / "tiers.json"
    proc = toy_run("-k", "toy/fwd/ok", "--references", "", "--save-tiers", str(tiers))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not tiers.exists()
    assert f"no tier was measured, so --save-tiers {tiers} is not written" in proc.stderr
