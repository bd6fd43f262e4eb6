"""The built HTML: every page exists, plotly.js is served locally once per page, GPU data is labelled."""

from __future__ import annotations

import re

from conftest import ROOT, book_pages
from gpulab.core import recordings, specs


def test_plotly_is_served_from_the_book_once_per_page_that_draws_a_figure(built_book):
    assert (built_book / "_static" / "plotly.min.js").stat().st_size > 1_000_000
    drawing = 0
    for page in book_pages(built_book):
        html = page.read_text()
        tags = re.findall(r'<script[^>]*src="[^"]*plotly[^"]*"', html)
        if "plotly-graph-div" in html:
            drawing += 1
            assert len(tags) == 1 and "_static/plotly.min.js" in tags[0], page
        else:
            assert not tags, f"{page} loads plotly.js but draws no figure"
        assert "cdn.plot.ly" not in html, page
    assert drawing >= 16  # every chapter draws


def test_blas_page_shows_the_recorded_gpu_with_name_and_date(built_book):
    html = (built_book / "notebooks" / "03_blas_levels.html").read_text()
    recording = recordings.load("blas_ceilings")
    assert recording is not None, "no GPU recording of blas_ceilings under results/"
    assert "Roofline of" in html and recording.label in html
    assert html.count("plotly-graph-div") >= 5
    assert "gpulab-needs-kernel" in html  # the live explorer says how to launch it


def test_notebook_pages_have_an_open_in_colab_button(built_book):
    for name in ("notebooks/03_blas_levels.html", "labs/02_gflops_vs_n.html"):
        html = (built_book / name).read_text()
        assert "colab.research.google.com/github/dnn-gpu-book/dnn-computing-on-gpus/blob/main/" in html, name


def test_bibliography_and_math_render(built_book):
    bibliography = (built_book / "book" / "bibliography.html").read_text()
    assert "Roofline: an insightful visual performance model" in bibliography
    chapter = (built_book / "notebooks" / "03_blas_levels.html").read_text()
    assert 'class="math' in chapter and "bibliography.html#" in chapter


def test_hardware_page_shows_recorded_gpu_and_every_gpu_of_the_table(built_book):
    html = (built_book / "notebooks" / "01_cpus_to_gpus.html").read_text()
    recording = recordings.load("hardware_peaks")
    assert recording is not None, "no GPU recording of hardware_peaks under results/"
    assert "Matrix multiply against its peak" in html and recording.label in html
    for name in specs.GPUS:
        assert name in html, name
    assert "gpulab-needs-kernel" in html  # the live comparison widget says how to launch it


DNN_LAYER_CHAPTERS = {
    "04_mlp_gemms": ("mlp_fc_batch_sweep", "mlp_fc_feature_sweep", "mlp_alignment"),
    "05_convolutions_as_gemms": ("conv_memory", "conv_layers"),
    "06_recurrent_and_attention": ("rnn_lstm_layer", "attention_training_step"),
}


def test_dnn_layer_pages_show_each_recording_by_name_and_date(built_book):
    for chapter, experiments in DNN_LAYER_CHAPTERS.items():
        html = (built_book / "notebooks" / f"{chapter}.html").read_text()
        for experiment in experiments:
            recording = recordings.load(experiment)
            assert recording is not None, f"no GPU recording of {experiment} under results/"
            assert recording.label in html, (chapter, experiment)
        assert html.count("plotly-graph-div") >= 2, chapter


def test_dnn_layer_pages_reproduce_the_courses_worked_examples(built_book):
    conv = (built_book / "notebooks" / "05_convolutions_as_gemms.html").read_text()
    assert "Every value the slide prints is reproduced" in conv
    lstm = (built_book / "notebooks" / "06_recurrent_and_attention.html").read_text()
    assert re.search(r"With the slides(’|'|&#39;) rounding, all \d+ are within one printed unit", lstm)


def test_chapters_link_terms_to_the_glossary(built_book):
    glossary = (built_book / "book" / "glossary.html").read_text()
    for term in ("SM", "warp", "tensor core", "TF32", "loss scaling", "arithmetic intensity", "roofline",
                 "all-reduce", "occupancy", "coalescing", "im2col", "LSTM", "wave quantization"):
        assert f'id="term-{term.replace(" ", "-")}"' in glossary, term
    for chapter in sorted((ROOT / "notebooks").glob("*.ipynb")):
        html = (built_book / "notebooks" / f"{chapter.stem}.html").read_text()
        assert "glossary.html#term-" in html, chapter.name
        assert "bibliography.html#" in html, chapter.name  # every chapter cites its sources


def test_reference_pages_list_recorded_gpus_and_the_labs(built_book):
    recorded = (built_book / "book" / "recorded_gpus.html").read_text()
    for row in recordings.inventory():
        assert row["gpu"] in recorded and row["experiment"] in recorded, row
    instructors = re.sub(r"<[^>]+>", "", (built_book / "book" / "instructors.html").read_text())
    assert "make labs" in instructors
    rows = dict(re.findall(r"^\| (\d\d) ([^|]+?) \|", (ROOT / "labs" / "README.md").read_text(), re.MULTILINE))
    assert sorted(rows) == sorted(lab.name[:2] for lab in (ROOT / "labs").glob("*.ipynb"))  # a row for every lab
    for title in rows.values():
        assert title in instructors, title
