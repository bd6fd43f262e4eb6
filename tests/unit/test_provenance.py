"""Recordings go stale when, and only when, the code their experiment runs changes (gpulab.core.provenance).

Each case edits a copy of the package's source and fingerprints every declared experiment again: edits that
change nothing an experiment runs stale nothing; an edit to code that runs stales exactly the experiments
whose closure holds it, however far down and in whichever module.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from gpulab.ch03_blas_levels import blas
from gpulab.core import closure, provenance, rates, recordings
from gpulab.core.closure import Source
from gpulab.core.provenance import experiment


@pytest.fixture(scope="module")
def baseline():
    source = closure.package_source()
    return {name: provenance.fingerprint(d.module, d.name, source) for name, (d, _) in source.experiments().items()}


@pytest.fixture
def package(tmp_path):
    """A copy of the package's source, to edit."""
    copy = tmp_path / "gpulab"
    shutil.copytree(closure.PACKAGE_ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def edit(package: Path, name: str, old: str, new: str) -> None:
    """Replace ``old`` by ``new`` in the top-level definition ``name`` (found in whichever module defines it;
    a name ending in ``.cu`` is a kernel file)."""
    if name.endswith(".cu"):
        path = package / "kernels" / name
        start, end = 0, len(path.read_text())
    else:
        [(module, node)] = [(m, node) for m in Source(package).modules.values()
                            for node in m.definitions.get(name, []) if not isinstance(node, ast.AugAssign)]
        relative = module.name.split(".")[1:]
        path = package.joinpath(*relative).with_suffix(".py")
        if not path.exists():
            path = package.joinpath(*relative, "__init__.py")
        lines = path.read_text().splitlines(keepends=True)
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        start, end = sum(map(len, lines[:first - 1])), sum(map(len, lines[:node.end_lineno]))
    text = path.read_text()
    assert text[start:end].count(old) == 1, f"{old!r} is not once in {name}"
    path.write_text(text[:start] + text[start:end].replace(old, new) + text[end:])


def staled(package: Path, baseline) -> set[str]:
    source = Source(package)
    return {name for name, (d, _) in source.experiments().items()
            if provenance.fingerprint(d.module, d.name, source).hash != baseline[name].hash}


def running(baseline, part: str) -> set[str]:
    """The experiments whose closure holds ``part`` (a bare definition name, or ``kernels/NN_name.cu``)."""
    return {name for name, fingerprint in baseline.items()
            if any(where == part or where.endswith(f".{part}") for where in fingerprint.parts)}


def test_fingerprints_are_the_recorded_ones_and_every_recording_is_fresh():
    stale = recordings.stale_recordings()
    assert not stale, "stale recordings, refresh with `make gpu-run`:\n" + "\n".join(map(str, stale))


def test_figures_docstrings_comments_and_unrun_helpers_stale_nothing(package, baseline):
    edit(package, "worklog_figure", "steps = [", "bars = steps = [")  # a figure
    edit(package, "measure", '"""Time ``fn()`` on ``device`` and return', '"""Time ``fn()`` on ``device``; return')
    edit(package, "measure", "    device = device or env.device()\n",
         "    # where the work runs\n    device = (\n        device or env.device()\n    )\n")  # comment, layout
    edit(package, "fit_partial", "def fit_partial(", "def fit_partial(unused_argument=None, *, ")  # runs nowhere
    edit(package, "nearest", "def nearest(", "def nearest(ignored=0, *, ")
    assert staled(package, baseline) == set()


def test_editing_the_experiment_function_stales_its_recordings_only(package, baseline):
    edit(package, "worklog", "    rows = []", "    rows = list()")
    assert staled(package, baseline) == running(baseline, "worklog") == {"gemm_worklog", "tensor_wmma"}


def test_a_constant_it_reads_stales_what_reads_it(package, baseline):
    edit(package, "THREADS_PER_BLOCK", "= 256", "= 128")  # the fused kernel's block size
    expected = running(baseline, "THREADS_PER_BLOCK")
    assert {"fusion_hand_kernel", "fusion_roofline"} <= expected and "blas_levels" not in expected
    assert staled(package, baseline) == expected


def test_a_helper_two_calls_down_in_another_module(package, baseline):
    # gemm.size_sweep -> mlp.tile_waves -> mlp.TileWaves: the wave model the quantization sweeps measure against
    edit(package, "TileWaves", "class TileWaves:", "class TileWaves:\n    extra = 1\n")
    expected = running(baseline, "TileWaves")
    assert {"gemm_wave_quantization", "gemm_tile_quantization"} <= expected
    assert "mlp_fc_batch_sweep" not in expected
    assert staled(package, baseline) == expected


def test_the_timer_is_in_every_timed_experiment(package, baseline):
    edit(package, "L2_FLUSH_BYTES", "256 * 2**20", "512 * 2**20")
    expected = running(baseline, "L2_FLUSH_BYTES")
    assert {"gemm_worklog", "blas_levels", "fusion_hand_kernel", "timing_fidelity"} <= expected
    assert staled(package, baseline) == expected


def test_a_kernel_file_stales_the_experiments_that_compile_it(package, baseline):
    kernel = package / "kernels" / "06_saxpy_float4.cu"
    kernel.write_text("// a comment, and blank lines\n\n" + kernel.read_text().replace("\n", "\n\n"))
    assert staled(package, baseline) == set()
    edit(package, "06_saxpy_float4.cu", "int first = blockIdx.x", "int first = 0 + blockIdx.x")
    assert staled(package, baseline) == running(baseline, "kernels/06_saxpy_float4.cu") == {"threads_saxpy_vs_copy"}


def test_moving_a_function_to_another_module_keeps_every_fingerprint(package, baseline):
    # a function moves to a new module, and its old module imports it from there (as a caller elsewhere would)
    [home] = [m for m in Source(package).modules.values() if "bytes_per_element" in m.definitions]
    [node] = home.definitions["bytes_per_element"]
    path = package.joinpath(*home.name.split(".")[1:]).with_suffix(".py")
    text = path.read_text()
    moved = ast.get_source_segment(text, node)
    (package / "elsewhere.py").write_text(
        f"import torch\n\nfrom gpulab.core.validation import torch_dtype\n\n\n{moved}\n")
    path.write_text(text.replace(moved, "") + "\n\nfrom gpulab.elsewhere import bytes_per_element  # noqa: E402\n")
    assert staled(package, baseline) == set()


def test_code_a_worker_process_runs_is_declared_and_counted(baseline):
    # the DDP experiments start `python -m gpulab.ch16_distributed_training.ddp`: the tasks run there only
    # through the declared main()
    for name in ("distributed_ddp_scaling", "distributed_nccl_allreduce"):
        assert {name for part in ("main", "_scaling_task", "_allreduce_task") for name in running(baseline, part)} >= {
            "distributed_ddp_scaling", "distributed_nccl_allreduce"}


def test_the_stale_report_names_what_changed(tmp_path, monkeypatch, package, baseline):
    recorded = baseline["gemm_tile_quantization"].as_dict()
    edit(package, "TileWaves", "class TileWaves:", "class TileWaves:\n    extra = 1\n")
    source = Source(package)
    definition, _ = source.experiments()["gemm_tile_quantization"]
    now = provenance.fingerprint(definition.module, definition.name, source)
    [changed] = provenance.changes(recorded, now)
    assert re.fullmatch(r"gpulab\.[\w.]+\.TileWaves changed", changed)
    assert provenance.changes({**recorded, "version": 0}, now)[0] == "version 0 -> 1"
    assert provenance.changes(recorded, baseline["gemm_tile_quantization"]) == []


def test_a_recording_needs_a_declared_experiment(tmp_path, monkeypatch):

    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path))
    with pytest.raises(ValueError, match=r"declares blas_levels, not 'tiny'"):
        recordings.run("tiny", blas.levels_sweep, vector_sizes=[256], matrix_sizes=[16], dtypes=["float32"])
    with pytest.raises(ValueError, match="is not an experiment: decorate it with @experiment"):
        recordings.run("copy", rates.measure_copy, n_bytes=1024)
    with pytest.raises(ValueError, match="^version: a positive int"):
        experiment("x", version=0)


