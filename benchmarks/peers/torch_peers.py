"""PyTorch peers running the cells of `cells.py`: eager recursion, one op per node as a user
writes it, and level-batched, one batched op per level (the DGL style), on the CPU or, when
PyTorch sees one, on the GPU. The same cell serves both, since `x @ W.T` and `chunk(dim=-1)`
apply to one vector and to a level's rows."""
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


def tensors(arrays, device="cpu"):
    """{name: tensor}; on the CPU sharing the NumPy array's memory."""
    return {name: torch.from_numpy(np.ascontiguousarray(value)).to(device)
            for name, value in arrays.items()}


def parameters(params, device="cpu"):
    """The parameters as attributes, like `p` in the recjit cell."""
    return SimpleNamespace(**tensors({name: getattr(params, name) for name in params.names()},
                                     device))


class LevelNode:
    """All the nodes of one level at once: fields and child states are row-stacked."""

    def __init__(self, level, states, fields, device):
        self.level, self.states, self.fields, self.device = level, states, fields, device
        self.is_leaf = level.child.size == 0
        self.child = torch.from_numpy(level.child).to(device)

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
        total = torch.zeros((count, *terms.shape[1:]), dtype=terms.dtype, device=self.device)
        return total.index_add_(0, torch.from_numpy(self.level.parent).to(self.device), terms)


def eager(cell):
    def factory(forest, params):
        p, fields = parameters(params), tensors(forest.fields)

        def run():
            with torch.no_grad():
                return torch.stack(run_eager(TorchOps, cell, forest, p, fields)).numpy()
        return run
    return factory


def level_batched(cell, device="cpu"):
    def factory(forest, params):
        p = parameters(params, device)

        def run():
            with torch.no_grad():
                linearized, level_list = levels(forest)
                fields = tensors(linearized.fields, device)
                states = []
                for level in level_list:
                    values = as_tuple(cell(TorchOps, p, LevelNode(level, states, fields,
                                                                  device)))
                    if not states:
                        states = [torch.empty((linearized.num_nodes, *v.shape[1:]),
                                              dtype=v.dtype, device=device) for v in values]
                    for store, value in zip(states, values):
                        store[level.begin:level.end] = value
                roots = torch.from_numpy(linearized.roots).to(device)
                return states[0][roots].cpu().numpy()
        return run
    return factory


EAGER = {name: eager(cell) for name, cell in CELLS.items()}
LEVELS = {name: level_batched(cell) for name, cell in CELLS.items()}
LEVELS_CUDA = ({name: level_batched(cell, "cuda") for name, cell in CELLS.items()}
               if torch.cuda.is_available() else {})
