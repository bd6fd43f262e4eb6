"""Chapter 17's tables, figures and sentences for WMMA against ``wgmma`` and for the Triton ladder: one function per
thing the page shows, from chapter 10's recordings (``tensor_wmma``), the compiled kernels
(:mod:`.sass_evidence`), the live checks (:mod:`.measure`) and the ladder's recordings (``triton_gemm_ladder``:
every recorded GPU behind a menu, a GPU column in the tables). The FP8 section's are in :mod:`.fp8_figures`.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from gpulab.core import counter_figures, plots
from gpulab.core.printing import say
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows
from gpulab.core.tables import Column, Table, table

TARGET = 0.9  # the best Triton kernel's share of cuBLAS bfloat16 at 8192^3 that the ladder aims for
TARGET_N, TARGET_DTYPE = 8192, "bfloat16"
KIB = {"format": lambda b: f"{b / 1024:,.0f}"}
PERCENT = {"format": ".0%"}
STEP_LABELS = {"step1_blocked": "1 blocked", "step2_pipelined": "2 pipelined", "step3_grouped": "3 grouped",
               "step4_tma": "4 TMA", "step5_persistent": "5 persistent", "step6_warp_specialized": "6 warp-specialized"}


def step_label(kernel: str) -> str:
    """'2 pipelined, 4 stages' for 'step2_pipelined (num_stages=4)', '4 TMA' for 'step4_tma', 'cuBLAS' as it is."""
    name, _, option = kernel.partition(" (num_stages=")
    label = STEP_LABELS.get(name, name)
    stages = option.rstrip(")")
    return f"{label}, {stages} stage{'' if stages == '1' else 's'}" if option else label


# ---- chapter 10's WMMA kernels against cuBLAS ------------------------------------------------------------------------

def _wmma_gap(run: Recording) -> dict | None:
    rows = ok_rows(run.rows)
    wmma = [r for r in rows if "wmma" in r.get("file", "")]
    cublas = next((r for r in rows if r.get("name") == "cuBLAS float16"), None)
    if not wmma or cublas is None:
        return None
    best = max(wmma, key=lambda r: r["tflops"])
    kernels = [k for k in (cublas.get("kernels") or "").split(", ") if k and not k.startswith("Memset")]
    return {"gpu": run.short_label, "label": run.label, "n": best["n"], "wmma": best["name"],
            "wmma_tflops": best["tflops"], "cublas_tflops": cublas["tflops"],
            "share": best["fraction_of_cublas_fp16"], "cublas_kernel": ", ".join(kernels) or None}


def wmma_gap_table(runs: Sequence[Recording]) -> Table:
    """Per recorded GPU: chapter 10's best WMMA kernel, cuBLAS float16 and the share, and the kernel cuBLAS ran."""
    rows = [gap for gap in map(_wmma_gap, runs) if gap]
    return table(rows, [Column("gpu", "GPU"), Column("n", "n"), Column("wmma_tflops", "best WMMA", "TFLOP/s", ",.0f"),
                        Column("cublas_tflops", "cuBLAS float16", "TFLOP/s", ",.0f"),
                        Column("share", "WMMA's share", format=".0%"), Column("cublas_kernel", "cuBLAS ran")],
                 caption="chapter 10's recordings (tensor_wmma): n x n x n in float16, float32 sums")


def wmma_gap_statements(runs: Sequence[Recording]) -> list[str]:
    said = []
    for gap in filter(None, map(_wmma_gap, runs)):
        said.append(f"{gap['label']}: the best WMMA kernel ({gap['wmma']}) ran at {gap['wmma_tflops']:,.0f} TFLOP/s "
                    f"at {gap['n']:,}^3, {gap['share']:.0%} of cuBLAS float16's {gap['cublas_tflops']:,.0f}; cuBLAS "
                    f"ran `{gap['cublas_kernel'] or 'a kernel the recording does not name'}`.")
    return said


# ---- the compiled kernels ------------------------------------------------------------------------------------------

def _loads(row: dict) -> str:
    parts = [f"{row[f'sass_{op}']} {op}" for op in ("LDG", "LDGSTS", "UTMALDG") if row.get(f"sass_{op}")]
    return ", ".join(parts) or "none"


