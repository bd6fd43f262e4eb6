"""Stamp the shared setup cell into every notebook and lab, with the repository URL from _config.yml.

The repository URL lives in one place, ``_config.yml``. A notebook opened on Colab cannot read that
file (the repository is not there yet), so each notebook carries a copy of the setup cell, made by
this script. ``python tools/notebook_cells.py --check`` fails if any copy is out of date (CI runs it).

The setup cell is the code cell tagged ``setup``; it is hidden (collapsed) in the book.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]

SETUP = '''\
# Setup. On Colab: fetch the book's code (its library, gpulab, and the GPU recordings) and put gpulab on the path,
# leaving Colab's own torch, ipywidgets and plotly as they are. Elsewhere gpulab is already installed.
# GPULAB_REPOSITORY may name another copy of the repository (a fork, a mirror, a local path).
import os
import sys

try:
    from google.colab import output as colab_output
except ImportError:  # not on Colab
    colab_output = None

ready = True
if colab_output is not None:
    import shutil
    import subprocess

    REPOSITORY = os.environ.get("GPULAB_REPOSITORY", "{url}")
    BOOK = os.environ.get("GPULAB_BOOK_DIR", "/content/book")
    if not os.path.isdir(os.path.join(BOOK, "src", "gpulab")):
        fetched = subprocess.run(["git", "clone", "--quiet", "--depth=1", REPOSITORY, BOOK], capture_output=True,
                                 text=True)
        if fetched.returncode:
            ready = False
            reason = (fetched.stderr.strip().splitlines() or ["no message"])[-1]
            print(f"Could not fetch the book's code from {{REPOSITORY}} ({{reason}}): check that this runtime can "
                  "reach it, or set GPULAB_REPOSITORY to a copy it can reach, then run this cell again.")
        shutil.rmtree(os.path.join(BOOK, "labs", "solutions"), ignore_errors=True)  # a lab's answers stay hidden
    sys.path.insert(0, os.path.join(BOOK, "src"))
    colab_output.enable_custom_widget_manager()

if ready:
    try:
        from gpulab.core.banner import banner
    except ImportError:
        print("gpulab, the book's library, is not installed here: run `pip install -e .` in the book's repository "
              "(or open this notebook on Colab), then run this cell again.")
    else:
        display(banner())'''


def repository_url() -> str:
    return yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]


def notebooks() -> list[Path]:
    return sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("labs/*.ipynb"), *ROOT.glob("labs/solutions/*.ipynb")])


def setup_source() -> str:
    return SETUP.format(url=repository_url())


def stamp(path: Path, check: bool) -> bool:
    """Give ``path`` the current setup cell; return True if it was already current."""
    nb = nbformat.read(path, as_version=4)
    cells = [c for c in nb.cells if "setup" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise SystemExit(f"{path}: expected exactly one cell tagged 'setup', found {len(cells)}")
    current = cells[0].source == setup_source()
    if not current and not check:
        cells[0].source = setup_source()
        cells[0].metadata["tags"] = ["setup", "hide-input"]
        nbformat.write(nb, path)
    return current


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a setup cell is out of date")
    args = parser.parse_args()
    stale = [p for p in notebooks() if not stamp(p, args.check)]
    for path in stale:
        print(f"{'out of date' if args.check else 'updated'}: {path.relative_to(ROOT)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
