"""The mixed-precision chapter's library: master weights, autocast's decisions, loss scaling, AMP training."""

from __future__ import annotations

import math

import pytest
import torch

from gpulab.ch04_mlp_gemms import mlp
from gpulab.ch11_mixed_precision import amp, autocast, figures
from gpulab.ch11_mixed_precision.gradients import (
    captured_gradients,
    flushed_share,
    gradient_histogram,
    loss_scale_trace,
    loss_scale_underflow,
)
from gpulab.core import env
from gpulab.core.precision import FORMATS, MATMUL_TOLERANCE

CPU = torch.device("cpu")


def test_master_weights_keep_the_updates_that_16_bit_weights_lose():
    rows = {r["weights"]: r for r in autocast.master_weight_updates(1.0, 1e-4, 100)}
    for name in ("float16", "bfloat16"):  # 1e-4 is below half the spacing at 1: every update rounds away
        row = rows[f"{name} weights"]
        assert row["spacing"] == FORMATS[name].epsilon and row["after_one"] == row["after_all"] == 1.0
    master = rows["float32 master weights (float16 copy)"]
    assert master["after_all"] == pytest.approx(0.99, abs=1e-5) and master["exact"] == pytest.approx(0.99)
    assert abs(master["copy_after_all"] - 0.99) <= FORMATS["float16"].spacing(0.99) / 2
    with pytest.raises(ValueError, match="^steps:"):
        autocast.master_weight_updates(1.0, 1e-4, 0)
    with pytest.raises(ValueError, match="^update:"):
        autocast.master_weight_updates(1.0, -1e-4, 10)
    with pytest.raises(ValueError, match="^weight:"):
        autocast.master_weight_updates(math.nan, 1e-4, 10)


@pytest.mark.parametrize(("from_float32", "from_low", "expected"), [
    ("bfloat16", "bfloat16", "casts to bfloat16"), ("float32", "float32", "runs in float32"),
    ("float32", "bfloat16", "follows its input"), ("bfloat16", "float32", "other"),
])
def test_autocast_treatment_reads_the_two_output_dtypes(from_float32, from_low, expected):
    assert autocast.autocast_treatment(from_float32, from_low, "bfloat16").startswith(expected)


def test_autocast_dtypes_on_this_device():
    rows = autocast.autocast_dtypes(["bfloat16", "float16"])
    assert len(rows) == 2 * len(autocast.AUTOCAST_OPS)
    treatment = {(r["autocast_dtype"], r["op"]): r["treatment"] for r in rows}
    for name in ("bfloat16", "float16"):  # the same on a CPU and on CUDA
        for op in ("linear", "matmul", "bmm", "conv2d"):
            assert treatment[name, op] == f"casts to {name}"
        assert treatment[name, "cross_entropy"] == treatment[name, "mse_loss"] == "runs in float32"
        assert treatment[name, "relu"] == treatment[name, "add"] == "follows its input"
    with pytest.raises(ValueError, match="^dtypes:"):
        autocast.autocast_dtypes(["float32"])


def test_autocast_dtypes_reports_a_dtype_the_device_lacks(monkeypatch):
    def no_bfloat16(dtype, device):
        return "bfloat16 needs an NVIDIA GPU of compute capability 8.0 or later" if dtype == "bfloat16" else None

    monkeypatch.setattr(autocast, "unsupported_reason", no_bfloat16)
    rows = autocast.autocast_dtypes(["float16", "bfloat16"])
    [skipped] = [r for r in rows if r["status"] != "ok"]
    assert skipped["autocast_dtype"] == "bfloat16" and skipped["reason"].startswith("bfloat16 needs")
    assert len(rows) == len(autocast.AUTOCAST_OPS) + 1


def test_new_training_checks_its_arguments():
    with pytest.raises(ValueError, match="^precision: tf32 is a tensor-core mode"):
        amp.new_training([4, 3], "tf32", device=CPU)
    with pytest.raises(ValueError, match="^precision:"):
        amp.new_training([4, 3], "float8")
    with pytest.raises(ValueError, match="^learning_rate:"):
        amp.new_training([4, 3], "float32", learning_rate=0)
    with pytest.raises(ValueError, match="^growth_interval:"):
        amp.new_training([4, 3], "float16", growth_interval=0)
    assert amp.new_training([4, 3], "float16", device=CPU).scaler.is_enabled()
    assert not amp.new_training([4, 3], "bfloat16", device=CPU).scaler.is_enabled()