def evidence_table(rows: Sequence[dict]) -> Table:
    """One row per compiled kernel (:func:`.sass_evidence.compiled_evidence`): its tensor-core instruction, how its
    tiles reach shared memory, its resources and its size."""
    shown = [{**r, "kernel": step_label(r["kernel"]), "mma": f"{r['sass_HGMMA'] or r['sass_HMMA']} "
              f"{'HGMMA' if r['sass_HGMMA'] else 'HMMA'}", "loads": _loads(r)} for r in rows]
    return table(shown, [Column("kernel"), Column("target"), Column("mma", "tensor-core instructions"),
                         Column("loads", "global loads"), Column("sass_STS", "STS"),
                         Column("shared_bytes", "shared memory", "KiB", **KIB), Column("num_stages", "stages"),
                         Column("num_warps", "warps"), Column("registers", "registers"),
                         Column("local_bytes", "spilled", "bytes"), Column("sass_instructions", "SASS instructions")],
                 caption="compiled on the machine that ran this page for each target, no GPU used: NVRTC (CUDA C) "
                         "and Triton (float16), disassembled by cuobjdump; counts are of instructions in the code, not "
                         "executed")


def _by_kernel(rows: Sequence[dict], target: str = "sm_90") -> dict[str, dict]:
    return {r["kernel"]: r for r in rows if r["target"] == target}


def evidence_statements(rows: Sequence[dict]) -> list[str]:
    """What the compiled code shows, in sentences computed from ``rows``."""
    hopper = _by_kernel(rows)
    ampere = _by_kernel(rows, "sm_80")
    wmma = next((r for r in hopper.values() if r["tensor_core"].startswith("HMMA")), None)
    steps = [r for name, r in hopper.items() if name.startswith("step")]
    said = []
    if wmma and steps:
        hgmma = sorted({r["sass_HGMMA"] for r in steps})
        said.append(f"For sm_90, chapter 10's WMMA kernel holds {wmma['sass_HMMA']} HMMA instructions and no HGMMA: "
                    "WMMA is Ampere's per-warp `mma.sync`, whatever the GPU. Every step of the Triton ladder holds "
                    f"HGMMA ({' or '.join(map(str, hgmma))} in its code) and no HMMA: Triton emits Hopper's warpgroup "
                    "`wgmma` for `tl.dot` from the first step on.")
    for name, row in ampere.items():
        same = hopper.get(name)
        if same:
            said.append(f"The same source, {name}, compiled for sm_80 (an A100) holds {row['sass_HMMA']} HMMA "
                        f"instructions where its sm_90 code holds {same['sass_HGMMA']} HGMMA: the instruction is the "
                        "compiler's choice for the target. For the same tile, each warp issues one HGMMA (with the "
                        f"three other warps of its warpgroup) where Ampere's code needs "
                        f"{row['sass_HMMA'] // max(same['sass_HGMMA'], 1)} HMMA.")
    pointer = [r for r in steps if not r["sass_UTMALDG"]]
    tma = [r for r in steps if r["sass_UTMALDG"]]
    if pointer and tma:
        def listed(group: list[dict]) -> str:
            return "; ".join(f"{step_label(r['kernel'])}: {_loads(r)}" for r in group)

        said.append(f"Steps 1 to {len(pointer)} load through the registers or `cp.async` ({listed(pointer)}); the "
                    f"TMA steps load by the copy engine ({listed(tma)}), with no LDG or LDGSTS left. They "
                    f"need {min(r['registers'] for r in tma)} to {max(r['registers'] for r in tma)} registers per "
                    f"thread where the pointer steps need {min(r['registers'] for r in pointer)} to "
                    f"{max(r['registers'] for r in pointer)}: the copy engine computes the addresses.")
        first = tma[0]
        if first.get("sass_UTMASTG") and first.get("sass_SYNCS"):
            said[-1] += (f" Step {step_label(first['kernel']).split(' ')[0]} also stores C by TMA "
                         f"({first['sass_UTMASTG']} UTMASTG) and holds {first['sass_SYNCS']} SYNCS instructions, "
                         "which set up and wait on the shared-memory barriers (mbarriers) that say when a copy has "
                         "landed.")
    five, six = hopper.get("step5_persistent"), hopper.get("step6_warp_specialized")
    if five and six:
        if six["sass_digest"] == five["sass_digest"]:
            said.append("Step 6 asks for warp specialization and gets none: its machine code is step 5's, instruction "
                        f"for instruction ({six['sass_instructions']:,} instructions, {six['sass_USETMAXREG']} "
                        "USETMAXREG, the same warps and shared memory). Triton 3.6 ignores `warp_specialize` for this "
                        "loop on Hopper.")
        else:
            said.append(f"Step 6's machine code differs from step 5's: {six['sass_instructions']:,} against "
                        f"{five['sass_instructions']:,} instructions, {six['sass_USETMAXREG']} USETMAXREG, warp "
                        f"specialized: {six['warp_specialized']}.")
    return said


# ---- the steps' configurations and the live checks ---

