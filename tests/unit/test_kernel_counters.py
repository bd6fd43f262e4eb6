"""The Nsight Compute experiment of chapter 18 on a CPU: the driver's kernel table and arguments, profile_kernels'
errors without a GPU or ncu, its rows built from ncu's CSV through a fake ncu run, and the figure and tables drawn from
synthetic recordings in a temporary results folder.

``tests/data/ncu_cublas_h100.csv`` is real: ncu 2025.3.1 on an H100 profiling cuBLAS's 4096^3 GEMM in float32 (TF32
off, launch 3) and in TF32 (launch 7), with the metric names of that day. The other CSV text is written here in the
same "details" format.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import needs_gpu
from gpulab.ch13_memory_bound_layers_and_fusion import fusion
from gpulab.ch18_flash_attention_and_counters import driver, profiled
from gpulab.core import counter_figures, counters, kernel_mode, provenance, recordings
from gpulab.core.recordings import Recording
from gpulab.kernels.triton_attention.measure import forward_flops

REAL_CSV = Path(__file__).resolve().parents[1] / "data" / "ncu_cublas_h100.csv"
BOOK_RESULTS = Path(__file__).resolve().parents[2] / "results"
HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


def real_launch(launch: str) -> str:
    """The real CSV with only launch ``launch`` ('3': float32, '7': TF32), as ncu writes one profiled launch."""
    lines = REAL_CSV.read_text().splitlines()
    return "\n".join(line for line in lines if not line.startswith('"') or line.startswith(('"ID",', f'"{launch}",')))


def synthetic_csv(kernel: str, seconds: float, flops: float = 0.0, dram_read: float = 1e6, dram_write: float = 1e6,
                  stalls: dict | None = None, tensor: float | None = None) -> str:
    """ncu's details page for one launch of ``kernel``: ``flops`` as FFMA instructions (2 FLOP each)."""
    values = {counters.TIME: ("ns", seconds * 1e9), counters.DRAM_READ: ("byte", dram_read),
              counters.DRAM_WRITE: ("byte", dram_write), counters.L2: ("byte", 3 * (dram_read + dram_write)),
              counters.SM_THROUGHPUT: ("%", 71.5), counters.MEMORY_THROUGHPUT: ("%", 45.0),
              "sm__sass_thread_inst_executed_op_ffma_pred_on.sum": ("inst", flops / 2)}
    if tensor is not None:
        values["sm__ops_path_tensor_src_bf16_dst_fp32.sum"] = ("", tensor)
    for reason, value in (stalls or {"long_scoreboard": 2.5, "mio_throttle": 4.0, "selected": 1.0}).items():
        values[f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"] = ("inst", value)
    lines = ["==PROF== Connected to process 77 (/usr/bin/python3.12)", HEADER]
    for metric, (unit, value) in values.items():
        lines.append(f'"0","77","python3.12","127.0.0.1","{kernel}","1","7","(256, 1, 1)","(64, 1, 1)","0","9.0",'
                     f'"Command line profiler metrics","{metric}","{unit}","{value:,.2f}"')
    return "\n".join(lines) + "\n"


def report(name: str, error: float = 1e-6) -> str:
    return "building...\n" + driver.MARKER + json.dumps({"kernel": name, "size": 1, "warmup": 2,
                                                         "relative_error": error}) + "\n"


CRASHED = (None, profiled.Finished(-11, "", "Segmentation fault"))  # a session that died before any kernel


class FakeNcu:
    """Stands in for :func:`profiled.execute`: per kernel, the log ncu writes and how the run ends; ``session``: the
    same for the session's run (by default one that crashed at once, so that every kernel runs in its own)."""

    def __init__(self, runs: dict[str, tuple[str | None, profiled.Finished]],
                 session: tuple[str | None, profiled.Finished] = CRASHED):
        self.runs, self.session, self.commands, self.timeouts = runs, session, [], []

    def __call__(self, command, timeout_s):
        self.commands.append(list(command))
        self.timeouts.append(timeout_s)
        kernel = command[command.index("-m") + 2]
        log, finished = self.session if kernel == "--session" else self.runs[kernel]
        if log is not None:
            Path(command[command.index("--log-file") + 1]).write_text(log)
        return finished


@pytest.fixture
def gpu_and_ncu(monkeypatch):
    """profile_kernels as on a GPU machine with ncu: the GPU check passes and ncu is 'found'."""
    monkeypatch.setattr(profiled.kernel_mode, "require_gpu", lambda what: None)
    monkeypatch.setattr(profiled, "find_ncu", lambda: "/opt/ncu")


def fake_profile(monkeypatch, runs: dict, session=CRASHED, kernels=None, **params) -> tuple[list[dict], FakeNcu]:
    fake = FakeNcu(runs, session)
    monkeypatch.setattr(profiled, "execute", fake)
    return profiled.profile_kernels(list(kernels or runs), **params), fake


# ---- the driver ------------------------------------------------------------------------------------------------

def test_the_kernel_table_covers_the_books_kernels_in_reading_order():
    assert profiled.KERNELS == driver.NAMES and len(set(driver.NAMES)) == len(driver.NAMES)
    chapters = [driver.kernel(name).chapter for name in driver.NAMES]
    assert chapters == sorted(chapters, key=["08", "09", "10", "17", "13", "18"].index)
    from gpulab.ch09_gemm_on_the_gpu import gemm
    from gpulab.ch10_tensor_cores import wmma
    assert {s.kernel for s in gemm.STEPS} | {k.kernel for k in wmma.KERNELS} <= set(driver.NAMES)
    assert {"transpose_naive", "transpose_tiled", "cublas_float32", "cublas_tf32", "cublas_bfloat16",
            "triton_gemm_persistent", "fused_bias_gelu_dropout", "flash_attention_forward"} <= set(driver.NAMES)
    for spec in driver.KERNELS:
        re.compile(spec.regex)
        assert spec.size > 0 and spec.size_means and spec.dtype in ("float32", "tf32", "float16", "bfloat16")


def test_each_regex_finds_its_kernel_and_none_of_the_launches_before_it():
    """ncu matches the regex anywhere in the kernel's name; the driver's set-up launches random numbers, fills and
    conversions, which must not match, or the launch ncu skips to would shift."""
    helpers = ("distribution_elementwise_grid_stride_kernel", "vectorized_elementwise_kernel",
               "unrolled_elementwise_kernel", "elementwise_kernel_with_index")
    cublas = ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize256x128x8_stage3_warpsize4x2x1_ffma_aligna4_alignc4_"
              "execute_kernel__5x_cublas", "nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_NNT")
    for spec in driver.KERNELS:
        assert not any(re.search(spec.regex, name) for name in helpers), spec.name
        own = cublas if spec.name.startswith("cublas") else (spec.regex,)
        assert all(re.search(spec.regex, name) for name in own), spec.name


