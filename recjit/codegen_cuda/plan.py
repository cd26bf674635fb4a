"""How a fused kernel uses its blocks and their shared memory, decided from the ILIR, the
weights' shapes and the grid's size before any source is generated: which products split in
row groups, which weights each block keeps on chip, the tile the products stage their inputs
through, the packs each block computes itself, the units the blocks split and the batches
whose nodes they split in ranges too. The emitter
writes the plan down; the refactoring choice reads the grid barriers it leaves
(`grid_barriers_per_batch`)."""
from dataclasses import dataclass, replace

import numpy as np

from ..lowering import internal_barriers
from ..lowering.ilir import (Barrier, BarrierScope, If, Let, Loop, MatMul, PackedProducts,
                             RangeShare, Statements, Var, walk)
from . import runtime
from .packs import NO_PACKS, BlockPacks, block_packs
from .ranges import NO_RANGES, NodeRanges, node_ranges
from .units import UnitSplit, split_units

# The nodes whose inputs a fused kernel's products stage in shared memory at a time: at most
# the first (more gain little: a 512-thread block loads 32 rows of 256 floats in 16 loads a
# thread), at least the second (the weights kept in shared memory leave room for it).
TILE_NODES = (32, 4)
# A tile of one node: `runtime.multiply` reads the inputs directly.
UNUSED_TILE = (1, 1)


@dataclass(frozen=True)
class LaunchPlan:
    """`row_groups`: the weights whose products the grid splits in groups of four rows and
    ranges of nodes; `persistent`: {weight: (rows, columns)}, each block's slice of a weight
    it keeps in shared memory for the whole launch; `tile`: the shape (nodes, columns) of the
    shared array the products stage their inputs through (`UNUSED_TILE`: they read them
    directly; None: the kernel multiplies nothing); `packs`: the packs each block computes
    into its tile (`packs.BlockPacks`); `split`: the units the blocks split, knowing the
    packs' barriers are a block's (`units.UnitSplit`); `ranges`: the batch statements whose
    nodes the blocks split in ranges too (`ranges.NodeRanges`)."""

    row_groups: frozenset
    persistent: dict
    tile: tuple
    packs: BlockPacks
    split: UnitSplit
    ranges: NodeRanges = NO_RANGES


def batch_weights(kernel):
    """The weights multiplied inside the batch loop (the kernel's sequential top-level loop):
    read in every batch, worth keeping on chip."""
    weights = []

    def visit(body):
        for statement in body:
            if isinstance(statement, MatMul) and statement.weight not in weights:
                weights.append(statement.weight)
            elif isinstance(statement, If):
                visit(statement.body + statement.orelse)

    for loop in kernel.body:
        if isinstance(loop, Loop) and not loop.parallel:
            visit(loop.body)
    return weights


def weights_to_keep(kernel, row_groups):
    """The weights multiplied in every batch whose rows a block could keep on chip: all but
    those the products split in row groups."""
    return [weight for weight in batch_weights(kernel) if weight not in row_groups]


def plan_launch(kernel, schedule, weight_shapes, blocks, shared_bytes):
    """The `LaunchPlan` of the fused kernel `kernel` (its roots gathered) on `blocks` blocks
    of `shared_bytes` of shared memory each, under `schedule`."""
    unit_split = split_units(kernel, weight_shapes, schedule.split_units)
    row_groups = _row_groups(kernel, schedule, weight_shapes, unit_split, blocks)
    persistent, tile = _shared_memory(kernel, schedule, weight_shapes, unit_split, row_groups,
                                      blocks, shared_bytes)
    packs, split = NO_PACKS, unit_split
    if schedule.block_packs and tile and tile != UNUSED_TILE:
        packs, split = block_packs(kernel, unit_split, tile[1])
        packs = replace(packs, shared_tiles=schedule.shared_tiles)
    ranges = node_ranges(kernel, split, weight_shapes) if schedule.node_ranges else NO_RANGES
    return LaunchPlan(row_groups, persistent, tile, packs, split, ranges)


def grid_barriers_per_batch(kernel, plan):
    """The barriers an internal batch of `kernel` crosses at which the whole grid meets under
    `plan`, counted in the planned ILIR: the lowering's, less those that split units and
    block packs make a block's and those the grid met before."""
    planned = planned_kernel(kernel, plan)
    return sum(statements[index].scope is None
               for statements, index in internal_barriers(planned))


def _row_groups(kernel, schedule, weight_shapes, unit_split, blocks):
    """The weights whose products the grid splits in groups of four rows and ranges of nodes
    (`runtime.matmul_row_groups`): those not split by units whose groups number at most half
    the blocks (MV-RNN's 64-row weights on 132 blocks: 16 groups of 4 rows, each group's
    nodes over 8 blocks). Split evenly instead, a block holds fewer than four rows and reads
    every node's inputs. They are not kept in shared memory."""
    if not schedule.row_groups:
        return frozenset()
    return frozenset(
        product.weight for product in walk(kernel.body)
        if isinstance(product, MatMul) and product.parallel
        and product.weight not in unit_split.weights
        and runtime.fits_row_groups(weight_shapes[product.weight][0], blocks))


