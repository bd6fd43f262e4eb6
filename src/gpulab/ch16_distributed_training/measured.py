"""Chapter 16's measured results, as tables, sentences and figures: DDP's gradients against the whole batch's, the
all-reduce's bandwidth (gloo on the CPU, NCCL on two GPUs) and the DDP step from one GPU to two.

The NCCL and DDP recordings are runs over the GPUs of one machine, not of one GPU: :func:`machine_runs` labels them
by their machine ('2 x NVIDIA H200, recorded 2026-11-24'), in titles, menus and tables alike.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
import torch
import torch.nn.functional as F

from gpulab.ch16_distributed_training.ddp import gpu_link, gradient_problem
from gpulab.ch16_distributed_training.figures import bandwidth_figure
from gpulab.core import plots, recordings, specs
from gpulab.core.correctness import check_close
from gpulab.core.printing import format_bytes
from gpulab.core.recordings import Recording
from gpulab.core.tables import Column, Table, table

BUCKET_BYTES = 25 * 2**20  # DDP's default bucket (bucket_cap_mb=25, in MiB), as a message size of the NCCL run
# One NVLink's rate in each direction, GB/s, by architecture: NVLink 2 (V100, 6 links), 3 (A100, 12 links) and
# 4 (H100 and H200, 18 links) all carry 25 GB/s each way per link, so 18 links make the datasheets' "900 GB/s" of
# Hopper, counting both directions; NVLink 5 (Blackwell) doubles it {nvidia2022hopper,nvidia2024h200}.
NVLINK_GB_S_PER_LINK = {"Volta": 25.0, "Ampere": 25.0, "Hopper": 25.0, "Blackwell": 50.0}
PCIE_PATHS = ("PIX", "PXB", "PHB", "NODE", "SYS")  # nvidia-smi topo -m's names for paths over PCIe


class MachineRun(Recording):
    """A run over several GPUs of one machine, labelled by the machine: its number of GPUs, then the GPU's label."""

    @property
    def gpus(self) -> int:
        return int(self.params.get("processes", 1))

    @property
    def label(self) -> str:
        return f"{self.gpus} x {super().label}"

    @property
    def short_label(self) -> str:
        return f"{self.gpus} x {super().short_label}"


def machine_runs(runs: Sequence[Recording]) -> list[MachineRun]:
    return [MachineRun(r.experiment, r.function, r.params, r.rows, r.provenance) for r in runs]


def _same_machine(run: Recording) -> tuple[str, bool]:
    return run.device_name, bool(run.provenance.get("recorded"))


def machine_link(run: Recording) -> str | None:
    """How the two GPUs of ``run``'s machine are linked, as ``nvidia-smi topo -m`` names it ('NV18'): from the run's
    rows, else from the DDP scaling recording of the same machine, else (a live run) from nvidia-smi here."""
    for row in run.rows:
        if row.get("link"):
            return row["link"]
    for other in recordings.newest_per_gpu("distributed_ddp_scaling"):
        if _same_machine(other) == _same_machine(run):
            return next((r["link"] for r in other.rows if r.get("link")), None)
    return None if run.provenance.get("recorded") else gpu_link()


def link_rate(link: str | None, device_name: str) -> float | None:
    """The rate, bytes/s in one direction, of ``link`` between two GPUs named ``device_name``: n NVLinks at their
    architecture's rate, or 16 PCIe lanes of the GPU's generation; None where the link or the GPU is unknown."""
    gpu = specs.find(device_name)
    if link is None or gpu is None:
        return None
    nvlinks = re.fullmatch(r"NV(\d+)", link)
    if nvlinks and gpu.architecture in NVLINK_GB_S_PER_LINK:
        return int(nvlinks.group(1)) * NVLINK_GB_S_PER_LINK[gpu.architecture] * 1e9
    return gpu.pcie_gb_s * 1e9 if link in PCIE_PATHS else None