def test_the_books_counts_follow_the_chapters():
    n = 4096
    assert driver.kernel("sgemm_naive").cost(n).flops == 2 * n**3
    assert driver.kernel("sgemm_naive").cost(n).bytes == 3 * 4 * n * n
    assert driver.kernel("wmma_gemm_naive").cost(n).bytes == 2 * 2 * n * n + 4 * n * n
    assert driver.kernel("cublas_tf32").cost(n) == driver.kernel("cublas_float32").cost(n)
    assert driver.kernel("cublas_bfloat16").cost(n).bytes == 3 * 2 * n * n
    transpose = driver.kernel("transpose_naive").cost(1024)
    assert transpose.flops == 0 and transpose.bytes == 8 * 1024 * 1024
    assert driver.kernel("fused_bias_gelu_dropout").cost(8) == fusion.chain_cost("bias_gelu_dropout", 8 * 4096,
                                                                                    fused=True)
    assert driver.attention_shape(4096) == (4, 16, 4096, 128)
    assert driver.kernel("flash_attention_forward").cost(4096).flops == forward_flops(4, 16, 4096, 128, False)


@pytest.mark.parametrize(("argv", "message"), [
    (["sgemm_fastest"], "^kernel:"), (["sgemm_naive", "--size", "0"], "^size:"),
    (["sgemm_naive", "--size", "big"], "^size:"), (["sgemm_naive", "--size", "2.5"], "^size:"),
    (["sgemm_naive", "--warmup", "-1"], "^warmup:"), (["sgemm_naive", "--warmup", "two"], "^warmup:"),
])
def test_the_driver_names_a_bad_argument(argv, message):
    with pytest.raises(ValueError, match=message):
        driver.parse_arguments(argv)


