"""The compiler's half of the schedule: the fields a `Schedule` leaves at None, chosen per
model and backend, and the checks that a schedule fits them."""
from dataclasses import dataclass

from ..errors import ScheduleError
from .ilir import Barrier, Loop, LoopRole, Statements
from .lower import lower
from .refactor import refactor
from .traffic import internal_positions


# What refactoring trades on the GPU, fitted on an H100 to the GPU ablation of TreeFC on perfect
# trees (benchmarks/README.md, "Measurements behind the code"): the time a batch's grid barrier
# saves, and the multiply-adds a microsecond the extra products cost. Models on SST trees gained
# more than these say, so a forest goes unrefactored only where the extra products cost MARGIN
# times what the batches save.
BATCH_SAVES_US = 2.4
MULTIPLY_ADDS_PER_US = 0.37e6
MARGIN = 3


def check_schedule(schedule, kind):
    """`schedule`, refused where it does not fit a model of this kind."""
    if schedule.unroll > 1 and kind == "dag":
        raise ScheduleError(f"Schedule.unroll={schedule.unroll} applies to trees and sequences: "
                            "a DAG node reached from two parents would be computed twice")
    return schedule


def refactor_variants(cell, schedule):
    """{refactor: the kernel lowered with it} for a schedule that leaves `refactor` to the
    compiler: what the backend counts the barriers of (`choose_schedule`'s `barriers`)."""
    return {refactored: lower(cell, schedule.but(refactor=refactored))
            for refactored in (False, True)}


def choose_schedule(cell, schedule, backend, arity, barriers=None):
    """(`schedule` with every field decided, what refactoring trades where the compiler
    chose: a `RefactorTrade`, else None). What the user set stands, the rest is chosen;
    `refactor` stays None where each forest decides (`RefactorTrade.pays_for`). `barriers`:
    {refactor: the barriers an internal batch of its variant (`refactor_variants`) crosses
    as the backend runs it}, counted by the backend; None: those the lowering placed."""
    if schedule.refactor is not None:
        return schedule, None
    if barriers is None:
        barriers = {refactored: barriers_per_batch(kernel)
                    for refactored, kernel in refactor_variants(cell, schedule).items()}
    trade = refactor_trade(cell, barriers[False] - barriers[True])
    return schedule.but(refactor=_refactoring_pays(cell, trade, backend, arity)), trade


def _refactoring_pays(cell, trade, backend, arity):
    """Refactor where it removes a barrier per batch and adds no multiply-adds. Where it adds
    some: on the CPU, no (a barrier is a prange join and the multiply-adds dominate:
    refactoring cost TreeLSTM and TreeRNN a third or more of their time); on the GPU, a grid
    barrier costs microseconds and idle SMs, and the forest decides (None)."""
    if trade.barriers_saved <= 0:
        return False
    before, after = refactor(cell).multiply_adds(2 if arity is None else arity)
    if after <= before:
        return True
    return None if backend == "cuda" else False


@dataclass(frozen=True)
class RefactorTrade:
    """What refactoring a cell trades: barriers per internal batch for multiply-adds. A
    refactored node multiplies its state by `node_multiply_adds` for its parent (every node
    but the last batch's, leaves included); an unrefactored internal node multiplies
    `parent_multiply_adds`, and `child_multiply_adds` per child."""

    barriers_saved: int
    node_multiply_adds: int
    parent_multiply_adds: int
    child_multiply_adds: int

    def pays_for(self, linearized):
        """Whether the GPU kernel should be refactored for this forest."""
        internal_batches = linearized.num_batches - 1
        if internal_batches <= 0:
            return True  # leaves only: neither kernel multiplies for a parent
        refactored = self.node_multiply_adds * (linearized.num_nodes
                                                - int(linearized.batch_begin[1]))
        unrefactored = (self.parent_multiply_adds * linearized.leaf_begin
                        + self.child_multiply_adds * linearized.child_idx.size)
        extra_us = (refactored - unrefactored) / MULTIPLY_ADDS_PER_US
        return extra_us <= MARGIN * BATCH_SAVES_US * self.barriers_saved * internal_batches


def refactor_trade(cell, barriers_saved):
    """The RefactorTrade of `cell`, refactoring saving an internal batch `barriers_saved`
    barriers as the backend runs it (on the GPU, only those at which the grid meets count:
    split units and block packs make others a block's)."""
    refactoring = refactor(cell)
    return RefactorTrade(
        barriers_saved,
        sum(projection.rows * projection.width for projection in refactoring.projections),
        sum(rows * columns for rows, columns, per_child in refactoring.replaced
            if not per_child),
        sum(rows * columns for rows, columns, per_child in refactoring.replaced if per_child))


def barriers_per_batch(kernel):
    """The barriers one internal batch of the kernel's batch loop crosses."""
    return len(internal_barriers(kernel))


def internal_barriers(kernel):
    """(statements, index) of each barrier one internal batch of the kernel's batch loop
    crosses, the statements a `Statements` whose path starts at the kernel's body."""
    body = Statements(kernel.body)
    for index, statement in enumerate(body):
        if isinstance(statement, Loop) and statement.role is LoopRole.BATCHES:
            return [(statements, position) for statements, position
                    in internal_positions(body.inner(index))
                    if isinstance(statements[position], Barrier)]
    return []
