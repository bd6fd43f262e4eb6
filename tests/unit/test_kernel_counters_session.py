"""Chapter 18's Nsight Compute session on a CPU: every kernel in one ncu run (``--profile-from-start off``), the
driver's session mode, the assignment of ncu's launches to the kernels the driver checked, and the fall-back to a
process per kernel wherever the session's row is not certain. ncu's runs are faked as in test_kernel_counters.py."""

from __future__ import annotations

import dataclasses
import json
import shlex

import pytest
import torch
from test_kernel_counters import CRASHED, FakeNcu, report, synthetic_csv

from gpulab.ch18_flash_attention_and_counters import driver, profiled
from gpulab.core import counters

SGEMMS = ["sgemm_naive", "sgemm_shared", "sgemm_prefetched"]


@pytest.fixture
def gpu_and_ncu(monkeypatch):
    """profile_kernels as on a GPU machine with ncu: the GPU check passes and ncu is 'found'."""
    monkeypatch.setattr(profiled.kernel_mode, "require_gpu", lambda what: None)
    monkeypatch.setattr(profiled, "find_ncu", lambda: "/opt/ncu")


def marker(name: str, error: float | None = 1e-6, stage: str = "", size: int | None = None) -> str:
    """The driver's session line for kernel ``name``: checked (``error``), or failed at ``stage``."""
    found = {"kernel": name, "size": size or driver.kernel(name).size, "warmup": driver.WARMUP}
    found.update({"stage": stage, "error": "AssertionError: wrong"} if stage else {"relative_error": error})
    return driver.MARKER + json.dumps(found)


def session_csv(*names: str) -> str:
    """ncu's details page for one launch of each of ``names``, in order, as one session writes it."""
    parts = []
    for i, name in enumerate(names):
        lines = synthetic_csv(name, 1e-3 * (i + 1), 2e9).splitlines()
        header = lines.index(next(line for line in lines if line.startswith('"ID",')))
        parts += (lines[:header + 1] if i == 0 else []) + [line.replace('"0",', f'"{i}",', 1)
                                                           for line in lines[header + 1:]]
    return "\n".join(parts) + "\n"


def launches(*names: str) -> list[dict]:
    return counters.parse_csv(session_csv(*names))


def sizes(names) -> dict[str, int]:
    return {name: driver.kernel(name).size for name in names}


def assign(names, reports, found):
    parsed = [json.loads(line[len(driver.MARKER):]) for line in reports]
    return profiled.assign(names, sizes(names), driver.WARMUP, parsed, found)


# ---- the command ---------------------------------------------------------------------------------------------------

def test_the_session_command_profiles_between_start_and_stop_with_every_kernels_regex():
    command = profiled.session_command(["sgemm_naive", "cublas_tf32", "flash_attention_forward"],
                                       {"flash_attention_forward": 1024}, 3, "k.csv", python="python")
    assert command[:4] == ["ncu", "--csv", "--profile-from-start", "off"]
    assert "--launch-skip" not in command and "--launch-count" not in command
    assert command[command.index("--kernel-name") + 1] == f"regex:sgemm_naive|{driver.CUBLAS_REGEX}|forward_kernel"
    assert command[command.index("python"):] == [
        "python", "-m", driver.MODULE, "--session", "sgemm_naive", "cublas_tf32", "flash_attention_forward",
        "--sizes", "flash_attention_forward=1024", "--warmup", "3"]
    assert profiled.session_regex(["cublas_tf32", "cublas_bfloat16"]) == driver.CUBLAS_REGEX
    with pytest.raises(ValueError, match="^kernels:"):
        profiled.session_command(["sgemm_naive", "sgemm_naive"])


def test_the_session_example_is_the_command_profile_kernels_runs():
    text = profiled.SESSION_COMMAND_EXAMPLE
    words = shlex.split(text.replace("\\\n", " "))
    assert words == profiled.session_command(profiled.KERNELS, output_csv=profiled.SESSION_CSV, python="python")
    assert all(len(line) <= 110 for line in text.splitlines()[-4:])  # the kernels wrapped, the regex is one word
    assert text.splitlines()[1].strip() == "--profile-from-start off \\"


# ---- the driver's session mode -------------------------------------------------------------------------------------