@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
def test_an_amp_step_matches_float32_and_keeps_float32_weights(precision):
    torch.manual_seed(0)
    X, labels = torch.randn(32, 8), torch.randint(0, 3, (32,))
    reference, mixed = (amp.new_training([8, 16, 3], p, seed=1, device=CPU) for p in ("float32", precision))
    losses = [(reference.step(X, labels).item(), mixed.step(X, labels).item()) for _ in range(3)]
    assert all(loss == pytest.approx(loss32, rel=1e-2) for loss32, loss in losses)
    assert losses[2][1] < losses[0][1]  # it learns
    assert all(p.dtype == torch.float32 for p in mixed.model.parameters())
    assert mixed.optimizer_steps == 3 and 0 <= mixed.accuracy(X, labels) <= 1


def test_batch_order_shuffles_each_epoch_and_drops_the_incomplete_batch():
    batches = amp.batch_order(10, 4, 5, seed=3)
    assert len(batches) == 5 and all(len(b) == 4 for b in batches)
    first_epoch = torch.cat(batches[:2])
    assert len(set(first_epoch.tolist())) == 8 and first_epoch.max() < 10
    assert all(torch.equal(a, b) for a, b in zip(batches, amp.batch_order(10, 4, 5, seed=3), strict=True))
    with pytest.raises(ValueError, match="^batch:"):
        amp.batch_order(10, 11, 1)


@pytest.fixture(scope="module")
def digits_rows():
    return amp.digits_precisions(["float16", "bfloat16", "tf32"], hidden=[16], epochs=1, batch=64, seeds=[0, 1])


def test_digits_precisions_train_check_and_time(digits_rows):
    ran = [r for r in digits_rows if r["status"] == "ok"]
    on_gpu = env.has_gpu()  # TF32 runs only on an NVIDIA GPU (Ampere and later); elsewhere its row says why not
    expected = ["bfloat16", "float16", "float32", *(["tf32"] if on_gpu else [])]
    assert sorted({r["precision"] for r in ran}) == expected and len(ran) == 2 * len(expected)
    if not on_gpu:
        [tf32] = [r for r in digits_rows if r["status"] != "ok"]
        assert tf32["precision"] == "tf32" and "tensor-core mode" in tf32["reason"]
    for row in ran:
        assert row["step_seconds"] > 0
        assert (row["peak_memory_bytes"] > 0) if on_gpu else row["peak_memory_bytes"] is None  # a CPU: not measured
        assert row["steps"] == len(mlp.load_digits_split()["y_train"]) // 64 and row["skipped_steps"] == 0
        assert row["test_accuracy"] > 0.3 and math.isfinite(row["final_loss"])
        assert row["first_loss_error"] <= MATMUL_TOLERANCE[row["precision"]]


def test_first_losses_must_match_float32(digits_rows):
    reference, row = (next(r for r in digits_rows if r.get("precision") == p and r.get("seed") == 0)
                      for p in ("float32", "bfloat16"))
    assert amp.check_first_losses(row, reference) < 1e-2
    with pytest.raises(AssertionError, match="relative error"):
        amp.check_first_losses({**row, "first_losses": [row["first_losses"][0], 2 * row["first_losses"][1]]},
                               reference)
    with pytest.raises(AssertionError, match="relative error"):  # NaN never passes
        amp.check_first_losses({**row, "first_losses": [math.nan, 1.0]}, reference)
    skipped = {**row, "first_step_skipped": True, "first_losses": [row["first_losses"][0], 99.0]}
    assert amp.check_first_losses(skipped, reference) < 1e-2  # a skipped step made no update to compare


