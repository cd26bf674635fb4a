"""What a kernel's scalar, structure and field arguments are for one linearized forest: the
same for every backend, since the lowering named them."""
from dataclasses import dataclass

import numpy as np

from ..frontend.cell_ir import transposed
from ..linearize import distinct, parent_edges
from .ilir import ArgumentRole
from .lower import field_name, param_name


def forest_arguments(kernel, linearized, groups=None):
    """(scalars, arrays): the kernel's arguments that come from the forest, by name, and from
    a backward's `LeafGroups` `groups`; arrays are contiguous, scalar (index) fields int64
    and vector fields in the kernel's dtype, but for GPU fields, still as the forest holds
    them (`Linearized.unpermuted`)."""
    leaf_begin = linearized.leaf_begin
    scalars = {"num_nodes": linearized.num_nodes, "leaf_begin": leaf_begin,
               "num_batches": linearized.num_batches,
               "max_batch_size": linearized.max_batch_size,
               "max_level_size": max(linearized.max_batch_size,
                                     linearized.num_nodes - leaf_begin),
               "max_batch_edges": linearized.max_batch_edges}
    arrays = {"batch_begin": linearized.batch_begin, "child_ptr": linearized.child_ptr,
              "child_idx": linearized.child_idx}
    if "max_children" in kernel.scalars:
        scalars["max_children"] = int(np.diff(linearized.child_ptr).max(initial=0))
    if "root_node" in kernel.arrays:
        arrays["root_node"], scalars["num_roots"] = linearized.roots, linearized.roots.size
    if "parent_ptr" in kernel.arrays:
        arrays["parent_ptr"], arrays["parent_edge"] = parent_edges(linearized)
    if "item_begin" in kernel.arrays:
        arrays["batch_item"], arrays["item_begin"] = linearized.batch_item, linearized.item_begin
    if groups is not None:
        scalars["num_leaf_groups"] = groups.count
        arrays["group_ptr"], arrays["group_leaves"] = groups.ptr, groups.leaves
    if kernel.distinct_key:
        keys = linearized.fields[kernel.distinct_key][leaf_begin:]
        arrays["leaf_distinct"], arrays["leaf_slot"] = distinct(keys)
        scalars["num_distinct_leaves"] = arrays["leaf_distinct"].size
    for name, values in linearized.fields.items():
        if field_name(name) not in kernel.arrays:
            continue
        if name in linearized.unpermuted:
            arrays[field_name(name)] = values  # a GPU array, for the CUDA backend to reorder
            continue
        index = values.ndim == 1 and values.dtype.kind in "iu"  # `node.word`, else data
        dtype = np.int64 if index else np.dtype(kernel.dtype)
        arrays[field_name(name)] = np.ascontiguousarray(values, dtype=dtype)
    return scalars, arrays


@dataclass(frozen=True)
class LeafGroups:
    """The groups of leaves whose rows a backward kernel sums (`Kernel.group_key`): group g's
    leaves are `leaves[ptr[g]:ptr[g + 1]]`, numbered from the first leaf, and share the key."""

    ptr: np.ndarray
    leaves: np.ndarray

    @property
    def count(self):
        return self.ptr.size - 1

    def first_leaves(self):
        """Each group's first leaf, whose key (and tree) stand for the group's."""
        return self.leaves[self.ptr[:-1]]


def leaf_groups(kernel, linearized, trees=None):
    """The `LeafGroups` of backward `kernel` for this forest, or None where it sums none: the
    leaves of one key together, keys ascending; with `trees` (the tree of every node, for
    per-tree gradients), those of one tree and one key, trees then keys ascending."""
    if kernel.group_key is None:
        return None
    leaf_begin = linearized.leaf_begin
    keys = np.asarray(linearized.fields[kernel.group_key][leaf_begin:], dtype=np.int64)
    columns = (keys,) if trees is None else (keys, trees[leaf_begin:])
    leaves = np.lexsort(columns).astype(np.int64)
    same = np.ones(max(keys.size - 1, 0), dtype=bool)  # leaf i + 1 is in leaf i's group
    for column in columns:
        ordered = column[leaves]
        same &= ordered[1:] == ordered[:-1]
    ptr = (np.concatenate(([0], np.flatnonzero(~same) + 1, [keys.size])) if keys.size
           else np.zeros(1))
    return LeafGroups(ptr.astype(np.int64), leaves)


def kernel_parameters(kernel):
    """(argument, attribute) for each parameter the kernel takes: argument `p_W` is `p.W`."""
    return [(name, kernel.source(name)) for name in kernel.arrays_of(ArgumentRole.PARAMETER)]


def weight_shapes(shapes):
    """{kernel array: shape} for parameters' `shapes` by name: `p_W`, and for a matrix its
    transposed view `pT_W` too, which a product may multiply."""
    arrays = {param_name(name): shape for name, shape in shapes.items()}
    arrays.update((param_name(transposed(name)), shape[::-1])
                  for name, shape in shapes.items() if len(shape) == 2)
    return arrays
