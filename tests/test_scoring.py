"""The grader's math with synthetic timings: tiers, points, failed references, roofline, summary, reports."""
import json

import numpy as np
import pytest

from ops.scoring import grading, report
from ops.scoring.grading import CaseResult, Timing
from ops.scoring.judge import Expected, judge, sum_bound, ulp
from ops.scoring.spec import case, edge_array, random_array, round_to_bfloat16

GB = 10**9


def result(ours_ms, refs, nbytes=GB, correct=True):
    return CaseResult("fam/fwd/x", nbytes, ours=Timing(ours_ms), correct=correct,
                      refs={k: (Timing(v) if isinstance(v, float) else Timing(error=v)) for k, v in refs.items()})


def test_throughput_is_bytes_over_time():
    assert grading.gbps(GB, 1.0) == pytest.approx(1000.0)
    assert grading.gbps(GB, None) is None


def test_default_tiers_naive_jittor_fastest():
    refs = {"naive": Timing(10.0), "jittor": Timing(4.0), "torch": Timing(2.0)}
    assert grading.default_tiers(GB, refs) == pytest.approx([100.0, 250.0, 500.0])


def test_failed_references_fall_back_and_tiers_never_decrease():
    refs = {"naive": Timing(2.0), "jittor": Timing(error="ERR fp16"), "torch": Timing(8.0)}
    assert grading.default_tiers(GB, refs) == pytest.approx([500.0, 500.0, 500.0])
    refs = {"naive": Timing(error="x"), "jittor": Timing(error="y"), "torch": Timing(4.0)}
    assert grading.default_tiers(GB, refs) == pytest.approx([250.0, 250.0, 250.0])
    assert grading.default_tiers(GB, {"naive": Timing(error="x")}) is None


@pytest.mark.parametrize("ours_ms, points", [
    (10.0, 40),          # exactly the naive tier
    (10.0 / 0.9501, 40),  # 0.95 of a tier still earns it
    (10.6, 0),           # below 0.95 of the first tier
    (4.2, 70), (2.1, 100), (1.0, 100),
])
def test_points_by_tier(ours_ms, points):
    r = grading.grade(result(ours_ms, {"naive": 10.0, "jittor": 4.0, "torch": 2.0}))
    assert r.points == points


def test_wrong_result_scores_zero_even_when_fast():
    assert grading.grade(result(0.1, {"naive": 10.0}, correct=False)).points == 0


def test_stored_tiers_win_over_this_run():
    r = grading.grade(result(2.0, {"naive": 10.0, "jittor": 4.0, "torch": 2.0}), stored_tiers=[100, 400, 1000])
    assert r.tiers == [100, 400, 1000] and r.points == 70


def test_no_reference_at_all_gives_no_points_even_to_a_correct_case():
    r = grading.grade(result(1.0, {"naive": "boom", "jittor": "ERR"}))
    assert r.tiers is None and r.points == 0 and "no reference measured" in r.tiers_source


def test_speedups_and_summary():
    a = grading.grade(result(1.0, {"naive": 4.0, "jittor": 2.0, "torch": 0.5}))
    b = grading.grade(result(2.0, {"naive": 16.0, "jittor": "ERR", "torch": 4.0}))
    assert grading.speedup(a, "torch") == pytest.approx(0.5)
    assert grading.speedup(b, "jittor") is None
    s = grading.summarize([a, b], copy_gbps=1000.0)
    assert s["geomean_speedup"]["naive"] == pytest.approx(np.sqrt(4 * 8))
    assert s["geomean_speedup"]["jittor"] == pytest.approx(2.0)
    assert s["geomean_speedup"]["torch"] == pytest.approx(np.sqrt(0.5 * 2))
    assert s["slower_than"]["torch"] == ["fam/fwd/x"]
    assert s["points"] == a.points + b.points and s["max_points"] == 200
    assert s["median_roofline"] == pytest.approx(1.0)  # 1 GB in 1 ms = 1000 GB/s, the copy bandwidth


def test_report_marks_failures_and_roofline(tmp_path):
    a = grading.grade(result(1.0, {"naive": 4.0, "jittor": "RuntimeError: no fp16", "torch": 2.0}))
    wrong = grading.grade(CaseResult("fam/bwd/y", GB, correct=False, why="3 elements off"))
    env = {"name": "Test GPU", "device": "cuda", "copy_gbps": 2000.0}
    text = report.render([a, wrong], ["naive", "jittor", "torch"], env, markdown=True, title="t")
    assert "| fam/fwd/x |" in text and "50%" in text and "ERR" in text and "no fp16" in text
    assert "WRONG" in text and "3 elements off" in text
    data = json.loads(report.to_json([a, wrong], env, {}))
    assert data["summary"]["correct"] == 1
    path = tmp_path / "tiers.json"
    report.save_tiers(str(path), [a, wrong], env)
    assert report.load_tiers(str(path)) == ({"fam/fwd/x": a.tiers}, "Test GPU")
    path.write_text(json.dumps({"tiers_gbps": {"x": [1, 2]}}))
    with pytest.raises(ValueError, match="three numbers"):
        report.load_tiers(str(path))


def terminal_case(case_id, ours_ms, nbytes=GB, flops=None, note_error=None, refs=("naive", "jittor", "torch")):
    timings = {r: Timing(ours_ms * (2 + i)) for i, r in enumerate(refs)}
    if note_error:
        timings[refs[-1]] = Timing(error=note_error)
    return grading.grade(CaseResult(case_id, nbytes, flops=flops, ours=Timing(ours_ms), correct=True, refs=timings))


