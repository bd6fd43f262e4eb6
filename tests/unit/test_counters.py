"""Unit tests of gpulab.core.counters: the ncu command line, parsing ncu's CSV, and the roofline arithmetic.

The CSV samples are written here in the format ncu's ``--csv`` prints (the "details" page: one quoted line per
kernel launch and metric, after ncu's '==PROF==' lines); they test the parser, not a measurement.
"""

from __future__ import annotations

import pytest

from gpulab.core import counters

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def line(launch: int, kernel: str, metric: str, unit: str, value: str) -> str:
    return (f'"{launch}","4242","python3","127.0.0.1","{kernel}","1","7","(256, 1, 1)","(64, 64, 1)","0","9.0",'
            f'"Command line profiler metrics","{metric}","{unit}","{value}"')


SGEMM = "sgemm_shared_tiles(int, int, int, float, const float *, const float *, float, float *)"
TRANSPOSE = "transpose_naive(const float *, float *, int)"
SAMPLE = "\n".join([
    '==PROF== Connected to process 4242 (/usr/bin/python3.12)',
    'the program printed this line',
    '==PROF== Profiling "sgemm_shared_tiles" - 0: 0%....50%....100% - 9 passes',
    HEADER,
    line(0, SGEMM, "gpu__time_duration.sum", "usecond", "1,250.50"),
    line(0, SGEMM, "dram__bytes_read.sum", "Mbyte", "12.58"),
    line(0, SGEMM, "dram__bytes_write.sum", "Mbyte", "4.19"),
    line(0, SGEMM, "lts__t_bytes.sum", "Gbyte", "1.07"),
    line(0, SGEMM, "sm__sass_thread_inst_executed_op_ffma_pred_on.sum", "inst", "1,073,741,824"),
    line(0, SGEMM, "sm__sass_thread_inst_executed_op_fadd_pred_on.sum", "inst", "0"),
    line(0, SGEMM, "sm__sass_thread_inst_executed_op_fmul_pred_on.sum", "inst", "1,048,576"),
    line(0, SGEMM, "sm__ops_path_tensor_src_fp16.sum", "", "n/a"),
    line(0, SGEMM, "sm__throughput.avg.pct_of_peak_sustained_elapsed", "%", "71.25"),
    line(0, SGEMM, "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", "%", "45.10"),
    line(0, SGEMM, "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio", "ratio", "2.50"),
    line(0, SGEMM, "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio", "ratio", "4.00"),
    line(0, SGEMM, "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio", "ratio", "1.25"),
    line(0, SGEMM, "smsp__average_warps_issue_stalled_selected_per_issue_active.ratio", "ratio", "9.00"),
    line(0, SGEMM, "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio", "ratio", "0.75"),
    line(1, TRANSPOSE, "gpu__time_duration.sum", "nsecond", "8,192"),
    line(1, TRANSPOSE, "dram__bytes_read.sum", "Kbyte", "524.29"),
    line(1, TRANSPOSE, "dram__bytes_write.sum", "byte", "524,288"),
    line(1, TRANSPOSE, "lts__t_bytes.sum", "Mbyte", "2.10"),
    '==PROF== Disconnected from process 4242',
])


def test_the_command_profiles_one_launch_of_the_named_kernel():
    command = counters.ncu_command(["-m", "gpulab.kernels.sgemm"], "sgemm_.*", launch_skip=3,
                                   output_csv="sgemm.csv", python="python3")
    assert command[:2] == ["ncu", "--csv"]
    assert command[command.index("--metrics") + 1] == ",".join(counters.METRICS)
    assert command[command.index("--kernel-name") + 1] == "regex:sgemm_.*"
    assert command[command.index("--launch-skip") + 1] == "3"
    assert command[command.index("--launch-count") + 1] == "1"
    assert command[command.index("--log-file") + 1] == "sgemm.csv"
    assert command[-3:] == ["python3", "-m", "gpulab.kernels.sgemm"]


