"""How a model is computed, kept apart from what it computes (Cortex §3.1).

A `Schedule` is what the user asks for; a field left at None is the compiler's to choose,
and `lowering.choose_schedule` fills it in per model and backend (`explain()` prints the
result). Every combination computes the same values as the naive recursion."""
from dataclasses import dataclass, fields, replace

from .errors import ScheduleError, did_you_mean

# The most threads a CUDA block may have: at 1024 a thread gets 64 registers, and the fused
# kernels spill over a kilobyte of them (ptxas, sm_90).
MAX_THREADS = 512


@dataclass(frozen=True)
class Schedule:
    """Scheduling choices.

    - `dynamic_batching`: a batch is every node of one height across the whole forest;
      `False` runs the internal nodes one at a time, in an order that puts children first
      (the ablation baseline: only the products' rows run in parallel).
    - `specialize`: the leaf case and the internal case get loop nests of their own; `False`
      runs one loop nest over every batch, leaves included, that branches on the batch's case
      (and so cannot hoist the leaves).
    - `hoist`: field-only work (leaf states, input projections) runs as one parallel pass over
      all nodes before the batches.
    - `fusion` (CUDA): one persistent cooperative launch per run, with grid barriers; `False`
      launches a kernel per parallel step and per matrix product instead (the ablation
      baseline, and what works where a grid barrier cannot).
    - `persistence` (CUDA, fused): each block keeps its rows of the weights multiplied in every
      batch in shared memory for the whole launch, when they fit; `False` reads them through L2
      in every batch (the ablation baseline).
    - `split_units` (CUDA, fused): the blocks split the hidden units, each computing the
      product rows that its own units' elementwise ops read (rows e, e + H, ... of a gated
      weight), so that a block barrier, not a grid barrier, separates those products from
      those ops (`codegen_cuda/units.py`); `False`: each block owns an even share of every
      weight's rows, and a grid barrier separates each product from its readers (the
      ablation baseline).
    - `stage_products` (CUDA, fused; off by default): a product of more nodes than a block's
      warps take at once stages their inputs through shared memory, a tile of nodes at a
      time, instead of each warp reading its node's from global memory (`runtime.multiply`);
      `False`: every product reads them directly. Off by default: an H200 ran every model
      measured faster without it (benchmarks/README.md).
    - `row_groups` (CUDA, fused): the products of a weight (not split by units) with rows
      for at most half the blocks at four a block are split over the grid in groups of four
      rows, each group's nodes in ranges over the blocks that share it
      (`runtime.matmul_row_groups`; MV-RNN); `False`: each block owns an even share of the
      rows, fewer than four, and multiplies every node's inputs (the ablation baseline).
    - `block_packs` (CUDA, fused, with `stage_products`): a product's packed inputs that any
      block can compute, from values the grid has met on since they were written (an
      unrefactored TreeFC's [h_l; h_r]), are packed by each block into its tile itself, a
      tile at a time, with a block barrier, not a grid barrier, before the product
      (`codegen_cuda/packs.py`); `False`: the grid packs them into global memory and meets
      before the product (the ablation baseline).
    - `shared_tiles` (CUDA, fused, with `block_packs`): products whose inputs one pack loop
      computes fill the same tiles, one product's rows after another's, with one pair of
      block barriers a tile for them all (`Emitter.packed_products`); `False`: each product
      packs and multiplies its own tiles, one product after the other (the ablation
      baseline).
    - `node_ranges` (CUDA, fused, with `split_units`): a batch of many nodes is split in ranges
      of nodes as well as in units, each block computing one group of units of one range, so
      that the grid reads each node's inputs once per group, not once per block
      (`codegen_cuda/ranges.py`); `False`: every block multiplies every node of the batch
      for its own units (the ablation baseline).
    - `unroll` (trees and sequences): the recursion unrolled to this depth: one work item (a
      CPU thread, a CUDA block) computes a node and its descendants up to `unroll - 1` levels
      down, one after another, so a batch covers `unroll` heights with no grid barrier
      inside; 1 is no unrolling.
    - `refactor`: recursive refactoring (Cortex Fig. 4): each product of a weight with a
      child's state moves from the parent's iteration to the end of the child's own, where it
      multiplies the state just computed; the parent reads the result elementwise, which
      removes the barrier before the parent's first products. None: where that removes a
      barrier per batch without adding multiply-adds (CPU), or removes one at all (CUDA).
    - `remat` (training, CPU): whether the backward rematerializes each internal node's
      products, recomputing them from its children's states (True), or reads them from the
      forward, which keeps them in arrays of a row per node or edge (False: a forward kernel
      of its own, unrefactored, batches of one height). None: keep them where the schedule
      allows (no `refactor=True`, no `unroll`), which saves the backward a third of its
      multiply-adds for a row of each product per node.
    - `fast_math`: in float32 kernels, the CPU's tanh and sigmoid use a branch-free rational
      approximation that vectorizes (max errors in docs/fast_math.md), and CUDA kernels are
      compiled with `fastmath`; `False`, and every float64 kernel, use the exact functions.
    - `row_block`: CPU, the weight rows one `matmul_rows` call takes; pairs of workers take or
      claim a product's rows block by block.
    - `pack_from_nodes`: CPU, forests of at least this many nodes multiply through weights
      transposed into panels once per run (outer-product blocks, about 25% faster per
      multiply-add); smaller ones read the weights as they are, since packing costs about a
      read and a write of every weight. A node whose products multiply a matrix state counts
      once per column of it (each column is a row of the products). 0: always.
    - `threads` (CUDA): threads a block, a multiple of 32 up to 512; the kernels are compiled
      with it as their launch bound, so their registers fit. None: the backend's default.
    - `blocks` (CUDA, fused): the blocks of the persistent grid, fewer where fewer can be
      co-resident. Fewer blocks meet at a grid barrier sooner and hold more of each weight
      on chip, more take a large batch's products faster. None: one a multiprocessor."""

    dynamic_batching: bool = True
    specialize: bool = True
    hoist: bool = True
    fusion: bool = True
    persistence: bool = True
    split_units: bool = True
    stage_products: bool = False
    row_groups: bool = True
    block_packs: bool = True
    shared_tiles: bool = True
    node_ranges: bool = True
    unroll: int = 1
    refactor: bool = None
    remat: bool = None
    fast_math: bool = True
    row_block: int = 32
    pack_from_nodes: int = 64
    threads: int = None
    blocks: int = None

    def __new__(cls, *positional, **named):
        """Refuse what the dataclass's own constructor would misread or answer with a bare
        TypeError: a value by position (it would set whichever field comes first) and a
        field the schedule does not have."""
        names = [field.name for field in fields(cls)]
        if positional:
            raise ScheduleError(f"Schedule takes its fields by name, Schedule(unroll=2, ...), "
                                f"not {positional[0]!r} by position")
        for name in named:
            if name not in names:
                raise ScheduleError(f"Schedule has no field {name!r}"
                                    + (did_you_mean(name, names) or ".")
                                    + f" Its fields: {', '.join(names)}")
        return super().__new__(cls)

    def __post_init__(self):
        for field in fields(self):
            value = getattr(self, field.name)
            if field.type is bool and not isinstance(value, bool) and not (
                    value is None and field.default is None):
                raise ScheduleError(f"Schedule.{field.name} must be True or False"
                                    + (" or None (the compiler chooses)"
                                       if field.default is None else "")
                                    + f", not {value!r}")
        for name in ("unroll", "row_block"):
            value = getattr(self, name)
            if not _whole(value) or value < 1:
                raise ScheduleError(f"Schedule.{name} must be a positive integer, not {value!r}")
        value = self.pack_from_nodes
        if not _whole(value) or value < 0:
            raise ScheduleError(f"Schedule.pack_from_nodes must be a non-negative integer "
                                f"(a number of nodes), not {value!r}")

        if self.threads is not None and (not _whole(self.threads)
                                         or not 0 < self.threads <= MAX_THREADS
                                         or self.threads % 32):
            raise ScheduleError(f"Schedule.threads must be a multiple of 32 up to {MAX_THREADS} "
                                f"(threads a CUDA block) or None, not {self.threads!r}")

        if self.blocks is not None and (not _whole(self.blocks) or self.blocks < 1):
            raise ScheduleError(f"Schedule.blocks must be a positive integer (blocks of the "
                                f"fused CUDA grid) or None, not {self.blocks!r}")

    def but(self, **changes):
        """This schedule with some fields changed."""
        return replace(self, **changes)


def _whole(value):
    """Whether `value` is an int, and not a bool (which Python counts as one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def checked_schedule(schedule, default):
    """`schedule`, or `default` where it is None; anything but a `Schedule` is refused."""
    if schedule is None:
        return default
    if not isinstance(schedule, Schedule):
        raise ScheduleError(f"schedule must be a recjit.Schedule, not {type(schedule).__name__} "
                            f"{schedule!r}")
    return schedule
