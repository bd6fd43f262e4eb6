"""The LSTM of the recurrent chapter: the stacked GEMM, PyTorch's layout, the worked example, the timed layer."""

from __future__ import annotations

import pytest
import torch

from gpulab.ch06_recurrent_and_attention import recurrent


def _random_cell(inputs=3, hidden=5):
    torch.manual_seed(1)
    return torch.nn.LSTMCell(inputs, hidden, dtype=torch.float64)


def test_one_stacked_gemm_equals_lstm_cell():
    cell = _random_cell()
    weight, bias = recurrent.from_torch(cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)
    assert weight.shape == (20, 5 + 3) and bias.shape == (20,)
    x, h, c = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64), torch.randn(
        4, 5, dtype=torch.float64)
    with torch.no_grad():
        ours_h, ours_c, gates = recurrent.lstm_cell(x, h, c, weight, bias)
        torch_h, torch_c = cell(x, (h, c))
    torch.testing.assert_close(ours_h, torch_h, rtol=0, atol=1e-12)
    torch.testing.assert_close(ours_c, torch_c, rtol=0, atol=1e-12)
    assert set(gates) == set(recurrent.GATES)


def test_to_torch_inverts_from_torch():
    cell = _random_cell()
    weight, bias = recurrent.from_torch(cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)
    back = recurrent.to_torch(weight, bias, 5)
    torch.testing.assert_close(back["weight_ih"], cell.weight_ih.detach())
    torch.testing.assert_close(back["weight_hh"], cell.weight_hh.detach())
    torch.testing.assert_close(back["bias_ih"] + back["bias_hh"], (cell.bias_ih + cell.bias_hh).detach())


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match="^W, U:"):
        recurrent.stack_weights(torch.zeros(6, 2), torch.zeros(6, 1))
    with pytest.raises(ValueError, match="^weight, bias:"):
        recurrent.lstm_cell(torch.zeros(1, 2), torch.zeros(1, 3), torch.zeros(1, 3), torch.zeros(12, 4),
                            torch.zeros(12))
    with pytest.raises(ValueError, match="^weight_ih, weight_hh:"):
        recurrent.from_torch(torch.zeros(8, 2), torch.zeros(8, 3))


def test_printed_unit():
    assert recurrent.printed_unit("0.81775") == pytest.approx(1e-5)
    assert recurrent.printed_unit("1.5176") == pytest.approx(1e-4)
    assert recurrent.printed_unit("-0.0922") == pytest.approx(1e-4)
    assert recurrent.printed_unit("0") == 1


def test_worked_example_matches_the_slides():
    exact = recurrent.compare_with_slides()
    assert len(exact) == len(recurrent.SLIDE_VALUES)
    by_name = {r["quantity"]: r for r in exact}
    for name, value in {"a_0": 0.81775, "out_1": 0.77197, "delta_state_1": -0.07111}.items():
        assert by_name[name]["computed"] == pytest.approx(value, abs=1.2e-5)
    # in full precision only the numbers the slides built from rounded intermediates are off, by < 2.2 units
    assert {r["quantity"] for r in exact if not r["within_one_unit"]} == {
        "out_1", "Delta_1", "delta_out_1", "dW[i,1]", "dW[f,1]", "dW[o,1]"}
    assert max(abs(r["units"]) for r in exact) < 2.2
    # redoing the slides' arithmetic with their rounding reproduces every printed number
    rounded = recurrent.compare_with_slides(recurrent.worked_example_values(rounded=True))
    assert all(r["within_one_unit"] for r in rounded)


def test_the_slides_negative_label_does_not_reproduce_them():
    values = recurrent.worked_example_values(labels=recurrent.SLIDE_LABELS)
    assert values["Delta_1"] == pytest.approx(0.77198 + 1.25, abs=1e-5)
    assert not all(r["within_one_unit"] for r in recurrent.compare_with_slides(values))


def test_hand_backward_equals_autograd():
    by_hand = recurrent.backward_trace(recurrent.forward_trace())
    by_autograd = recurrent.autograd_gradients()
    for name in ("dW", "dU", "db"):
        torch.testing.assert_close(by_hand[name], by_autograd[name], rtol=0, atol=1e-14)


def test_round_like_slides():
    values = torch.tensor([0.817754, 1.517633, -0.0711077, 0.0, 12.34567], dtype=torch.float64)
    torch.testing.assert_close(recurrent.round_like_slides(values),
                               torch.tensor([0.81775, 1.5176, -0.07111, 0.0, 12.346], dtype=torch.float64))


@pytest.mark.parametrize("name", ["lstm_layer_per_step", "lstm_layer_hoisted"])
def test_layer_loops_equal_nn_lstm(name):
    torch.manual_seed(2)
    module = torch.nn.LSTM(6, 4, dtype=torch.float64)
    x = torch.randn(7, 3, 6, dtype=torch.float64)
    weight, bias = recurrent.from_torch(module.weight_ih_l0, module.weight_hh_l0, module.bias_ih_l0,
                                        module.bias_hh_l0)
    with torch.no_grad():
        torch.testing.assert_close(getattr(recurrent, name)(x, weight, bias), module(x)[0], rtol=0, atol=1e-12)


def test_lstm_layer_sweep_checks_and_times():
    rows = recurrent.lstm_layer_sweep([8, 16], [4], batch=2, dtypes=["float32"])
    assert [r["implementation"] for r in rows] == list(recurrent.IMPLEMENTATIONS) * 2
    for r in rows:
        assert r["status"] == "ok" and r["seconds"] > 0 and r["relative_error"] < 1e-4
        assert r["flops"] == recurrent.layer_flops(r["hidden"], 4, 2, r["hidden"])


def test_measure_lstm_layer_catches_a_wrong_result(monkeypatch):
    real = recurrent.lstm_layer_hoisted
    monkeypatch.setattr(recurrent, "lstm_layer_hoisted", lambda x, w, b: real(x, w, b) + 1e-2)
    with pytest.raises(AssertionError, match="relative error"):
        recurrent.measure_lstm_layer(8, 4, 2, "float32", "hoisted input GEMM")


def test_measure_lstm_layer_rejects_bad_arguments():
    with pytest.raises(ValueError, match="^implementation:"):
        recurrent.measure_lstm_layer(8, 4, 2, implementation="scan")
    with pytest.raises(ValueError, match="^hidden:"):
        recurrent.measure_lstm_layer(0, 4, 2)
    with pytest.raises(ValueError, match="^dtype:"):
        recurrent.measure_lstm_layer(8, 4, 2, dtype="float16", device=torch.device("cpu"))
    with pytest.raises(ValueError, match="^seq_len: needs"):
        recurrent.measure_lstm_layer(4096, 10**6, 64)
