"""tests/call_record.py: the recorder writes what a call was given, the committed recording decodes and replays."""
import json

import numpy as np
import pytest

import call_record
import ops
from ops import registry
from ops._jittor import jt


def test_recorded_calls_name_shapes_dtypes_arguments_and_grad_mode(tmp_path, monkeypatch):
    path = tmp_path / "calls.jsonl"
    call_record.install(str(path), patch=monkeypatch.setattr)
    x = jt.array(np.ones((2, 3, 4), np.float32))
    ops.permute(x, 2, 0, 1)
    with jt.no_grad():
        ops.max_pool3d(jt.array(np.ones((1, 1, 4, 4, 4), np.float32)), 2, return_indices=True)
    ops.expand_as(jt.array(np.ones((3, 1), np.float32)), x)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0] == {"fn": "permute", "no_grad": False, "switches": {},
                        "args": {"seq": [{"var": [2, 3, 4], "dtype": "float32"}, 2, 0, 1], "tuple": False},
                        "kwargs": {"seq": [], "tuple": False}}
    assert lines[1]["no_grad"] and lines[1]["args"]["seq"][1:] == [2]
    assert lines[1]["kwargs"]["seq"] == [{"seq": ["return_indices", True], "tuple": True}]
    assert [e["fn"] for e in lines[2:]] == ["expand_as"]


def test_the_committed_recording_replays(monkeypatch):
    """Every recorded call decodes and names a function of ops; a sample of them replays (on this machine's
    device), the forwards of the grad-mode calls with their gradients."""
    entries = call_record.load(call_record.RECORDING)
    assert len(entries) > 100
    assert {e["fn"] for e in entries} <= set(ops.__all__)
    rng = np.random.default_rng(0)
    for e in entries:
        call_record._decode(e["args"], rng)
    sample = entries[::25]
    outs = call_record.replay(sample, rng)
    assert len(outs) > len(sample)  # gradients too
    jt.sync(outs)


def test_record_only_mode_records_and_stops_the_call(tmp_path, monkeypatch):
    path = tmp_path / "calls.jsonl"
    monkeypatch.setenv(call_record.ONLY_ENV, "1")
    call_record.install(str(path), patch=monkeypatch.setattr)
    with pytest.raises(call_record.RecordedOnly):
        ops.timex(jt.array(np.ones((2, 5), np.float32)), jt.array(np.ones((1, 2, 5), np.float32)))
    (entry,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert entry["fn"] == "timex" and entry["args"]["seq"][1] == {"var": [1, 2, 5], "dtype": "float32"}


def test_the_committed_cuda_test_recording_names_gpu_only_calls():
    """``tests/cuda_test_calls.jsonl`` holds the first calls of the CUDA-only tests (recorded without a GPU):
    tensor-core timex switches and GPU-sized inputs, which the CPU half never calls."""
    entries = call_record.load(call_record.CUDA_TESTS_RECORDING, 1 << 28)
    assert len(entries) > 100
    assert {e["fn"] for e in entries} <= set(ops.__all__)
    assert {e["switches"].get("OPS_TIMEX_MMA") for e in entries} >= {"0", "1", "3"}
    assert max(call_record._elements(e["args"]) for e in entries) > call_record.MAX_ELEMENTS


def test_recording_flags_hold_use_cuda_and_forward_the_rest():
    real = jt.flags
    flags = call_record.RecordingFlags(real)
    flags.use_cuda = 1
    assert flags.use_cuda == 1 and real.use_cuda == 0
    previous = real.no_grad
    flags.no_grad = 1
    try:
        assert real.no_grad == 1 and flags.no_grad == 1
    finally:
        real.no_grad = previous
    assert min(flags.cuda_archs) >= 80 if not hasattr(real, "cuda_archs") else flags.cuda_archs == real.cuda_archs


def test_large_recorded_inputs_decode_to_uninitialized_vars():
    rng = np.random.default_rng(0)
    big = call_record._decode({"var": [2048, 1024], "dtype": "bfloat16"}, rng)
    small = call_record._decode({"var": [4, 3], "dtype": "float16"}, rng)
    assert (tuple(big.shape), str(big.dtype)) == ((2048, 1024), "bfloat16")
    assert (tuple(small.shape), str(small.dtype)) == ((4, 3), "float16")
    assert np.abs(small.float32().numpy()).max() <= 1.0


def test_a_recording_names_public_functions_of_registered_families_only(monkeypatch):
    monkeypatch.delenv(registry.FAMILY_MODULES_ENV, raising=False)
    assert call_record._function("transpose_add") is ops.permutation.transpose_add
    with pytest.raises(ValueError, match="'scale', a function of no registered family"):
        call_record._function("scale")
    monkeypatch.setenv(registry.FAMILY_MODULES_ENV, "toy_family")
    import toy_family
    assert call_record._function("scale") is toy_family.scale
    assert call_record.recorded_files() == [] and call_record.public() == {"toy_family": ("scale",)}