def test_the_driver_reads_its_arguments_and_exits_2_on_a_bad_one(capsys):
    assert driver.parse_arguments(["sgemm_shared"]) == ("sgemm_shared", None, driver.WARMUP)
    assert driver.parse_arguments(["transpose_tiled", "--size", "8192", "--warmup", "0"]) == (
        "transpose_tiled", 8192, 0)
    assert driver.main(["no_such_kernel"]) == 2
    assert "driver: kernel: no kernel called 'no_such_kernel'" in capsys.readouterr().err


def test_the_driver_needs_a_gpu():
    assert not kernel_mode.on_gpu()
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        driver.run("sgemm_naive", 64)
    with pytest.raises(ValueError, match="^warmup:"):
        driver.run("sgemm_naive", 64, warmup=-2)


def test_the_cublas_check_passes_a_right_product_and_catches_an_unwritten_one():
    """The cuBLAS kernels' preparation runs on any device: here on the CPU, where torch.mm is not cuBLAS."""
    prepared = driver.kernel("cublas_float32").prepare(48, torch.device("cpu"))
    with pytest.raises(AssertionError, match="cuBLAS float32"):
        prepared.check()  # the output is still NaN: not written yet
    prepared.launch()
    assert prepared.check() < 1e-6


def test_the_attention_check_compares_with_float64_attention():
    q, k, v = (torch.randn(2, 3, 64, 16) for _ in range(3))
    right = torch.softmax(q @ k.transpose(-2, -1) / 4.0, dim=-1) @ v
    assert driver._attention_error(q, k, v, right) < 1e-6
    with pytest.raises(AssertionError, match="FlashAttention"):
        driver._attention_error(q, k, v, right.flip(-2))


SMALL = {"08": 1024, "13": 64, "18": 512}  # sizes for a quick run on a GPU; the GEMMs: 512


@needs_gpu
@pytest.mark.parametrize("name", driver.NAMES)
def test_each_kernel_runs_and_passes_its_check_on_the_gpu(name):
    spec = driver.kernel(name)
    try:
        reported = driver.run(name, SMALL.get(spec.chapter, 512), warmup=1)
    except ValueError as error:
        if "is not available here" not in str(error):  # the pipelined WMMA kernel before Ampere
            raise
        pytest.skip(str(error))
    assert reported["kernel"] == name and reported["relative_error"] >= 0


@needs_gpu
def test_one_kernel_profiled_by_ncu_on_the_gpu():
    try:
        profiled.find_ncu()
    except kernel_mode.MissingPackage as error:
        pytest.skip(str(error))
    (row,) = profiled.profile_kernels(["sgemm_shared"], sizes={"sgemm_shared": 1024})
    assert row["status"] == "ok", row["status"]
    assert row["flops_within"] and row["ncu_kernel"] == "sgemm_shared" and row["seconds"] > 0


# ---- the command and its errors ----------------------------------------------------------------------------------

