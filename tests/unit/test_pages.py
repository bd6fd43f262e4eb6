"""What a page is built from: tables, the runs it draws, figures per GPU, hover text, the banner."""

from __future__ import annotations

import json

import pytest

from gpulab.ch03_blas_levels import blas
from gpulab.core import banner, plots, recordings, tables
from gpulab.core.recordings import Recording
from gpulab.core.tables import Column


def recording(name: str, rows: list[dict], recorded: bool = True, kind: str = "cuda") -> Recording:
    provenance = {"device": {"name": name, "kind": kind}, "date": "2026-11-25T10:00:00+00:00", "recorded": recorded}
    return Recording("demo", "gpulab.x:y", {}, rows, provenance)


H100 = recording("NVIDIA H100 80GB HBM3", [{"kernel": "naive", "gbytes_per_s": 1234.5}, {"kernel": "padded",
                                                                                       "gbytes_per_s": 2987.0}])
H200 = recording("NVIDIA H200", [{"kernel": "padded", "gbytes_per_s": 4123.9}, {"kernel": "naive",
                                                                              "gbytes_per_s": 1500.25}])


def test_a_table_formats_each_number_once_with_its_unit_in_the_header():
    t = tables.table([{"kernel": "naive", "gbytes_per_s": 1234.5, "share": 0.4125, "n": 16384, "note": None}],
                     [Column("kernel"), Column("gbytes_per_s", "bandwidth", "GB/s", ",.0f"),
                      Column("share", format=".1%"), Column("n"), Column("note")])
    html = t._repr_html_()
    assert "<th" in html and "bandwidth (GB/s)" in html and ">1,234<" in html.replace("1,235", "1,234")
    assert ">41.2%<" in html and ">16,384<" in html and ">–<" in html  # None is a dash, never 'None'
    assert "overflow-x:auto" in html  # a wide table scrolls inside the column
    text = str(t).splitlines()
    assert text[0].split() == ["kernel", "bandwidth", "(GB/s)", "share", "n", "note"] and "1,234" in text[2]


def test_a_table_escapes_html_and_aligns_numbers_right():
    html = tables.table([{"name": "<b>x</b>", "value": 3}], ["name", "value"])._repr_html_()
    assert "&lt;b&gt;" in html and "<b>x" not in html
    assert '<td style="text-align:right;' in html and '>3</td>' in html and '<td style="text-align:left;' in html


def test_by_gpu_sets_the_gpus_side_by_side_in_the_order_rows_first_appear():
    t = tables.by_gpu([H100, H200], "kernel", Column("gbytes_per_s", "bandwidth", "GB/s", ",.0f"))
    assert t.headers == ["kernel", "H100 80GB HBM3: bandwidth (GB/s)", "H200: bandwidth (GB/s)"]
    assert t.cells == [["naive", "1,234", "1,500"], ["padded", "2,987", "4,124"]]


def test_stacked_leads_each_row_with_its_gpu():
    t = tables.stacked([H100, H200], [Column("kernel"), Column("gbytes_per_s", format=",.0f")],
                       where=lambda r: r["kernel"] == "padded")
    assert [row[0] for row in t.cells] == ["H100 80GB HBM3", "H200"]


def test_runs_draw_every_recorded_gpu_and_a_live_cpu_run_only_where_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path))
    for gpu in ("NVIDIA H200", "NVIDIA H100 80GB HBM3"):
        made = recordings.run("blas_levels", blas.levels_sweep, vector_sizes=[64], matrix_sizes=[8],
                              dtypes=["float32"])
        made.provenance["device"] = {**made.provenance["device"], "name": gpu, "kind": "cuda"}
        recordings.save(made)
    params = dict(vector_sizes=[64], matrix_sizes=[8], dtypes=["float32"])
    found = recordings.runs("blas_levels", blas.levels_sweep, **params)
    assert [run.short_label for run in found] == ["H100 80GB HBM3", "H200"]  # the CPU run is not drawn
    assert found.live is not None and not found.live.on_gpu and found.live.rows  # but it ran (CI checks it)
    with_cpu = recordings.runs("blas_levels", blas.levels_sweep, draw_cpu=True, **params)
    assert len(with_cpu) == 3 and with_cpu[-1] is with_cpu.live
    monkeypatch.setenv(recordings.BOOK_BUILD, "1")
    assert with_cpu.live.label.startswith("the machine that built this book (")
    assert with_cpu.live.short_label == "build machine (CPU)"