def test_the_driver_reads_its_session_arguments():
    assert driver.parse_session_arguments(["--session", "sgemm_naive", "cublas_tf32"]) == (
        ["sgemm_naive", "cublas_tf32"], {}, driver.WARMUP)
    assert driver.parse_session_arguments(["--session", "sgemm_naive", "transpose_tiled", "--sizes",
                                           "transpose_tiled=1024, sgemm_naive=512", "--warmup", "0"]) == (
        ["sgemm_naive", "transpose_tiled"], {"transpose_tiled": 1024, "sgemm_naive": 512}, 0)


@pytest.mark.parametrize(("argv", "message"), [
    (["--session", "sgemm_fastest"], "^kernel:"), (["--session", "sgemm_naive", "sgemm_naive"], "^session:"),
    (["--session", "sgemm_naive", "--sizes", "sgemm_naive"], "^sizes:"),
    (["--session", "sgemm_naive", "--sizes", "cublas_tf32=64"], "^sizes:"),
    (["--session", "sgemm_naive", "--sizes", "sgemm_naive=0"], "^sizes"),
    (["--session", "sgemm_naive", "--sizes", "sgemm_naive=big"], "^sizes"),
    (["--session", "sgemm_naive", "--sizes", "sgemm_naive=64,sgemm_naive=64"], "^sizes:"),
    (["--session", "sgemm_naive", "--warmup", "-1"], "^warmup:"),
])
def test_the_driver_names_a_bad_session_argument(argv, message):
    with pytest.raises(ValueError, match=message):
        driver.parse_session_arguments(argv)


def test_the_session_on_a_cpu_fails_in_one_line(capsys):
    assert driver.main(["--session", "sgemm_naive", "cublas_tf32"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "needs a CUDA GPU" in captured.err
    assert driver.main(["--session", "nothing"]) == 2 and "driver: kernel:" in capsys.readouterr().err


def test_the_session_brackets_only_the_profiled_launch_and_reports_each_kernel(monkeypatch, capsys):
    """On the CPU, with the GPU's calls recorded: cuBLAS's preparation runs anywhere; sgemm_naive's needs a GPU and
    fails in its preparation, which the session reports and goes on."""
    events = []
    monkeypatch.setattr(driver.kernel_mode, "require_gpu", lambda what: None)
    monkeypatch.setattr(driver.env, "device", lambda: torch.device("cpu"))
    monkeypatch.setattr(driver.torch.cuda, "synchronize", lambda device=None: events.append("sync"))
    monkeypatch.setattr(driver.torch.cuda.profiler, "start", lambda: events.append("start"))
    monkeypatch.setattr(driver.torch.cuda.profiler, "stop", lambda: events.append("stop"))
    original = driver.kernel("cublas_float32").prepare

    def counted(n, device):
        prepared = original(n, device)
        return driver.Prepared(lambda: (events.append("launch"), prepared.launch()),
                               lambda: (events.append("check"), prepared.check())[1])

    spec = driver.kernel("cublas_float32")
    monkeypatch.setattr(driver, "KERNELS", tuple(dataclasses.replace(k, prepare=counted) if k is spec else k
                                                 for k in driver.KERNELS))
    reports = driver.run_session(["cublas_float32", "sgemm_naive"], {"cublas_float32": 48, "sgemm_naive": 48}, 2)
    assert events == ["launch", "launch", "sync", "start", "launch", "sync", "stop", "check"]
    fine, failed = reports
    assert fine == {"kernel": "cublas_float32", "size": 48, "warmup": 2, "relative_error": fine["relative_error"]}
    assert fine["relative_error"] < 1e-6
    assert failed["stage"] == "prepare" and failed["kernel"] == "sgemm_naive" and "\n" not in failed["error"]
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line[len(driver.MARKER):]) for line in lines] == reports


# ---- assigning the launches ----------------------------------------------------------------------------------------

def test_each_checked_kernel_gets_its_launch_in_order():
    found = launches(*SGEMMS)
    certain = assign(SGEMMS, [marker(n) for n in SGEMMS], found)
    assert list(certain) == SGEMMS and [certain[n][1]["kernel"] for n in SGEMMS] == SGEMMS