def link_statements(nccl: Sequence[Recording]) -> list[str]:
    """Per machine that ran NCCL: how its GPUs are linked, and that link's rate in one direction and in both."""
    said = []
    for run in machine_runs(nccl):
        link = machine_link(run)
        rate = link_rate(link, run.device_name)
        if rate is None:
            said.append(f"{run.label}: the link between the GPUs ({link or 'not reported'}) has no rate in this book.")
        elif link.startswith("NV"):
            said.append(f"{run.label}: `nvidia-smi topo -m` reports {link} between the two GPUs, {link[2:]} NVLinks of "
                        f"{NVLINK_GB_S_PER_LINK[specs.find(run.device_name).architecture]:g} GB/s each way: "
                        f"{rate / 1e9:,.0f} GB/s in each direction, {2 * rate / 1e9:,.0f} GB/s counting both.")
        else:
            said.append(f"{run.label}: `nvidia-smi topo -m` reports {link} between the two GPUs, a path over PCIe: at "
                        f"most {rate / 1e9:,.0f} GB/s in each direction on 16 lanes.")
    return said


def whole_batch_step(sizes: Sequence[int], batch: int) -> tuple[float, dict[str, torch.Tensor]]:
    """One process's training step on the whole batch of :func:`.ddp.gradient_problem` (the workers' model and
    batch): the loss, the mean over all its samples, and every parameter's gradient by name. What a parallel step,
    DDP's or another method's, must reproduce."""
    model, X, labels = gradient_problem(sizes, batch)
    loss = F.cross_entropy(model(X), labels)
    loss.backward()
    return loss.item(), {name: parameter.grad for name, parameter in model.named_parameters()}


def ddp_check_table(averaged: Mapping[str, torch.Tensor], sizes: Sequence[int], batch: int) -> Table:
    """DDP's averaged gradients (:func:`.ddp.ddp_gradients`) against the gradient of the whole batch computed by one
    process; raises if a parameter's differ by more than float32 rounding allows."""
    _, gradients = whole_batch_step(sizes, batch)
    rows = [{"name": name, "shape": " x ".join(map(str, gradient.shape)),
             "error": check_close(averaged[name], gradient, 1e-5, f"DDP's gradient of {name}")}
            for name, gradient in gradients.items()]
    return table(rows, [Column("name", "parameter"), Column("shape"),
                        Column("error", "DDP's average against the whole batch's gradient, relative", format=".1e")],
                 caption=f"one DDP step of 2 gloo processes on {batch // 2} samples each")


def bandwidth_table(rows: Sequence[dict], caption: str) -> Table:
    """The rows of :func:`.ddp.allreduce_bandwidth`: per message size, the time, algbw and busbw."""
    return table(rows, [Column("bytes", "message", format=lambda b: format_bytes(int(b))),
                        Column("seconds", "time", "µs", format=lambda s: f"{1e6 * s:,.1f}"),
                        Column("algbw_gbs", "algbw", "GB/s", ".3g"), Column("busbw_gbs", "busbw", "GB/s", ".3g")],
                 caption=caption)


def _shape(label: str, rows: Sequence[dict]) -> str:
    """The latency (the smallest message's time) and how far it holds, the peak busbw and where half is reached."""
    first, peak = rows[0], max(rows, key=lambda r: r["busbw_gbs"])
    flat = list(itertools.takewhile(lambda r: r["seconds"] < 2 * first["seconds"], rows))[-1]
    half = next(r for r in rows if r["busbw_gbs"] >= peak["busbw_gbs"] / 2)
    return (f"{label}: {format_bytes(first['bytes'])} take {first['seconds'] * 1e6:,.1f} µs, and every size up to "
            f"{format_bytes(flat['bytes'])} takes less than twice that. The bus bandwidth peaks at "
            f"{peak['busbw_gbs']:,.3g} GB/s ({format_bytes(peak['bytes'])}"
            + (", the largest size measured" if peak is rows[-1] else "")
            + f") and reaches half of that from {format_bytes(half['bytes'])}.")


GLOO = "gloo, 2 processes on the CPU of the machine that ran this page (not a GPU number)"


def bandwidth_statements(nccl: Sequence[Recording], gloo_rows: Sequence[dict]) -> list[str]:
    """The shape of each NCCL machine's curve and of gloo's; a sentence when no machine has recorded NCCL."""
    said = [_shape(f"NCCL {run.rows[0]['nccl_version']}, {run.label}", run.rows) for run in machine_runs(nccl)]
    if not nccl:
        said.append("NCCL on two GPUs: not measured yet. It waits for a machine with two GPUs, where this page "
                    "measures it live (make gpu-run records it).")
    return [*said, _shape(GLOO, gloo_rows)]