def test_the_command_for_a_session_profiles_every_launch_between_start_and_stop():
    command = counters.ncu_command(["bench.py"], "sgemm|gemm", launch_count=None, profile_from_start=False)
    assert command[:4] == ["ncu", "--csv", "--profile-from-start", "off"]
    assert "--launch-skip" not in command and "--launch-count" not in command
    skipped = counters.ncu_command(["bench.py"], "k", launch_skip=2, launch_count=None)
    assert skipped[skipped.index("--launch-skip") + 1] == "2" and "--launch-count" not in skipped
    assert "--profile-from-start" not in skipped


def test_the_command_without_a_file_writes_to_stdout_and_takes_chosen_metrics():
    command = counters.ncu_command(["bench.py"], "transpose", metrics=["gpu__time_duration.sum"])
    assert "--log-file" not in command
    assert command[command.index("--metrics") + 1] == "gpu__time_duration.sum"


@pytest.mark.parametrize(("arguments", "message"), [
    (dict(python_args=[], kernel_regex="k"), "^python_args:"),
    (dict(python_args="bench.py", kernel_regex="k"), "^python_args:"),
    (dict(python_args=["bench.py"], kernel_regex=""), "^kernel_regex:"),
    (dict(python_args=["bench.py"], kernel_regex="(unclosed"), "^kernel_regex:"),
    (dict(python_args=["bench.py"], kernel_regex="k", metrics=[]), "^metrics:"),
    (dict(python_args=["bench.py"], kernel_regex="k", metrics=["dram bytes"]), "^metrics:"),
    (dict(python_args=["bench.py"], kernel_regex="k", launch_skip=-1), "^launch_skip:"),
    (dict(python_args=["bench.py"], kernel_regex="k", launch_count=0), "^launch_count:"),
    (dict(python_args=["bench.py"], kernel_regex="k", launch_count=True), "^launch_count:"),
    (dict(python_args=["bench.py"], kernel_regex="k", profile_from_start="off"), "^profile_from_start:"),
])
def test_the_command_rejects_bad_arguments_naming_them(arguments, message):
    with pytest.raises(ValueError, match=message):
        counters.ncu_command(**arguments)


def test_metrics_cover_time_bytes_flops_throughput_and_stalls():
    for metric in ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum",
                   "sm__sass_thread_inst_executed_op_ffma_pred_on.sum", "sm__inst_executed_pipe_tensor_op_hmma.sum",
                   "sm__throughput.avg.pct_of_peak_sustained_elapsed",
                   "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"):
        assert metric in counters.METRICS
    assert len(set(counters.METRICS)) == len(counters.METRICS)
    assert any("issue_stalled_long_scoreboard" in m for m in counters.METRICS)


def test_two_kernels_in_one_file_become_two_rows_in_order():
    rows = counters.parse_csv(SAMPLE)
    assert [r["id"] for r in rows] == [0, 1]
    assert [r["kernel"] for r in rows] == [SGEMM, TRANSPOSE]


def test_units_and_thousands_separators_are_converted():
    sgemm, transpose = counters.parse_csv(SAMPLE)
    assert sgemm["seconds"] == pytest.approx(1250.5e-6)
    assert transpose["seconds"] == pytest.approx(8192e-9)
    assert sgemm["dram_read_bytes"] == pytest.approx(12.58e6)
    assert sgemm["dram_bytes"] == pytest.approx(16.77e6)
    assert sgemm["l2_bytes"] == pytest.approx(1.07e9)
    assert transpose["dram_bytes"] == pytest.approx(524_290 + 524_288)
    assert sgemm["sm_throughput_pct"] == pytest.approx(71.25)
    assert sgemm["memory_throughput_pct"] == pytest.approx(45.10)


def test_flops_count_an_fma_twice_and_skip_what_ncu_could_not_collect():
    sgemm, transpose = counters.parse_csv(SAMPLE)
    assert sgemm["flops"] == 2 * 1_073_741_824 + 1_048_576
    assert sgemm["flops_by_precision"]["fp32"] == sgemm["flops"]
    assert sgemm["flops_by_precision"]["tensor"] == 0
    assert "sm__ops_path_tensor_src_fp16.sum" in sgemm["missing"]
    assert transpose["flops"] == 0
    assert "gpu__time_duration.sum" not in transpose["missing"]


