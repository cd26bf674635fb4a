"""What `run` and `reference` return."""
import numpy as np


class Result:
    """Per-node and per-root states: tuples with one array per returned value.

    `nodes[i][n]` is component i of node n's state, nodes in the forest's own order;
    `roots[i][r]` is the same for the forest's r-th root. A compiled run puts `nodes` in the
    forest's order on first use only (on a GPU, copies them back only then): most callers read
    the roots alone."""

    def __init__(self, nodes=None, roots=None, order_nodes=None):
        self._nodes = nodes
        self._order_nodes = order_nodes
        self.roots = roots

    @property
    def nodes(self):
        order_nodes = self._order_nodes
        if self._nodes is None and order_nodes is not None:
            self._nodes = order_nodes()
            self._order_nodes = None  # and whatever it holds on to
        return self._nodes

    @property
    def has_nodes(self):
        """Whether `nodes` is at hand, not yet to be put in order or copied back."""
        return self._nodes is not None

    @classmethod
    def from_nodes(cls, nodes, roots_index):
        nodes = tuple(np.asarray(a) for a in nodes)
        return cls(nodes=nodes, roots=tuple(a[roots_index] for a in nodes))

    @classmethod
    def from_linearized(cls, states, shapes, new_of_old, new_roots):
        """States in the linearized numbering (`states[i][new]`, flat per node). Rows are
        gathered with `take`, a third of the time of fancy indexing: this runs at every run."""
        return cls(roots=rows_in_order(states, shapes, new_roots),
                   order_nodes=lambda: rows_in_order(states, shapes, new_of_old))

    def __reduce__(self):
        """Pickled whole, its nodes put in order (on a GPU, copied back) now: a result
        crosses processes (a pool's worker returns it) without the lambda that orders them."""
        return type(self), (self.nodes, self.roots)

    def __repr__(self):
        """Short: how many roots, and each state component's shape and dtype (a notebook shows
        this, not every root's numbers)."""
        parts = ", ".join(f"{state.shape[1:]} {state.dtype}" for state in self.roots)
        count = self.roots[0].shape[0] if self.roots else 0
        return f"Result({count} roots; state: {parts})"


def rows_in_order(states, shapes, order):
    """Rows `order` of each flat state (`states[i][new]`), each row in its state's shape."""
    return tuple([state.take(order, axis=0).reshape((-1,) + shape)
                  for state, shape in zip(states, shapes)])