def allreduce_bandwidth_figure(nccl: Sequence[Recording], gloo_rows: Sequence[dict]) -> go.Figure:
    """busbw against the message size: a line per machine that ran NCCL, and gloo on this CPU."""
    lines = [(f"NCCL: {run.label}", run.rows) for run in machine_runs(nccl)]
    lines.append(("gloo, 2 processes on this page's CPU: not a GPU number", gloo_rows))
    title = "All-reduce bus bandwidth against message size" + (
        "" if nccl else ": gloo on this page's CPU only (NCCL on two GPUs: not recorded yet)")
    return bandwidth_figure(lines, title=title)


def _bucket_algbw(run: Recording, nccl: Sequence[Recording]) -> tuple[float | None, dict | None]:
    """The algbw (bytes/s) of a DDP-sized bucket in the NCCL run of ``run``'s machine, and that row."""
    for other in nccl:
        if _same_machine(other) == _same_machine(run):
            row = min(other.rows, key=lambda r: abs(r["bytes"] - BUCKET_BYTES))
            return row["algbw_gbs"] * 1e9, row
    return None, None


def _no_overlap(row: dict, algbw: float | None) -> float | None:
    """The efficiency if DDP waited for one all-reduce of all the gradients after the backward pass."""
    return row["single_seconds"] / (row["single_seconds"] + row["gradient_bytes"] / algbw) if algbw else None


def _one_batch(run: Recording) -> list[dict]:
    return [r for r in run.rows if r.get("micro_batches", 1) == 1]


def scaling_table(runs: Sequence[Recording], nccl: Sequence[Recording]) -> Table:
    """Per machine, precision and batch per GPU (one batch per step): the step on one GPU and on all, the samples
    per second, the efficiency, and the efficiency without overlap (at the algbw of a bucket in the NCCL run)."""
    rows, links = [], []
    for run in machine_runs(runs):
        algbw, _ = _bucket_algbw(run, nccl)
        first = _one_batch(run)[0]
        links.append(f"{run.short_label}: MLP {first['sizes']}, {first['parameters'] / 1e6:.0f} M parameters, "
                     f"{format_bytes(first['gradient_bytes'])} of gradients, GPUs linked by "
                     f"{first['link'] or 'unknown'}")
        rows += [{"machine": run.short_label, **r, "no_overlap": _no_overlap(r, algbw)} for r in _one_batch(run)]
    ms = {"unit": "ms", "format": lambda s: f"{1e3 * s:,.2f}"}
    return table(rows, [Column("machine"), Column("precision"), Column("batch_per_device", "batch per GPU"),
                        Column("single_seconds", "step, 1 GPU", **ms), Column("ddp_seconds", "step, 2 GPUs", **ms),
                        Column("single_samples_per_s", "samples/s, 1 GPU", format=",.0f"),
                        Column("ddp_samples_per_s", "samples/s, 2 GPUs", format=",.0f"),
                        Column("efficiency", format=".0%"), Column("no_overlap", "without overlap", format=".0%")],
                 caption="; ".join(links))


def accumulation_table(runs: Sequence[Recording]) -> Table:
    """Per machine, the steps that accumulate micro-batches (one all-reduce per step), beside one batch per step of
    the micro-batch's size and of the step's size."""
    rows = []
    for run in machine_runs(runs):
        single = {(r["precision"], r["batch_per_device"]): r for r in _one_batch(run)}
        for r in run.rows:
            if r.get("micro_batches", 1) > 1:
                micro, step = (single.get((r["precision"], size), {})
                               for size in (r["batch_per_device"], r["samples_per_step"]))
                rows.append({"machine": run.short_label, "precision": r["precision"],
                             "step": f"{r['micro_batches']} x {r['batch_per_device']:,} = {r['samples_per_step']:,}",
                             "efficiency": r["efficiency"], "throughput": r["ddp_samples_per_s"],
                             "micro_efficiency": micro.get("efficiency"), "micro_throughput": micro.get(
                                 "ddp_samples_per_s"), "step_efficiency": step.get("efficiency"),
                             "step_throughput": step.get("ddp_samples_per_s")})
    per_s = {"format": ",.0f"}
    return table(rows, [Column("machine"), Column("precision"), Column("step", "micro-batches x samples"),
                        Column("efficiency", format=".0%"), Column("throughput", "samples/s, 2 GPUs", **per_s),
                        Column("micro_efficiency", "one batch of the micro-batch's size: efficiency", format=".0%"),
                        Column("micro_throughput", "samples/s", **per_s),
                        Column("step_efficiency", "one batch of the step's size: efficiency", format=".0%"),
                        Column("step_throughput", "samples/s", **per_s)])