def test_terminal_table_keeps_ids_and_notes_whole_within_120_columns():
    """Long case ids stand on their own line; notes too long for the room left become numbered footnotes, each
    whole (wrapped between words); every line fits 120 columns."""
    refs = ["naive", "jittor", "torch", "compile"]
    long_id = "expand_as/bwd/paddle2-edge-32x807x1-to-32x807x807-float16-with-a-longer-name"
    error = "RuntimeError: a reason long enough that no terminal row could hold it beside the columns " * 2
    results = [terminal_case("fam/fwd/short", 1.0, refs=refs), terminal_case(long_id, 1.0, refs=refs),
               terminal_case("fam/fwd/err", 1.0, note_error=error.strip(), refs=refs)]
    env = {"name": "Test GPU", "device": "cuda", "copy_gbps": 2000.0}
    text = report.render(results, refs, env, markdown=False)
    lines = text.splitlines()
    assert all(len(line) <= report.TERMINAL_WIDTH for line in lines)
    assert long_id in lines and "fam/fwd/short" in text
    assert lines[lines.index(long_id) + 1].split()[0] == "1.000"  # its row below it
    assert any(line.startswith("fam/fwd/err ") and line.endswith("  [1]") for line in lines)
    footnote = text.split("\n[1] ", 1)[1].split("\n\n")[0]
    assert " ".join(footnote.split()) == "compile: " + error.strip()
    assert "..." not in text


def test_roofline_only_where_the_bytes_model_applies():
    """Compute-bound cases get FLOP/s and no %roof; cases within the last-level cache, or whose bytes the
    roofline moves in under a microsecond, get '-'; a case of 2 flops gets neither (no '0.00 GFLOP/s')."""
    big = terminal_case("fam/fwd/big", 1.0)  # 1 GB in 1 ms: 1000 GB/s, half of 2000
    compute = terminal_case("fam/fwd/mma", 1.0, flops=4 * GB)
    tiny = terminal_case("fam/fwd/tiny", 0.005, nbytes=12, flops=2)
    cached = terminal_case("fam/fwd/cached", 0.01, nbytes=10**6)
    env = {"name": "Test", "device": "cpu", "copy_gbps": 2000.0}
    assert grading.roofline(big, 2000.0) == pytest.approx(0.5)
    assert grading.roofline(compute, 2000.0) is None and grading.roofline(tiny, 2000.0) is None
    assert grading.roofline(cached, 2000.0, cache_bytes=32 << 20) is None
    assert grading.roofline(cached, 20.0) == pytest.approx(5.0)  # no cache size known: the model as it is
    head, body = report.compact_rows([big, compute, tiny, cached], ["naive"], 2000.0, 32 << 20)
    roof = {row[0]: row[head.index("%roof")] for row in body}
    assert roof == {"fam/fwd/big": "50%", "fam/fwd/mma": "-", "fam/fwd/tiny": "-", "fam/fwd/cached": "-"}
    notes = {row[0]: row[-1] for row in body}
    assert notes["fam/fwd/mma"] == "4.00 TFLOP/s" and notes["fam/fwd/tiny"] == ""
    head, body = report.compact_rows([tiny, cached], ["naive"], 2000.0, 32 << 20)
    assert "%roof" not in head  # a column of nothing but '-' is left out of the terminal table
    assert "%roof" in report.rows([tiny, cached], ["naive"], 2000.0, 32 << 20)[0]
    summary = grading.summarize([big, compute, tiny, cached], 2000.0, 32 << 20)
    assert summary["median_roofline"] == pytest.approx(0.5) and summary["roofline_cases"] == 1
    text = report.render([big, compute, tiny, cached], ["naive"], dict(env, cache_bytes=32 << 20), markdown=False)
    assert "0.00 " not in text and "of the 1 cases it applies to" in text


def test_summary_lists_slow_cases_whole():
    ids = [f"expand_as/fwd/case-{i:02d}-of-a-long-name-1785x1-to-1785x128-float32" for i in range(30)]
    results = [grading.grade(CaseResult(i, GB, ours=Timing(2.0), correct=True, refs={"jittor": Timing(1.0)}))
               for i in ids]
    text = report.format_summary(grading.summarize(results, None), markdown=False, width=report.TERMINAL_WIDTH)
    lines = text.splitlines()
    assert all(len(line) <= report.TERMINAL_WIDTH for line in lines)
    slow = " ".join(line for line in lines if "slower" in line or line.startswith("    "))
    shown = [i for i in ids if i in slow]
    assert shown == ids[:len(shown)] and slow.endswith(f"and {len(ids) - len(shown)} more")
    assert all(f"{i}," in slow or f"{i} " in slow for i in shown)
    markdown = report.format_summary(grading.summarize(results, None), markdown=True)
    assert all(i in markdown for i in ids)


def test_exact_outputs_compare_bits_and_the_sign_of_zero():
    want = np.array([1.0, np.nan, -0.0, np.inf], dtype=np.float32)
    exp = Expected(want, ("float32",), signed_zero=True)
    assert judge(want.copy(), "float32", exp)[0]
    nan_payload = want.copy()
    nan_payload.view(np.uint32)[1] |= 1
    assert judge(nan_payload, "float32", exp)[0]  # NaN matches any NaN
    assert "1 elements differ" in judge(np.array([1.0, np.nan, 0.0, np.inf], np.float32), "float32", exp)[2]
    close = np.array([1.0 + 2 ** -23, np.nan, -0.0, np.inf], np.float32)
    assert not judge(close, "float32", exp)[0]  # one ulp is wrong for an op that copies
    assert judge(np.array([1.0, np.nan, 0.0, np.inf], np.float32), "float32",
                 Expected(want, ("float32",)))[0]  # where the sign of zero does not matter


