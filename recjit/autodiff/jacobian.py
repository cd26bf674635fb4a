"""A jacobian as pfor vectorizes it: the forward runs once, then the backward runs over the
forest taken once per element of the state, each copy's roots given that element's unit
cotangent, so that one pass computes many rows of the jacobian."""
import numpy as np

from ..linearize import Forest
from ..lowering.backward import kept_for_copies
from ..params import to_host
from .pullback import Pullback

# The nodes a jacobian's backward pass takes at once: the forest is copied once per output
# element, in groups of copies of about this many nodes, whose rows stay in cache.
JACOBIAN_NODES = 8192


def jacobian_by_copies(pullback, forest, output, wrt, gathered, linearize):
    """`J[n]` = ∂ (state component `output` of node n's root) / ∂ (node n's float field `wrt`,
    or the row of table `wrt` that node n gathers, when `gathered`), shaped (num_nodes,
    *state, *field or row), from `pullback`, a vjp's on `forest` whose backward computes the
    effects on `wrt` alone. `linearize`: the model's, for the copies of the forest."""
    cell = pullback.cell
    shape = cell.state_shapes[output]
    row = cell.parameters[wrt][1:] if gathered else cell.fields[wrt][0]
    if forest.num_nodes == 0:
        return np.zeros((0,) + shape + tuple(row), dtype=cell.dtype)
    elements = int(np.prod(shape))
    copies = max(1, min(elements, JACOBIAN_NODES // max(1, forest.num_nodes)))
    jacobian = np.zeros((forest.num_nodes, elements) + tuple(row), dtype=cell.dtype)
    pullbacks = {}
    for first in range(0, elements, copies):
        count = min(copies, elements - first)
        if count not in pullbacks:
            pullbacks[count] = copies_pullback(pullback, forest, count, linearize)
        add_jacobian_rows(pullbacks[count], forest, output, wrt, gathered, first, count,
                          jacobian)
    return jacobian.reshape((forest.num_nodes,) + shape + jacobian.shape[2:])


def copies_pullback(pullback, forest, copies, linearize):
    """`pullback` (of a run on `forest`) for the forest taken `copies` times
    (`Forest.concat`), the run's states and kept products copied to each: the forward runs
    once."""
    linearized = linearize(Forest.concat([forest.on_host()] * copies))
    original = pullback.linearized
    rows = original.new_of_old[linearized.old_of_new % forest.num_nodes]
    kernel = pullback.compiled.kernel if pullback.compiled is not None else None
    kept = {name: to_host(values) for name, values in pullback.kept.items()}
    kept = (kept_for_copies(kernel.kept, kept, original, linearized, rows,
                            kernel.distinct_key) if kernel is not None else {})
    return Pullback(pullback.cell, pullback.adjoints, linearized,
                    [state[rows] for state in pullback.states], pullback.params,
                    pullback.context, pullback.compiled, kept, pullback.guards)


def add_jacobian_rows(pullback, forest, output, wrt, gathered, first, count, jacobian):
    """Adds rows `first`..`first + count` of a jacobian (over state `output`'s elements) to
    `jacobian` (nodes, elements, *the field's or row's shape), from a pullback of the forest
    taken `count` times (`Forest.concat`: node n of copy k is its node k · nodes + n): copy
    k's roots get element first + k's unit cotangent. Each node's gradient goes straight to
    its place, with no array of the copies' rows first: a jacobian is hundreds of MB."""
    cell = pullback.cell
    shape = cell.state_shapes[output]
    units = np.zeros((count, int(np.prod(shape))), dtype=cell.dtype)
    units[np.arange(count), first + np.arange(count)] = 1
    roots = [None] * len(cell.state_shapes)
    roots[output] = np.repeat(units, forest.roots.size, axis=0).reshape((-1,) + shape)
    sink = pullback.backward(roots=tuple(roots) if cell.state_is_tuple else roots[0])
    for nodes, values in sink.parts_by_node(wrt, gathered):
        copy, node = np.divmod(nodes, forest.num_nodes)
        jacobian[node, first + copy] += values.reshape((-1,) + jacobian.shape[2:])
