"""The compiler's half of the schedule: the fields a `Schedule` leaves at None, chosen per
model and backend, and the checks that a schedule fits them."""
from ..errors import ScheduleError
from .ilir import Barrier, Loop
from .lower import lower
from .refactor import refactor
from .traffic import internal_path


def choose_schedule(cell, schedule, backend, kind, arity):
    """`schedule` with every field decided: what the user set stands, the rest is chosen."""
    if schedule.unroll > 1 and kind == "dag":
        raise ScheduleError(f"Schedule.unroll={schedule.unroll} applies to trees and sequences: "
                            "a DAG node reached from two parents would be computed twice")
    if schedule.refactor is None:
        schedule = schedule.but(refactor=_refactoring_pays(cell, schedule, backend, arity))
    return schedule


def _refactoring_pays(cell, schedule, backend, arity):
    """Refactor where it removes a barrier per batch. On the GPU a grid barrier costs
    microseconds and idle SMs, so that is enough; on the CPU a barrier is a prange join and
    the multiply-adds dominate (measured on the 2-core EPYC, h256: refactoring TreeLSTM cost
    30%, TreeRNN 50%), so only where it adds none (sequences)."""
    removes_barrier = (barriers_per_batch(lower(cell, schedule.but(refactor=True)))
                       < barriers_per_batch(lower(cell, schedule.but(refactor=False))))
    if not removes_barrier or backend == "cuda":
        return removes_barrier
    before, after = refactor(cell).multiply_adds(2 if arity is None else arity)
    return after <= before


def barriers_per_batch(kernel):
    """The barriers one internal batch of the kernel's batch loop crosses."""
    for statement in kernel.body:
        if isinstance(statement, Loop) and statement.var == "b":
            return _barriers(statement.body)
    return 0


def _barriers(body):
    return sum(1 for statement in internal_path(body) if isinstance(statement, Barrier))
