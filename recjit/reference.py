"""The reference semantics: the user's own function, run as plain Python on node views.

Every node's cell runs exactly once, children before parents, and a recursive call on a child
returns the child's memoised state; that is the naive recursion's result without its Python
stack depth, so a chain of any length can be checked. It shares no code with the compiler."""
import threading
from typing import NamedTuple

import numpy as np

from .errors import InputError

_active = threading.local()


class NodeView:
    """A node of a forest as the cell function sees it."""

    __slots__ = ("forest", "index")

    def __init__(self, forest, index):
        self.forest = forest
        self.index = index

    @property
    def num_children(self):
        return int(self.forest.child_ptr[self.index + 1] - self.forest.child_ptr[self.index])

    @property
    def is_leaf(self):
        return self.num_children == 0

    @property
    def children(self):
        return [NodeView(self.forest, int(c)) for c in self.forest.children(self.index)]

    def child(self, k, name):
        children = self.forest.children(self.index)
        if k >= children.size:
            raise InputError(f"node {self.index} has {children.size} children; the cell reads "
                             f"node.{name}")
        return NodeView(self.forest, int(children[k]))

    @property
    def left(self):
        return self.child(0, "left")

    @property
    def right(self):
        return self.child(1, "right")

    def __getattr__(self, name):
        fields = self.forest.fields
        if name not in fields:
            raise InputError(f"the forest has no field {name!r}; its fields are {sorted(fields)}")
        value = fields[name][self.index]
        if np.ndim(value) == 0:  # an index, or a number that takes the parameters' dtype
            return int(value) if np.asarray(value).dtype.kind in "iu" else float(value)
        return value

    def __repr__(self):
        return f"NodeView({self.index})"


def memoised_state(forest, node, params, context=()):
    """The state of `node` if the running reference has computed it with these parameters and
    this context, else None (a call with others computes it as a plain call would)."""
    memo = getattr(_active, "memo", None)
    if memo is None or memo.forest is not forest or memo.params is not params \
            or len(memo.context) != len(context) \
            or any(a is not b for a, b in zip(memo.context, context)):
        return None
    return memo.states.get(node)


class Memo(NamedTuple):
    """The states the running reference has computed, and what it computes them with."""

    forest: object
    params: object
    context: tuple
    states: dict


def children_first(forest):
    """All nodes, every child before its parents (iterative depth-first search)."""
    order, state = [], np.zeros(forest.num_nodes, dtype=np.int8)
    for root in forest.roots:
        stack = [int(root)]
        while stack:
            node = stack[-1]
            if state[node] == 0:
                state[node] = 1
                stack.extend(int(c) for c in forest.children(node) if state[c] == 0)
            else:
                stack.pop()
                if state[node] == 1:
                    state[node] = 2
                    order.append(node)
    return order


def run_reference(function, forest, params, context=()):
    """Per-node states (a tuple per node) of `function` on every node reachable from a root;
    `context`: the cell's arguments after the parameters."""
    states = {}
    previous = getattr(_active, "memo", None)
    _active.memo = Memo(forest, params, context, states)
    try:
        for node in children_first(forest):
            states[node] = function(NodeView(forest, node), params, *context)
    finally:
        _active.memo = previous
    return states
