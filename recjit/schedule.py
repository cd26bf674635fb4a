"""How a model is computed, kept apart from what it computes (Cortex §3.1)."""
from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    """Scheduling choices.

    - `hoist`: field-only work (leaf states, input projections) runs as one parallel pass over
      all nodes before the batches.
    - `fusion` (CUDA): one persistent cooperative launch per run, with grid barriers; `False`
      launches a kernel per parallel step and per matrix product instead (the ablation
      baseline, and what works where a grid barrier cannot).
    - `persistence` (CUDA, fused): each block keeps its rows of the weights multiplied in every
      batch in shared memory for the whole launch, when they fit; `False` reads them through L2
      in every batch (the ablation baseline).
    - `fast_math`: in float32 kernels, the CPU's tanh and sigmoid use a branch-free rational
      approximation that vectorizes (max errors in docs/fast_math.md), and CUDA kernels are
      compiled with `fastmath`; `False`, and every float64 kernel, use the exact functions.
    - `row_block`: weight rows per parallel work item of a CPU matrix product."""

    hoist: bool = True
    fusion: bool = True
    persistence: bool = True
    fast_math: bool = True
    row_block: int = 32

    def __post_init__(self):
        if self.row_block < 1:
            raise ValueError("Schedule.row_block must be a positive number of weight rows")