def configs_table(steps: Sequence) -> Table:
    """What each step of ``steps`` (modules of :data:`gpulab.kernels.triton_gemm.STEPS`) launches with: its tile,
    warps, pipeline stages, group of rows and loop options."""
    rows = []
    for step in steps:
        c, options = step.CONFIG, step.LAUNCH_OPTIONS
        name = step.__name__.rsplit(".", 1)[-1]
        rows.append({"step": step_label(name), "kernel": step.KERNEL.fn.__name__,
                     "tile": f"{c['BLOCK_M']} x {c['BLOCK_N']} x {c['BLOCK_K']}",
                     "warps": c["num_warps"], "stages": c["num_stages"], "group": c.get("GROUP_M"),
                     "options": ", ".join(f"{k}={v}" for k, v in options.items()) or None})
    return table(rows, [Column("step"), Column("kernel", "Triton kernel"), Column("tile", "tile (M x N x K)"),
                        Column("warps"), Column("stages"), Column("group", "GROUP_M"),
                        Column("options", "loop options")])


# ---- the live checks -----------------------------------------------------------------------------------------------

def checks_table(rows: Sequence[dict]) -> Table:
    shown = [{**r, "kernel": step_label(r["kernel"]), "shape": f"{r['m']} x {r['n']} x {r['k']}",
              "result": "passed" if r["status"] == "ok" else r["status"]} for r in rows]
    return table(shown, [Column("kernel", "step"), Column("shape", "M x N x K"), Column("dtype"),
                         Column("tile", "tile (M x N x K)"), Column("stages"), Column("warps"),
                         Column("relative_error", "error against float64", format=".2e"),
                         Column("tolerance", format=".2e"), Column("result", "check")])


# ---- the ladder's recordings ---------------------------------------------------------------------------------------

def _cases(run: Recording) -> list[tuple[str, int]]:
    return list(dict.fromkeys((r["dtype"], r["n"]) for r in ok_rows(run.rows)))


def _ladder_one(run: Recording) -> go.Figure:
    """One GPU's ladder: a bar per kernel (TFLOP/s, labelled with its share of cuBLAS), a menu entry per dtype and
    size, the target drawn as a dotted line at its share of that case's cuBLAS."""
    fig = go.Figure()
    cases = _cases(run)
    buttons = []
    for i, (dtype, n) in enumerate(cases):
        rows = [r for r in ok_rows(run.rows) if (r["dtype"], r["n"]) == (dtype, n)]
        fig.add_trace(go.Bar(
            x=[step_label(r["kernel"]) for r in rows], y=[r["tflops"] for r in rows], visible=i == 0,
            name=f"{dtype}, {n:,}^3", marker_color=[plots.PALETTE[1] if r["kernel"] == "cuBLAS" else plots.PALETTE[0]
                                                   for r in rows],
            text=[f"{r['share_of_cublas']:.0%}" for r in rows], textposition="outside",
            hovertext=[plots.hover_text(r, ("kernel", "tflops", "share_of_cublas", "tensor_core", "registers",
                                            "shared_bytes", "num_stages", "seconds")) for r in rows],
            hoverinfo="text"))
        cublas = next(r["tflops"] for r in rows if r["kernel"] == "cuBLAS")
        line = [dict(type="line", xref="paper", x0=0, x1=1, y0=TARGET * cublas, y1=TARGET * cublas,
                     line=dict(dash="dot", color="#444444"))]
        buttons.append(dict(label=f"{dtype}, {n:,}^3", method="update",
                            args=[{"visible": [j == i for j in range(len(cases))]},
                                  {"title.text": f"Triton GEMM ladder, {dtype} {n:,}^3: {run.label}",
                                   "shapes": line}]))
    first = buttons[0]["args"][1] if buttons else {"title.text": f"Triton GEMM ladder: {run.label}", "shapes": []}
    fig.update_layout(title=first["title.text"], shapes=first["shapes"], showlegend=False,
                      xaxis_title="kernel (step of the ladder)", yaxis_title="rate (TFLOP/s)",
                      updatemenus=[dict(buttons=buttons, active=0, x=0.0, y=1.0, xanchor="left", yanchor="bottom",
                                        direction="down")] if len(buttons) > 1 else [])
    return fig


def ladder_figure(runs: Sequence[Recording]) -> go.Figure | None:
    """Every recorded GPU's ladder behind one menu (GPU, dtype and size); None when nothing was recorded."""
    return plots.by_gpu(runs, _ladder_one) if runs else None