def test_exact_outputs_nan_placement_reference_values_and_narrow_dtypes():
    """The exact verdict compares bit patterns in the output's dtype: NaN must sit where the reference has it,
    a float64 reference is compared after its exact cast, and one that the dtype cannot hold is reported."""
    want = np.array([[1.5, -2.0], [np.nan, 0.25]])  # float64, every value a float16
    exp = Expected(want, ("float16",), signed_zero=True)
    got = want.astype(np.float16)
    assert judge(got, "float16", exp) == (True, 0.0, "")
    assert "NaN where the reference has none, first at (0, 1)" in judge(
        np.array([[1.5, np.nan], [np.nan, 0.25]], np.float16), "float16", exp)[2]
    ok, err, why = judge(np.array([[1.5, -2.0], [7.0, 0.25]], np.float16), "float16", exp)
    assert not ok and why.startswith("a number where the reference has NaN, first at (1, 0)")
    ok, err, why = judge(np.array([[1.5, -2.5], [np.nan, 0.75]], np.float16), "float16", exp)
    assert not ok and err == 0.5 and why.startswith("2 elements differ (exact op), first at (0, 1)")
    inexact = Expected(np.array([0.1]), ("float32",))  # 0.1 is no float32: no output can equal it
    assert "cannot represent" in judge(np.array([0.1], np.float32), "float32", inexact)[2]
    transposed = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert judge(np.ascontiguousarray(transposed.T), "float32", Expected(transposed.T, ("float32",)))[0]


def test_shapes_and_dtypes_must_match():
    exp = Expected(np.zeros((2, 3)), ("float16",))
    assert "shape (3, 2)" in judge(np.zeros((3, 2), np.float16), "float16", exp)[2]
    assert judge(np.zeros((2, 3), np.float32), "float32", exp)[2] == "dtype float32 != expected float16"
    ints = Expected(np.array([1, 3], dtype=np.int64), ("int64", "int32"))
    assert judge(np.array([1, 3], np.int32), "int32", ints)[0]
    assert judge(np.array([1, 2], np.int64), "int64", ints)[2].startswith("1 elements differ")


def test_rounded_outputs_nan_infinities_and_bounds():
    want = np.array([1.0, np.nan, np.inf, -2.0])
    exp = Expected(want, ("float32",), "rounded", 1e-3)
    assert judge(np.array([1.0005, np.nan, np.inf, -2.0], np.float32), "float32", exp)[0]
    assert "NaN where the reference has none" in judge(np.array([np.nan, np.nan, np.inf, -2], np.float32),
                                                       "float32", exp)[2]
    assert "a number where the reference has NaN" in judge(np.array([1, 0, np.inf, -2], np.float32),
                                                           "float32", exp)[2]
    assert "infinities differ" in judge(np.array([1, np.nan, -np.inf, -2], np.float32), "float32", exp)[2]
    ok, err, why = judge(np.array([1.0, np.nan, np.inf, -2.01], np.float32), "float32", exp)
    assert not ok and err == pytest.approx(0.01, rel=1e-4) and "first at (3,)" in why


def _as_dtype(x64, dtype):
    """float64 values rounded to ``dtype`` (bfloat16: to nearest even, held in float32)."""
    if dtype == "bfloat16":
        return round_to_bfloat16(x64.astype(np.float32))  # f64 -> f32 -> bf16: double rounding harmless here
    return x64.astype(dtype)


def _step(values, dtype, steps):
    """``values`` moved ``steps`` floats of ``dtype`` up (positive) or down."""
    out = values.copy()
    for _ in range(abs(steps)):
        if dtype == "bfloat16":
            bits = out.view(np.uint32)
            up = (steps > 0) == (out >= 0)  # away from zero: the magnitude's bits grow
            bits[...] = np.where(up, bits + np.uint32(1 << 16), bits - np.uint32(1 << 16))
        else:
            out = np.nextafter(out, np.array(np.inf if steps > 0 else -np.inf, out.dtype))
    return out


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_faithful_sums_pass_rounded_or_truncated_and_nothing_further(dtype, rng):
    """transpose_add's verdict: the correctly rounded sum and the neighbour on the exact sum's side (what a
    truncating conversion gives where rounding went away from zero) pass; the neighbour on the other side, two
    floats off, NaN and infinities that differ fail. The rounded sum is the float64-exact sum rounded once."""
    from ops.scoring.fam_permute import rounded_sum
    a = _as_dtype(rng.standard_normal(4096), dtype)
    b = _as_dtype(rng.standard_normal(4096) * 2.0 ** rng.integers(-12, 12, 4096), dtype)
    exact = a.astype(np.float64) + b.astype(np.float64)
    want, side = rounded_sum(a, b, dtype)
    np.testing.assert_array_equal(want, _as_dtype(exact, dtype))
    np.testing.assert_array_equal(side, np.sign(exact - want.astype(np.float64)))
    exp = Expected(want, (dtype,), "faithful", side)
    assert judge(want.copy(), dtype, exp)[:2] == (True, 0.0)
    inexact = np.flatnonzero(side)
    assert inexact.size > 1000
    i = inexact[0]
    for steps, ok in ((int(side[i]), True), (-int(side[i]), False), (2 * int(side[i]), False)):
        got = want.copy()
        got[i] = _step(want[i:i + 1], dtype, steps)[0]
        assert judge(got, dtype, exp)[0] is ok, (steps, want[i], got[i])
    exact_i = np.flatnonzero(side == 0)[0]
    got = want.copy()
    got[exact_i] = _step(want[exact_i:exact_i + 1], dtype, 1)[0]
    assert not judge(got, dtype, exp)[0]  # an exact sum leaves no room
    specials = want.copy()
    specials[:3] = [np.nan, np.inf, -np.inf]
    exp = Expected(specials, (dtype,), "faithful", side)
    for k, value, why in ((0, 1.0, "a number where the reference has NaN"), (1, -np.inf, "infinities differ"),
                          (5, np.nan, "NaN where the reference has none")):
        got = specials.copy()
        got[k] = value
        ok, _, message = judge(got, dtype, exp)
        assert not ok and why in message


