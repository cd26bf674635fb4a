"""Batches for an unrolled recursion (`Schedule(unroll=k)`, Cortex §3.1).

A batch covers k consecutive heights of internal nodes. Inside it, each work item is a
maximal subtree of those heights: a node whose parent lies in a taller batch, and its
descendants within the batch. Items are independent, and one worker computes an item's nodes
one after another, children first, so a batch needs no barrier inside. Needs single parents:
trees and sequences."""
from dataclasses import replace

import numba
import numpy as np

from .linearizer import permuted_children, permuted_rows


@numba.njit(cache=True, nogil=True)
def _item_roots(child_ptr, child_idx, band, leaf_begin):
    """For every internal node, the root of its item: itself when its parent lies in another
    band (or it has none), else its parent's root. Parents are numbered before children."""
    root = np.arange(leaf_begin)
    for node in range(leaf_begin):
        for position in range(child_ptr[node], child_ptr[node + 1]):
            child = child_idx[position]
            if child < leaf_begin and band[child] == band[node]:
                root[child] = root[node]
    return root


def unroll_batches(linearized, depth, dynamic_batching=True):
    """Renumber a height-batched forest (single parents) into batches of `depth` heights
    split into items; with `dynamic_batching=False`, every item is a batch of its own."""
    leaf_begin = linearized.leaf_begin
    if leaf_begin == 0:
        return replace(linearized, batch_item=np.zeros(2, np.int64),
                       item_begin=np.zeros(1, np.int64))
    sizes = np.diff(linearized.batch_begin[:-1])
    height = np.repeat(np.arange(sizes.size, 0, -1), sizes)       # of each internal node
    band = (height - 1) // depth
    root = _item_roots(linearized.child_ptr, linearized.child_idx, band, leaf_begin)
    # Tallest band first, an item's nodes together; the stable sort keeps them parents first.
    order = np.argsort((band.max() - band) * leaf_begin + root, kind="stable")
    order = np.concatenate([order, np.arange(leaf_begin, linearized.num_nodes)])
    renumbered = _permute(linearized, order)
    root, band = root[order[:leaf_begin]], band[order[:leaf_begin]]
    item_starts = np.flatnonzero(np.diff(root, prepend=-1) != 0)
    item_begin = np.append(item_starts, leaf_begin)
    if dynamic_batching:
        band_of_item = band[item_starts]
        batch_item = np.append(np.flatnonzero(np.diff(band_of_item, prepend=-1) != 0),
                               item_starts.size)
    else:
        batch_item = np.arange(item_starts.size + 1)
    batch_begin = np.append(item_begin[batch_item], linearized.num_nodes)
    batch_sizes = np.diff(batch_begin[:-1])
    edges = np.diff(renumbered.child_ptr[batch_begin[:-1]])
    return replace(renumbered, batch_begin=batch_begin.astype(np.int64),
                   batch_item=batch_item.astype(np.int64), item_begin=item_begin.astype(np.int64),
                   max_batch_size=int(batch_sizes.max()), max_batch_edges=int(edges.max()))


def _permute(linearized, order):
    """The same forest with node `order[new]` renumbered `new`."""
    new_of_current = np.empty_like(order)
    new_of_current[order] = np.arange(order.size)
    child_ptr, child_idx = permuted_children(linearized.child_ptr, linearized.child_idx,
                                             order, new_of_current)
    old_of_new = linearized.old_of_new[order]
    new_of_old = np.empty_like(old_of_new)
    new_of_old[old_of_new] = np.arange(order.size)
    return replace(linearized, child_ptr=child_ptr, child_idx=child_idx,
                   roots=new_of_current[linearized.roots], old_of_new=old_of_new,
                   new_of_old=new_of_old,
                   fields={name: values if name in linearized.unpermuted
                           else permuted_rows(values, order)
                           for name, values in linearized.fields.items()})
