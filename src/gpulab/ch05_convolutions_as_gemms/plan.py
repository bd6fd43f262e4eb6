"""Chapter 05's sizes in every setting, and what they cost: the one place the notebook's sizes are set.

Two experiments: ``conv_memory`` builds and weighs each layer's im2col matrix (untimed: milliseconds), and
``conv_layers`` checks, then times, six ways of computing each layer in each number format. The second is the
chapter's time: a measurement per (format, layer, method) as :class:`gpulab.core.budget.Work` prices it (the
timer's L2 flush before each repeat, a host check of the layer's output), three of them Python loops with a floor
of :data:`gpulab.core.budget.HOST_CALL_SECONDS` an operation (the direct convolution, one small GEMM per output
pixel; im2col's copy per filter tap; the implicit GEMM's tiles).
"""

from __future__ import annotations

import math

from gpulab.ch05_convolutions_as_gemms import conv
from gpulab.core import budget, flops

# ResNet-50's convolutions {he2016resnet}, without the batch: the layers the chapter times.
RESNET_LAYERS = [
    dict(name="conv1 7x7/2", c=3, h=224, w=224, k=64, r=7, s=7, stride=2, padding=3),
    dict(name="res2 3x3", c=64, h=56, w=56, k=64, r=3, s=3, stride=1, padding=1),
    dict(name="res2 1x1", c=256, h=56, w=56, k=64, r=1, s=1, stride=1, padding=0),
    dict(name="res3 3x3", c=128, h=28, w=28, k=128, r=3, s=3, stride=1, padding=1),
    dict(name="res4 3x3", c=256, h=14, w=14, k=256, r=3, s=3, stride=1, padding=1),
    dict(name="res5 3x3", c=512, h=7, w=7, k=512, r=3, s=3, stride=1, padding=1),
]
SMOKE_LAYERS = [dict(name="3x3", c=8, h=16, w=16, k=8, r=3, s=3, stride=1, padding=1),
                dict(name="5x5/2", c=3, h=20, w=20, k=8, r=5, s=5, stride=2, padding=2)]

# The recorded sizes, from the notebook's parameters cell: ResNet-50 at batch 32, float32 and float16; the direct
# loop runs only on layers of at most 28 x 28 output pixels; the implicit GEMM builds 16 MiB tiles.
FULL = dict(batch=32, layers=RESNET_LAYERS, dtypes=["float32", "float16"], direct_max_positions=784,
            tile_bytes=2**24)
CPU = dict(FULL, batch=1, dtypes=["float32"], tile_bytes=2**20)  # float16 convolutions are a GPU feature
SMOKE = dict(batch=1, layers=SMOKE_LAYERS, dtypes=["float32"], direct_max_positions=784, tile_bytes=2**14)
CLASSES = [
    # Every layer, both formats and every method run in either candidate: the figures and the rates table keep their
    # bars. A smaller batch saves nothing on a T4: the timer repeats a shorter call more often (up to 2,000 times, for
    # 0.2 s), each behind a 1 ms flush of its L2, so batch 16 takes longer there than batch 32 (budget.Work).
    # Batch 16, the direct loop only on the two smallest layers (14 x 14 and 7 x 7 output pixels): a fallback.
    dict(FULL, batch=16, direct_max_positions=196),
    # The recorded sizes: about a minute on a T4.
    FULL,
]

DIRECT_OPS = 4  # a pixel of the direct loop: a slice, a reshape, a GEMM, a store
# The implicit GEMM's gather (advanced indexing with a slice between the indices) is far from a copy: the H200 took
# about 0.5 ms a 16 MiB tile (conv_layers), 0.7% of its bandwidth. Its Python: a dozen operations a tile.
GATHER_EFFICIENCY = 0.007
TILE_OPS = 12


def layers(sizes: budget.Sizes) -> list[conv.ConvLayer]:
    """The notebook's layers at the batch of ``sizes``."""
    return [conv.ConvLayer(n=sizes["batch"], **spec) for spec in sizes["layers"]]


def _layer_work(layer: conv.ConvLayer, dtype: str, sizes: budget.Sizes) -> list[budget.Work]:
    """The measurements of one layer in one format (sweeps.measure_layer): each method checked, then timed."""
    size = flops.bytes_per_element(dtype)
    im2col, inputs, outputs = (n * size for n in (layer.im2col_elements, layer.input_elements,
                                                  layer.output_elements))
    filters = layer.filter_elements * size
    memory = 2 * inputs + im2col + 3 * outputs + (layer.input_elements + layer.output_elements) * 8
    gemm = flops.gemm(layer.gemm_m, layer.gemm_n, layer.gemm_k, dtype)
    tiles = math.ceil(layer.gemm_m / conv.tile_rows_for(layer, size, sizes["tile_bytes"]))
    call = budget.HOST_CALL_SECONDS
    # each method: its first call compared with the reference on the host, then timed (timing.measure's defaults:
    # three warm-up calls, repeats behind L2 flushes)
    common = dict(precision=dtype, warmup=1 + budget.WARMUP, memory_bytes=memory,
                  checked_elements=layer.output_elements)
    items = [
        # the float64 reference of the layer, on the GPU, once for all its methods
        budget.once(f"float64 reference, {layer.name}", flops=layer.flops, precision="float64"),
        # the matrix: written once tap by tap (a strided read and write each), read by the GEMM; the output reordered
        budget.Work(f"im2col + GEMM, {layer.name}", flops=layer.flops, bytes=3 * im2col + inputs + 3 * outputs,
                    least_seconds=(layer.r * layer.s + 6) * call, **common),
        budget.Work(f"GEMM alone, {layer.name}", flops=gemm.flops, bytes=gemm.bytes, **common),
        budget.Work(f"implicit GEMM (tiled), {layer.name}", flops=layer.flops,
                    bytes=im2col / GATHER_EFFICIENCY + inputs + outputs, least_seconds=tiles * TILE_OPS * call,
                    **common),
        *(budget.Work(f"conv2d {layout}, {layer.name}", flops=layer.flops, bytes=inputs + filters + outputs, **common)
          for layout in ("NCHW", "NHWC")),
    ]
    if layer.p * layer.q <= sizes["direct_max_positions"]:
        items.append(budget.Work(f"direct, {layer.name}", flops=layer.flops, bytes=inputs + filters + outputs,
                                 least_seconds=layer.p * layer.q * DIRECT_OPS * call, **common))
    return items


def work(sizes: budget.Sizes) -> list[budget.Work]:
    """Every measurement of ``conv_layers`` at ``sizes``, and ``conv_memory``'s matrices (untimed, for memory)."""
    items: list[budget.Work] = []
    for layer in layers(sizes):
        # conv_memory: the im2col matrix twice (ours and unfold's), the input, two outputs; milliseconds of copies
        items.append(budget.Work(f"im2col matrix weighed, {layer.name}", measurements=0, memory_bytes=4 * (
            2 * layer.im2col_elements + layer.input_elements + 2 * layer.output_elements)))
        for dtype in sizes["dtypes"]:
            items.extend(_layer_work(layer, dtype, sizes))
    return items


def fixed_seconds(sizes: budget.Sizes) -> float:
    """The notebook's other cells: start and imports, the course's example (milliseconds), the checks of every
    implementation on five small shapes, and the explorer; about a second for the conv_memory sweep's copies and
    allocator statistics."""
    return budget.NOTEBOOK_SECONDS + 1.0 + 1.0


CHAPTER = budget.Chapter(name="05 Convolutions as GEMMs", full=FULL, classes=CLASSES, cpu=CPU, smoke=SMOKE,
                         work=work, fixed_seconds=fixed_seconds)
