"""Levels of a forest for the level-batched peers. They use recjit's linearizer (about 15 µs for
10 SST trees), the cheapest preprocessing there is, so the comparison favours the peer."""
from dataclasses import dataclass

import numpy as np

from recjit.linearize import linearize


@dataclass
class Level:
    """Nodes begin..end-1 (new ids) of one height; their child edges, grouped by parent."""

    begin: int
    end: int
    child: np.ndarray  # the child of every edge, in the new numbering
    parent: np.ndarray  # the edge's parent, counted from `begin`
    arity: int  # children per node, or -1 where the level mixes arities


def levels(forest):
    """(linearized, [Level] from the leaves up)."""
    linearized = linearize(forest, single_parent=forest.kind != "dag")
    begins, ptr = linearized.batch_begin, linearized.child_ptr
    result = []
    for batch in range(linearized.num_batches - 1, -1, -1):
        begin, end = int(begins[batch]), int(begins[batch + 1])
        counts = np.diff(ptr[begin:end + 1])
        arity = int(counts[0]) if np.all(counts == counts[0]) else -1
        result.append(Level(begin, end, linearized.child_idx[ptr[begin]:ptr[end]],
                            np.repeat(np.arange(end - begin), counts), arity))
    return linearized, result


def children_first(forest):
    """Every node once, children before parents: the eager peers' evaluation order."""
    return linearize(forest, single_parent=forest.kind != "dag").old_of_new[::-1].tolist()
