"""get_score.py end to end on the CPU with the toy family: verdicts, isolation of crashes and hangs, outputs."""
import json
import os
import subprocess
import sys

from ops.scoring import grading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_grader_end_to_end_with_failures(tmp_path):
    env = dict(os.environ, OPS_SCORING_FAMILY_MODULES="toy_family",
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "tests"), ROOT, os.environ.get("PYTHONPATH", "")]))
    out_json, out_md, tiers = tmp_path / "r.json", tmp_path / "r.md", tmp_path / "tiers.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "get_score.py"), "--device", "cpu", "--no-torch",
                           "--timeout", "20", "--no-progress", "--json", str(out_json), "--markdown", str(out_md),
                           "--save-tiers", str(tiers)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out_json.read_text())
    by_id = {r["case_id"]: r for r in data["results"]}
    assert by_id["toy/fwd/ok"]["correct"] and by_id["toy/fwd/ok"]["ours"]["ms"] > 0
    assert by_id["toy/bwd/ok"]["correct"]
    assert by_id["toy/bwd/ok"]["refs"]["jittor"]["error"] == "skipped: too slow for toys"
    assert by_id["toy/fwd/ok"]["refs"]["jittor"]["error"].endswith("no built-in for toys")
    ok = by_id["toy/fwd/ok"]
    assert ok["variant"] == "scale" and ok["tiers"] and ok["refs"]["naive"]["ms"] > 0
    assert ok["points"] == grading.points_for(grading.gbps(ok["nbytes"], ok["ours"]["ms"]), ok["tiers"], True)
    assert ok["seconds"] > 0 and by_id["toy/fwd/hang"]["seconds"] is None  # the worker's time per finished case
    assert not by_id["toy/fwd/wrong"]["correct"] and "elements off" in by_id["toy/fwd/wrong"]["why"]
    assert "kernel exploded" in by_id["toy/fwd/raise"]["why"]
    assert by_id["toy/fwd/crash"]["why"] == "crashed: worker exited with code 3"
    assert by_id["toy/fwd/hang"]["why"].startswith("hung")
    assert by_id["toy/fwd/after"]["correct"]  # the worker was restarted after the hang
    refhang = by_id["toy/fwd/refhang"]  # a reference hung: it fails, our verdict and time stand
    assert refhang["correct"] and refhang["ours"]["ms"] > 0 and refhang["refs"]["naive"]["error"].startswith("hung")
    assert data["env"]["copy_gbps"] > 0  # measured by the first worker, kept across restarts
    assert sum(r["points"] for r in data["results"]) == data["summary"]["points"]
    assert all(by_id[c]["points"] == 0 for c in ("toy/fwd/wrong", "toy/fwd/raise", "toy/fwd/crash", "toy/fwd/hang"))
    md = out_md.read_text()
    assert "| toy/fwd/crash |" in md and "WRONG" in md and "points:" in md
    assert json.loads(tiers.read_text())["tiers_gbps"]["toy/fwd/ok"]
    assert "toy/fwd/ok" in proc.stdout


def test_time_budget_reports_unrun_cases(tmp_path):
    env = dict(os.environ, OPS_SCORING_FAMILY_MODULES="toy_family",
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "tests"), ROOT, os.environ.get("PYTHONPATH", "")]))
    out_json = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "get_score.py"), "--device", "cpu", "--no-torch",
                           "-k", "ok", "--budget", "0", "--no-progress", "--json", str(out_json)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out_json.read_text())["results"]
    assert len(results) == 2 and all(r["why"] == "not run: time budget spent" and r["points"] == 0 for r in results)


def test_a_terminated_run_still_writes_what_it_measured(tmp_path):
    """`timeout` sends SIGTERM: the finished cases are kept, the rest reported as not run (2026-11-23 lost two
    GPU score runs' JSON that way)."""
    import signal
    import time
    env = dict(os.environ, OPS_SCORING_FAMILY_MODULES="toy_family",
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "tests"), ROOT, os.environ.get("PYTHONPATH", "")]))
    out_json = tmp_path / "r.json"
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "get_score.py"), "--device", "cpu", "--no-torch",
                             "-k", "fwd/ok,fwd/hang", "--timeout", "600", "--no-progress", "--json", str(out_json)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 300
    for line in proc.stderr:  # the worker is now asleep in the hanging case
        if line.startswith("toy/fwd/ok: ok") or time.monotonic() > deadline:
            break
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == 0
    by_id = {r["case_id"]: r for r in json.loads(out_json.read_text())["results"]}
    assert by_id["toy/fwd/ok"]["correct"] and by_id["toy/fwd/ok"]["ours"]["ms"] > 0
    assert by_id["toy/fwd/hang"]["why"] == "not run: interrupted (SIGTERM)"
