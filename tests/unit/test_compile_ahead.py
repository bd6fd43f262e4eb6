"""gpulab.kernels.compile_ahead: tasks run in spawned processes, failures reported, nothing done where it cannot help,
and the task list of the attention race."""

from __future__ import annotations

import functools
import os
import textwrap
import time

import pytest
import torch

from conftest import needs_gpu
from gpulab.core import kernel_mode
from gpulab.kernels import compile_ahead
from gpulab.kernels.triton_attention import measure as attention_measure
from gpulab.kernels.triton_gemm import common, step1_blocked

PROBE = """
import os
import time


def where():
    return os.getpid()


def fails():
    raise ValueError("the probe failed\\nand this second line is not reported")


def sleeps(seconds):
    time.sleep(seconds)
    return seconds
"""


@pytest.fixture
def probe(tmp_path, monkeypatch):
    """A module found only through this process's sys.path (not PYTHONPATH): a spawned worker must inherit it."""
    (tmp_path / "ahead_probe.py").write_text(textwrap.dedent(PROBE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "ahead_probe"


def test_tasks_run_in_other_processes_with_the_parents_path_and_environment(probe, monkeypatch):
    monkeypatch.setenv("GPULAB_AHEAD_PROBE", "inherited")
    tasks = [(f"{probe}:where", {}), (f"{probe}:where", {}), ("os:getenv", {"key": "GPULAB_AHEAD_PROBE"}),
             (os.getenv, {"key": "GPULAB_AHEAD_PROBE"})]
    outcome = compile_ahead.compile_ahead(tasks, workers=2, enabled=True, quiet=True)
    assert outcome["failed"] == [] and outcome["tasks"] == 4 and outcome["workers"] == 2
    pids = outcome["results"][:2]
    assert all(isinstance(pid, int) and pid != os.getpid() for pid in pids)
    assert outcome["results"][2:] == ["inherited", "inherited"]
    assert outcome["seconds"] > 0 and outcome["skipped"] is None


def test_a_raising_task_is_reported_in_one_line_and_the_others_still_run(probe, capsys):
    outcome = compile_ahead.compile_ahead([(f"{probe}:fails", {}), (f"{probe}:sleeps", {"seconds": 0})],
                                          workers=2, enabled=True)
    assert outcome["results"] == [None, 0]
    [line] = outcome["failed"]
    assert line == f"{probe}:fails (task 0): ValueError: the probe failed"
    printed = capsys.readouterr().out
    assert "2 tasks on 2 processes" in printed and "1 failed" in printed and "the probe failed" in printed


def test_a_missing_function_is_a_failure_not_an_error():
    outcome = compile_ahead.compile_ahead([("os:no_such_function", {})], workers=1, enabled=True, quiet=True)
    assert outcome["failed"] == ["os:no_such_function (task 0): AttributeError: module 'os' has no attribute "
                                 "'no_such_function'"]


def test_a_task_still_running_at_the_timeout_is_stopped(probe):
    start = time.perf_counter()
    outcome = compile_ahead.compile_ahead([(f"{probe}:sleeps", {"seconds": 60})], workers=1, enabled=True,
                                          timeout_s=3, quiet=True)
    assert time.perf_counter() - start < 30
    assert outcome["failed"] == [f"{probe}:sleeps (task 0): still running after 3 s: stopped"]


def test_in_turn_runs_every_call_then_raises_the_first_failure(probe):
    assert compile_ahead.in_turn([("os:getcwd", {}), (f"{probe}:sleeps", {"seconds": 0})]) == [os.getcwd(), 0]
    with pytest.raises(ValueError, match="the probe failed"):
        compile_ahead.in_turn([(f"{probe}:fails", {}), (f"{probe}:fails", {})])


def test_skipped_when_asked_not_to_and_returns_at_once():
    start = time.perf_counter()
    outcome = compile_ahead.compile_ahead([("os:getpid", {})] * 4, enabled=False)
    assert time.perf_counter() - start < 0.5
    assert outcome["skipped"] == "not asked to" and outcome["workers"] == 0 and outcome["failed"] == []
    assert outcome["results"] == [None] * 4
    assert compile_ahead.describe(outcome) == "Triton kernels not compiled ahead: not asked to."


@pytest.mark.skipif(kernel_mode.on_gpu(), reason="the CPU's decision")
def test_skipped_without_a_gpu(capsys):
    start = time.perf_counter()
    outcome = compile_ahead.compile_ahead([("os:getpid", {})] * 4)
    assert time.perf_counter() - start < 0.5
    assert outcome["skipped"].startswith("no GPU") and outcome["workers"] == 0
    assert capsys.readouterr().out == ""


def test_the_decision_is_made_by_why_not_and_the_cores(monkeypatch):
    monkeypatch.setattr(compile_ahead, "why_not", lambda: "Triton's interpreter runs the kernels")
    assert compile_ahead.compile_ahead([("os:getpid", {})] * 4)["skipped"] == "Triton's interpreter runs the kernels"
    monkeypatch.setattr(compile_ahead, "why_not", lambda: None)
    monkeypatch.setattr(compile_ahead, "usable_cores", lambda: 3)
    outcome = compile_ahead.compile_ahead([("os:getpid", {})] * 4)
    assert outcome["skipped"].startswith("too few tasks or cores") and outcome["workers"] == 0
    monkeypatch.setattr(compile_ahead, "usable_cores", lambda: 16)
    assert compile_ahead.default_workers(36) == 8 and compile_ahead.default_workers(4) == 4
    assert compile_ahead.compile_ahead([("os:getpid", {})])["skipped"].startswith("too few tasks")
    assert compile_ahead.compile_ahead([])["skipped"] == "no tasks"


@pytest.mark.parametrize("task, says", [
    (("os.getpid", {}), "tasks[1]: target"),
    (("os:getpid",), "tasks[1]: a pair"),
    ("os:getpid", "tasks[1]: a pair"),
    (("os:getpid", [1]), "tasks[1]: kwargs must be a dict"),
    (("os:getpid", {1: 2}), "tasks[1]: kwargs must be a dict"),
    (("os:getpid", {"x": lambda: 0}), "tasks[1]: kwargs must be picklable"),
    ((lambda: 0, {}), "tasks[1]: target"),
])
def test_a_malformed_task_is_a_value_error_naming_it(task, says):
    with pytest.raises(ValueError, match=says.replace("[", r"\[").replace("]", r"\]")):
        compile_ahead.compile_ahead([("os:getpid", {}), task], enabled=False)


def test_bad_arguments():
    with pytest.raises(ValueError, match="tasks:"):
        compile_ahead.compile_ahead("os:getpid")
    with pytest.raises(ValueError, match="workers:"):
        compile_ahead.compile_ahead([("os:getpid", {})], workers=0)
    with pytest.raises(ValueError, match="timeout_s:"):
        compile_ahead.compile_ahead([("os:getpid", {})], timeout_s=0)


def test_specializations_follow_triton():
    assert [compile_ahead.specialization(n) for n in (1, 16, 4096, 1000, 1240, 7)] == [
        "one", "multiple of 16", "multiple of 16", "other", "other", "other"]
    assert compile_ahead.one_per_specialization([16384, 1024, 256, 1000, 300, 1]) == [1, 256, 300]
    with pytest.raises(TypeError, match="n:"):
        compile_ahead.specialization(True)


def test_the_races_tasks_cover_each_head_size_and_mask():
    tasks = attention_measure._compile_tasks((1024, 2048, 4096), (64, 128), (False, True), ("triton", "sdpa-math"),
                                             "bfloat16", 256, None, None)
    assert len(tasks) == 4
    points = [(c[1]["head_dim"], c[1]["causal"], c[1]["seq_len"]) for _, kw in tasks for c in kw["calls"]]
    assert points == [(64, False, 256), (64, True, 256), (128, False, 256), (128, True, 256)]
    for task in tasks:
        compile_ahead.check_task(task)
    odd = attention_measure._compile_tasks((1000, 4096), (64,), (True,), ("triton",), "bfloat16", 256, None, None)
    assert [c[1]["seq_len"] for c in odd[0][1]["calls"]] == [256, 1000]
    assert attention_measure._compile_tasks((1024,), (64,), (True,), ("sdpa-flash",), "bfloat16", 256, None, None) == []


@needs_gpu
def test_the_parent_loads_what_a_worker_compiled_instead_of_compiling_it(tmp_path, monkeypatch):
    """On the GPU: a worker compiles a kernel into a fresh cache; the same launch in this process then finds it
    there (Triton's ptxas stage, patched to fail here, is never reached)."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))  # inherited by the worker
    config = {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 16, "num_warps": 4, "num_stages": 2}  # used by no other test
    matmul = functools.partial(step1_blocked.matmul, **config)
    call = {"matmul": matmul, "m": 200, "n": 104, "k": 40, "dtype": torch.float16}
    outcome = compile_ahead.compile_ahead([(common.check, call)], workers=1, enabled=True, quiet=True)
    assert outcome["failed"] == [] and any((tmp_path / "triton").rglob("*.cubin"))
    from triton.backends.nvidia.compiler import CUDABackend

    def compiled_here(*args, **kwargs):
        raise AssertionError("the parent compiled the kernel again: the worker's launch was keyed differently")

    monkeypatch.setattr(CUDABackend, "make_cubin", compiled_here)
    common.check(**call)