def test_a_count_or_a_name_that_does_not_fit_leaves_every_kernel_out():
    reports = [marker(n) for n in SGEMMS]
    assert assign(SGEMMS, reports, launches(*SGEMMS[:2])) == {}  # a launch ncu did not profile
    assert assign(SGEMMS, reports, launches(SGEMMS[0], *SGEMMS)) == {}  # a helper launch too many
    assert assign(SGEMMS, reports, launches("sgemm_naive", "sgemm_prefetched", "sgemm_shared")) == {}  # names
    assert assign(SGEMMS, [reports[1], reports[0], reports[2]], launches(*SGEMMS)) == {}  # reports out of order
    wrong_size = marker("sgemm_shared", size=1024)
    assert assign(SGEMMS, [reports[0], wrong_size, reports[2]], launches(*SGEMMS)) == {}
    parsed = [json.loads(r[len(driver.MARKER):]) for r in reports]
    assert profiled.assign(SGEMMS, sizes(SGEMMS), driver.WARMUP, [parsed[0], None, parsed[2]], launches(*SGEMMS)) == {}


def test_a_kernel_that_failed_its_check_used_its_launch_and_one_that_failed_before_made_none():
    found = launches("sgemm_naive", "sgemm_prefetched")
    certain = assign(SGEMMS, [marker("sgemm_naive"), marker("sgemm_shared", stage="prepare"),
                              marker("sgemm_prefetched")], found)
    assert list(certain) == ["sgemm_naive", "sgemm_prefetched"]
    found = launches(*SGEMMS)
    certain = assign(SGEMMS, [marker("sgemm_naive"), marker("sgemm_shared", stage="check"),
                              marker("sgemm_prefetched")], found)
    assert list(certain) == ["sgemm_naive", "sgemm_prefetched"] and certain["sgemm_prefetched"][1]["id"] == 2


def test_a_kernel_that_failed_in_its_bracket_may_or_may_not_have_launched():
    reports = [marker("sgemm_naive"), marker("sgemm_shared", stage="launch"), marker("sgemm_prefetched")]
    assert list(assign(SGEMMS, reports, launches(*SGEMMS))) == ["sgemm_naive", "sgemm_prefetched"]
    assert list(assign(SGEMMS, reports, launches("sgemm_naive", "sgemm_prefetched"))) == ["sgemm_naive",
                                                                                        "sgemm_prefetched"]
    two_unknown = [reports[0], reports[1], marker("sgemm_prefetched", stage="launch")]
    assert assign(SGEMMS, two_unknown, launches(*SGEMMS)) == {}


def test_a_session_that_died_part_way_keeps_the_kernels_before_it():
    reports = [marker("sgemm_naive")]
    assert list(assign(SGEMMS, reports, launches("sgemm_naive"))) == ["sgemm_naive"]
    assert list(assign(SGEMMS, reports, launches("sgemm_naive", "sgemm_shared"))) == ["sgemm_naive"]  # died after
    assert assign(SGEMMS, reports, launches("sgemm_naive", "sgemm_prefetched")) == {}  # not the next kernel's name
    assert assign(SGEMMS, reports, launches(*SGEMMS)) == {}  # a launch too many for one dying kernel
    assert assign(SGEMMS, [], []) == {}


# ---- profile_kernels: the session and the fall-back ----------------------------------------------------------------

def test_every_kernel_profiled_in_the_session_shares_its_time(monkeypatch, gpu_and_ncu):
    stdout = "\n".join(marker(n) for n in SGEMMS) + "\n"
    fake = FakeNcu({}, (session_csv(*SGEMMS), profiled.Finished(0, stdout, "")))
    monkeypatch.setattr(profiled, "execute", fake)
    rows = profiled.profile_kernels(SGEMMS, timeout_s=10)
    assert len(fake.commands) == 1 and fake.timeouts == [profiled.SESSION_EXTRA_S + 3 * 10]
    assert [r["kernel"] for r in rows] == SGEMMS and all(r["status"] == "ok" for r in rows)
    assert {r["profiled_in"] for r in rows} == {"session"}
    seconds = rows[0]["session_seconds"]
    assert all(r["session_seconds"] == seconds and r["profile_seconds"] == pytest.approx(seconds / 3) for r in rows)
    assert [r["ncu_kernel"] for r in rows] == SGEMMS and rows[2]["seconds"] == pytest.approx(3e-3)
    json.dumps(rows, allow_nan=False)