@pytest.mark.parametrize("dtype, tiny", [("float16", 2.0 ** -24), ("bfloat16", 2.0 ** -30), ("float32", 2.0 ** -60)])
def test_a_sum_the_wider_float_rounds_away_keeps_its_side(dtype, tiny):
    """1 + tiny rounds to 1 already in the wider float the reference sums in: the sum is still inexact (side
    +1, so a result truncated toward the exact sum passes), and 1 - tiny has side -1 (one float below 1 is
    then the truncated result and passes too)."""
    from ops.scoring.fam_permute import rounded_sum
    a = _as_dtype(np.array([1.0, 1.0, -1.0]), dtype)
    b = _as_dtype(np.array([tiny, -tiny, tiny]), dtype)
    want, side = rounded_sum(a, b, dtype)
    np.testing.assert_array_equal(want.astype(np.float64), [1.0, 1.0, -1.0])
    np.testing.assert_array_equal(side, [1, -1, 1])
    exp = Expected(want, (dtype,), "faithful", side)
    below = want.copy()
    below[1] = _step(want[1:2], dtype, -1)[0]
    assert judge(below, dtype, exp)[0]
    above = want.copy()
    above[1] = _step(want[1:2], dtype, 1)[0]
    assert not judge(above, dtype, exp)[0]
    moved = np.tile(a, (4, 1)).T  # a transposed operand, as the family's reference passes it
    _, side = rounded_sum(moved, np.tile(b[:, None], (1, 4)), dtype)
    np.testing.assert_array_equal(side, np.tile([[1], [-1], [1]], (1, 4)))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_the_faithful_judge_asks_for_sides_only_one_step_away(dtype, rng):
    """An element two or more steps from the rounded sum is wrong whatever the exact sum's side: the side is
    computed only for elements one step away (a wrong output's every element would cost an exact sum)."""
    want = _as_dtype(rng.uniform(1, 2, 64), dtype)
    asked = []

    def side(flat):
        asked.extend(int(i) for i in flat)
        return np.ones(len(flat), dtype=np.int8)

    exp = Expected(want, (dtype,), "faithful", side)
    got = want.copy()
    got[3] = _step(want[3:4], dtype, 2)[0]
    got[9] = _step(want[9:10], dtype, 1)[0]
    ok, _, why = judge(got, dtype, exp)
    assert not ok and why.startswith("1 elements off") and "first at (3,)" in why and asked == [9]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_the_transpose_add_judge_finds_sides_only_where_outputs_differ(dtype, rng):
    """The family's expectation gives the sides as a function of the differing elements (not computed for a
    right output): the same verdicts as the eager sides, on blocks of rows with their origin."""
    import dataclasses

    from ops.scoring.fam_permute import rounded_sum
    from ops.scoring.families import load_families
    (fam,) = load_families(["permute"])
    base = next(c for c in fam.all_cases() if c.p.get("op") == "transpose_add" and c.direction == "fwd")
    c = dataclasses.replace(base, shapes=((96, 40), (40, 96)), dtype=dtype)
    x = random_array((96, 40), dtype, rng)
    y = random_array((40, 96), dtype, rng) * np.float32(2.0) ** rng.integers(-12, 12, (40, 96)).astype(np.float32)
    y = _as_dtype(y.astype(np.float64), dtype)
    want, side = rounded_sum(np.transpose(x), y, dtype)
    n, block = fam.expected_rows(c, [x, y], None)
    assert n == 40 and callable(block(slice(0, 8)).bound)
    assert judge(want[8:16].copy(), dtype, block(slice(8, 16)), origin=(8,))[:2] == (True, 0.0)
    inexact = np.argwhere(side[8:16] != 0)
    r, k = inexact[0]
    for steps, ok in ((int(side[8 + r, k]), True), (-int(side[8 + r, k]), False)):
        got = want[8:16].copy()
        got[r, k] = _step(got[r:r + 1, k], dtype, steps)[0]
        verdict = judge(got, dtype, block(slice(8, 16)), origin=(8,))
        assert verdict[0] is ok, (steps, verdict)
        if not ok:
            assert f"first at ({8 + r}, {k})" in verdict[2]


def test_ulp_of_each_dtype():
    assert ulp(np.array([1.0]), "float32")[0] == 2.0 ** -23
    assert ulp(np.array([1.5]), "float16")[0] == 2.0 ** -10
    assert ulp(np.array([-3.0]), "bfloat16")[0] == 2.0 ** -6
    assert ulp(np.array([0.0]), "float16")[0] == 2.0 ** -24  # subnormal spacing


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_ulp_in_blocks_is_the_spacing_of_the_dtype(dtype, rng, monkeypatch):
    """``ulp`` works on blocks of the flat values (BOUND_BLOCK): across block edges, and for zeros,
    float64 subnormals, infinities and NaN, each value's spacing is NumPy's of the dtype at |value| (the
    smallest normal's spacing below it)."""
    from ops.scoring import judge as J
    monkeypatch.setattr(J, "BOUND_BLOCK", 7)
    values = rng.standard_normal((5, 13)) * 2.0 ** rng.integers(-30, 30, (5, 13))
    values.flat[:6] = [0.0, -0.0, 5e-324, np.inf, -np.inf, np.nan]
    narrow = {"float16": np.float16, "float32": np.float32, "float64": np.float64}.get(dtype, np.float32)
    tiny = {"float16": 2.0 ** -14, "bfloat16": 2.0 ** -126, "float32": 2.0 ** -126, "float64": 2.0 ** -1022}[dtype]
    a = np.where(np.isfinite(values), np.abs(values), 0.0)
    a = np.maximum(np.where(a >= tiny, a, tiny), tiny)
    exponent = np.frexp(a)[1] - 1  # |value| in [2**exponent, 2**(exponent + 1))
    want = np.ldexp(1.0, exponent - (J.SIGNIFICAND_BITS[dtype] - 1))
    got = ulp(values, dtype)
    assert got.shape == values.shape
    np.testing.assert_array_equal(got, want)
    if dtype != "bfloat16":
        fits = np.isfinite(values) & (np.abs(values) >= tiny) & (np.abs(values) < np.finfo(narrow).max / 2)
        spacing = np.spacing(np.abs(values[fits]).astype(narrow)).astype(np.float64)
        exact = np.abs(values[fits]).astype(narrow).astype(np.float64) == np.abs(values[fits])
        np.testing.assert_array_equal(got[fits][exact], spacing[exact])


