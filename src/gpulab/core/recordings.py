"""Measure live when a GPU is present; otherwise draw what a real GPU recorded.

A recording is ``results/<gpu-slug>/<experiment>.json``: the rows an experiment function returned,
the parameters it ran with, and provenance -- the device, driver, CUDA, cuDNN and torch versions,
the date, the git commit, and the fingerprint of the code the experiment runs (:mod:`gpulab.core.provenance`).
When that code changes the recording becomes *stale*: :func:`stale_recordings` says which recordings and
which of their code changed, and the test suite fails until ``make gpu-run`` refreshes them.

Set ``GPULAB_RECORD=1`` (``make gpu-run`` does) to save every live GPU run as the new recording.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpulab.core import env, kernel_mode
from gpulab.core.closure import package_source
from gpulab.core.provenance import changes as code_changes
from gpulab.core.provenance import declaration, fingerprint, fingerprint_of

SCHEMA = 2  # 2: the code fingerprint is the closure of what the experiment runs (gpulab.core.provenance)
BOOK_BUILD = "GPULAB_BOOK_BUILD"  # set to 1 by `make book` (and the test's book stage): the CPU here built the book


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
    def on_gpu(self) -> bool:
        return self.provenance.get("device", {}).get("kind") == "cuda"

    @property
    def label(self) -> str:
        """'NVIDIA H100 80GB HBM3, recorded 2026-11-21', 'NVIDIA H200, live', or for a live run on a CPU 'the machine
        that built this book (AMD EPYC 7B13), 2026-11-25' in the book's build and 'this CPU (...), live' elsewhere."""
        if self.provenance.get("recorded"):
            return f"{self.device_name}, recorded {self.date}"
        if self.on_gpu:
            return f"{self.device_name}, live"
        if os.environ.get(BOOK_BUILD) == "1":
            return f"the machine that built this book ({self.device_name}), {self.date}"
        return f"this CPU ({self.device_name}), live"

    @property
    def short_label(self) -> str:
        """A column header: 'H100 80GB HBM3', 'H200 (live)', 'build machine (CPU)'."""
        if not self.on_gpu:
            return "build machine (CPU)" if os.environ.get(BOOK_BUILD) == "1" else "this CPU"
        name = self.device_name.removeprefix("NVIDIA ")
        return name if self.provenance.get("recorded") else f"{name} (live)"

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA, "experiment": self.experiment, "function": self.function,
            "params": self.params, "rows": self.rows, "provenance": self.provenance,
        }

    @classmethod
    def from_json(cls, data: dict) -> Recording:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"recording {data.get('experiment')!r}: schema {data.get('schema')}, this gpulab reads "
                             f"schema {SCHEMA}")
        provenance = {**data["provenance"], "recorded": True}
        return cls(data["experiment"], data["function"], data["params"], data["rows"], provenance)


def function_name(fn: Callable) -> str:
    return f"{fn.__module__}:{fn.__qualname__}"


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
    """Where and when ``fn`` ran, and the fingerprint of the code it runs (:mod:`gpulab.core.provenance`)."""
    return {
        "device": info.as_dict(),
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "git_commit": _git_commit(),
        "code": fingerprint_of(fn).as_dict(),
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
    if experiment not in declaration(fn).names:
        raise ValueError(f"experiment: {function_name(fn)} declares {', '.join(declaration(fn).names)}, not "
                         f"{experiment!r}; add it to the function's @experiment(...)")
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


def changes(recording: Recording) -> list[str]:
    """How the code of ``recording``'s experiment differs from the code it was made with, in words (empty when
    it is fresh). The experiment is found by its recording name among the package's ``@experiment``s."""
    source = package_source()
    declared = source.experiments().get(recording.experiment)
    if declared is None:
        return [f"no gpulab function declares @experiment({recording.experiment!r}) any more"]
    definition, _ = declared
    return code_changes(recording.provenance.get("code", {}),
                        fingerprint(definition.module, definition.name, source))


def is_stale(recording: Recording) -> bool:
    """True if the code that ``recording``'s experiment runs has changed since it was made."""
    return bool(changes(recording))


@dataclass(frozen=True)
class Stale:
    """A recording whose experiment's code has changed, and what changed."""

    path: Path
    experiment: str
    changes: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.path.parent.name}/{self.path.name}: {'; '.join(self.changes)}"


