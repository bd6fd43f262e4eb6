"""Measure live when a GPU is present; otherwise draw what a real GPU recorded.

A recording is ``results/<gpu-slug>/<experiment>.json``: the rows an experiment function returned,
the parameters it ran with, and provenance -- the device, driver, CUDA, cuDNN and torch versions,
the date, the git commit, and a hash of the code that produced the rows. When that code changes
the recording becomes *stale*, and the test suite says so until ``make gpu-run`` refreshes it.

Set ``GPULAB_RECORD=1`` (``make gpu-run`` does) to save every live GPU run as the new recording.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib
import inspect
import json
import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpulab import env, timing

SCHEMA = 1
KERNELS = Path(__file__).parent / "kernels"  # the CUDA C files, named in experiments as "NN_name"


@dataclass
class Recording:
    """The rows of one experiment on one device, with where and how they were measured."""

    experiment: str
    function: str  # "module:qualname" of the experiment function
    params: dict
    rows: list[dict]
    provenance: dict = field(default_factory=dict)

    @property
    def device_name(self) -> str:
        return self.provenance.get("device", {}).get("name", "unknown device")

    @property
    def date(self) -> str:
        return self.provenance.get("date", "")[:10]

    @property
    def label(self) -> str:
        """'NVIDIA H100 80GB HBM3, recorded 2026-11-21' or 'this CPU, live'."""
        if self.provenance.get("recorded"):
            return f"{self.device_name}, recorded {self.date}"
        return f"{self.device_name}, live"

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA, "experiment": self.experiment, "function": self.function,
            "params": self.params, "rows": self.rows, "provenance": self.provenance,
        }

    @classmethod
    def from_json(cls, data: dict) -> Recording:
        provenance = {**data["provenance"], "recorded": True}
        return cls(data["experiment"], data["function"], data["params"], data["rows"], provenance)


def function_name(fn: Callable) -> str:
    return f"{fn.__module__}:{fn.__qualname__}"


def code_hash(fn: Callable) -> str:
    """Hash of the source of ``fn``'s module, of the CUDA C kernel files it names, and of the timing method:
    edit any of them and recordings go stale."""
    module = inspect.getmodule(fn)
    defined_in_notebook = module is None or module.__name__ == "__main__"
    code = inspect.getsource(fn if defined_in_notebook else module)
    kernel_files = sorted(KERNELS / f"{stem}.cu" for stem in set(re.findall(r'"(\d\d_\w+)"', code))
                          if (KERNELS / f"{stem}.cu").is_file())
    sources = [code, *(path.read_text() for path in kernel_files), inspect.getsource(timing)]
    return hashlib.sha256("\n".join(sources).encode()).hexdigest()[:16]


def _git_commit() -> str | None:
    if os.environ.get("GPULAB_GIT_COMMIT"):  # set where the tree travels without .git (a GPU machine)
        return os.environ["GPULAB_GIT_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
            cwd=Path(__file__).parent, check=True,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def provenance(fn: Callable, info: env.DeviceInfo) -> dict:
    return {
        "device": info.as_dict(),
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "git_commit": _git_commit(),
        "code_hash": code_hash(fn),
    }


def results_dir() -> Path | None:
    """The repository's ``results/`` folder (or ``$GPULAB_RESULTS``); None when gpulab runs outside the repo."""
    if os.environ.get("GPULAB_RESULTS"):
        return Path(os.environ["GPULAB_RESULTS"])
    for start in (Path.cwd(), Path(__file__).resolve()):
        for folder in (start, *start.parents):
            if (folder / "_toc.yml").exists() and (folder / "results").is_dir():
                return folder / "results"
    return None


def run(experiment: str, fn: Callable[..., list[dict]], **params) -> Recording:
    """Run ``fn(**params)`` live on this machine's device and return it as a (not yet saved) Recording.

    With ``GPULAB_RECORD=1`` and a GPU present, the run is also saved as the new recording.
    """
    info = env.describe()
    rows = fn(**params)
    recording = Recording(experiment, function_name(fn), _jsonable(params), rows, provenance(fn, info))
    if info.kind == "cuda" and os.environ.get("GPULAB_RECORD") == "1":
        save(recording)
    return recording