def test_the_kernels_the_session_gave_no_certain_row_run_in_processes_of_their_own(monkeypatch, gpu_and_ncu):
    """The session ran out of time in sgemm_shared (its launch profiled, no report) and sgemm_prefetched never ran:
    both run again alone; sgemm_naive keeps its row from the session."""
    own = {"sgemm_shared": (synthetic_csv("sgemm_shared", 2e-3, 2e9), profiled.Finished(0, report("x"), "")),
           "sgemm_prefetched": (synthetic_csv("sgemm_prefetched", 3e-3, 2e9), profiled.Finished(0, report("x"), ""))}
    session = (session_csv("sgemm_naive", "sgemm_shared"), profiled.Finished(None, marker("sgemm_naive") + "\n", ""))
    rows, fake = fake_run(monkeypatch, own, session)
    assert [c[c.index("-m") + 2] for c in fake.commands] == ["--session", "sgemm_shared", "sgemm_prefetched"]
    assert [r["profiled_in"] for r in rows] == ["session", "own process", "own process"]
    assert all(r["status"] == "ok" for r in rows)
    assert rows[0]["profile_seconds"] == rows[0]["session_seconds"]  # the session gave one row


def test_a_kernel_that_failed_in_the_session_runs_again_alone(monkeypatch, gpu_and_ncu):
    traceback = "Traceback (most recent call last):\nAssertionError: SGEMM step 5: relative error 1 exceeds 1e-4"
    own = {"sgemm_shared": (None, profiled.Finished(1, "", traceback))}
    stdout = "\n".join([marker("sgemm_naive"), marker("sgemm_shared", stage="check"), marker("sgemm_prefetched")])
    rows, fake = fake_run(monkeypatch, own, (session_csv(*SGEMMS), profiled.Finished(1, stdout, "")))
    assert len(fake.commands) == 2
    assert [r["status"] for r in rows] == ["ok", f"failed: {traceback.splitlines()[-1]}", "ok"]
    assert [r["profiled_in"] for r in rows] == ["session", "own process", "session"]


def test_a_session_whose_count_is_off_runs_every_kernel_alone(monkeypatch, gpu_and_ncu):
    own = {n: (synthetic_csv(n, 1e-3, 2e9), profiled.Finished(0, report(n), "")) for n in SGEMMS}
    stdout = "\n".join(marker(n) for n in SGEMMS)
    rows, fake = fake_run(monkeypatch, own, (session_csv("sgemm_naive", *SGEMMS), profiled.Finished(0, stdout, "")))
    assert len(fake.commands) == 4 and {r["profiled_in"] for r in rows} == {"own process"}
    unparsable = session_csv(*SGEMMS).replace(counters.DRAM_WRITE, "other.sum")
    rows, fake = fake_run(monkeypatch, own, (unparsable, profiled.Finished(0, stdout, "")))
    assert len(fake.commands) == 4 and all(r["status"] == "ok" for r in rows)


def test_ncu_that_profiled_nothing_with_an_error_fails_every_kernel_without_running_them_again(monkeypatch,
                                                                                             gpu_and_ncu):
    log = "==PROF== Connected\n==ERROR== ERR_NVGPUCTRPERM - The user does not have permission\n"
    stdout = "\n".join(marker(n) for n in SGEMMS)
    rows, fake = fake_run(monkeypatch, {}, (log, profiled.Finished(0, stdout, "")))
    assert len(fake.commands) == 1
    assert {r["status"] for r in rows} == {"failed: ERR_NVGPUCTRPERM - The user does not have permission"}
    assert {r["profiled_in"] for r in rows} == {"session"}


def fake_run(monkeypatch, own: dict, session) -> tuple[list[dict], FakeNcu]:
    fake = FakeNcu(own, session)
    monkeypatch.setattr(profiled, "execute", fake)
    return profiled.profile_kernels(SGEMMS), fake


def test_crashed_is_a_session_without_output():
    assert CRASHED[0] is None and profiled._reports(CRASHED[1].stdout) == []
