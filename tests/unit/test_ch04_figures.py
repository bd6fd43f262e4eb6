"""Chapter 04's tables, figures and explorer: the counts of a layer and a step, and the recorded sweeps of one GPU
or several."""

from __future__ import annotations

import pytest

from conftest import shown
from gpulab.ch04_mlp_gemms import figures, mlp, sweeps, waves
from gpulab.ch04_mlp_gemms.explorer import layer_explorer
from gpulab.core.recordings import Recording

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


def recording(experiment: str, device: str, rows: list[dict], sms: int = 132, **params) -> Recording:
    return Recording(experiment, "gpulab.ch04_mlp_gemms.sweeps:x", params, rows, {
        "device": {"name": device, "kind": "cuda", "multiprocessors": sms}, "date": "2026-01-02", "recorded": True})


def cells(table) -> list[dict]:
    return [dict(zip(table.headers, row, strict=True)) for row in table.cells]


def model_rows(xs, *, vary: str, sms: int, fixed: int = 4096, dtype: str = "float16") -> list[dict]:
    """Forward-GEMM rows whose rate is the 128 x 128 tile/wave model exactly."""
    rows = []
    for x in xs:
        batch, outputs = (x, fixed) if vary == "batch" else (fixed, x)
        rate = 500 * waves.tile_waves(outputs, batch, (128, 128), sms).efficiency
        rows.append({"vary": vary, "batch": batch, "inputs": 4096, "outputs": outputs, "M": outputs, "N": batch,
                     "K": 4096, "dtype": dtype, "tflops": rate, "seconds": 1e-3, "status": "ok"})
    return rows


def test_the_gemm_tables_read_layer_gemms():
    gemms = mlp.layer_gemms(10, 784, 16)
    rows = cells(figures.gemms_table(gemms))
    assert [r["formula"] for r in rows] == ["Y = X W", "dX = dY W^T", "dW = X^T dY"]
    assert rows[2]["A"] == "X^T: 784 x 10 (inputs x batch)"
    mnk = cells(figures.mnk_table(gemms))
    assert [(r["M"], r["N"], r["K"], r["K (summed) is the"]) for r in mnk] == [
        ("16", "10", "784", "inputs"), ("784", "10", "16", "outputs"), ("16", "784", "10", "batch")]


def test_step_tables_and_sentences():
    operations = mlp.training_step_operations([784, 16, 10], 10)
    assert len(figures.operations_table(operations).cells) == len(operations)
    said = figures.step_totals_said(mlp.step_totals(operations))
    assert said[0].startswith("GEMMs: 511,360 FLOP (95.0% of the step)") and "2.01 x the forward" in said[1]
    counts = [{"sizes": [784, 16, 10], "batch": 10, "forward": 2, "backward": 3, "total": 5, "ours": 5.0}]
    [row] = cells(figures.flop_counts_table(counts))
    assert row["MLP"] == "784 -> 16 -> 10" and row["backward / forward"] == "1.50"
    [check] = cells(figures.autograd_table([{"tensor": "dW", "shape": (784, 16), "error": 1.23e-16}]))
    assert check == {"tensor": "dW", "shape": "784 x 16", "relative error against autograd": "1.2e-16"}
    [layer] = cells(figures.gradient_check_table([{"layer": 1, "shape": (64, 32), "dW": 1e-15, "db": 2e-15}]))
    assert layer["dW"] == "64 x 32" and layer["db: relative error"] == "2.0e-15"
    training = mlp.train_digits([8], epochs=2)
    assert figures.training_said(training, 2).startswith(f"{training.steps} SGD steps over 2 epochs")


def test_the_wave_example_and_its_gpu(monkeypatch):
    said = figures.wave_example(4096, 544, "an H200", 132)
    assert "32 x 5 = 160 tiles, 2 waves; the last wave keeps 28 of 132 SMs busy" in said[0]
    assert said[1] == "Tile efficiency 85% x wave efficiency 61% = 52% of the peak at best."
    monkeypatch.setenv("GPULAB_DEVICE", "cpu")
    assert figures.example_gpu([recording("mlp_fc_batch_sweep", H100, [], sms=114)]) == (H100, 114)
    assert figures.example_gpu([]) == ("an H100 or H200", 132)