def test_runs_of_a_gpu_only_experiment_without_a_gpu_say_what_is_missing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path))
    found = recordings.runs("blas_levels", blas.levels_sweep, needs_gpu=True, vector_sizes=[64], matrix_sizes=[8],
                            dtypes=["float32"])
    assert len(found) == 0 and found.live is None
    assert "no recording yet, and no GPU here" in capsys.readouterr().out


def test_one_figure_per_gpu_behind_a_menu():
    def bars(run):
        return plots.bars_figure(run.rows, "kernel", {"bandwidth": "gbytes_per_s"}, title=f"Transposes: {run.label}",
                                 y_title="GB/s")

    fig = plots.by_gpu([H100, H200], bars)
    assert len(fig.data) == 2 and [t.visible for t in fig.data] == [True, False]
    menu = fig.layout.updatemenus[0]
    assert [b.label for b in menu.buttons] == ["H100 80GB HBM3", "H200"]
    assert menu.buttons[1].args[0]["visible"] == [False, True]
    assert menu.buttons[1].args[1]["title.text"].startswith("Transposes: NVIDIA H200")
    assert plots.by_gpu([H100], bars).layout.updatemenus == ()  # one GPU: no menu


def test_hover_text_names_fields_with_units_and_no_exponents():
    row = {"gflops": 52930.0, "seconds": 0.00123, "nbytes": 2**30, "fraction_of_copy": 0.934, "stride": 4}
    text = plots.hover_text(row, list(row))
    assert text.split("<br>") == ["rate = 52,930 GFLOP/s", "time = 1.230 ms", "size = 1.0 GiB",
                                  "fraction of copy = 93.4%", "stride = 4"]
    assert "e+" not in text


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_the_banner_names_the_recorded_gpus_and_what_a_live_run_adds(kind, tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path))
    (tmp_path / "nvidia-h200").mkdir()
    (tmp_path / "nvidia-h200" / "x.json").write_text(json.dumps({"provenance": {
        "device": {"name": "NVIDIA H200"}, "date": "2026-11-24T00:00:00"}}))
    info = banner.DeviceInfo(kind, "NVIDIA H100 80GB HBM3" if kind == "cuda" else "AMD EPYC", 80 * 2**30, 132,
                             "9.0" if kind == "cuda" else None, "2.11", "13.0", None, None)
    shown = banner.banner(info)
    assert "NVIDIA H200 (1 recording, 2026-11-24)" in str(shown) and "<strong>" in shown._repr_html_()
    if kind == "cpu":
        assert "AMD EPYC" not in str(shown)  # the build machine is not the reader's
        assert "run the notebook on a GPU" in str(shown)
    else:
        assert str(shown).startswith("Running on NVIDIA H100 80GB HBM3")


def test_a_figure_with_its_own_menu_keeps_its_choices_per_gpu():
    def with_menu(run, method):
        fig = plots.bars_figure(run.rows, "kernel", {"bandwidth": "gbytes_per_s"}, title=f"t: {run.label}",
                                y_title="GB/s")
        fig.add_trace(fig.data[0])
        buttons = ([dict(label="first", method="update", args=[{"visible": [True, False]}]),
                    dict(label="second", method="update", args=[{"visible": [False, True]}])] if method == "update"
                   else [dict(label="log", method="relayout", args=[{"yaxis.type": "log"}])])
        return fig.update_layout(updatemenus=[dict(buttons=buttons)])

    update = plots.by_gpu([H100, H200], lambda run: with_menu(run, "update"))
    assert [b.label for b in update.layout.updatemenus[0].buttons] == [
        "H100 80GB HBM3: first", "H100 80GB HBM3: second", "H200: first", "H200: second"]
    assert update.layout.updatemenus[0].buttons[3].args[0]["visible"] == [False, False, False, True]
    relayout = plots.by_gpu([H100, H200], lambda run: with_menu(run, "relayout")).layout.updatemenus[0].buttons
    assert relayout[1].args[0]["visible"] == [False, False, True, True] and relayout[1].args[1]["yaxis.type"] == "log"
