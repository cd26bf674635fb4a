"""What `run` and `reference` return."""
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Result:
    """Per-node and per-root states: tuples with one array per returned value.

    `nodes[i][n]` is component i of node n's state, nodes in the forest's own order;
    `roots[i][r]` is the same for the forest's r-th root."""

    nodes: tuple
    roots: tuple

    @classmethod
    def from_nodes(cls, nodes, roots_index):
        nodes = tuple(np.asarray(a) for a in nodes)
        return cls(nodes=nodes, roots=tuple(a[roots_index] for a in nodes))