def test_stalls_are_read_by_reason_and_the_top_ones_exclude_issuing():
    sgemm, transpose = counters.parse_csv(SAMPLE)
    assert sgemm["stalls"]["long_scoreboard"] == pytest.approx(2.5)
    assert sgemm["top_stalls"] == [("mio_throttle", 4.0), ("long_scoreboard", 2.5), ("barrier", 1.25)]
    assert transpose["stalls"] == {} and transpose["top_stalls"] == []


def test_the_raw_page_parses_too():
    raw = "\n".join([
        '"ID","Process ID","Kernel Name","dram__bytes_read.sum","dram__bytes_write.sum","gpu__time_duration.sum",'
        '"sm__sass_thread_inst_executed_op_dfma_pred_on.sum"',
        '"","","","Kbyte","Kbyte","usecond","inst"',
        '"0","7","dgemm_kernel","2,048.00","1,024.00","10.00","1,000,000"',
    ])
    [row] = counters.parse_csv(raw)
    assert row["kernel"] == "dgemm_kernel"
    assert row["dram_bytes"] == pytest.approx(3.072e6)
    assert row["seconds"] == pytest.approx(1e-5)
    assert row["flops_by_precision"]["fp64"] == 2_000_000


@pytest.mark.parametrize(("text", "message"), [
    ("==PROF== Connected to process 1\nno csv here\n", "no ncu CSV header"),
    (HEADER + "\n", "no kernel launches"),
    ('"ID","Kernel Name","Metric Name","Metric Value"\n"0","k","gpu__time_duration.sum","1"', "'Metric Unit'"),
    (HEADER + "\n" + line(0, "k", "gpu__time_duration.sum", "usecond", "3.0"), "dram__bytes_read.sum"),
    (HEADER + "\n" + line(0, "k", "gpu__time_duration.sum", "usecond", "fast"), "gpu__time_duration.sum"),
    (HEADER + '\n"0","1","python3"', "number of fields"),
])
def test_malformed_text_raises_naming_what_is_missing(text, message):
    with pytest.raises(ValueError, match=message):
        counters.parse_csv(text)


def test_a_point_has_the_rate_and_both_intensities():
    row = {"kernel": "sgemm", "seconds": 2e-3, "flops": 4e9, "dram_bytes": 1e8, "l2_bytes": 4e8}
    point = counters.counter_point(row)
    assert point["flops_per_s"] == pytest.approx(2e12)
    assert point["gflops"] == pytest.approx(2000)
    assert point["intensity"] == pytest.approx(40)
    assert point["intensity_l2"] == pytest.approx(10)
    assert point["op"] == "sgemm"
    with pytest.raises(ValueError, match="time"):
        counters.counter_point({**row, "seconds": 0})


def test_a_parsed_launch_is_a_point():
    point = counters.counter_point(counters.parse_csv(SAMPLE)[0])
    assert point["gflops"] == pytest.approx((2 * 1_073_741_824 + 1_048_576) / 1250.5e-6 / 1e9)
    assert point["intensity"] == pytest.approx(point["flops"] / 16.77e6)


def test_counts_are_compared_with_the_books_within_ten_percent():
    row = {"kernel": "sgemm", "flops": 2.1e9, "dram_bytes": 1.5e7}
    result = counters.compare_counts(row, book_flops=2e9, book_bytes=1.2e7)
    assert result["flops_ratio"] == pytest.approx(1.05)
    assert result["bytes_ratio"] == pytest.approx(1.25)
    assert result["flops_within"] and not result["bytes_within"]
    edge = counters.compare_counts({"flops": 0.9, "dram_bytes": 1.1}, book_flops=1, book_bytes=1)
    assert edge["flops_within"] and edge["bytes_within"]
    with pytest.raises(ValueError, match="^book_bytes:"):
        counters.compare_counts(row, book_flops=2e9, book_bytes=0)
