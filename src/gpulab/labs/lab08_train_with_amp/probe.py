"""The probe a student's AMP step runs on: a small MLP with an SGD optimizer, a GradScaler that notes which of
its methods ran and in what order, and two batches of fresh random data; and the reference steps (plain and with
gradient clipping) it is compared with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from gpulab.ch04_mlp_gemms import mlp
from gpulab.ch11_mixed_precision.amp import amp_step

PROBE_SIZES = (32, 64, 64, 10)  # the graders' MLP: small, so that a check takes milliseconds
PROBE_BATCH = 64
PROBE_SCALE = 2.0**12  # the scale the graders start from: far from 1, so scaled gradients are told from unscaled
# float16's largest number is 65504. The gradient of the mean cross-entropy over a logit is (p - y) / batch, up to
# about 1/64 here; times 2^24 that is about 2.6e5: the scaled gradients overflow float16 (not bfloat16, nor float32).
OVERFLOW_SCALE = 2.0**24
LEARNING_RATE = 0.1  # plain SGD, so the update is the gradient times this


reference_step = amp_step  # the step the graders compare a student's with: the mixed-precision chapter's


def reference_clipped_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                           X: torch.Tensor, labels: torch.Tensor, dtype: torch.dtype,
                           max_norm: float) -> torch.Tensor:
    """:func:`reference_step` with the gradients clipped to ``max_norm``: unscaled first, then clipped."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(X.device.type, dtype=dtype):
        loss = F.cross_entropy(model(X), labels)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()






class RecordingScaler(torch.amp.GradScaler):
    """A GradScaler that notes which of its methods ran, in order, and the gradients' norm at each unscale.

    ``calls`` holds "scale", "unscale_" (called by the step's author), "unscale_ in step" (called by
    ``step`` itself, because nobody had), "step" and "update". ``norms_at_unscale`` holds the norm of all
    the optimizer's gradients just before each unscale: still multiplied by the scale, if the loss was.
    """

    def __init__(self, device_type: str, init_scale: float) -> None:
        super().__init__(device_type, init_scale=init_scale)
        self.calls: list[str] = []
        self.norms_at_unscale: list[float] = []
        self._in_step = False

    def scale(self, outputs):
        self.calls.append("scale")
        return super().scale(outputs)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        self.calls.append("unscale_ in step" if self._in_step else "unscale_")
        self.norms_at_unscale.append(gradient_norm(optimizer))
        super().unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer, *args, **kwargs):
        self.calls.append("step")
        self._in_step = True
        try:
            return super().step(optimizer, *args, **kwargs)
        finally:
            self._in_step = False

    def update(self, new_scale=None) -> None:
        self.calls.append("update")
        super().update(new_scale)


def gradient_norm(optimizer: torch.optim.Optimizer) -> float:
    """The 2-norm of all the optimizer's gradients together (inf or NaN if any is); 0 if there are none."""
    grads = [p.grad.detach().double() for group in optimizer.param_groups for p in group["params"]
             if p.grad is not None]
    if not grads:
        return 0.0
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item()


@dataclass
class StepRun:
    """What one call of a training step did to a probe model."""

    returned: object
    error: Exception | None
    forward_dtypes: list[torch.dtype]  # the output dtype of each linear layer, in the order they ran
    backward_autocast: list[bool]  # for each backward through the output: was autocast on?
    calls: list[str]  # the RecordingScaler's
    norms_at_unscale: list[float]
    update: torch.Tensor  # all parameters after the step minus before, flattened, float64 on the CPU
    finite: bool  # every parameter is finite after the step
    scale_before: float
    scale_after: float

    @property
    def moved(self) -> bool:
        return bool(torch.any(self.update != 0)) or not self.finite


@dataclass
class Probe:
    """A small MLP, its SGD optimizer, a :class:`RecordingScaler` and two batches of fresh random data.

    Two probes made with the same arguments start identical, so a student's step and the reference step
    can be run side by side and their updates compared.
    """

    device: torch.device
    init_scale: float
    seed: int = 0
    model: torch.nn.Sequential = field(init=False)
    optimizer: torch.optim.Optimizer = field(init=False)
    scaler: RecordingScaler = field(init=False)
    batches: list[tuple[torch.Tensor, torch.Tensor]] = field(init=False)

    def __post_init__(self) -> None:
        with torch.random.fork_rng(devices=[]):  # torch_mlp seeds the global generator: leave the caller's alone
            self.model = mlp.torch_mlp(PROBE_SIZES, seed=self.seed).to(self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LEARNING_RATE)
        self.scaler = RecordingScaler(self.device.type, self.init_scale)
        generator = torch.Generator().manual_seed(self.seed + 1)
        self.batches = [(torch.randn(PROBE_BATCH, PROBE_SIZES[0], generator=generator).to(self.device),
                         torch.randint(0, PROBE_SIZES[-1], (PROBE_BATCH,), generator=generator).to(self.device))
                        for _ in range(2)]
        self._forward_dtypes: list[torch.dtype] = []
        self._backward_autocast: list[bool] = []
        linears = [m for m in self.model if isinstance(m, torch.nn.Linear)]
        self._output_layer = linears[-1]
        for layer in linears:
            layer.register_forward_hook(self._seen_forward)

    def _seen_forward(self, module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        self._forward_dtypes.append(output.dtype)
        if module is self._output_layer and output.requires_grad:
            device_type = self.device.type
            output.register_hook(lambda grad: self._backward_autocast.append(torch.is_autocast_enabled(device_type)))

    def parameters(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1).to("cpu", torch.float64) for p in self.model.parameters()])

    def run(self, step: Callable, batch: int, *arguments) -> StepRun:
        """Call ``step(model, optimizer, scaler, X, labels, *arguments)`` on batch ``batch`` and watch it."""
        self._forward_dtypes, self._backward_autocast = [], []
        self.scaler.calls, self.scaler.norms_at_unscale = [], []
        before, scale_before = self.parameters(), self.scaler.get_scale()
        X, labels = self.batches[batch]
        returned, error = None, None
        try:
            returned = step(self.model, self.optimizer, self.scaler, X, labels, *arguments)
        except Exception as caught:  # a grader reports, never raises
            error = caught
        after = self.parameters()
        return StepRun(returned, error, list(self._forward_dtypes), list(self._backward_autocast),
                       list(self.scaler.calls), list(self.scaler.norms_at_unscale), after - before,
                       bool(torch.isfinite(after).all()), scale_before, self.scaler.get_scale())


@contextmanager
def forward_dtypes() -> Iterator[list[torch.dtype]]:
    """Within the block, the output dtype of every ``nn.Linear`` that runs, in any model, is appended to the list."""
    seen: list[torch.dtype] = []

    def hook(module: torch.nn.Module, inputs: tuple, output: object) -> None:
        if isinstance(module, torch.nn.Linear) and isinstance(output, torch.Tensor):
            seen.append(output.dtype)

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        yield seen
    finally:
        handle.remove()
