"""The roots' states gathered on the device, the last phase of a CUDA kernel.

Most callers read a forest's roots only, but every node's states are what a kernel writes, and
copying them all back was a quarter of a run of ten perfect trees. So the kernel ends by
gathering each root's rows of each state into `root_<state>`, in the forest's order of roots,
and the host copies back those rows alone; a `Result` reads its nodes from the device only
when asked for them (`buffers._States`)."""
from dataclasses import replace

from ..lowering.ilir import (
    Argument,
    ArgumentRole,
    Barrier,
    Const,
    Load,
    Loop,
    LoopRole,
    Store,
    Var,
)


def root_name(state):
    """The array the kernel gathers the roots' rows of `state` into."""
    return f"root_{state}"


def gather_roots(kernel):
    """`kernel` with a last phase, after a barrier, that copies row `root_node[root]` of each
    state into row `root` of its `root_<state>`, for root < num_roots: one parallel loop for
    the states of each size."""
    sizes = {}
    for state, size in kernel.states:
        sizes.setdefault(size, []).append(state)
    gathers = tuple(
        Loop("root", Const(0), Var("num_roots"), (
            Loop("e", Const(0), Const(size), tuple(
                Store(root_name(state), (Var("root"), Var("e")),
                      Load(state, (Load("root_node", (Var("root"),)), Var("e"))))
                for state in states), LoopRole.ELEMENTS),),
             LoopRole.ROOTS)
        for size, states in sizes.items())
    roles = (Argument("root_node", ArgumentRole.STRUCTURE),) + tuple(
        Argument(root_name(state), ArgumentRole.STATE) for state, _ in kernel.states)
    return replace(kernel, scalars=kernel.scalars + ("num_roots",),
                   arrays=kernel.arrays + tuple(argument.name for argument in roles),
                   roles=kernel.roles + roles,
                   body=kernel.body + (Barrier("the roots read the last batches' states"),)
                   + gathers)
