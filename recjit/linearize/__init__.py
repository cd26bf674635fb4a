"""Forests and their linearization into the arrays kernels walk (docs/design.md §3)."""
from ..generated import guard_caches, key_caches_by
from . import linearizer, unroll
from .forest import Forest, random_bracketing
from .linearizer import (Linearized, distinct, edge_parents, first_outside, linearize,
                         node_trees, one_node_per_batch, parent_edges)
from .unroll import unroll_batches

guard_caches(linearizer, unroll)
key_caches_by(unroll, linearizer)

__all__ = ["Forest", "Linearized", "distinct", "edge_parents", "first_outside", "linearize",
           "node_trees", "one_node_per_batch", "parent_edges", "random_bracketing",
           "unroll_batches"]