def test_the_example_command_is_the_one_profile_kernels_runs():
    text = profiled.NCU_COMMAND_EXAMPLE
    words = shlex.split(text.replace("\\\n", " "))
    expected = profiled.profile_command("sgemm_shared", 4096, output_csv="sgemm_shared.csv", python="python")
    assert words == expected
    assert words[:2] == ["ncu", "--csv"] and "regex:sgemm_shared" in words
    assert words[words.index("--launch-skip") + 1] == str(driver.WARMUP)
    assert text.splitlines()[-1].strip() == (f"python -m {driver.MODULE} sgemm_shared --size 4096 "
                                             f"--warmup {driver.WARMUP}")
    cublas = profiled.command_text(profiled.profile_command("cublas_tf32", warmup=5))
    assert f"--kernel-name 'regex:{driver.CUBLAS_REGEX}'" in cublas and "--launch-skip 5" in cublas


@pytest.mark.parametrize(("arguments", "message"), [
    (dict(kernels=[]), "^kernels:"), (dict(kernels="sgemm_naive"), "^kernels:"),
    (dict(kernels=["sgemm_naive", "sgemm_fastest"]), "^kernels:"), (dict(kernels=["sgemm_naive"] * 2), "^kernels:"),
    (dict(kernels=["sgemm_naive"], sizes=[4096]), "^sizes:"),
    (dict(kernels=["sgemm_naive"], sizes={"sgemm_shared": 4096}), "^sizes:"),
    (dict(kernels=["sgemm_naive"], sizes={"sgemm_naive": 0}), "^sizes"),
    (dict(kernels=["sgemm_naive"], warmup=-1), "^warmup:"),
    (dict(kernels=["sgemm_naive"], timeout_s=0), "^timeout_s:"),
])
def test_profile_kernels_names_a_bad_argument(arguments, message):
    with pytest.raises(ValueError, match=message):
        profiled.profile_kernels(**arguments)


def test_profile_kernels_needs_a_gpu_and_then_ncu(monkeypatch):
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        profiled.profile_kernels(["sgemm_naive"])
    monkeypatch.setattr(profiled.kernel_mode, "require_gpu", lambda what: None)
    monkeypatch.delenv(profiled.NCU_ENV, raising=False)
    monkeypatch.setattr(profiled.shutil, "which", lambda name: None)
    monkeypatch.setattr(profiled, "NCU_PLACES", ())
    with pytest.raises(kernel_mode.MissingPackage, match=r"\(ncu\) is not on the PATH"):
        profiled.profile_kernels(["sgemm_naive"])


def test_ncu_is_found_where_gpulab_ncu_says(monkeypatch, tmp_path):
    ncu = tmp_path / "ncu"
    ncu.write_text("#!/bin/sh\n")
    ncu.chmod(0o755)
    monkeypatch.setenv(profiled.NCU_ENV, str(ncu))
    assert profiled.find_ncu() == str(ncu)


def test_execute_returns_the_output_and_stops_a_run_past_its_limit():
    done = profiled.execute([sys.executable, "-c", "import gpulab, sys; print('ran'); sys.exit(3)"], 60)
    assert done.returncode == 3 and done.stdout == "ran\n"
    start = time.perf_counter()
    stuck = profiled.execute([sys.executable, "-c", "import time; time.sleep(60)"], 0.5)
    assert stuck.returncode is None and time.perf_counter() - start < 20


# ---- rows from ncu's CSV -------------------------------------------------------------------------------------------

