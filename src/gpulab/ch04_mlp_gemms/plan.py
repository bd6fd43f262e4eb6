"""Chapter 04's sizes in every setting, and the work they make: the digits MLP trained on the host, then a linear
layer's forward GEMM timed against the batch, the widths and their alignment (:class:`gpulab.core.budget.Chapter`).
"""

from __future__ import annotations

from gpulab.ch04_mlp_gemms.mlp import CHECK_ROWS, GPU_REPEATS
from gpulab.core import budget, flops

EPOCH_SECONDS = 0.04  # an epoch of the digits MLP (23 steps of 64 images) on the host: 1 s for 30 on a laptop core
LINEAR_SETUP_SECONDS = 0.01  # sweeps.measure_linear on the host: operands, the check's bookkeeping

FULL = dict(epochs=30, hidden=[32], fc_features=4096, batches=list(range(32, 4097, 32)), feature_batch=2048,
            features=list(range(128, 8193, 64)), alignment_sizes=[4088, 4095, 4096, 4097, 4100, 4104],
            sweep_dtypes=["float16", "tf32", "float32"])
CLASSES = [
    # batches to 2048 every 64 (a point in each 128-row tile still shows every wave's step), widths to 4096 every
    # 128 at a batch of 1024: the waves of a T4's 40 SMs and of an H100's 132 step several times in that range
    {**FULL, "batches": list(range(64, 2049, 64)), "feature_batch": 1024, "features": list(range(128, 4097, 128))},
    # the recordings' batch sweep to 4096 every 64, widths to 8192 every 128
    {**FULL, "batches": list(range(64, 4097, 64)), "features": list(range(128, 8193, 128))},
    FULL,  # the recordings' sizes
]
CPU = dict(epochs=30, hidden=[32], fc_features=512, batches=list(range(16, 513, 16)), feature_batch=256,
           features=list(range(64, 1025, 64)), alignment_sizes=[504, 511, 512, 513, 516, 520],
           sweep_dtypes=["float32"])
SMOKE = dict(epochs=3, hidden=[16], fc_features=32, batches=[8, 16, 24, 32], feature_batch=16, features=[16, 32],
             alignment_sizes=[31, 32, 33, 36, 40], sweep_dtypes=["float32"])


def linear(batch: int, inputs: int, outputs: int, dtype: str) -> list[budget.Work]:
    """sweeps.measure_linear: the forward GEMM checked once against float64 on CHECK_ROWS rows (compared on the
    host), then timed GPU_REPEATS times. A format the GPU lacks is left out, as the notebook leaves it out
    (:func:`gpulab.core.validation.supported_dtypes`)."""
    cost = flops.gemm(outputs, batch, inputs, dtype)
    size = flops.bytes_per_element(dtype)
    forward = dict(flops=cost.flops, bytes=cost.bytes, precision=dtype, missing="skip",
                   memory_bytes=(batch * inputs + outputs * inputs + batch * outputs) * size + outputs * inputs * 8)
    label = f"linear {batch}x{inputs} -> {outputs} {dtype}"
    return [budget.once(f"{label}, checked", **forward),
            budget.once(f"float64 reference of {CHECK_ROWS} rows", flops=2 * CHECK_ROWS * inputs * outputs,
                        bytes=outputs * inputs * (size + 8), precision="float64", requires=dtype,
                        checked_elements=CHECK_ROWS * outputs),
            budget.Work(label, repeats=GPU_REPEATS, extra_seconds=LINEAR_SETUP_SECONDS, **forward)]


def work(sizes: dict) -> list[budget.Work]:
    """The digits MLP trained on the host, then the layers each sweep checks and times: the batch sweep, the
    feature sweep (outputs, then inputs; no float32 where there is another format) and the alignment sweep (each
    of batch, inputs, outputs moved in turn)."""
    fc, dtypes = sizes["fc_features"], sizes["sweep_dtypes"]
    feature_dtypes = [d for d in dtypes if d != "float32"] or dtypes
    base = dict(batch=fc, inputs=fc, outputs=fc)
    layers = [
        *(dict(batch=b, inputs=fc, outputs=fc, dtype=d) for d in dtypes for b in sizes["batches"]),
        *(dict(batch=sizes["feature_batch"], inputs=i, outputs=o, dtype=d) for d in feature_dtypes
          for f in sizes["features"] for i, o in ((fc, f), (f, fc))),
        *({**base, dim: s, "dtype": d} for d in dtypes for dim in base
          for s in dict.fromkeys([fc, *sizes["alignment_sizes"]])),
    ]
    return [budget.host_seconds("the digits MLP trained on the host, an epoch", EPOCH_SECONDS, sizes["epochs"]),
            *(w for layer in layers for w in linear(**layer))]


CHAPTER = budget.Chapter(name="04 MLP GEMMs", full=FULL, classes=CLASSES, cpu=CPU, smoke=SMOKE, work=work,
                         fixed_seconds=lambda sizes: budget.NOTEBOOK_SECONDS)