def test_fingerprints_are_the_same_on_every_python_the_book_runs_on(tmp_path):
    """CI runs Python 3.11, the GPU machines 3.12, Colab 3.13: a recording made on one is checked on another.
    The fingerprint reads the source with `ast`, whose dump differs between versions; ours must not."""
    script = ("import json, sys; sys.path.insert(0, sys.argv[1]); from gpulab.core import provenance as p;"
              "s = p.Source(); print(json.dumps({n: p.fingerprint(d.module, d.name, s).hash"
              " for n, (d, _) in s.experiments().items()}))")
    others = [Path(f"/root/.pyenv/versions/{v}/bin/python") for v in ("3.12.1", "3.13.0")]
    others = [python for python in others if python.exists()]
    if not others:
        pytest.skip("no other Python version on this machine")
    here = json.loads(subprocess.run([sys.executable, "-c", script, str(ROOT / "src")], capture_output=True,
                                     text=True, check=True).stdout)
    for python in others:
        there = subprocess.run([str(python), "-c", script, str(ROOT / "src")], capture_output=True, text=True,
                               check=True)
        assert json.loads(there.stdout) == here, python


def test_stamped_recordings_were_fresh_when_they_moved_to_the_closure_fingerprint():
    """Schema 1's recordings were stamped with their closure fingerprint without being re-run: each was fresh
    under the old module hash at the commit it was stamped from (recomputed there, from git history)."""
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "stamp_fingerprints.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_parts_with_the_same_name_and_code_in_several_modules_are_matched_one_to_one():
    # step4.CONFIG = dict(STEP3_CONFIG), step5.CONFIG = dict(STEP4_CONFIG), ...: one text, one digest, three places
    recorded = {"hash": "old", "version": 1, "parts": {"m4.CONFIG": "d", "m5.CONFIG": "d", "m6.CONFIG": "d",
                                                        "m1.tile": "t1"}}
    now = provenance.Fingerprint(hash="new", version=1, parts={"m4.CONFIG": "d", "m5.CONFIG": "d", "m6.CONFIG": "d",
                                                                "m1.tile": "t2"})
    assert provenance.changes(recorded, now) == ["m1.tile changed"]
    fewer = provenance.Fingerprint(hash="new", version=1, parts={"m4.CONFIG": "d", "m1.tile": "t1"})
    assert provenance.changes(recorded, fewer) == ["the code changed"]  # two CONFIGs fewer, but the name still runs