def test_rows_from_real_ncu_output_compare_with_the_books_counts(monkeypatch, gpu_and_ncu):
    rows, fake = fake_profile(monkeypatch, {
        "cublas_float32": (real_launch("3"), profiled.Finished(0, report("cublas_float32", 2e-7), "")),
        "cublas_tf32": (real_launch("7"), profiled.Finished(0, report("cublas_tf32", 3e-4), ""))})
    own = fake.commands[1:]  # after the session, which crashed
    assert "--session" in fake.commands[0]
    assert [c[c.index("--launch-skip") + 1] for c in own] == [str(driver.WARMUP)] * 2
    assert own[1][own[1].index("-m"):] == ["-m", driver.MODULE, "cublas_tf32", "--size", "4096",
                                           "--warmup", str(driver.WARMUP)]
    fp32, tf32 = rows
    assert fp32["status"] == tf32["status"] == "ok"
    assert fp32["profiled_in"] == tf32["profiled_in"] == "own process" and fp32["session_seconds"] >= 0
    assert fp32["ncu_kernel"].startswith("sm80_xmma_gemm_f32f32") and tf32["ncu_kernel"].startswith("sm90_xmma")
    assert fp32["size"] == 4096 and fp32["chapter"] == "09" and tf32["chapter"] == "10"
    # FFMA x 2 and TF32 tensor operations both count 2 M N K (plus a few epilogue FLOPs)
    assert fp32["flops_within"] and abs(fp32["flops_ratio"] - 1) < 1e-3
    assert tf32["flops_within"] and tf32["flops_by_precision"]["tensor"] == 2 * 4096**3
    # cold caches: cuBLAS reads A and B about twice from DRAM (the book counts each once)
    assert not fp32["bytes_within"] and 1.5 < fp32["bytes_ratio"] < 2.5
    assert tf32["relative_error"] == 3e-4 and fp32["seconds"] == pytest.approx(3.29e-3, rel=0.01)
    assert tf32["top_stalls"][0][0] == "barrier" and tf32["intensity"] == pytest.approx(
        tf32["flops"] / tf32["dram_bytes"])
    assert tf32["dram_gbytes_per_s"] == pytest.approx(tf32["dram_bytes"] / tf32["seconds"] / 1e9)
    json.dumps(rows, allow_nan=False)  # a recording is plain JSON


def test_a_kernel_without_arithmetic_is_compared_on_its_bytes(monkeypatch, gpu_and_ncu):
    n = driver.kernel("transpose_naive").size
    csv = synthetic_csv("transpose_naive", 1e-3, dram_read=4 * n * n, dram_write=4.2 * n * n)
    (row,), _ = fake_profile(monkeypatch, {"transpose_naive": (csv, profiled.Finished(0, report("x"), ""))})
    assert row["status"] == "ok" and row["flops"] == 0 and row["intensity"] == 0
    assert row["flops_ratio"] is None and row["flops_within"] is None
    assert row["bytes_ratio"] == pytest.approx(8.2 / 8) and row["bytes_within"]