@pytest.mark.parametrize("n", [81, 4096, 167049, 262144])
def test_a_1e_2_error_in_one_float32_sum_is_outside_the_bound(n):
    """The bound comes from each sum's own value and terms: a plain float32 loop of up to 4096 terms and a
    blocked sum of any length pass; 1e-2 in one element of a sum of 10^5 terms in [-1, 1] does not."""
    rng = np.random.default_rng(n)
    terms = rng.uniform(-1, 1, size=(3, n)).astype(np.float32)
    want = terms.astype(np.float64).sum(axis=1)
    l2 = np.sqrt((terms.astype(np.float64) ** 2).sum(axis=1))
    bound = sum_bound(want, l2, n, "float32")
    blocked = np.add.reduce(terms.reshape(3, -1, min(n, 4096) if n % 4096 == 0 else n), axis=2,
                            dtype=np.float32).sum(axis=1, dtype=np.float32)
    sequential = np.zeros(3, np.float32)
    if n <= 4096:
        for k in range(n):
            sequential += terms[:, k]
        assert (np.abs(sequential - want) <= bound).all()
    assert (np.abs(blocked - want) <= bound).all()
    assert (bound < 1e-2).all()


def test_edge_arrays_hold_ties_and_special_values():
    rng = np.random.default_rng(0)
    for dtype in ("float32", "float16", "bfloat16", "float64"):
        a = edge_array((40, 50), dtype, rng)
        assert np.isnan(a).any() and np.isposinf(a).any() and np.isneginf(a).any()
        assert (np.signbit(a) & (a == 0)).any() and (~np.signbit(a) & (a == 0)).any()
        finite = a[np.isfinite(a)]
        assert np.array_equal(finite, np.round(finite)) and len(np.unique(finite)) <= 9  # ties
    assert edge_array((10,), "int8", rng).dtype == np.int8


def test_two_gradings_of_the_same_timings_give_the_same_points():
    """Points are a function of the measured times only: the same (synthetic) timings graded twice, and after
    a JSON round trip, give identical points."""
    import copy

    from ops.scoring.grading import result_from_json
    results = []
    for i, ours in enumerate([1.0, 2.6, 4.1, 9.9, 10.6, 0.5]):
        r = result(ours, {"naive": 10.0, "jittor": 4.0, "torch": 2.0})
        r.case_id = f"fam/fwd/{i}"
        results.append(r)
    first = [grading.grade(copy.deepcopy(r)).points for r in results]
    again = [grading.grade(copy.deepcopy(r)).points for r in results]
    saved = json.loads(report.to_json([grading.grade(copy.deepcopy(r)) for r in results], {}, {}))["results"]
    reloaded = [grading.grade(result_from_json(d)).points for d in saved]
    assert first == again == reloaded == [100, 70, 70, 40, 0, 100]


def test_random_arrays_are_fresh_and_exact_in_their_dtype():
    rng = np.random.default_rng(0)
    for dtype in ("float32", "float16", "float64", "bfloat16", "int8", "int64", "uint8", "bool"):
        a = random_array((64,), dtype, rng)
        assert np.count_nonzero(a) > 16
    b = random_array((1000,), "bfloat16", rng)
    assert np.array_equal(round_to_bfloat16(b), b)
    assert (b.view(np.uint32) & 0xFFFF == 0).all()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_large_arrays_drawn_in_parallel_blocks_are_seeded_exact_and_fresh_in_every_block(dtype, monkeypatch):
    from ops.scoring import spec
    monkeypatch.setattr(spec, "PARALLEL_DRAW_ELEMENTS", 256)
    monkeypatch.setattr(spec, "DRAW_THREADS", 4)
    a = random_array((40, 50), dtype, np.random.default_rng(7))
    assert a.dtype == (np.float32 if dtype == "bfloat16" else np.dtype(dtype)) and a.shape == (40, 50)
    assert np.array_equal(a, random_array((40, 50), dtype, np.random.default_rng(7)))  # --seed reproduces it
    assert not np.array_equal(a, random_array((40, 50), dtype, np.random.default_rng(8)))
    assert ((a >= -1) & (a <= 1)).all()
    if dtype == "bfloat16":
        assert np.array_equal(round_to_bfloat16(a), a)
    blocks = a.reshape(4, -1)  # each thread's block is its own stream: no two blocks repeat each other
    assert len({b.tobytes() for b in blocks}) == 4 and all(len(np.unique(b)) > 100 for b in blocks)
    e = edge_array((40, 50), dtype, np.random.default_rng(7))
    assert np.array_equal(e, edge_array((40, 50), dtype, np.random.default_rng(7)), equal_nan=True)
    for special in (np.isnan(e), np.isposinf(e), np.isneginf(e), np.signbit(e) & (e == 0)):
        assert 0.01 < special.mean() < 0.03  # each at about the density (2%), though drawn places may repeat
    finite = e[np.isfinite(e)]
    assert np.array_equal(finite, np.round(finite)) and set(np.unique(finite)) <= set(range(-4, 5))


