"""Generate each lab's student version from its solution, so that the two cannot drift apart.

``labs/solutions/NN_topic.ipynb`` is the source. In its code cells, a solution is fenced::

        # >>> solution
        return 2 * n**3
        # <<< solution: return None

The student version (``labs/NN_topic.ipynb``) replaces each fence with ``# YOUR CODE HERE`` and the
stub written after ``<<< solution:`` (indented like the fence), sets ``SOLUTION = False`` in the
parameters cell so that checks print hints instead of raising, and has no outputs.

``python tools/make_labs.py`` writes the student versions; ``--check`` fails if any is out of date.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^(?P<indent>[ \t]*)# >>> solution[ \t]*\n.*?^[ \t]*# <<< solution(?::[ \t]*(?P<stub>[^\n]*))?$",
                   re.MULTILINE | re.DOTALL)


def student_source(source: str, where: str) -> str:
    def replace(match: re.Match) -> str:
        indent, stub = match["indent"], (match["stub"] or "").strip()
        return f"{indent}# YOUR CODE HERE" + (f"\n{indent}{stub}" if stub else "")

    result = FENCE.sub(replace, source)
    if ">>> solution" in result or "<<< solution" in result:
        raise SystemExit(f"{where}: unmatched solution fence")
    compile(result.replace("%", "#"), where, "exec")  # a student cell must at least parse
    return result


def student_notebook(solution: Path) -> nbformat.NotebookNode:
    nb = nbformat.read(solution, as_version=4)
    parameters = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    if len(parameters) != 1 or not re.search(r"^SOLUTION = True\b", parameters[0].source, re.MULTILINE):
        raise SystemExit(f"{solution}: needs one 'parameters' cell that sets SOLUTION = True")
    parameters[0].source = re.sub(r"^SOLUTION = True\b", "SOLUTION = False", parameters[0].source, flags=re.MULTILINE)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            cell.source = student_source(cell.source, f"{solution.name}, cell {index}")
            cell.outputs, cell.execution_count = [], None
    return nb


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a student version is out of date")
    args = parser.parse_args()
    stale = []
    for solution in sorted((ROOT / "labs" / "solutions").glob("*.ipynb")):
        target = ROOT / "labs" / solution.name
        text = nbformat.writes(student_notebook(solution)) + "\n"
        if not target.exists() or target.read_text() != text:
            stale.append(target)
            if not args.check:
                target.write_text(text)
    for path in stale:
        print(f"{'out of date' if args.check else 'written'}: {path.relative_to(ROOT)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