def test_a_failed_kernel_is_a_row_with_the_first_line_of_its_error_and_the_sweep_goes_on(monkeypatch, gpu_and_ncu):
    traceback = ("Traceback (most recent call last):\n  File x\n"
                 "AssertionError: SGEMM step 1: relative error 1 exceeds 1e-4")
    runs = {
        "sgemm_naive": (None, profiled.Finished(1, "", traceback)),
        "sgemm_coalesced": ("==PROF== Connected\n==ERROR== ERR_NVGPUCTRPERM - The user does not have permission\n",
                            profiled.Finished(0, report("sgemm_coalesced"), "")),
        "sgemm_shared": (None, profiled.Finished(None, "", "")),
        "sgemm_1d_blocking": ("==PROF== Connected\n==WARNING== No kernels were profiled.\n",
                              profiled.Finished(0, report("sgemm_1d_blocking"), "")),
        "sgemm_2d_blocking": (synthetic_csv("sgemm_2d_blocking", 1e-3, 1e9), profiled.Finished(0, "no report\n", "")),
        "sgemm_vectorized": (synthetic_csv("sgemm_vectorized", 1e-3, 1e9).replace(counters.DRAM_WRITE, "other.sum"),
                             profiled.Finished(0, report("sgemm_vectorized"), "")),
        "sgemm_warp_tiled": (synthetic_csv("sgemm_warp_tiled", 0.0, 1e9), profiled.Finished(0, report("x"), "")),
        "sgemm_double_buffered": (synthetic_csv("sgemm_double_buffered", 1e-3, 1e9),
                                  profiled.Finished(0, driver.MARKER + "{not json\n", "")),
        "sgemm_prefetched": (synthetic_csv("sgemm_prefetched", 2e-2, 2 * 1024**3, 2e8, 1e8),
                             profiled.Finished(0, report("sgemm_prefetched"), "")),
    }
    rows, _ = fake_profile(monkeypatch, runs, sizes={"sgemm_prefetched": 1024})
    status = {r["kernel"]: r["status"] for r in rows}
    assert status["sgemm_naive"] == "failed: AssertionError: SGEMM step 1: relative error 1 exceeds 1e-4"
    assert status["sgemm_coalesced"] == "failed: ERR_NVGPUCTRPERM - The user does not have permission"
    assert status["sgemm_shared"].startswith("failed: ran past its time limit")
    assert status["sgemm_1d_blocking"] == ("failed: ncu profiled no launch matching 'sgemm_1d_blocking' after "
                                           f"skipping {driver.WARMUP} (No kernels were profiled.)")
    assert status["sgemm_2d_blocking"].startswith("failed: the driver printed no report")
    assert status["sgemm_vectorized"].startswith("failed: text: kernel launch 0 (sgemm_vectorized) lacks")
    assert status["sgemm_warp_tiled"] == "failed: row: the time must be > 0, got 0.0"
    assert status["sgemm_double_buffered"].startswith("failed: the driver printed no report")
    assert status["sgemm_prefetched"] == "ok"
    assert all(r["profile_seconds"] >= 0 and r["label"] for r in rows)
    best = rows[-1]
    assert best["size"] == 1024 and best["flops_ratio"] == pytest.approx(2 * 1024**3 / (2 * 1024**3))
    assert best["top_stalls"] == [["mio_throttle", 4.0], ["long_scoreboard", 2.5]]


def test_the_recordings_fingerprint_covers_the_code_the_driver_runs():
    parts = provenance.fingerprint_of(profiled.profile_kernels).parts
    for kernel_file in ("16_sgemm_naive", "24_sgemm_prefetched", "25_wmma_naive", "26_wmma_pipelined",
                        "12_transpose_naive", "27_fused_bias_gelu_dropout"):
        assert f"kernels/{kernel_file}.cu" in parts
    names = {where.rsplit(".", 1)[-1] for where in parts}
    assert {"main", "run", "persistent_kernel", "forward_kernel", "parse_csv", "prepared_bias_gelu_dropout"} <= names


# ---- the figure and tables, from recordings ------------------------------------------------------------------------

def rows_for(kernels: dict[str, str]) -> list[dict]:
    """Rows as profile_kernels makes them, from ``{kernel: csv text}`` (None: a failed run)."""
    rows = []
    for name, csv in kernels.items():
        finished = profiled.Finished(0, report(name), "") if csv else profiled.Finished(1, "", "ncu crashed")
        rows.append(profiled.kernel_row(name, driver.kernel(name).size, 2, finished, csv, 12.5))
    return rows


def recorded_rows() -> list[dict]:
    n = 4096
    return rows_for({
        "transpose_naive": synthetic_csv("transpose_naive", 2e-3, dram_read=4 * 16384**2, dram_write=4 * 16384**2),
        "sgemm_naive": synthetic_csv("sgemm_naive", 0.25, 2 * n**3, 5e9, 7e7, {"long_scoreboard": 9.0}),
        "sgemm_prefetched": synthetic_csv("sgemm_prefetched", 0.006, 2 * n**3, 3e8, 7e7),
        "cublas_float32": real_launch("3"),
        "cublas_tf32": real_launch("7"),
        "triton_gemm_persistent": None,
        "flash_attention_forward": synthetic_csv("forward_kernel", 0.0012, 0, 2e8, 7e7, tensor=5.5e11),
    })