def stale_recordings(root: Path | None = None) -> list[Stale]:
    """The recordings whose experiment's code has changed since they were made, each with what changed."""
    root = root or results_dir()
    if root is None:
        return []
    stale = []
    for path in sorted(Path(root).glob("*/*.json")):
        recording = Recording.from_json(json.loads(path.read_text()))
        if said := changes(recording):
            stale.append(Stale(path, recording.experiment, tuple(said)))
    return stale


def newest_per_gpu(experiment: str, root: Path | None = None) -> list[Recording]:
    """The newest recording of ``experiment`` made on each GPU, in the order of the GPUs' names."""
    newest: dict[str, Recording] = {}
    for recording in recordings(experiment, root):  # newest first
        newest.setdefault(recording.device_name, recording)
    return [newest[name] for name in sorted(newest)]


class Runs(Sequence[Recording]):
    """What a page draws for one experiment: the newest recording of every recorded GPU, then the live run if it
    ran on a GPU (a live run on a CPU is drawn only where the page asked for it: where the CPU is the lesson).

    ``live`` is the live run whether drawn or not: on the machine that builds the book it is what CI checks.
    """

    def __init__(self, experiment: str, recorded: Sequence[Recording], live: Recording | None, draw_cpu: bool):
        self.experiment, self.recorded, self.live = experiment, list(recorded), live
        drawn_live = live is not None and (live.on_gpu or draw_cpu)
        self._drawn = [*self.recorded, *([live] if drawn_live else [])]

    def __getitem__(self, index):
        return self._drawn[index]

    def __len__(self) -> int:
        return len(self._drawn)

    def __repr__(self) -> str:
        return f"Runs({self.experiment!r}: {', '.join(run.label for run in self) or 'nothing to draw'})"

    @property
    def note(self) -> str:
        """A sentence for the page when a GPU's measurement is missing, else ''."""
        if self.recorded:
            return ""
        live_gpu = self.live is not None and self.live.on_gpu
        return f"{self.experiment}: no recording yet" + ("." if live_gpu else ", and no GPU here to measure it live.")


def runs(experiment: str, fn: Callable[..., list[dict]], *, needs_gpu: bool = False, draw_cpu: bool = False,
         **params) -> Runs:
    """The one call a chapter makes for an experiment: run ``fn(**params)`` live, and return it with every GPU's
    recording (:class:`Runs`).

    ``needs_gpu``: the experiment times kernels and cannot run without a GPU (it then runs nowhere but on one).
    ``draw_cpu``: draw a live run on a CPU too (where the CPU is the lesson); it runs either way, so that CI checks
    the code. A missing recording is said in one printed line.
    """
    recorded = newest_per_gpu(experiment)  # before the run: with GPULAB_RECORD=1 the run replaces its GPU's file
    can_run = kernel_mode.on_gpu() if needs_gpu else True
    live = run(experiment, fn, **params) if can_run else None
    found = Runs(experiment, recorded, live, draw_cpu)
    if found.note:
        print(found.note)
    return found


def recorded(experiment: str) -> Runs:
    """What a page draws of an experiment that another chapter measures: every GPU's recording, no live run (a
    missing recording is said in one printed line)."""
    found = Runs(experiment, newest_per_gpu(experiment), None, draw_cpu=False)
    if found.note:
        print(f"{experiment}: no recording yet.")
    return found


def live_and_recorded(experiment: str, fn: Callable[..., list[dict]], **params) -> tuple[Recording, Recording | None]:
    """Run the experiment live here, and the newest GPU recording made before this run, to draw beside it."""
    recorded = load(experiment)  # before the run: with GPULAB_RECORD=1 the run replaces the recording
    return run(experiment, fn, **params), recorded


def gpu_runs(experiment: str, fn: Callable[..., list[dict]], **params) -> list[Recording]:
    """What a chapter draws for an experiment that needs a GPU: the newest recording, then a live run
    beside it when kernels run on a GPU (:func:`live_and_recorded`). Prints a line when there is no recording."""

    live, recorded = live_and_recorded(experiment, fn, **params) if kernel_mode.on_gpu() else (None, load(experiment))
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