def test_bfloat16_rounding_is_to_nearest_even():
    x = np.array([1 + 2**-8 + 2**-10, 1 + 2**-8, 1 + 3 * 2**-8], dtype=np.float32)
    assert round_to_bfloat16(x).tolist() == [1 + 2**-7, 1.0, 1 + 2**-6]


def test_case_ids_and_params():
    c = case("max_pool3d", "k2", "bwd", [(1, 2, 4, 4, 4)], "float32", devices=("cpu",), kernel_size=2)
    assert c.id == "max_pool3d/bwd/k2" and c.p == {"kernel_size": 2} and c.devices == ("cpu",)
    with pytest.raises(ValueError, match="direction"):
        case("f", "n", "sideways", [(1,)], "float32")


def test_speedup_plot(tmp_path):
    pytest.importorskip("matplotlib")
    a = grading.grade(result(1.0, {"naive": 4.0, "jittor": "ERR", "torch": 2.0}))
    path = tmp_path / "speedup.png"
    report.plot(str(path), [a], ["naive", "jittor", "torch"])
    assert path.stat().st_size > 1000


def test_merging_saved_runs(tmp_path, capsys):
    from ops.scoring import cli
    env = {"name": "Test GPU", "device": "cuda", "copy_gbps": 1000.0}
    measured = result(1.0, {"naive": 4.0, "jittor": 2.0, "torch": 2.0})
    first = CaseResult("fam/fwd/a", GB, why="not run: time budget spent")
    other = CaseResult("fam/fwd/b", GB, ours=Timing(2.0), correct=True, refs={"naive": Timing(4.0)})
    measured.case_id = "fam/fwd/a"
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(report.to_json([measured, other], env, {"references": ["naive", "jittor", "torch"]}))
    b.write_text(report.to_json([first], {"name": "Test GPU"}, {"references": ["naive"]}))
    md = tmp_path / "m.md"
    assert cli.main(["--from-json", str(a), str(b), "--markdown", str(md)]) == 0
    text = md.read_text()
    assert "| fam/fwd/a |" in text and "NOT RUN" not in text  # a measured case is never replaced by "not run"
    assert "| fam/fwd/b |" in text and "Test GPU" in text and "points: 200 / 200" in text


@pytest.mark.parametrize("meta, env, what", [({"impl": "student_ops"}, {"name": "Test GPU"}, "module"),
                                             ({}, {"name": "Other GPU"}, "device")])