def test_compare_precisions_rejects_bad_arguments():
    data = amp.digits_data()
    with pytest.raises(ValueError, match="^precisions:"):
        amp.compare_precisions([64, 10], data, ["float64"], batch=64, steps=2, learning_rate=0.1, seeds=[0])
    with pytest.raises(ValueError, match="^seeds:"):
        amp.compare_precisions([64, 10], data, ["float16"], batch=64, steps=2, learning_rate=0.1, seeds=[])
    with pytest.raises(ValueError, match="^steps:"):
        amp.train_and_time([64, 10], data, "float32", batch=64, steps=1)


def synthetic(precision, seconds, accuracies, test_samples=10_000):
    return [{"precision": precision, "label": amp.PRECISION_LABELS[precision], "seed": s, "step_seconds": seconds,
             "test_accuracy": a, "test_samples": test_samples, "peak_memory_bytes": 2**20, "skipped_steps": 0,
             "first_loss_error": 1e-4, "status": "ok"} for s, a in enumerate(accuracies)]


def test_summary_speedups_noise_and_the_target():
    rows = (synthetic("float32", 0.010, [0.80, 0.81, 0.79]) + synthetic("bfloat16", 0.002, [0.80, 0.80, 0.81])
            + synthetic("float16", 0.004, [0.70, 0.71, 0.70])
            + [{"precision": "tf32", "label": "TF32", "status": "not run", "reason": "no GPU"}])
    summary = {s["precision"]: s for s in amp.summarize(rows)}
    assert summary["tf32"]["runs"] == 0 and summary["tf32"]["reason"] == "no GPU"
    assert summary["bfloat16"]["speedup"] == pytest.approx(5) and summary["float16"]["speedup"] == pytest.approx(2.5)
    assert summary["bfloat16"]["within_noise"] and not summary["float16"]["within_noise"]
    assert summary["float32"]["accuracy_sd"] == pytest.approx(0.01)
    verdict = amp.target_met(list(summary.values()))
    assert verdict["met"] and verdict["precision"] == "bfloat16"
    slow = synthetic("float32", 0.010, [0.8, 0.8]) + synthetic("bfloat16", 0.008, [0.8, 0.8])
    assert not amp.target_met(amp.summarize(slow))["met"]
    # identical runs still carry the test set's sampling noise: a gap of one example in 10,000 is within it
    close = synthetic("float32", 0.01, [0.8, 0.8]) + synthetic("bfloat16", 0.002, [0.8001, 0.8001])
    assert amp.summarize(close)[1]["within_noise"]


def test_teacher_data_is_labelled_by_a_fixed_network():
    data = amp.teacher_data(512, 256, 16, classes=4, device=CPU)
    assert data["X_train"].shape == (512, 16) and data["y_test"].shape == (256,)
    assert set(data["y_train"].tolist()) == {0, 1, 2, 3}
    again = amp.teacher_data(512, 256, 16, classes=4, device=CPU)
    assert torch.equal(data["y_train"], again["y_train"]) and not torch.equal(data["X_train"][:256], data["X_test"])
    with pytest.raises(ValueError, match="^train_samples: needs"):
        amp.teacher_data(10**12, 1, 1024, device=CPU)


def test_wide_mlp_precisions_runs_small():
    rows = amp.wide_mlp_precisions(["bfloat16"], inputs=16, width=32, depth=2, batch=32, steps=4, seeds=[0],
                                   test_samples=64)
    assert [r["precision"] for r in rows] == ["float32", "bfloat16"] and rows[1]["first_loss_error"] < 1e-2


def test_captured_gradients_are_autograds_times_the_scale():
    model = mlp.torch_mlp([6, 5, 3], seed=2)
    X, labels = torch.randn(4, 6), torch.tensor([0, 1, 2, 1])
    torch.nn.functional.cross_entropy(model(X), labels).backward()
    expected = torch.cat([p.grad.flatten() for p in model.parameters()])
    gradients = captured_gradients(model, X, labels, loss_scale=2.0**10)
    assert torch.equal(gradients["weight"], expected * 2.0**10)  # a power of two scales exactly
    assert gradients["activation"].numel() == 4 * (5 + 3)
    low = captured_gradients(model, X, labels, "float16")
    assert low["activation"].dtype == torch.float16 and low["weight"].dtype == torch.float32
    with pytest.raises(ValueError, match="^precision:"):
        captured_gradients(model, X, labels, "tf32")
    with pytest.raises(ValueError, match="^loss_scale:"):
        captured_gradients(model, X, labels, loss_scale=0)