def scaling_statements(runs: Sequence[Recording], nccl: Sequence[Recording], target: float) -> list[str]:
    """Per machine: the target, bfloat16 against float32, overlap, how one GPU's step follows the work, and what
    DDP added to a step against one all-reduce of the gradients; a sentence when nothing has been recorded."""
    if not runs:
        return ["The DDP step on one GPU and on two: not measured yet. It waits for a machine with two GPUs, where "
                "this page measures it live (make gpu-run records it)."]
    said = []
    for run in machine_runs(runs):
        rows = _one_batch(run)
        algbw, bucket = _bucket_algbw(run, nccl)
        best = max(rows, key=lambda r: r["efficiency"])
        met = [r for r in rows if r["efficiency"] >= target]
        lines = [f"{run.label}: the target (efficiency at least {target:.0%}) is {'met' if met else 'not met'}: best "
                 f"{best['efficiency']:.0%} ({best['precision']}, {best['batch_per_device']:,} per GPU)"
                 + (f"; met by {len(met)} of {len(rows)} configurations." if met else ".")]
        efficiency = {(r["precision"], r["batch_per_device"]): r["efficiency"] for r in rows}
        both = [b for p, b in efficiency if p == "float32" and ("bfloat16", b) in efficiency]
        if both:
            worse = [b for b in both if efficiency["bfloat16", b] < efficiency["float32", b]]
            lines.append(f"bfloat16 scaled less well than float32 at {len(worse)} of the {len(both)} batches per GPU "
                         "measured in both.")
        if algbw:
            beaten = [r for r in rows if r["efficiency"] > _no_overlap(r, algbw)]
            lines.append(f"The measured efficiency beats the one without overlap in {len(beaten)} of {len(rows)} "
                         f"configurations (without overlap: DDP waiting for one all-reduce of all the gradients after "
                         f"the backward pass, at the algorithm bandwidth of a {format_bytes(bucket['bytes'])} "
                         "all-reduce of the NCCL run).")
        for precision in dict.fromkeys(r["precision"] for r in rows):  # does one GPU's step follow the work?
            mine = sorted((r for r in rows if r["precision"] == precision), key=lambda r: r["batch_per_device"])
            low, high = mine[0], mine[-1]
            lines.append(f"{precision}: from {low['batch_per_device']:,} to {high['batch_per_device']:,} samples per "
                         f"GPU, the work of a step grows {high['batch_per_device'] / low['batch_per_device']:.0f}x and "
                         f"one GPU's step time {high['single_seconds'] / low['single_seconds']:.1f}x "
                         f"({low['single_tflops']:.0f} to {high['single_tflops']:.0f} TFLOP/s).")
        added = [r["ddp_seconds"] - r["single_seconds"] for r in rows]
        line = f"DDP added {min(added) * 1e3:.2f} to {max(added) * 1e3:.2f} ms to a step"
        same = [n for n in machine_runs(nccl) if _same_machine(n) == _same_machine(run)]
        if same:
            whole = min(same[0].rows, key=lambda r: abs(r["bytes"] - rows[0]["gradient_bytes"]))
            line += (f"; one all-reduce of {format_bytes(whole['bytes'])}, about the gradients' size, took "
                     f"{whole['seconds'] * 1e3:.2f} ms in the NCCL run of the same machine")
        said.append(" ".join([*lines, line + "."]))
    return said


def scaling_figure(runs: Sequence[Recording], target: float) -> go.Figure:
    """The efficiency against the batch per GPU, a line per precision, the target dotted; a menu per machine."""
    def figure(run: Recording) -> go.Figure:
        fig = plots.sweep_figure(_one_batch(run), "batch_per_device", "efficiency", color="precision", log_x=True,
                                 title=f"DDP scaling efficiency, 1 to 2 GPUs: {run.label}",
                                 x_title="batch per GPU (samples)", y_title="efficiency t1 / t2",
                                 hover=("precision", "batch_per_device", "single_seconds", "ddp_seconds",
                                        "efficiency"))
        fig.add_hline(y=target, line_dash="dot", annotation_text=f"target {target:.0%}")
        return fig.update_yaxes(tickformat=".0%")
    return plots.by_gpu(machine_runs(runs), figure)