def ladder_table(runs: Sequence[Recording]) -> Table | None:
    """Every kernel of every recorded GPU's ladder: rate, share of cuBLAS and what the compiled kernel held."""
    if not runs:
        return None
    rows = [{"gpu": run.short_label, **r, "kernel": step_label(r["kernel"]),
             "mma": (r.get("tensor_core") or "").split(" ")[0] or None,
             "loads": _loads(r) if "sass_LDG" in r else None} for run in runs for r in ok_rows(run.rows)]
    return table(rows, [Column("gpu", "GPU"), Column("dtype"), Column("n", "n"), Column("kernel"),
                        Column("tflops", "rate", "TFLOP/s", ",.0f"), Column("share_of_cublas", "of cuBLAS", **PERCENT),
                        Column("mma", "tensor cores"), Column("loads", "global loads"),
                        Column("registers", "registers"), Column("spills", "spills"),
                        Column("shared_bytes", "shared memory", "KiB", **KIB), Column("num_stages", "stages")])


def _row(run: Recording, dtype: str, n: int, kernel: str) -> dict | None:
    return next((r for r in ok_rows(run.rows) if (r["dtype"], r["n"], r["kernel"]) == (dtype, n, kernel)), None)


def _named(kernel: str) -> str:
    """'step 2 (pipelined)' for 'step2_pipelined'."""
    number, _, name = step_label(kernel).partition(" ")
    return f"step {number} ({name})"


def ladder_statements(runs: Sequence[Recording]) -> list[str]:
    """Per GPU, in the largest size in bfloat16 (or the last case the run has): where step 1 starts, what each step
    gained over the one before, and the best kernel against the target."""
    said = []
    for run in runs:
        cases = _cases(run)
        if not cases:
            continue
        dtype, n = (TARGET_DTYPE, TARGET_N) if (TARGET_DTYPE, TARGET_N) in cases else cases[-1]
        cublas = _row(run, dtype, n, "cuBLAS")
        steps = [row for name in STEP_LABELS if (row := _row(run, dtype, n, name))]
        if cublas is None or not steps:
            continue
        first, best = steps[0], max(steps, key=lambda r: r["tflops"])
        verdict = ("meets" if best["share_of_cublas"] >= TARGET else "misses") if (dtype, n) == (
            TARGET_DTYPE, TARGET_N) else "cannot be judged at this size against"
        text = (f"{run.label}, {dtype} at {n:,}^3: {_named(first['kernel'])} ran at {first['tflops']:,.0f} "
                f"TFLOP/s, {first['share_of_cublas']:.0%} of cuBLAS's {cublas['tflops']:,.0f}.")
        if len(steps) > 1:
            text += " Each step against the one before: " + ", ".join(
                f"{_named(later['kernel'])} {later['tflops'] / before['tflops']:.2f}x"
                for before, later in zip(steps, steps[1:], strict=False)) + "."
        text += (f" The best, {_named(best['kernel'])}, ran at {best['tflops']:,.0f} TFLOP/s, "
                 f"{best['share_of_cublas']:.0%} of cuBLAS in the same run: it {verdict} the target of {TARGET:.0%}.")
        six = _row(run, dtype, n, "step6_warp_specialized")
        if six is not None:
            text += f" Step 6 {'was' if six.get('warp_specialized') else 'was not'} warp-specialized in its code."
        said.append(text)
    return said


def show_ladder(runs: Sequence[Recording]) -> None:
    """Display the ladder's figure, table and sentences, where a GPU recorded or ran it (the line printed by the run
    says when none did)."""
    if runs:
        ladder_figure(runs).show()
        ladder_table(runs).show()
        say(*ladder_statements(runs))


COUNTED_KERNELS = ("wmma_gemm_pipelined", "cublas_bfloat16", "triton_gemm_persistent")  # kernel_counters' names


def executed_tensor_instructions(runs: Sequence) -> list[str]:
    """Per GPU that profiled them (chapter 18's ``kernel_counters``): how many tensor-core instructions chapter 10's
    WMMA kernel, cuBLAS's bfloat16 kernel and the ladder's persistent kernel executed, how many of them were Hopper's
    warpgroup instructions (GMMA), and the FLOPs each instruction did. The counts are per warp: a ``wgmma`` that the
    four warps of a warpgroup issue together counts four times."""
    said = []
    for run in runs:
        rows = {name: row for name, row in counter_figures.kernels(run).items() if name in COUNTED_KERNELS}
        parts = []
        for name in COUNTED_KERNELS:
            row = rows.get(name)
            if row is None or not row.get("tensor_instructions", {}).get("hmma"):
                continue
            counts = row["tensor_instructions"]
            parts.append(f"{row['label']} (`{row['ncu_kernel'][:48]}`): {counts['hmma']:,.0f} tensor-core "
                         f"instructions, {counts['gmma'] or 0:,.0f} of them GMMA, "
                         f"{row['flops'] / counts['hmma']:,.0f} FLOP each")
        if parts:
            said.append(f"{run.label}, at n = {next(iter(rows.values()))['size']:,}, as Nsight Compute counted them: "
                        + "; ".join(parts) + ".")
    return said
