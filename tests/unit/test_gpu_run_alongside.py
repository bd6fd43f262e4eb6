"""tools/gpu_run.py's labs run beside chapter 18: which notebooks move, that each runs in a process of its own with a
time entry, and that the recording's total is the notebooks' wall time (a wait for them counted, their own time not)."""

from __future__ import annotations

import sys

from nbformat.v4 import new_code_cell, new_notebook, writes

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import gpu_run  # noqa: E402  (tools/ is not a package)


def test_every_notebook_alongside_exists_and_its_host_is_a_chapter():
    for host, guests in gpu_run.alongside(1).items():
        assert (ROOT / "notebooks" / f"{host}.ipynb").is_file()
        for guest in guests:
            folders = ("labs/solutions", "notebooks")
            assert any((ROOT / folder / f"{guest}.ipynb").is_file() for folder in folders), guest


def test_chapter_16_runs_beside_only_on_one_gpu():
    """With two GPUs chapter 16 times NCCL live: it must run alone then."""
    chapter = ROOT / "notebooks" / "16_distributed_training.ipynb"
    host = ROOT / "notebooks" / "17_hopper_tensor_cores.ipynb"
    sequence, beside = gpu_run.split_alongside([chapter, host], gpus=1)
    assert sequence == [host] and beside == {host.stem: [chapter]}
    sequence, beside = gpu_run.split_alongside([chapter, host], gpus=2)
    assert sequence == [chapter, host] and beside == {}


def test_the_labs_move_beside_their_host_only_when_it_runs():
    host = ROOT / "notebooks" / "18_flash_attention_and_counters.ipynb"
    lab = ROOT / "labs" / "solutions" / "11_all_reduce.ipynb"
    other = ROOT / "notebooks" / "03_blas_levels.ipynb"
    sequence, beside = gpu_run.split_alongside([other, host, lab])
    assert sequence == [other, host] and beside == {host.stem: [lab]}
    sequence, beside = gpu_run.split_alongside([other, lab])  # its host not run: the lab runs in the sequence
    assert sequence == [other, lab] and beside == {}


def test_the_total_is_the_wall_time():
    times = [{"notebook": "a", "seconds": 10.0},
             {"notebook": "b", "seconds": 20.0, "waited_for_alongside_seconds": 2.5},
             {"notebook": "lab", "seconds": 21.0, "alongside": "b"}]
    assert gpu_run.total_seconds(times) == 32.5


def test_a_notebook_alongside_runs_in_its_own_process_and_is_timed(tmp_path):
    (tmp_path / "notebooks").mkdir()
    good, bad = tmp_path / "notebooks" / "good.ipynb", tmp_path / "bad.ipynb"
    # a chapter (in notebooks/) gets the run's profile as its PROFILE parameter; this one fails without it
    good.write_text(writes(new_notebook(cells=[new_code_cell("PROFILE = None", metadata={"tags": ["parameters"]}),
                                               new_code_cell("assert PROFILE == 'class', PROFILE")],
                                        metadata={"kernelspec": {"name": "python3", "language": "python",
                                                                 "display_name": "Python 3"}})))
    bad.write_text(writes(new_notebook(cells=[new_code_cell("raise ValueError('wrong on purpose')")])))
    out = tmp_path / "out"
    out.mkdir()
    side = gpu_run.Alongside([good, bad], out, "notebooks/18_flash_attention_and_counters.ipynb", "class")
    original = gpu_run.ROOT
    gpu_run.ROOT = tmp_path  # the entries name notebooks relative to the repository; here, to tmp_path
    try:
        side.start()
        side.join(timeout=300)
    finally:
        gpu_run.ROOT = original
    assert [t["notebook"] for t in side.times] == ["notebooks/good.ipynb", "bad.ipynb"]
    assert side.times[0]["status"] == "ok" and (out / "good.ipynb").is_file()
    assert side.times[1]["status"].startswith("FAILED") and "wrong on purpose" in side.times[1]["status"]
    assert side.failed == ["bad.ipynb"]
    assert all(t["seconds"] > 0 for t in side.times)
