"""Chapter 05's explorer: a convolution layer's sizes, its im2col matrix and its GEMM, and the recorded times of the
layers the GPUs measured."""

from __future__ import annotations

import ipywidgets as w

from gpulab.ch05_convolutions_as_gemms.conv import ConvLayer
from gpulab.core import recordings
from gpulab.core.printing import format_bytes
from gpulab.core.sweep import ok_rows
from gpulab.core.tables import Column, table
from gpulab.core.widgets import WIDE, assemble, render

ELEMENT_BYTES = {"float32": 4, "float16": 2}
SHAPE = ("n", "c", "h", "w", "k", "r", "s", "stride", "padding")  # the fields that make two layers the same
MEMORY_METHODS = {"im2col + GEMM": "im2col", "implicit GEMM (tiled)": "implicit", "conv2d NCHW": "torch"}
OWN = "(your own sizes)"


def _same(row: dict, layer: ConvLayer) -> bool:
    return all(row.get(key) == getattr(layer, key) for key in SHAPE)


def recorded_layers() -> dict[str, dict]:
    """The layers the GPUs' recordings of ``conv_layers`` measured, by name: their sizes (the recording's params)."""
    found: dict[str, dict] = {}
    for run in recordings.newest_per_gpu("conv_layers"):
        for spec in run.params.get("layers", []):
            found.setdefault(spec.get("name") or str(spec), {k: spec[k] for k in SHAPE})
    return found


def measured_rows(layer: ConvLayer, dtype: str) -> list[dict]:
    """For each GPU that measured ``layer`` in ``dtype``: a row per method with its time and rate, and (float32) the
    memory it allocated beyond its output (``conv_memory``)."""
    memory = {run.device_name: next((r for r in ok_rows(run.rows) if _same(r, layer)), None)
              for run in recordings.newest_per_gpu("conv_memory") if run.params.get("dtype") == dtype}
    rows = []
    for run in recordings.newest_per_gpu("conv_layers"):
        peaks = memory.get(run.device_name)
        for r in ok_rows(run.rows):
            if r["dtype"] == dtype and _same(r, layer):
                key = MEMORY_METHODS.get(r["method"])
                extra = peaks.get(f"{key}_peak_extra_bytes") if peaks and key else None
                rows.append({"gpu": run.short_label, "method": r["method"], "ms": r["seconds"] * 1e3,
                             "tflops": r["tflops"], "extra": extra})
    return rows


def conv_layer_explorer(n: int = 32, c: int = 64, h: int = 56, w_: int = 56, k: int = 64, r: int = 3, s: int = 3,
                        stride: int = 1, padding: int = 1, dtype: str = "float32") -> w.Widget:
    """Pick a convolution layer's sizes: its output, its im2col matrix against its input, the GEMM it becomes, and,
    where a GPU's recording measured a layer of these sizes, each method's time there. Arithmetic and recordings:
    it answers without a GPU."""
    def number(value: int, description: str, low: int = 1, high: int = 4096) -> w.BoundedIntText:
        return w.BoundedIntText(value=value, min=low, max=high, description=description, style=WIDE,
                                layout=w.Layout(width="11em"))

    controls = {"n": number(n, "N (images)"), "c": number(c, "C (channels)"), "h": number(h, "H"),
                "w": number(w_, "W"), "k": number(k, "K (filters)"), "r": number(r, "R", high=64),
                "s": number(s, "S", high=64), "stride": number(stride, "stride u", high=16),
                "padding": number(padding, "padding", low=0, high=32)}
    known = recorded_layers()
    preset = w.Dropdown(options=[OWN, *known], value=OWN, description="recorded layer", style=WIDE)
    dtypes = w.Dropdown(options=list(ELEMENT_BYTES), value=dtype, description="number format", style=WIDE)
    output = w.Output()
    applying = False

    def apply_preset(_change=None) -> None:
        nonlocal applying
        if preset.value == OWN:
            return
        applying = True
        for key, value in known[preset.value].items():
            controls[key].value = value
        applying = False
        update()

    preset.observe(apply_preset, names="value")

    def update(_change=None) -> None:
        if applying:
            return
        try:
            layer = ConvLayer(**{key: control.value for key, control in controls.items()})
        except ValueError as error:
            render(output, f"Not a layer: {error}")
            return
        if preset.value != OWN and any(known[preset.value][key] != getattr(layer, key) for key in SHAPE):
            preset.value = OWN  # the sizes are no longer the recorded layer's
        size = ELEMENT_BYTES[dtypes.value]
        input_bytes, im2col_bytes = layer.input_elements * size, layer.im2col_elements * size
        lines = [
            f"Output: {layer.k} channels of P x Q = {layer.p} x {layer.q} pixels per image "
            f"(P = floor(({layer.h} + 2 x {layer.padding} - {layer.r}) / {layer.stride}) + 1).",
            f"The GEMM: M = NPQ = {layer.gemm_m:,}, N = K = {layer.gemm_n:,}, K = CRS = {layer.gemm_k:,}; "
            f"2MNK = {layer.flops / 1e9:,.3f} GFLOP.",
            f"The im2col matrix: CRS x NPQ = {layer.gemm_k:,} x {layer.gemm_m:,}, {format_bytes(im2col_bytes)} in "
            f"{dtypes.value} against {format_bytes(input_bytes)} of input: {layer.blowup:,.2f} times the input "
            f"(R S PQ / HW).",
        ]
        rows = measured_rows(layer, dtypes.value)
        if rows:
            lines.append("Recorded on a GPU at these sizes (the memory column: float32's peak beyond the output):")
        else:
            lines.append(f"No GPU recording has this layer in {dtypes.value}. The recorded layers: "
                         + ("; ".join(f"{name} (N={v['n']}, C={v['c']}, H={v['h']}, W={v['w']}, K={v['k']}, "
                                      f"{v['r']}x{v['s']}, stride {v['stride']}, padding {v['padding']})"
                                      for name, v in known.items()) or "none yet") + ".")
        shown = table(rows, [Column("gpu", "GPU"), Column("method"), Column("ms", "time", "ms", ",.3f"),
                             Column("tflops", "rate", "TFLOP/s", ",.2f"),
                             Column("extra", "extra memory", format=lambda b: format_bytes(int(b)))]) if rows else None
        render(output, "\n".join(lines), table=shown)

    return assemble([[preset, dtypes], [controls[k] for k in ("n", "c", "h", "w")],
                     [controls[k] for k in ("k", "r", "s")], [controls[k] for k in ("stride", "padding")]],
                    output, update)