def test_flushed_share_against_float16s_range():
    values = torch.tensor([2.0**-30, 2.0**-20, 1.0, 2.0**17, 0.0])  # the zero is not counted
    assert flushed_share(values, 1.0) == {"flushed": 0.25, "subnormal": 0.25, "overflowed": 0.25}
    assert flushed_share(values, 2.0**8) == {"flushed": 0.0, "subnormal": 0.25, "overflowed": 0.25}
    assert flushed_share(values, 2.0**-2) == {"flushed": 0.25, "subnormal": 0.25, "overflowed": 0.0}
    with pytest.raises(ValueError, match="^loss_scale:"):
        flushed_share(values, math.inf)
    with pytest.raises(ValueError, match="^values:"):
        flushed_share(torch.zeros(3), 1.0)
    with pytest.raises(ValueError, match="^dtype:"):
        flushed_share(values, 1.0, "float12")
    assert flushed_share(values, 1.0, "bfloat16")["flushed"] == 0  # float32's range: nothing to flush


def test_gradient_histogram_and_underflow_by_scale():
    histogram = gradient_histogram(hidden=[32], epochs=3)
    for kind in ("activation", "weight"):
        rows = [r for r in histogram if r["gradients"] == kind]
        assert sum(r["share"] for r in rows) == pytest.approx(1)
        assert sum(r["count"] for r in rows) + rows[0]["zeros"] == rows[0]["values"]
    rows = loss_scale_underflow([1.0, 2.0**16, 2.0**40], hidden=[32], epochs=3)
    by = {(r["gradients"], r["log2_scale"]): r for r in rows}
    for kind in ("activation", "weight"):
        assert by[kind, 16]["backward_lost"] <= by[kind, 0]["backward_lost"]
        assert by[kind, 16]["backward_not_finite"] == 0 and by[kind, 16]["relative_error"] < 0.05
        assert by[kind, 40]["backward_not_finite"] > 0 and by[kind, 40]["relative_error"] is None
    fig = figures.underflow_figure(rows, title="t")
    assert len(fig.data) == 6 and {t.line.dash for t in fig.data} == {"dot", "solid", "dashdot"}
    with pytest.raises(ValueError, match="^scales:"):
        loss_scale_underflow([0.0])


def test_loss_scale_trace_halves_on_overflow_and_grows_after_good_steps():
    rows = loss_scale_trace(init_scale=2.0**30, growth_interval=3, steps=40, hidden=[16])
    assert rows[0]["skipped"] and rows[0]["log2_scale"] == 30
    good_run = 0
    for row, after in zip(rows, rows[1:], strict=False):
        good_run = 0 if row["skipped"] else good_run + 1
        if row["skipped"]:
            assert after["loss_scale"] == row["loss_scale"] / 2
        elif good_run == 3:
            assert after["loss_scale"] == 2 * row["loss_scale"]
            good_run = 0
        else:
            assert after["loss_scale"] == row["loss_scale"]
    assert not all(r["skipped"] for r in rows)


def test_figures():
    histogram = [{"gradients": k, "log2_magnitude": e, "count": 1, "share": 0.5, "values": 3, "zeros": 1}
                 for k in ("activation", "weight") for e in (-30, -10)]
    fig = figures.histogram_figure(histogram, [1.0, 2.0**16], title="t")
    assert len(fig.data) == 2 and len(fig.layout.updatemenus[0].buttons) == 2 and len(fig.layout.shapes) == 3
    trace = [{"step": i, "loss_scale": 2.0**i, "log2_scale": i, "skipped": i % 2 == 0, "loss": 1.0} for i in range(4)]
    assert len(figures.loss_scale_figure(trace, title="t").data) == 2
    summary = amp.summarize(synthetic("float32", 0.01, [0.8, 0.82]) + synthetic("bfloat16", 0.002, [0.8, 0.81]))
    assert len(figures.precision_figure(summary, title="t").data) == 2
