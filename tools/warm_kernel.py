"""Notebook kernels started ahead of their notebook, for `make gpu-run` (tools/gpu_run.py).

Each notebook papermill runs used to start its own kernel and import torch, plotly and gpulab in its first cells:
5 to 6.5 s outside the cells and 4 to 6 s in the setup and import cells, on the H100 machine, 27 times. A
:class:`WarmKernel` starts the next notebook's kernel while the current notebook runs, and has it import the
packages every notebook imports, silently (no output, no execution count, no name bound in the notebook's
namespace). papermill then runs the notebook on that kernel (``papermill.execute_notebook(..., km=...)``: papermill
hands extra keyword arguments to its engine, and nbclient's ``NotebookClient`` reuses a kernel manager whose kernel
has started, leaving it running afterwards, so :meth:`WarmKernel.close` shuts it down).

The imports must not touch CUDA: a CUDA context made while another notebook is timing kernels would take GPU
memory from it. gpulab's ``kernel_mode`` and ``banner`` look for a GPU when they are imported, so they, and every
module that imports them, stay for the notebook's own cells; :data:`WARM_IMPORTS` names only modules that do not
(``tests/unit/test_warm_kernel.py`` imports them with CUDA's entry points disabled).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from queue import Empty

import papermill
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.session import Session
from jupyter_core.utils import run_sync

# What every notebook imports before its first experiment, none of which looks for a GPU when imported
WARM_IMPORTS = (
    "numpy", "torch", "torch.nn", "torch.nn.functional", "plotly.graph_objects", "plotly.io", "plotly.subplots",
    "ipywidgets", "IPython.display",
    "gpulab.core.budget", "gpulab.core.correctness", "gpulab.core.env", "gpulab.core.flops", "gpulab.core.plots",
    "gpulab.core.printing", "gpulab.core.provenance", "gpulab.core.specs", "gpulab.core.sweep", "gpulab.core.tables",
    "gpulab.core.timing", "gpulab.core.validation",
)


def warm_up_code(modules: tuple[str, ...] = WARM_IMPORTS) -> str:
    """Python that imports ``modules`` and leaves no name behind in the kernel's namespace (a module a notebook
    forgot to import must still fail there); a module that fails to import is left for the notebook to import."""
    return ("def _gpulab_warm_up(modules):\n"
            "    import importlib\n"
            "    for module in modules:\n"
            "        try:\n"
            "            importlib.import_module(module)\n"
            "        except Exception:\n"
            "            pass\n"
            f"_gpulab_warm_up({list(modules)!r})\n"
            "del _gpulab_warm_up\n")


class WarmKernel:
    """A kernel started in ``cwd`` (the notebook's folder, where papermill would start it), importing ``modules``
    in the background. It inherits this process's environment at the time it starts."""

    def __init__(self, cwd: Path, kernel_name: str = "python3", modules: tuple[str, ...] = WARM_IMPORTS):
        self.manager = AsyncKernelManager(kernel_name=kernel_name)
        run_sync(self.manager.start_kernel)(cwd=str(cwd))  # returns once the process is launched, not when ready
        # A session of its own: a client's sockets take its session's id as their identity, and the kernel hands an
        # identity over to whichever socket connected with it last. Sharing the manager's session with papermill's
        # client, this one could take the replies papermill waits for (it did, at random, a minute at a time).
        own = Session(key=self.manager.session.key, signature_scheme=self.manager.session.signature_scheme)
        self._client = self.manager.client(session=own)
        self._client.start_channels()
        # queued on the kernel's shell channel: it runs before anything papermill sends, which waits for it
        self._client.execute(warm_up_code(modules), silent=True, store_history=False)

    def execute(self, path: Path, output: Path, **papermill_arguments) -> None:
        """Run the notebook at ``path`` on this kernel with papermill, into ``output`` (papermill's exceptions
        pass through); the kernel serves one notebook."""
        papermill.execute_notebook(str(path), str(output), km=self.manager, **papermill_arguments)

    def close(self) -> None:
        """Shut the kernel down (as papermill does with its own: politely, then killed if it does not stop).

        First the kernel freezes its objects (``gc.freeze()``, silently): the notebook is done, and the full garbage
        collections of the kernel's exit (IPython's atexit, then Python's finalization) walked every object a chapter
        made, more than the 2.5 s jupyter_client waits before it sends SIGTERM. And this client's channels stop
        while the kernel is alive: stopped after it, its heartbeat socket held a ping queued for the dead kernel,
        and closing its context waited out the socket's 1 s linger, up to the next heartbeat (whole seconds)."""
        try:
            if self.manager.has_kernel and run_sync(self.manager.is_alive)():  # a dead kernel would not reply
                self._freeze_objects()
        finally:
            self._client.stop_channels()
            if self.manager.has_kernel:
                run_sync(self.manager.shutdown_kernel)(now=False)

    def _freeze_objects(self, timeout: float = 10.0) -> None:
        """``gc.freeze()`` in the kernel, waiting for its reply (a kernel that died or hangs is shut down anyway)."""
        msg_id = self._client.execute("import gc as _gc; _gc.freeze(); del _gc", silent=True, store_history=False)

        async def reply() -> None:
            while (await self._client.get_shell_msg(timeout=timeout))["parent_header"].get("msg_id") != msg_id:
                pass  # the warm-up's reply, unread until now
        with contextlib.suppress(Empty):  # no reply in time
            run_sync(reply)()