@pytest.fixture
def results(tmp_path, monkeypatch) -> Path:
    """A results folder with kernel_counters on an H100 (with its real ceilings) and an H200 (without them)."""
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path))
    recordings.save(recordings.load("blas_ceilings", "H100", BOOK_RESULTS), tmp_path)
    for device in (H100, H200):
        provenance_ = {"device": {"name": device, "kind": "cuda"}, "date": "2026-11-26T10:00:00+00:00"}
        recordings.save(Recording("kernel_counters", recordings.function_name(profiled.profile_kernels), {},
                                  recorded_rows(), provenance_), tmp_path)
    return tmp_path


def cells(table) -> list[dict]:
    return [dict(zip(table.headers, row, strict=True)) for row in table.cells]


def test_the_roofline_draws_each_gpu_with_its_own_roof(results):
    runs = recordings.newest_per_gpu("kernel_counters", results)
    fig = counter_figures.counter_roofline(runs)
    assert [b.label for b in fig.layout.updatemenus[0].buttons] == ["H100 80GB HBM3", "H200"]
    names = [t.name for t in fig.data]
    assert "roof float32" in names and "roof tf32" in names and "roof bfloat16" in names
    assert {"ch. 09, GEMM", "ch. 10, tensor cores", "ch. 18, FlashAttention"} <= set(names)
    assert "ch. 08, memory hierarchy" not in names  # transposes have no FLOPs
    h100, h200 = (b.args[1]["annotations"][0]["text"] for b in fig.layout.updatemenus[0].buttons)
    assert h100.startswith("roofs: measured ceilings<br>") and h200.startswith("roofs: datasheet peaks<br>")
    assert h100.endswith("not drawn: 1 without FLOPs, 1 failed")
    gemm = next(t for t in fig.data if t.name == "ch. 09, GEMM")
    assert len(gemm.x) == 3 and "long_scoreboard 9.0" in gemm.hovertext[0] and "of the roof" in gemm.hovertext[0]
    assert "float32, n = 4,096" in gemm.hovertext[0]
    fig.to_json()


def test_the_roofline_of_one_chapter_and_of_nothing(results):
    runs = recordings.newest_per_gpu("kernel_counters", results)
    fig = counter_figures.counter_roofline(runs[:1], chapter="18")
    points = [t for t in fig.data if t.mode == "markers" and t.visible is not False and t.visible != "legendonly"]
    assert [t.name for t in points] == ["ch. 18, FlashAttention"]
    assert [t.name for t in fig.data if t.name.startswith("roof")] == ["roof bfloat16"]
    assert counter_figures.counter_roofline([]).layout.title.text == "No recording yet"


def test_the_counts_table_puts_the_gpus_side_by_side(results):
    runs = recordings.newest_per_gpu("kernel_counters", results)
    table = counter_figures.counts_table(runs)
    assert table.headers[4:] == ["H100 80GB HBM3: FLOP counted / book", "H100 80GB HBM3: DRAM bytes counted / book",
                                 "H200: FLOP counted / book", "H200: DRAM bytes counted / book"]
    rows = {r["kernel"]: r for r in cells(table)}
    assert rows["naive transpose"]["book's count (GFLOP)"] == "–"
    assert rows["naive transpose"]["H200: DRAM bytes counted / book"] == "1.000 ✓"
    assert rows["cuBLAS TF32"]["H100 80GB HBM3: FLOP counted / book"].endswith("✓")
    assert not rows["cuBLAS float32 (TF32 off)"]["H200: DRAM bytes counted / book"].endswith("✓")
    assert rows["Triton GEMM, step 5 (persistent, TMA)"]["H200: FLOP counted / book"] == "failed"
    assert "within 10%" in table.caption
    assert len(cells(counter_figures.counts_table(runs, chapter="09"))) == 3