def _shared_memory(kernel, schedule, weight_shapes, unit_split, row_groups, blocks,
                   shared_bytes):
    """(each block's slice of the weights multiplied in every batch, kept in shared memory
    when all of them fit; the tile the products stage their inputs through). The weights
    come first: they save reading a weight in every batch; the tile takes what they leave, at
    least `TILE_NODES[1]` nodes."""
    itemsize = np.dtype(kernel.dtype).itemsize
    columns = max((_product_columns(product, weight_shapes) for product in walk(kernel.body)
                   if isinstance(product, MatMul)), default=0)
    keep = weights_to_keep(kernel, row_groups)
    if not columns:
        return _persistence(schedule, keep, weight_shapes, unit_split, blocks, itemsize,
                            shared_bytes), None
    most, least = TILE_NODES
    persistent = _persistence(schedule, keep, weight_shapes, unit_split, blocks, itemsize,
                              shared_bytes - least * columns * itemsize)
    left = shared_bytes - slice_bytes(persistent, itemsize)
    nodes = min(most, left // (columns * itemsize)) if schedule.stage_products else 0
    # Staging off, or rows too wide to stage two nodes' on chip.
    return persistent, (nodes, columns) if nodes > 1 else UNUSED_TILE


def _product_columns(product, weight_shapes):
    """The columns of x a product multiplies: its block of the weight's columns."""
    if product.columns is not None:
        return product.columns[1] - product.columns[0]
    return weight_shapes[product.weight][1]


def _persistence(schedule, weights, weight_shapes, unit_split, blocks, itemsize, budget):
    """{weight: (rows, columns)}, a block's slice of each of `weights`, if all of them fit in
    `budget` bytes; else none."""
    if not schedule.persistence:
        return {}
    slices = {}
    for weight in weights:
        rows, columns = weight_shapes[weight]
        units = unit_split.weights.get(weight)
        slices[weight] = ((rows // units * -(-units // blocks) if units
                           else -(-rows // blocks)), columns)
    return slices if slice_bytes(slices, itemsize) <= budget else {}


def slice_bytes(slices, itemsize):
    """The bytes of shared memory that weight slices {weight: (rows, columns)} take."""
    return itemsize * sum(rows * columns for rows, columns in slices.values())


def planned_kernel(kernel, plan):
    """`kernel` with `plan`'s decisions written into its statements, which the emitter prints
    one to one and `explain(backend="cuda")` shows: each barrier's scope, the loops whose
    units (and ranges of nodes) the blocks split, each product's pack and input rows, the
    pack loops and barriers that the blocks' own packs replace left out, runs of products
    that share their tiles as one `PackedProducts`, and the batch's `RangeShare`."""
    return replace(kernel, body=_planned_body(Statements(kernel.body), plan))


def _planned_body(body, plan):
    """The planned statements of `body` (`Statements`)."""
    statements, run = [], []
    for index, statement in enumerate(body):
        if body.place(index) in plan.packs.skipped:  # ends a run of products, as it stood
            statements += _tile_run(run)
            run = []
            continue
        planned = _planned(body, index, plan)
        if _shares_tiles(planned, plan) and (not run or planned.pack.columns
                                             == run[0].pack.columns):
            run.append(planned)
            continue
        statements += _tile_run(run)
        run = [planned] if _shares_tiles(planned, plan) else []
        if not run:
            statements.append(planned)
        if isinstance(statement, Let) and body.place(index) == plan.ranges.after:
            statements.append(RangeShare(Var(statement.name), plan.ranges.units,
                                         plan.ranges.balance))
    return tuple(statements + _tile_run(run))


def _shares_tiles(statement, plan):
    """Whether a planned statement is a product that may share its tiles with the next."""
    return (plan.packs.shared_tiles and isinstance(statement, MatMul)
            and statement.pack is not None and statement.pack.element is None)


def _tile_run(run):
    """A run of products that may share tiles: one `PackedProducts`, or a lone product."""
    return [PackedProducts(tuple(run))] if len(run) > 1 else list(run)


def _planned(body, index, plan):
    """`body[index]` with the plan's decisions about it (and what it holds)."""
    statement, split = body[index], plan.split
    if isinstance(statement, Barrier):
        if split.grid_met_before(body, index):
            return replace(statement, scope=BarrierScope.MET)
        if split.block_barrier(body, index):
            return replace(statement, scope=BarrierScope.BLOCK)
        return statement
    if isinstance(statement, MatMul):
        return replace(statement, pack=plan.packs.products.get(body.place(index)),
                       input_rows=plan.ranges.products.get(body.place(index)))
    if isinstance(statement, If):
        return replace(statement, body=_planned_body(body.inner(index, "body"), plan),
                       orelse=_planned_body(body.inner(index, "orelse"), plan))
    if not isinstance(statement, Loop):
        return statement
    planned = replace(statement, body=_planned_body(body.inner(index), plan))
    if not statement.parallel or statement.one_worker:
        return planned
    if body.place(index) in plan.ranges.loops:
        return replace(planned, ranged=True)
    return replace(planned, units=split.loop_units(statement))