def test_merging_refuses_runs_of_other_modules_or_devices(tmp_path, capsys, meta, env, what):
    from ops.scoring import cli
    a, b, md = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "m.md"
    a.write_text(report.to_json([result(1.0, {"naive": 4.0})], {"name": "Test GPU"}, {"impl": "ops"}))
    b.write_text(report.to_json([CaseResult("fam/fwd/b", GB)], env, {"impl": "ops", **meta}))
    assert cli.main(["--from-json", str(a), str(b), "--markdown", str(md)]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"has results of {what}" in err[0] and str(b) in err[0] and not md.exists()


def test_merging_takes_bytes_from_the_current_model(tmp_path):
    """A run saved under an older byte model is merged with the current one; unknown cases keep theirs."""
    from ops.scoring import cli
    from ops.scoring import fam_pool3d as F
    c = next(c for c in F.FAMILY.cases if c.direction == "bwd" and "cuda" in c.devices)
    saved = result(1.0, {"naive": 4.0})
    saved.case_id, saved.nbytes = c.id, 12345
    gone = CaseResult("fam/fwd/gone", 678, ours=Timing(2.0), correct=True, refs={"naive": Timing(4.0)})
    path = tmp_path / "a.json"
    path.write_text(report.to_json([saved, gone], {"name": "Test GPU"}, {"references": ["naive"]}))
    _, _, merged, _ = cli.merge_saved([str(path)])
    assert [r.nbytes for r in merged] == [F.FAMILY.bytes_moved(c), 678]


def test_keyword_filter_takes_comma_separated_alternatives():
    from ops.scoring.cli import keyword_matches
    assert keyword_matches("max_pool3d/fwd/k2s2_tiny_1x1x4x4x4", None)
    assert keyword_matches("max_pool3d/fwd/k2s2_tiny_1x1x4x4x4", "tiny")
    assert keyword_matches("expand_as/fwd/paddle0-1785x1", "tiny,paddle0")
    assert not keyword_matches("permute/fwd/102_f32_16MB", "tiny,paddle0")
    assert not keyword_matches("permute/fwd/102_f32_16MB", ",")


def test_a_compile_failure_is_reported_by_its_first_compiler_error():
    from ops.scoring.logs import compile_error
    log = "x.cc:1:2: warning: unused\nx.cc:9:4: error: no match for 'operator+='\nmore\n"
    assert compile_error("Check failed ret(256) == 0(0) Run cmd failed: g++ ...", log) == \
        "compile failed: no match for 'operator+='"
    message = "RuntimeError: size of var should be larger"
    assert compile_error(message, log) == message


@pytest.mark.parametrize("case_id", ["permute/fwd/cpu_021_f32", "max_pool3d/fwd/cpu_k2s2"])
@pytest.mark.parametrize("threads, eager_limit", [(1, 1 << 30), (3, 1 << 30), (3, 0)])
def test_references_made_in_advance_or_by_the_judge_give_one_verdict(tmp_path, monkeypatch, threads, eager_limit,
                                                                     case_id):
    """prepare_case computes the references with the inputs (threads > 1, small enough, a family that does
    not judge by blocks of rows) or leaves them to the judge; either way the outputs of the reference itself
    pass and a changed element fails."""
    from ops.scoring import prepare
    from ops.scoring.families import load_families
    from ops.scoring.judging import judge_outputs
    monkeypatch.setattr(prepare, "EAGER_REFERENCE_BYTES", eager_limit)
    fam = load_families([case_id.split("/")[0]])[0]
    c = next(c for c in fam.all_cases() if c.id == case_id)
    prepared = prepare.prepare_case(fam, c, str(tmp_path), 7, 11, threads=threads)
    by_rows = fam.expected_rows(c, *prepared.sets[0]) is not None
    assert by_rows == (fam.name == "permute")
    assert (prepared.expected[0] is not None) == (threads > 1 and eager_limit > 0 and not by_rows)
    from ops.scoring.fresh import call_number
    files, checks = {}, {"calls": {}}
    calls = [("check", 0, None)] + [(f"call{i}", k, call_number(k, 40 + i))
                                    for i, k in enumerate(prepared.timed)]
    for tag, k, number in calls:
        arrays = prepared.sets[0][0] if number is None else prepared.call_inputs(fam, c, k, number)[0]
        want = fam.expected(c, arrays)[0].value.astype(np.float32)
        np.save(tmp_path / f"{tag}.npy", want)
        files[tag] = [[f"{tag}.npy", "float32"]]
        if number is not None:
            checks["calls"][tag] = [k, number]
    for judging in (1, 3):
        assert judge_outputs(fam, c, prepared, files, threads=judging, checks=checks)[:2] == (True, "")
    bad = np.load(tmp_path / "call0.npy")
    bad.reshape(-1)[5] += 1.0
    np.save(tmp_path / "call0.npy", bad)
    for judging in (1, 3):  # groups judged at once give the verdict of the first failing group
        ok, why = judge_outputs(fam, c, prepared, files, threads=judging, checks=checks)[:2]
        assert not ok and f"timed call 40 on input set {prepared.timed[0]}" in why and "1 elements differ" in why
    # the same output as another call's inputs would give is wrong for this one's
    checks["calls"]["call0"] = [prepared.timed[0], call_number(prepared.timed[0], 39)]
    np.save(tmp_path / "call0.npy", np.load(tmp_path / "call1.npy") if prepared.timed[0] == prepared.timed[1]
            else fam.expected(c, prepared.call_inputs(fam, c, prepared.timed[0], 40)[0])[0].value.astype(np.float32))
    assert not judge_outputs(fam, c, prepared, files, threads=1, checks=checks)[0]


def test_groups_judged_at_once_only_as_memory_allows(monkeypatch):
    from ops.scoring import budget
    from ops.scoring.spec import case
    c = case("toy", "big", "fwd", [(1 << 20,)], "float32", devices=("cpu",))
    monkeypatch.setattr(budget, "available_memory", lambda: 2 * 3 * budget.JUDGE_BYTES_PER_ELEMENT << 20)
    assert budget.judge_threads(c, 4, 4) == 3 and budget.judge_threads(c, 2, 4) == 2
    monkeypatch.setattr(budget, "available_memory", lambda: 0)
    assert budget.judge_threads(c, 4, 4) == 1


def test_workers_share_one_hash_seed_and_cpu_workers_one_thread(tmp_path, monkeypatch):
    """Every worker gets PYTHONHASHSEED=0 (run-to-run repeatability of few-microsecond calls); CPU workers
    also OMP_NUM_THREADS=1 unless the user set it."""
    from ops.scoring import worker_proxy
    seen = []

    class FakeProcess:
        stdout = iter(())

        def __init__(self, *args, env=None, **kwargs):
            seen.append(env)

    worker_proxy._grader_nvcc_path()  # (its probe runs processes: before Popen is faked)
    monkeypatch.setattr(worker_proxy.subprocess, "Popen", FakeProcess)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("PYTHONHASHSEED", "random")
    for device in ("cpu", "cuda"):
        worker_proxy.Worker(device=device, impl="ops", log_path=str(tmp_path / f"{device}.log"), copy=False)
    assert [e["PYTHONHASHSEED"] for e in seen] == ["0", "0"]
    assert seen[0]["OMP_NUM_THREADS"] == "1" and "OMP_NUM_THREADS" not in seen[1]


@pytest.mark.parametrize("case_id", ["permute/fwd/cpu_ta_f32", "permute/fwd/cpu_021_f32"])
def test_judged_by_blocks_of_rows_as_whole(tmp_path, monkeypatch, case_id):
    """A judge by blocks of rows (small blocks here, several threads) passes what the whole judge passes and
    fails what it fails, naming the element's index in the whole output; the first failing block decides (the
    rows after it are not judged)."""
    from ops.scoring import budget, judging
    from ops.scoring.families import load_families
    monkeypatch.setattr(budget, "ROW_BLOCK_ELEMENTS", 64)
    fam = load_families(["permute"])[0]
    c = next(c for c in fam.all_cases() if c.id == case_id)
    arrays = fam.make_inputs(c, np.random.default_rng(3))
    whole = fam.expected(c, arrays)[0]
    got = whole.value.astype(np.float32)
    np.save(tmp_path / "out.npy", got)
    listed = [["out.npy", "float32"]]
    assert judging.judge_by_rows(fam, c, arrays, [], listed, str(tmp_path), 3)[0]
    last = tuple(n - 1 for n in got.shape)
    got[last] += 1.0
    got[(1,) + last[1:]] += 1.0
    np.save(tmp_path / "out.npy", got)
    ok, _, why = judging.judge_by_rows(fam, c, arrays, [], listed, str(tmp_path), 3)
    assert not ok and judge(got, "float32", whole)[0] is False
    assert f"first at {(1,) + last[1:]}" in why and "on not judged" in why
    np.save(tmp_path / "out.npy", got[:-1])
    assert "rows" in judging.judge_by_rows(fam, c, arrays, [], listed, str(tmp_path), 3)[2]


def test_rounds_stop_early_only_far_from_every_tier():
    """The worker stops after MIN_ROUNDS where ours is FAR_FROM_TIER or more from every tier's boundary."""
    from ops.scoring import harness as H

    class Best:
        def __init__(self, ms):
            self.ms = ms

        def best(self):
            return self.ms

    refs = [Best(1.0), Best(2.0)]  # boundaries where ours * 0.95 equals a reference's time

    def near(ms, margin):
        return H.near_a_tier(Best(ms), refs, 1, None, 0.95, margin)
    assert not near(0.5, H.FAR_FROM_TIER) and not near(1.5, H.FAR_FROM_TIER)  # far: stop after MIN_ROUNDS
    assert near(1.0, H.FAR_FROM_TIER) and near(2.0 / 0.95 * 1.1, H.FAR_FROM_TIER)  # within 20% of one: go on
    assert near(1.0 / 0.95, H.NEAR_TIER) and not near(1.2, H.NEAR_TIER)


def test_bfloat16_outputs_go_back_as_their_bits_and_read_back_exactly():
    """The worker hands a bfloat16 output back as its uint16 bits (half a float32 copy's bytes); the parent reads
    them as the float32 values they are: every bit pattern, NaN payloads, infinities and -0.0 included."""
    from ops._jittor import jt
    from ops.scoring.harness import hand_back_array, to_jittor, to_numpy
    from ops.scoring.judge import host_values

    jt.flags.use_cuda = 0
    bits = np.arange(1 << 16, dtype=np.uint32).reshape(4, 128, 128)
    values = (bits << np.uint32(16)).view(np.float32)  # every bfloat16
    v = to_jittor(values, "bfloat16")
    handed = hand_back_array(v)
    assert handed.dtype == np.uint16 and handed.shape == (4, 128, 128) and handed.nbytes == values.nbytes // 2
    back = host_values(handed, "bfloat16")
    assert back.dtype == np.float32
    assert np.array_equal(back.view(np.uint32), to_numpy(v).view(np.uint32))  # what the float32 cast gives
    numbers = ~np.isnan(values)  # (the cast into bfloat16 may make NaN payloads its own)
    assert np.array_equal(back.view(np.uint32)[numbers], values.view(np.uint32)[numbers])
    assert np.isnan(back[~numbers]).all()
    f = np.arange(6, dtype=np.float32)
    assert host_values(f, "float32") is f and host_values(f.astype(np.uint16), "uint16").dtype == np.uint16


def test_bfloat16_outputs_go_back_as_float32_where_the_bit_copy_fails(monkeypatch):
    from ops._jittor import jt
    from ops.scoring import harness as H
    from ops.scoring.judge import host_values

    jt.flags.use_cuda = 0
    assert H.bfloat16_bits_work()
    monkeypatch.setattr(H, "_bits_work", False)
    values = np.array([[1.0, -2.5], [np.inf, 3.140625]], np.float32)
    handed = H.hand_back_array(H.to_jittor(values, "bfloat16"))
    assert handed.dtype == np.float32 and handed.shape == (2, 2)
    assert np.array_equal(host_values(handed, "bfloat16"), values)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64", "bool"])
def test_an_upload_from_a_mapped_file_holds_the_file_values(tmp_path, dtype):
    """``harness.upload`` (a GPU worker's way in for large inputs: one copy from the mapped file) gives the Var
    ``to_jittor`` gives, every dtype; run here through its host memcpy."""
    from ops._jittor import jt
    from ops.scoring import harness as H

    jt.flags.use_cuda = 0
    rng = np.random.default_rng(3)
    host = H._host_dtype(dtype)
    a = (rng.random((6, 7, 9)) < 0.5) if dtype == "bool" else (rng.standard_normal((6, 7, 9)) * 1000).astype(host)
    if dtype == "bfloat16":
        a = round_to_bfloat16(a)
    np.save(tmp_path / "x.npy", a)
    mapped = np.load(tmp_path / "x.npy", mmap_mode="c")
    v = H.upload(mapped, dtype)
    assert str(v.dtype) == dtype and tuple(v.shape) == a.shape
    assert np.array_equal(H.to_numpy(v), H.to_numpy(H.to_jittor(a, dtype)))
    assert H.direct_upload_works()


def test_a_jittor_ops_failure_is_reported_by_its_op_and_reason():
    """A reference that fails inside jittor says which op failed and why, not the start of jittor's message (the
    op's source path, cut before the reason)."""
    from ops.scoring.harness import short_error
    msg = ("[f 1128 01:36:56.184258 68 executor.cc:686] \nExecute fused operator(4/7) failed. \n[JIT Source]: "
           + "/root/.cache/jittor/" + "x" * 200 + "/cudnn_conv.cc \n[OP TYPE]: cudnn_conv \n[Input]: bfloat16[8,512,"
           "1,1024,], \n[Output]: bfloat16[8,512,1,1,], \n[Async Backtrace]: not found, please set env JT_SYNC=1 \n"
           "[Reason]: [f 1128 01:36:56.184100 68 cudnn_conv_op.cc:212] Check failed: ret == CUDNN_STATUS_SUCCESS "
           "CUDNN_STATUS_NOT_SUPPORTED")
    assert short_error(RuntimeError(msg)) == ("cudnn_conv: cudnn_conv_op.cc:212: Check failed: ret == "
                                              "CUDNN_STATUS_SUCCESS CUDNN_STATUS_NOT_SUPPORTED")
    assert short_error(ValueError("bad\n  shape")) == "ValueError: bad shape"
    assert len(short_error(RuntimeError("y" * 500))) == 160
