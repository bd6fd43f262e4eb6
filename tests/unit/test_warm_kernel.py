"""tools/warm_kernel.py: a notebook's kernel started, and its imports made, before papermill runs the notebook on it.

The kernel must leave a notebook's results as a fresh kernel would (the same outputs, execution counts and names),
and its imports must not start CUDA, which would take GPU memory from the notebook that runs meanwhile.
"""

from __future__ import annotations

import os
import subprocess
import sys

import nbformat
import papermill
from nbformat.v4 import new_code_cell, new_notebook

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import warm_kernel  # noqa: E402  (tools/ is not a package)


def test_the_warm_imports_do_not_touch_cuda():
    """Import every module of WARM_IMPORTS in a fresh interpreter whose CUDA entry points raise."""
    poisoned = ("is_available", "current_device", "init", "_lazy_init", "device_count", "get_device_properties",
                "mem_get_info", "set_device")
    script = "\n".join([
        "import importlib, torch",
        "def refuse(*args, **kwargs):",
        "    raise RuntimeError('touched CUDA')",
        *(f"torch.cuda.{name} = refuse" for name in poisoned),
        f"for module in {list(warm_kernel.WARM_IMPORTS)!r}:",
        "    importlib.import_module(module)",
        "print('imported')",
    ])
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert result.returncode == 0 and result.stdout.strip() == "imported", result.stderr[-2000:]


def test_the_warm_up_binds_no_name_in_the_kernel():
    namespace: dict = {}
    exec(warm_kernel.warm_up_code(("json", "no.such.module")), namespace)  # a missing module is the notebook's
    assert set(namespace) == {"__builtins__"}
    assert "json" in sys.modules


def _notebook(path):
    nbformat.write(new_notebook(cells=[
        new_code_cell("x = 6 * 7\nprint(x)"),
        new_code_cell("print(sorted(n for n in dir() if not n.startswith('_') and n not in ('In', 'Out', 'exit',"
                      " 'quit', 'get_ipython', 'open')))"),
        new_code_cell("import os\nprint(os.path.basename(os.getcwd()))"),
    ], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}), path)


def _outputs(path) -> list:
    return [(c.execution_count, [o.get("text") for o in c.outputs]) for c in nbformat.read(path, as_version=4).cells]


def test_a_notebook_on_a_warm_kernel_runs_as_on_a_fresh_one(tmp_path):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    _notebook(folder / "plain.ipynb")
    papermill.execute_notebook(str(folder / "plain.ipynb"), str(tmp_path / "cold.ipynb"), cwd=str(folder),
                               progress_bar=False, kernel_name="python3")
    kernel = warm_kernel.WarmKernel(folder, modules=("json", "decimal"))
    try:
        kernel.execute(folder / "plain.ipynb", tmp_path / "warm.ipynb", cwd=str(folder), progress_bar=False,
                       request_save_on_cell_execute=False)
    finally:
        kernel.close()
    assert not kernel.manager.has_kernel
    cold, warm = _outputs(tmp_path / "cold.ipynb"), _outputs(tmp_path / "warm.ipynb")
    assert warm == cold
    assert warm[0] == (1, ["42\n"]) and warm[2][1] == ["notebooks\n"]  # counts from 1, in the notebook's folder
