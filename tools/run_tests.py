"""`make test`: every check, stage by stage, with each stage's time; exits non-zero if any stage fails.

Stages: lint (ruff), unit (the library, the repository's rules, its layers and its references), notebooks
(papermill, SMOKE=True, in parallel), colab (the same notebooks in ``.venv-colab``, which has Google Colab's versions of
ipywidgets, plotly, IPython and ipykernel: requirements-colab.txt), book (the full build, -n -W
--keep-going), pages (the built HTML, and Chromium offline).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
COLAB_BIN = ROOT / ".venv-colab" / "bin"
# The colab stage's kernels must start from .venv-colab too: its python comes first on the PATH.
COLAB_ENV = {"PATH": f"{COLAB_BIN}{os.pathsep}{os.environ.get('PATH', '')}", "GPULAB_COLAB_VERSIONS": "1"}
# The book's build labels a live run on its CPU as the machine that built the book (gpulab.core.recordings).
STAGE_ENV = {"colab": {**os.environ, **COLAB_ENV}, "book": {**os.environ, "GPULAB_BOOK_BUILD": "1"}}

STAGES = [
    ("lint", [str(BIN / "ruff"), "check", "src", "tests", "tools", "book/_ext", "notebooks", "labs"]),
    ("unit", [*PYTEST, "tests/unit", "tests/test_repository.py", "tests/test_layers.py", "tests/test_references.py"]),
    ("notebooks", [*PYTEST, "-n", "2", "tests/test_notebooks.py"]),
    ("colab", [str(COLAB_BIN / "python"), *PYTEST[1:], "-n", "2", "tests/test_notebooks.py"]),
    ("book", [str(BIN / "jupyter-book"), "build", ".", "--path-output", ".", "-n", "-W", "--keep-going"]),
    ("pages", [*PYTEST, "tests/test_book.py", "tests/test_browser.py"]),
]


def main() -> int:
    os.chdir(ROOT)
    shutil.rmtree(ROOT / "_build" / "html", ignore_errors=True)  # the pages stage must see this run's build
    times, failed = [], []
    for name, command in STAGES:
        if name == "pages" and "book" in failed:
            failed.append(name)
            times.append((name, 0.0, "skipped: the book did not build"))
            continue
        print(f"\n=== {name}: {' '.join([Path(command[0]).name, *command[1:]])}", flush=True)
        start = time.perf_counter()
        code = subprocess.run(command, env=STAGE_ENV.get(name)).returncode
        elapsed = time.perf_counter() - start
        status = "ok" if code == 0 else f"FAILED (exit {code})"
        if code:
            failed.append(name)
        times.append((name, elapsed, status))
        print(f"=== {name}: {status} in {elapsed:.0f} s", flush=True)
    print("\nstage        time  result")
    for name, elapsed, status in times:
        print(f"{name:<10} {elapsed:6.0f} s  {status}")
    print(f"total      {sum(t for _, t, _ in times):6.0f} s")
    print(f"stages: {len(STAGES) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