def test_batch_figure_and_table_cover_every_gpu_and_tile_model():
    runs = [recording("mlp_fc_batch_sweep", name, model_rows(range(32, 4097, 32), vary="batch", sms=sms), sms=sms,
                      inputs=4096, outputs=4096) for name, sms in ((H100, 132), (H200, 132))]
    fig = figures.batch_figure(runs)
    labels = [b.label for b in fig.layout.updatemenus[0].buttons]
    assert len(labels) == 2 * len(waves.TILE_MODELS) and labels[0] == "H100 80GB HBM3: model: 128x128 per SM"
    assert len(fig.layout.shapes) == 7  # the first model's wave steps
    rows = cells(figures.step_agreement_table(runs, "batch", vary="n"))
    first = [r for r in rows if r["tile model"] == "128x128 per SM"]
    assert [(r["GPU"], r["steps predicted"], r["seen as a drop"]) for r in first] == [
        ("H100 80GB HBM3", "7", "7"), ("H200", "7", "7")]


def test_feature_figures_and_tables_split_outputs_and_inputs():
    rows = model_rows(range(128, 8193, 64), vary="outputs", sms=132, fixed=2048)
    rows += [{**r, "vary": "inputs", "inputs": r["outputs"], "outputs": 4096, "tflops": 400.0} for r in rows]
    runs = [recording("mlp_fc_feature_sweep", H200, rows, batch=2048, fixed=4096)]
    assert figures.outputs_figure(runs).layout.xaxis.title.text == "outputs (M)"
    assert all(int(r["steps predicted"]) > 0 for r in cells(figures.step_agreement_table(runs, "outputs", vary="m")))
    assert figures.inputs_figure(runs).data[0].name == "float16"
    [drops] = cells(figures.inputs_drops_table(runs))
    assert drops["drops of more than 4% against inputs (K)"] == "0" and drops["at inputs"] == ""


def test_alignment_table_stars_the_misaligned_rows():
    rows = sweeps.alignment_sweep(16, [15, 20], ["float32"])
    runs = [recording("mlp_alignment", H200, rows, base=16)]
    table = figures.alignment_table(runs)
    assert table.headers == ["GPU", "format", "dimension changed", "15", "16", "20"]
    by_dimension = {row[2]: row[3:] for row in table.cells}
    assert by_dimension["inputs"][0].endswith(" *") and not by_dimension["batch"][0].endswith("*")
    assert by_dimension["outputs"][1] == "1.00" and not by_dimension["inputs"][2].endswith("*")  # 20 x 4 B = 80 B
    assert figures.alignment_by_gpu(runs).layout.xaxis.title.text == "the dimension changed, and its new size"


def test_the_layer_explorer_counts_three_gemms_and_finds_recorded_shapes():
    runs = [recording("mlp_fc_batch_sweep", H200, model_rows([544, 2048], vary="batch", sms=132),
                      batches=[544, 2048], inputs=4096, outputs=4096)]
    explorer = layer_explorer(batch=544, inputs=4096, outputs=4096, runs=runs)
    (batch, inputs, _outputs), (gpu, tile, dtype) = explorer.children[0].children, explorer.children[1].children
    assert gpu.value == "H200: 132 SMs (recorded)" and dtype.value == "float16"
    text, [figure] = shown(explorer.children[-1])
    assert "three GEMMs of 18,253,611,008 FLOP each" in text  # 2 x 544 x 4096 x 4096
    lines = {line.split("  ")[0]: line for line in text.splitlines()}
    forward = lines["forward"].split()
    recorded = 500 * waves.tile_waves(4096, 544, (128, 128), 132).efficiency
    assert forward[forward.index("Y") + 4:] == ["4,096", "544", "4,096", "18.25", "160", "2", "85%", "61%", "52%",
                                                f"{recorded:,.1f}"]
    assert lines["weight gradient"].split()[-1] == "–"  # M = outputs, N = inputs: no recording of that shape
    assert [t["name"] for t in figure["data"]] == ["forward", "activation gradient", "weight gradient"]
    gpu.value = "H100 SXM5 80GB: 132 SMs"
    batch.value = 528  # 4096 x 528: 32 x 5 tiles, 2 waves still
    assert "On the H100 SXM5 80GB (132 SMs)" in shown(explorer.children[-1])[0]
    tile.value = (256, 128, 2)
    text = shown(explorer.children[-1])[0]
    assert "256x128 per 2-SM cluster" in text
    inputs.value = 2048
    gradient = next(line for line in shown(explorer.children[-1])[0].splitlines() if line.startswith("activation"))
    assert gradient.split()[6:9] == ["2,048", "528", "4,096"]  # M = inputs, N = batch, K = outputs


@pytest.mark.parametrize("value", [1, 2**17])
def test_the_layer_explorer_takes_any_size_in_bounds(value):
    explorer = layer_explorer(runs=[])
    batch = explorer.children[0].children[0]
    batch.value = value
    text = shown(explorer.children[-1])[0]
    assert f"on a batch of {value:,}" in text and "recorded rates" not in text
