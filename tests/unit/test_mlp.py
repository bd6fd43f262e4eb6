"""The MLP chapter's library: the three GEMMs against autograd, FLOP counts, the tile/wave model, the sweeps."""

from __future__ import annotations

import pytest
import torch

from gpulab.ch04_mlp_gemms import figures, mlp, sweeps, waves


def fresh(*shape):
    return torch.randn(*shape, dtype=torch.float64)


def test_linear_layer_gemms_equal_autograd():
    X, W, b, dY = fresh(7, 5), fresh(5, 3), fresh(3), fresh(7, 3)
    X_, W_, b_ = (t.clone().requires_grad_() for t in (X, W, b))
    (X_ @ W_ + b_).backward(dY)
    mine = mlp.linear_backward(X, W, dY)
    assert torch.allclose(mlp.linear_forward(X, W, b), X @ W + b)
    for ours, theirs in ((mine.dX, X_.grad), (mine.dW, W_.grad), (mine.db, b_.grad)):
        assert ours.shape == theirs.shape and torch.allclose(ours, theirs, rtol=1e-12, atol=1e-12)
    assert mlp.linear_backward(X, W, dY, need_dX=False).dX is None


def test_linear_layer_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="^W:"):
        mlp.linear_forward(fresh(4, 5), fresh(6, 3))
    with pytest.raises(ValueError, match="^b:"):
        mlp.linear_forward(fresh(4, 5), fresh(5, 3), fresh(4))
    with pytest.raises(ValueError, match="^dY:"):
        mlp.linear_backward(fresh(4, 5), fresh(5, 3), fresh(3, 4))
    with pytest.raises(ValueError, match="^dA:"):
        mlp.relu_backward(fresh(4, 5), fresh(5, 4))


def test_layer_gemms_shapes_in_nvidia_terms():
    forward, activation, weight = mlp.layer_gemms(10, 784, 16)
    assert (forward["M"], forward["N"], forward["K"]) == (16, 10, 784)  # outputs, batch, inputs
    assert (activation["M"], activation["N"], activation["K"]) == (784, 10, 16)  # inputs, batch, outputs
    assert (weight["M"], weight["N"], weight["K"]) == (16, 784, 10)  # outputs, inputs, batch
    assert {g["flops"] for g in (forward, activation, weight)} == {2 * 10 * 784 * 16}
    assert "10 x 16" in forward["C"] and "784 x 16" in weight["C"]
    with pytest.raises(ValueError, match="^batch:"):
        mlp.layer_gemms(0, 784, 16)


def test_mlp_backward_and_loss_gradient_equal_autograd():
    layers = mlp.init_mlp([6, 5, 4, 3], seed=1, dtype=torch.float64)
    X, labels = fresh(9, 6), torch.randint(0, 3, (9,))
    logits, cache = mlp.mlp_forward(layers, X)
    loss, dlogits = mlp.softmax_cross_entropy(logits, labels)
    reference_loss, reference = mlp.autograd_gradients(layers, X, labels)
    assert loss.item() == pytest.approx(reference_loss, rel=1e-12)
    errors = mlp.gradient_errors(mlp.mlp_backward(layers, cache, dlogits), reference)
    assert len(errors) == 3 and all(e["dW"] < 1e-12 and e["db"] < 1e-12 for e in errors)
    with pytest.raises(ValueError, match="^labels:"):
        mlp.softmax_cross_entropy(logits, labels[:4])
    with pytest.raises(ValueError, match="^sizes:"):
        mlp.init_mlp([6])


def test_training_learns_the_digits():
    training = mlp.train_digits([16], epochs=4, batch=64, learning_rate=0.1)
    assert [r["epoch"] for r in training.rows] == [1, 2, 3, 4]
    assert training.rows[-1]["loss"] < training.rows[0]["loss"]
    assert training.rows[-1]["test_accuracy"] > 0.6
    with pytest.raises(ValueError, match="^learning_rate:"):
        mlp.train_digits(epochs=1, learning_rate=0)


@pytest.mark.parametrize(("sizes", "batch"), [([784, 16, 10], 10), ([64, 32, 32, 10], 16)])
def test_step_count_matches_flop_counter(sizes, batch):
    operations = mlp.training_step_operations(sizes, batch)
    totals = mlp.step_totals(operations)
    counted = mlp.flop_counter_totals(mlp.torch_mlp(sizes), torch.randn(batch, sizes[0]),
                                      torch.randint(0, sizes[-1], (batch,)))
    assert counted["total"] == totals["gemm"] and counted["forward"] == totals["forward_gemm"]
    assert 2 <= totals["step_over_forward"] < 3 and 0.9 < totals["gemm_share"] < 1
    assert sum(op["kind"] == "GEMM" for op in operations) == 3 * (len(sizes) - 1) - 1