def test_the_counter_table_gives_rates_shares_of_the_roof_and_stalls(results):
    runs = recordings.newest_per_gpu("kernel_counters", results)
    rows = cells(counter_figures.counter_table(runs))
    assert len(rows) == 2 * len(recorded_rows())
    transpose = next(r for r in rows if r["kernel"] == "naive transpose" and r["GPU"] == "H100 80GB HBM3")
    roof, _ = counter_figures.roofline_of(runs[0])
    assert transpose["DRAM (GB/s)"] == f"{2 * 4 * 16384**2 / 2e-3 / 1e9:,.0f}"
    assert transpose["of the roof"] == f"{2 * 4 * 16384**2 / 2e-3 / roof.bandwidth:.0%}"
    failed = next(r for r in rows if r["kernel"].startswith("Triton GEMM"))
    assert failed["top stalls (cycles per instruction)"] == "failed: ncu crashed" and failed["time (µs)"] == "–"
    naive = next(r for r in rows if r["kernel"] == "SGEMM step 1: naive")
    assert naive["top stalls (cycles per instruction)"] == "long_scoreboard 9.0"
    assert naive["rate (TFLOP/s)"] == f"{2 * 4096**3 / 0.25 / 1e12:,.2f}"


def test_a_chapter_draws_its_kernels_without_flops_against_the_dram_roof(results):
    runs = recordings.newest_per_gpu("kernel_counters", results)
    fig = counter_figures.counter_bandwidth(runs, chapter="08")
    assert [b.label for b in fig.layout.updatemenus[0].buttons] == ["H100 80GB HBM3", "H200"]
    dram = next(t for t in fig.data if t.name == "DRAM")
    assert list(dram.x) == ["naive transpose"] and dram.y[0] == pytest.approx(2 * 4 * 16384**2 / 2e-3 / 1e9)
    assert "of the roof's DRAM bandwidth" in dram.hovertext[0] and "mio_throttle 4.0" in dram.hovertext[0]
    h100, h200 = (b.args[1]["annotations"][0]["text"] for b in fig.layout.updatemenus[0].buttons)
    assert "(measured ceilings)" in h100 and "(datasheet peaks)" in h200
    fig.to_json()


def test_a_chapter_tags_its_points_and_an_unknown_chapter_is_refused(results):
    runs = recordings.newest_per_gpu("kernel_counters", results)
    tags = {"sgemm_naive": "1", "cublas_float32": "cuBLAS"}
    fig = counter_figures.counter_roofline(runs[:1], chapter="09", tags=tags)
    gemm = next(t for t in fig.data if t.name == "ch. 09, GEMM")
    assert gemm.mode == "markers+text" and list(gemm.text) == ["1", "", "cuBLAS"]
    assert "ch. 09, GEMM" in fig.layout.title.text
    for call in (counter_figures.counter_roofline, counter_figures.counter_bandwidth, counter_figures.counts_table,
                 counter_figures.counter_table):
        with pytest.raises(ValueError, match="chapter"):
            call(runs, chapter="9")


def test_the_kernels_of_a_chapter_and_their_stalls_in_words(results):
    run = recordings.newest_per_gpu("kernel_counters", results)[0]
    found = counter_figures.kernels(run, "09")
    assert list(found) == ["sgemm_naive", "sgemm_prefetched", "cublas_float32"]
    assert "triton_gemm_persistent" not in counter_figures.kernels(run)  # it failed
    naive = found["sgemm_naive"]
    assert counter_figures.top_stall(naive) == ("long_scoreboard", 9.0)
    assert counter_figures.describe_stall(naive).startswith("`long_scoreboard`, 9.0 cycles per instruction (waiting")
    with pytest.raises(KeyError, match="rank 1"):
        counter_figures.top_stall(naive, 1)
    assert set(counters.STALL_REASONS) - {"selected"} <= set(counter_figures.STALL_MEANINGS)


def test_a_recorded_gpu_without_the_counters_is_named_in_one_line(results):
    runs = recordings.newest_per_gpu("kernel_counters", results)
    assert counter_figures.missing_note(runs) == ""
    note = counter_figures.missing_note(runs[:1])
    assert "the H200 has no recording of the hardware counters" in note and note.endswith("H100 80GB HBM3's.")
