"""Measure tensor, pipeline and sharded parallelism and the all-reduce on this machine's GPUs and record them.

On a machine of 2 or more GPUs (one process per GPU, NCCL), at the sizes of
``gpulab.ch16_distributed_training.plan.MACHINES``, on 2, 4 and 8 GPUs as far as the machine has them:
``distributed_parallel_scaling``, ``distributed_pipeline_bubble`` and ``distributed_allreduce_gpus`` under
``results/<gpu>/``, which chapter 16 draws (or only the experiments named as arguments). ``make gpu-parallel``
runs it; it takes about 3 minutes on 4 GPUs.
"""

from __future__ import annotations

import os
import sys
import time

import torch

os.environ["GPULAB_RECORD"] = "1"  # before gpulab reads it

from gpulab.ch16_distributed_training import ddp, parallel, plan  # noqa: E402
from gpulab.core import recordings  # noqa: E402

LAUNCH_TIMEOUT_S = 240  # one launch (all the runs of one GPU count) takes well under a minute on H200s


def main() -> int:
    gpus = torch.cuda.device_count()
    counts = [count for count in (2, 4, 8) if count <= gpus]
    if not counts:
        print(f"record_parallelism: this machine has {gpus} GPU(s); the measurements need at least 2, one process "
              "each. Run it on a machine of 2, 4 or 8 GPUs.", file=sys.stderr)
        return 1
    m = plan.MACHINES
    runs = [("distributed_parallel_scaling", parallel.parallel_scaling,
             dict(sizes=m["sizes"], batches=m["batches"], precisions=m["precisions"])),
            ("distributed_pipeline_bubble", parallel.pipeline_bubble,
             dict(sizes=m["sizes"], batch=m["bubble_batch"], micro_batches=m["bubble_micro_batches"],
                  precision=m["bubble_precision"])),
            ("distributed_allreduce_gpus", ddp.allreduce_by_gpus, dict(sizes=m["nccl_sizes"]))]
    wanted = sys.argv[1:] or [name for name, _, _ in runs]  # the experiments named on the command line, or all
    for name, fn, params in (run for run in runs if run[0] in wanted):
        start = time.perf_counter()
        recording = recordings.run(name, fn, processes=counts, backend="nccl", timeout_s=LAUNCH_TIMEOUT_S, **params)
        print(f"{name}: {len(recording.rows)} rows on {', '.join(map(str, counts))} GPUs of {recording.device_name} "
              f"in {time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
