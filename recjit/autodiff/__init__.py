"""Reverse mode through the compiled recursion (docs/training.md): the adjoint of the cell IR,
evaluated a batch at a time, roots first."""
from ..generated import guard_caches
from . import pullback
from .adjoint import AdjointCase, adjoint_case
from .gradients import Gradients, RowGrad
from .pullback import Pullback, copied_parameters, parameter_guards, tree_of_nodes

guard_caches(pullback)

__all__ = ["AdjointCase", "Gradients", "Pullback", "RowGrad", "adjoint_case",
           "copied_parameters", "parameter_guards", "tree_of_nodes"]