def test_tile_and_wave_quantization():
    # NVIDIA's example: 12 tiles on 8 SMs run as a full wave and a half-empty one, 75% at best
    model = waves.tile_waves(3 * 128, 4 * 128, (128, 128), sms=8)
    assert (model.tiles, model.waves, model.wave_efficiency, model.tile_efficiency) == (12, 2, 0.75, 1.0)
    assert waves.tile_waves(129, 128, (128, 128), sms=8).tile_efficiency == pytest.approx(129 / 256)
    clustered = waves.tile_waves(4096, 1024, (256, 128, 2), sms=132)
    assert clustered.slots == 66 and clustered.tiles == 16 * 8 and clustered.waves == 2
    assert waves.wave_steps(64, 4096, 4096, vary="n", tile=(128, 128), sms=132) == [513, 1025, 1537, 2049, 2561,
                                                                                 3073, 3585]
    assert waves.wave_steps(64, 4096, 4096, vary="m", tile=(128, 128), sms=132) == [513, 1025, 1537, 2049, 2561,
                                                                                 3073, 3585]
    assert waves.tile_label((256, 128, 2)) == "256x128 per 2-SM cluster"
    with pytest.raises(ValueError, match="^tile:"):
        waves.tile_waves(128, 128, (128,))
    with pytest.raises(ValueError, match="^tile:"):
        waves.tile_waves(128, 128, (128, 128, 16), sms=8)
    with pytest.raises(ValueError, match="^vary:"):
        waves.wave_steps(1, 10, 10, vary="k")


def synthetic_rows(batches, tile, sms, outputs=4096):
    """Rows whose rate is exactly the tile/wave model: every predicted step is a drop."""
    return [{"batch": b, "M": outputs, "N": b, "dtype": "float16", "status": "ok",
             "tflops": 500 * waves.tile_waves(outputs, b, tile, sms).efficiency} for b in batches]


def test_step_agreement_and_figures_on_model_data():
    rows = synthetic_rows(range(32, 4097, 32), (128, 128), 132)
    [agreement] = waves.step_agreement(rows, "batch", vary="n", tile=(128, 128), sms=132)
    assert agreement["predicted"] == agreement["seen"] == 7
    fig = figures.quantization_figure(rows, "batch", sms=132, vary="n", title="t", x_title="batch")
    buttons = fig.layout.updatemenus[0].buttons
    assert len(buttons) == len(waves.TILE_MODELS) and len(fig.layout.shapes) == 7
    assert sum(bool(v) for v in buttons[1].args[0]["visible"]) == 2  # the measurement and that model's prediction
    assert all(abs(p["tflops"] - r["tflops"]) < 1e-9 for p, r in zip(
        waves.predicted_rows(rows, "batch", tile=(128, 128), sms=132), rows, strict=True))


def test_measure_linear_checks_and_times():
    row = sweeps.measure_linear(24, 40, 16, "float32")
    assert (row["M"], row["N"], row["K"]) == (16, 24, 40) and row["seconds"] > 0
    assert row["tflops"] == pytest.approx(2 * 24 * 40 * 16 / row["seconds"] / 1e12)
    assert row["relative_error"] < 1e-5


def test_measure_linear_catches_a_wrong_result(monkeypatch):
    real = sweeps._forward_gemm

    def transposed_weights(X, W, Y):
        fn = real(X, W, Y)
        return lambda: fn().mul_(1.01)

    monkeypatch.setattr(sweeps, "_forward_gemm", transposed_weights)
    with pytest.raises(AssertionError, match="relative error"):
        sweeps.measure_linear(16, 16, 16, "float32")


def test_measure_linear_rejects_bad_arguments():
    with pytest.raises(ValueError, match="^dtype: tf32 is a tensor-core mode"):
        sweeps.measure_linear(8, 8, 8, "tf32", torch.device("cpu"))
    with pytest.raises(ValueError, match="^dtype:"):
        sweeps.measure_linear(8, 8, 8, "float64")
    with pytest.raises(ValueError, match="^batch: needs"):
        sweeps.measure_linear(10**6, 10**6, 8)
    with pytest.raises(ValueError, match="^outputs:"):
        sweeps.measure_linear(8, 8, -1)


def test_sweeps_and_their_figures():
    batch_rows = sweeps.fc_batch_sweep([8, 16], 16, 16, ["float32"])
    assert [r["batch"] for r in batch_rows] == [8, 16] and all(r["status"] == "ok" for r in batch_rows)
    feature_rows = sweeps.fc_feature_sweep([8, 16], 8, 16, ["float32"])
    assert [(r["vary"], r["features"]) for r in feature_rows] == [("outputs", 8), ("outputs", 16), ("inputs", 8),
                                                                 ("inputs", 16)]
    assert feature_rows[0]["outputs"] == 8 and feature_rows[2]["inputs"] == 8
    alignment = sweeps.alignment_sweep(16, [15, 17], ["float32"])
    assert len(alignment) == 9 and all(r["relative"] == 1.0 for r in alignment if r["size"] == 16)
    assert {r["multiple_of_8"] for r in alignment if r["size"] != 16} == {False}
    assert len(figures.alignment_figure(alignment, title="a").data) == 1
    training = mlp.train_digits([8], epochs=2)
    assert len(figures.loss_figure(training.rows, title="l").data) == 3