def _jsonable(params: dict) -> dict:
    return {key: value if isinstance(value, int | float | str | bool | list | type(None)) else str(value)
            for key, value in params.items()}


def save(recording: Recording, root: Path | None = None) -> Path:
    """Write ``recording`` to ``<root>/<device-slug>/<experiment>.json`` and return the path."""
    root = root or results_dir()
    if root is None:
        raise ValueError("root: no results/ folder found; set GPULAB_RESULTS or run inside the repository")
    path = Path(root) / env.slugify(recording.device_name) / f"{recording.experiment}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(recording.to_json(), indent=1) + "\n")
    return path


def recordings(experiment: str, root: Path | None = None) -> list[Recording]:
    """Every GPU's recording of ``experiment``, newest first."""
    root = root or results_dir()
    if root is None:
        return []
    found = [Recording.from_json(json.loads(p.read_text())) for p in Path(root).glob(f"*/{experiment}.json")]
    return sorted(found, key=lambda r: r.provenance.get("date", ""), reverse=True)


def load(experiment: str, gpu: str | None = None, root: Path | None = None) -> Recording | None:
    """The newest recording of ``experiment`` (of the GPU whose name contains ``gpu``, if given), or None."""
    for recording in recordings(experiment, root):
        if gpu is None or gpu.lower() in recording.device_name.lower():
            return recording
    return None


def is_stale(recording: Recording) -> bool:
    """True if the experiment's code has changed since the recording was made."""
    module_name, _, qualname = recording.function.partition(":")
    fn = importlib.import_module(module_name)
    for part in qualname.split("."):
        fn = getattr(fn, part)
    return code_hash(fn) != recording.provenance.get("code_hash")


def stale_recordings(root: Path | None = None) -> list[Path]:
    """Paths of recordings whose experiment code has changed since they were made."""
    root = root or results_dir()
    if root is None:
        return []
    return [p for p in sorted(Path(root).glob("*/*.json"))
            if is_stale(Recording.from_json(json.loads(p.read_text())))]


def live_and_recorded(experiment: str, fn: Callable[..., list[dict]], **params) -> tuple[Recording, Recording | None]:
    """Run the experiment live here, and the newest GPU recording made before this run, to draw beside it."""
    recorded = load(experiment)  # before the run: with GPULAB_RECORD=1 the run replaces the recording
    return run(experiment, fn, **params), recorded


def gpu_runs(experiment: str, fn: Callable[..., list[dict]], **params) -> list[Recording]:
    """What a chapter draws for an experiment that needs a GPU: the newest recording, then a live run
    beside it when kernels run on a GPU (:func:`live_and_recorded`). Prints a line when there is no recording."""
    from gpulab import kernels  # here, not at the top: kernels decides its mode at import

    live, recorded = live_and_recorded(experiment, fn, **params) if kernels.on_gpu() else (None, load(experiment))
    if recorded is None:
        print(f"{experiment}: no recording yet" + ("." if live else ", and no GPU here to measure it live."))
    return [run for run in (recorded, live) if run is not None]


def inventory(root: Path | None = None) -> list[dict]:
    """One row per recording: the GPU, the experiment, when and at which commit it was made, and if it is stale."""
    root = root or results_dir()
    if root is None:
        return []
    rows = []
    for path in sorted(Path(root).glob("*/*.json")):
        recording = Recording.from_json(json.loads(path.read_text()))
        device = recording.provenance.get("device", {})
        rows.append({"gpu": recording.device_name, "experiment": recording.experiment, "date": recording.date,
                     "commit": recording.provenance.get("git_commit"), "torch": device.get("torch_version"),
                     "cuda": device.get("cuda_version"), "driver": device.get("driver_version"),
                     "stale": is_stale(recording)})
    return rows
