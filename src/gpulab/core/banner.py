"""The box every chapter shows first: where its figures come from, and what running it here adds.

A reader of the static book sees pages built on a machine without a GPU, so every GPU number on them comes from a
recording, and the box says which GPUs were recorded, and when. Where the notebook runs on a GPU, the box says so:
each experiment then adds this GPU's live run beside the recordings. The last line says where kernels run
(:func:`gpulab.core.kernel_mode.describe`).
"""

from __future__ import annotations

import html
import json
from collections import Counter

from gpulab.core import kernel_mode, recordings
from gpulab.core.env import DeviceInfo, describe


def recorded_gpus() -> list[tuple[str, int, str]]:
    """(GPU name, number of recordings, newest date) of every GPU with recordings in ``results/``."""
    root = recordings.results_dir()
    if root is None:
        return []
    count: Counter[str] = Counter()
    newest: dict[str, str] = {}
    for path in sorted(root.glob("*/*.json")):
        provenance = json.loads(path.read_text())["provenance"]
        name = provenance.get("device", {}).get("name", path.parent.name)
        count[name] += 1
        newest[name] = max(newest.get(name, ""), provenance.get("date", "")[:10])
    return [(name, count[name], newest[name]) for name in sorted(count)]


class Banner:
    """A short note (HTML on the page, text in a terminal): its lines, the first one in bold."""

    def __init__(self, lines: list[str]):
        self.lines = lines

    def __str__(self) -> str:
        return "\n".join(self.lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        first, *rest = (html.escape(line) for line in self.lines)
        return ('<div class="gpulab-banner" style="border-left:4px solid #1f6fb4;padding:0.4em 0.8em;'
                f'margin:0.5em 0;background:#f4f8fb"><strong>{first}</strong>'
                + "".join(f"<br>{line}" for line in rest) + "</div>")


def banner(info: DeviceInfo | None = None) -> Banner:
    """Where this page's figures come from (the recorded GPUs), what runs this notebook, and where its kernels run."""
    info = info or describe()
    gpus = recorded_gpus()
    recorded = "; ".join(f"{name} ({count} recording{'' if count == 1 else 's'}, {date})"
                         for name, count, date in gpus) or "none yet"
    if info.kind == "cuda":
        gib = info.memory_bytes / 2**30 if info.memory_bytes else float("nan")
        lines = [f"Running on {info.name}: each experiment measures live here and is drawn beside the recorded GPUs.",
                 f"This GPU: {info.multiprocessors} SMs, {gib:.0f} GiB, compute capability {info.compute_capability}; "
                 f"torch {info.torch_version}, CUDA {info.cuda_version}.",
                 f"Recorded GPUs: {recorded}."]
    else:
        lines = ["The GPU figures on this page are drawn from recordings, each labelled with its GPU and date.",
                 f"Recorded GPUs: {recorded}.",
                 "This run has no GPU, so nothing here was measured on one; run the notebook on a GPU (the Colab "
                 "button at the top of the page) to add that GPU's own measurements beside the recordings."]
    return Banner([*lines, kernel_mode.describe() + "."])
