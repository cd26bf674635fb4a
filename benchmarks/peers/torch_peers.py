"""PyTorch (CPU) peers running the cells of `cells.py`: eager recursion, one op per node as a
user writes it, and level-batched, one batched op per level (the DGL style). The same cell
serves both, since `x @ W.T` and `chunk(dim=-1)` apply to one vector and to a level's rows."""
from types import SimpleNamespace

import numpy as np
import torch

from .cells import CELLS, as_tuple, run_eager
from .levels import levels


class TorchOps:
    linear = staticmethod(lambda weight, x: x @ weight.T)
    matvec = staticmethod(lambda matrix, x: (matrix @ x.unsqueeze(-1)).squeeze(-1))
    matmul = staticmethod(lambda weight, matrix: weight @ matrix)
    mul = staticmethod(torch.mul)
    sigmoid, tanh, relu = torch.sigmoid, torch.tanh, torch.relu
    one_minus = staticmethod(lambda x: 1 - x)
    cat = staticmethod(lambda parts: torch.cat(parts, dim=-1))
    cat_rows = staticmethod(lambda parts: torch.cat(parts, dim=-2))
    split = staticmethod(lambda x, count: torch.chunk(x, count, dim=-1))
    row = staticmethod(lambda table, index: table[index])
    vector = staticmethod(lambda x: x)


def tensors(arrays):
    """{name: tensor sharing the NumPy array's memory}."""
    return {name: torch.from_numpy(np.ascontiguousarray(value)) for name, value in arrays.items()}


def parameters(params):
    """The parameters as attributes, like `p` in the recjit cell."""
    return SimpleNamespace(**tensors({name: getattr(params, name) for name in params.names()}))


class LevelNode:
    """All the nodes of one level at once: fields and child states are row-stacked."""

    def __init__(self, level, states, fields):
        self.level, self.states, self.fields = level, states, fields
        self.is_leaf = level.child.size == 0
        self.child = torch.from_numpy(level.child)

    def __getattr__(self, field):
        return self.fields[field][self.level.begin:self.level.end]

    @property
    def children(self):
        arity = self.level.arity
        return [tuple(s[self.child[k::arity]] for s in self.states) if len(self.states) > 1
                else self.states[0][self.child[k::arity]] for k in range(arity)]

    def sum(self, term):
        terms = term(*(s[self.child] for s in self.states))
        count = self.level.end - self.level.begin
        if self.level.arity > 0:
            return terms.reshape(count, self.level.arity, *terms.shape[1:]).sum(1)
        total = torch.zeros((count, *terms.shape[1:]), dtype=terms.dtype)
        return total.index_add_(0, torch.from_numpy(self.level.parent), terms)


def eager(cell):
    def factory(forest, params):
        p, fields = parameters(params), tensors(forest.fields)

        def run():
            with torch.no_grad():
                return torch.stack(run_eager(TorchOps, cell, forest, p, fields)).numpy()
        return run
    return factory


def level_batched(cell):
    def factory(forest, params):
        p = parameters(params)

        def run():
            with torch.no_grad():
                linearized, level_list = levels(forest)
                fields = tensors(linearized.fields)
                states = []
                for level in level_list:
                    values = as_tuple(cell(TorchOps, p, LevelNode(level, states, fields)))
                    if not states:
                        states = [torch.empty((linearized.num_nodes, *v.shape[1:]),
                                              dtype=v.dtype) for v in values]
                    for store, value in zip(states, values):
                        store[level.begin:level.end] = value
                return states[0][torch.from_numpy(linearized.roots)].numpy()
        return run
    return factory


EAGER = {name: eager(cell) for name, cell in CELLS.items()}
LEVELS = {name: level_batched(cell) for name, cell in CELLS.items()}
