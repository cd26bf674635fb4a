"""The numba-jitted linearizer (docs/design.md §3, Cortex §4.2 and appendix B).

It renumbers a forest so that every batch (all nodes of one height, across the whole forest) is
a contiguous range, parents are numbered below their children and the leaves come last; a batch
is then `batch_begin[b] .. batch_begin[b+1]` and "is leaf" is `n >= leaf_begin`. Everything is
O(nodes + edges) in compiled code and validates the structure on the way."""
from dataclasses import dataclass, field, replace

import numba
import numpy as np

from ..errors import InputError

OK = 0
BAD_CHILD_PTR = 1
CHILD_OUT_OF_RANGE = 2
ROOT_OUT_OF_RANGE = 3
TWO_PARENTS = 4
ROOT_IS_CHILD = 5
CYCLE = 6
ORPHAN = 7
WRONG_ARITY = 8
ANY_ARITY = -1
# How a forest's numbering orders the ends of every edge (`_check_structure`).
PARENTS_FIRST = 0
CHILDREN_FIRST = 1
MIXED = 2


@numba.njit(cache=True, nogil=True)
def _check_structure(child_ptr, child_idx, roots, single_parent, arity):
    """Returns (status, culprit node, parent count per node, the order every edge keeps in
    the numbering: PARENTS_FIRST, CHILDREN_FIRST or MIXED). `arity` >= 0: every node has
    0 or `arity` children."""
    num_nodes = child_ptr.size - 1
    parent_count = np.zeros(num_nodes, dtype=np.int64)
    parents_first = children_first = True
    if child_ptr[0] != 0 or child_ptr[num_nodes] != child_idx.size:
        return BAD_CHILD_PTR, 0, parent_count, MIXED
    for node in range(num_nodes):
        if child_ptr[node] > child_ptr[node + 1]:
            return BAD_CHILD_PTR, node, parent_count, MIXED
        num_children = child_ptr[node + 1] - child_ptr[node]
        if arity != ANY_ARITY and num_children != 0 and num_children != arity:
            return WRONG_ARITY, node, parent_count, MIXED
        for position in range(child_ptr[node], child_ptr[node + 1]):
            child = child_idx[position]
            if child < 0 or child >= num_nodes:
                return CHILD_OUT_OF_RANGE, node, parent_count, MIXED
            parent_count[child] += 1
            if single_parent and parent_count[child] > 1:
                return TWO_PARENTS, child, parent_count, MIXED
            parents_first &= child > node
            children_first &= child < node
    is_root = np.zeros(num_nodes, dtype=np.bool_)
    for position in range(roots.size):
        root = roots[position]
        if root < 0 or root >= num_nodes:
            return ROOT_OUT_OF_RANGE, position, parent_count, MIXED
        if parent_count[root] > 0:
            return ROOT_IS_CHILD, root, parent_count, MIXED
        is_root[root] = True
    for node in range(num_nodes):
        if parent_count[node] == 0 and not is_root[node]:
            return ORPHAN, node, parent_count, MIXED
    order = PARENTS_FIRST if parents_first else CHILDREN_FIRST if children_first else MIXED
    return OK, 0, parent_count, order


@numba.njit(cache=True, nogil=True)
def _heights_in_order(child_ptr, child_idx, order):
    """Height of every node in one pass, where every edge keeps `order` (PARENTS_FIRST, as
    pre-order numbers a tree, or CHILDREN_FIRST): each child's height is known before its
    parent's, and no cycle is possible."""
    num_nodes = child_ptr.size - 1
    height = np.zeros(num_nodes, dtype=np.int64)
    for step in range(num_nodes):
        node = num_nodes - 1 - step if order == PARENTS_FIRST else step
        for position in range(child_ptr[node], child_ptr[node + 1]):
            height[node] = max(height[node], height[child_idx[position]] + 1)
    return height


@numba.njit(cache=True, nogil=True)
def _heights(child_ptr, child_idx, parent_count):
    """Height of every node (longest path down to a leaf) by Kahn's algorithm from the leaves.
    Returns (heights, a node on a cycle or -1)."""
    num_nodes = child_ptr.size - 1
    parent_ptr = np.zeros(num_nodes + 1, dtype=np.int64)
    for node in range(num_nodes):
        parent_ptr[node + 1] = parent_ptr[node] + parent_count[node]
    fill = parent_ptr[:-1].copy()
    parent_idx = np.empty(child_idx.size, dtype=np.int64)
    for node in range(num_nodes):
        for position in range(child_ptr[node], child_ptr[node + 1]):
            child = child_idx[position]
            parent_idx[fill[child]] = node
            fill[child] += 1
    pending = np.empty(num_nodes, dtype=np.int64)
    height = np.zeros(num_nodes, dtype=np.int64)
    queue = np.empty(num_nodes, dtype=np.int64)
    queue_end = 0
    for node in range(num_nodes):
        pending[node] = child_ptr[node + 1] - child_ptr[node]
        if pending[node] == 0:
            queue[queue_end] = node
            queue_end += 1
    queue_begin = 0
    while queue_begin < queue_end:
        child = queue[queue_begin]
        queue_begin += 1
        for position in range(parent_ptr[child], parent_ptr[child + 1]):
            parent = parent_idx[position]
            if height[child] + 1 > height[parent]:
                height[parent] = height[child] + 1
            pending[parent] -= 1
            if pending[parent] == 0:
                queue[queue_end] = parent
                queue_end += 1
    if queue_end < num_nodes:
        for node in range(num_nodes):
            if pending[node] > 0:
                return height, node
    return height, -1


@numba.njit(cache=True, nogil=True)
def permuted_children(child_ptr, child_idx, old_of_new, new_of_old):
    """The children CSR (child_ptr, child_idx) in a new numbering of the nodes."""
    num_nodes = child_ptr.size - 1
    new_child_ptr = np.zeros(num_nodes + 1, dtype=np.int64)
    for new in range(num_nodes):
        old = old_of_new[new]
        new_child_ptr[new + 1] = new_child_ptr[new] + child_ptr[old + 1] - child_ptr[old]
    return new_child_ptr, placed_children(child_ptr, child_idx, new_child_ptr, new_of_old)


@numba.njit(cache=True, nogil=True)
def placed_children(child_ptr, child_idx, new_child_ptr, new_of_old):
    """child_idx in a new numbering, each node's children at the offset `new_child_ptr`
    gives its new number."""
    new_child_idx = np.empty(child_idx.size, dtype=np.int64)
    for node in range(child_ptr.size - 1):
        offset = new_child_ptr[new_of_old[node]] - child_ptr[node]
        for position in range(child_ptr[node], child_ptr[node + 1]):
            new_child_idx[position + offset] = new_of_old[child_idx[position]]
    return new_child_idx


@numba.njit(cache=True, nogil=True)
def _renumber(child_ptr, child_idx, height):
    """Counting sort by height, highest first; stable in the original order within a batch.
    A batch's children are contiguous too, in the same order, so a node's first child's new
    position is its batch's running count of edges: one pass places the nodes, a second
    their children (`placed_children`)."""
    num_nodes = child_ptr.size - 1
    max_height = 0
    for node in range(num_nodes):
        max_height = max(max_height, height[node])
    num_batches = max_height + 1
    batch_begin = np.zeros(num_batches + 1, dtype=np.int64)
    edge_begin = np.zeros(num_batches + 1, dtype=np.int64)
    for node in range(num_nodes):
        batch = max_height - height[node]
        batch_begin[batch + 1] += 1
        edge_begin[batch + 1] += child_ptr[node + 1] - child_ptr[node]
    for batch in range(num_batches):
        batch_begin[batch + 1] += batch_begin[batch]
        edge_begin[batch + 1] += edge_begin[batch]
    node_fill = batch_begin[:-1].copy()
    edge_fill = edge_begin[:-1].copy()
    new_of_old = np.empty(num_nodes, dtype=np.int64)
    old_of_new = np.empty(num_nodes, dtype=np.int64)
    new_child_ptr = np.empty(num_nodes + 1, dtype=np.int64)
    new_child_ptr[num_nodes] = child_idx.size
    for node in range(num_nodes):
        batch = max_height - height[node]
        new = node_fill[batch]
        node_fill[batch] = new + 1
        new_of_old[node] = new
        old_of_new[new] = node
        new_child_ptr[new] = edge_fill[batch]
        edge_fill[batch] += child_ptr[node + 1] - child_ptr[node]
    new_child_idx = placed_children(child_ptr, child_idx, new_child_ptr, new_of_old)
    max_batch_size = 0
    max_batch_edges = 0
    for batch in range(num_batches - 1):
        max_batch_size = max(max_batch_size, batch_begin[batch + 1] - batch_begin[batch])
        max_batch_edges = max(max_batch_edges, edge_begin[batch + 1] - edge_begin[batch])
    return (batch_begin, new_of_old, old_of_new, new_child_ptr, new_child_idx, max_batch_size,
            max_batch_edges)


@numba.njit(cache=True, nogil=True)
def _linearize(child_ptr, child_idx, roots, single_parent, arity):
    """Validation, heights and renumbering in one compiled call: (status, culprit node, then
    `_renumber`'s arrays and maxima, empty when the status is not OK). Forests numbered in
    either order along every edge (pre-order trees, sequences, most DAG builders) get their
    heights in one pass; any other numbering goes through Kahn's algorithm, which also finds
    cycles."""
    empty = np.zeros(0, dtype=np.int64)
    status, culprit, parent_count, order = _check_structure(child_ptr, child_idx, roots,
                                                            single_parent, arity)
    if status != OK:
        return status, culprit, empty, empty, empty, empty, empty, 0, 0
    if order == MIXED:
        height, on_cycle = _heights(child_ptr, child_idx, parent_count)
        if on_cycle >= 0:
            return CYCLE, on_cycle, empty, empty, empty, empty, empty, 0, 0
    else:
        height = _heights_in_order(child_ptr, child_idx, order)
    return (OK, 0) + _renumber(child_ptr, child_idx, height)


@dataclass(frozen=True)
class Linearized:
    """A forest in Cortex's numbering. Batch b holds the nodes of height num_batches-1-b, so
    batch 0 is the tallest and the last batch is the leaves; kernels run the batches from the
    last to the first. Fields are in the new numbering; `old_of_new`/`new_of_old` convert."""

    num_nodes: int
    batch_begin: np.ndarray
    child_ptr: np.ndarray
    child_idx: np.ndarray
    roots: np.ndarray
    old_of_new: np.ndarray
    new_of_old: np.ndarray
    fields: dict
    max_batch_size: int = 0  # the largest batch of internal nodes: what per-batch scratch holds
    max_batch_edges: int = 0  # the most child edges of one internal batch: per-child scratch
    # Unrolled (`unroll_batches`): batch b runs the work items batch_item[b]..batch_item[b+1],
    # item i the nodes item_begin[i]..item_begin[i+1], parents first.
    batch_item: np.ndarray = None
    item_begin: np.ndarray = None
    # Fields still in the forest's numbering: GPU arrays, which a CUDA run puts in this
    # numbering on the device (reading them through `old_of_new`).
    unpermuted: frozenset = frozenset()
    # The first leaf (the last batch's first node); read several times a run, so kept.
    leaf_begin: int = field(init=False)

    def __post_init__(self):
        leaf_begin = int(self.batch_begin[-2]) if self.batch_begin.size > 1 else 0
        object.__setattr__(self, "leaf_begin", leaf_begin)

    @property
    def num_batches(self):
        return self.batch_begin.size - 1

    @property
    def num_leaves(self):
        return self.num_nodes - self.leaf_begin

    def __str__(self):
        sizes = np.diff(self.batch_begin)
        on_device = (f"; GPU fields {', '.join(sorted(self.unpermuted))} still in the forest's "
                     "order (a CUDA run reorders them on the device)" if self.unpermuted else "")
        return (f"Linearized: {self.num_nodes} nodes, {self.num_leaves} leaves, "
                f"{self.num_batches} batches (sizes {sizes.tolist()}){on_device}")


# Rows of floats, this many elements or more, are gathered in compiled code (`permuted_rows`).
WIDE_ROW = 64
GATHERED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@numba.njit(cache=True, nogil=True)
def _gather_rows(values, order):
    permuted = np.empty((order.size, values.shape[1]), values.dtype)
    for row in range(order.size):
        source = order[row]
        for column in range(values.shape[1]):
            permuted[row, column] = values[source, column]
    return permuted


def permuted_rows(values, order):
    """values[order]. Wide rows go through a compiled loop, faster than NumPy's fancy
    indexing for DAG-RNN's 256 features a node; narrow ones, a word a node, and other dtypes
    through NumPy."""
    if values.ndim < 2 or values[0].size < WIDE_ROW or values.dtype not in GATHERED_DTYPES:
        return values[order]
    rows = _gather_rows(values.reshape(values.shape[0], -1), order)
    return rows.reshape((order.size,) + values.shape[1:])


def native(values):
    """`values` in the machine's byte order, which compiled code reads (a field read from a
    big-endian file, `>i8`, holds the same numbers)."""
    return values if values.dtype.isnative else values.astype(values.dtype.newbyteorder("="))


def _structure_error(status, culprit, forest, arity):
    if status == WRONG_ARITY:
        return InputError(f"node {culprit} has {int(forest.num_children[culprit])} children; "
                          f"the model declares arity={arity} (0 or {arity} children). A cell "
                          "for any number of children is declared "
                          "@rj.recursive_model(arity=None) and loops over node.children")
    messages = {
        BAD_CHILD_PTR: f"child_ptr is not a monotone offset array (at node {culprit}; it must "
                       f"start at 0 and end at len(child_idx) = {forest.child_idx.size})",
        CHILD_OUT_OF_RANGE: f"node {culprit} has a child outside 0..{forest.num_nodes - 1}",
        ROOT_OUT_OF_RANGE: f"root #{culprit} is outside 0..{forest.num_nodes - 1}",
        TWO_PARENTS: f"node {culprit} has two parents, which a tree does not: shared "
                     f"nodes need a forest of kind='dag' and a model declared "
                     f"@rj.recursive_model(kind='dag')",
        ROOT_IS_CHILD: f"root node {culprit} is also a child of another node",
        ORPHAN: f"node {culprit} is neither a root nor anyone's child",
        CYCLE: f"node {culprit} lies on a cycle or depends on one; a forest must be acyclic",
    }
    return InputError(messages[status])


def check_structure(forest):
    """Raise the InputError `linearize` would for this forest's CSR arrays and roots, of any
    arity, shared nodes allowed (cycles aside: its heights find those)."""
    status, culprit, _, _ = _check_structure(forest.child_ptr, forest.child_idx, forest.roots,
                                             False, ANY_ARITY)
    if status != OK:
        raise _structure_error(status, culprit, forest, None)


def first_bad_structure(forests, child_ptr, child_idx, roots, bounds):
    """(the position among `forests` of the first whose structure `check_structure` refuses,
    its InputError), or None: their arrays laid end to end, unshifted (`child_ptr`,
    `child_idx`, `roots`; forest k's from bounds[0][k], bounds[1][k], bounds[2][k]), checked
    in one compiled call, where a call a forest cost more than its check."""
    position, status, culprit = _first_bad_structure(child_ptr, child_idx, roots, *bounds)
    if position < 0:
        return None
    return position, _structure_error(status, culprit, forests[position], None)


@numba.njit(cache=True, nogil=True)
def _first_bad_structure(child_ptr, child_idx, roots, ptr_begin, idx_begin, roots_begin):
    for k in range(ptr_begin.size - 1):
        status, culprit, _, _ = _check_structure(
            child_ptr[ptr_begin[k]:ptr_begin[k + 1]], child_idx[idx_begin[k]:idx_begin[k + 1]],
            roots[roots_begin[k]:roots_begin[k + 1]], False, ANY_ARITY)
        if status != OK:
            return k, status, culprit
    return -1, OK, 0


def linearize(forest, single_parent=True, arity=None):
    """Validate the forest's structure and renumber it (docs/design.md §3). `single_parent`: a tree,
    where a node reached from two parents is an error; otherwise a DAG. `arity`: every node
    has 0 or `arity` children (None: any number)."""
    if forest.num_nodes == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Linearized(0, np.zeros(1, np.int64), np.zeros(1, np.int64), empty, empty, empty,
                          empty, dict(forest.fields), unpermuted=forest.device_fields)
    (status, culprit, batch_begin, new_of_old, old_of_new, child_ptr, child_idx,
     max_batch_size, max_batch_edges) = _linearize(
        forest.child_ptr, forest.child_idx, forest.roots, single_parent,
        ANY_ARITY if arity is None else arity)
    if status != OK:
        raise _structure_error(status, culprit, forest, arity)
    fields = {name: permuted_rows(native(values), old_of_new)
              for name, values in forest.fields.items() if isinstance(values, np.ndarray)}
    linearized = Linearized(forest.num_nodes, batch_begin, child_ptr, child_idx,
                            new_of_old[forest.roots], old_of_new, new_of_old, fields,
                            int(max_batch_size), int(max_batch_edges))
    if len(fields) == len(forest.fields):
        return linearized
    unpermuted = forest.device_fields
    fields.update((name, forest.fields[name]) for name in unpermuted)
    return replace(linearized, unpermuted=unpermuted)


@numba.njit(cache=True, nogil=True)
def _distinct(values):
    num_values = values.size
    largest = 0
    for position in range(num_values):
        largest = max(largest, values[position])
    slot_of_value = np.full(largest + 1, -1, dtype=np.int64)
    first = np.empty(num_values, dtype=np.int64)
    slot = np.empty(num_values, dtype=np.int64)
    count = 0
    for position in range(num_values):
        value = values[position]
        if slot_of_value[value] < 0:
            slot_of_value[value] = count
            first[count] = position
            count += 1
        slot[position] = slot_of_value[value]
    return first[:count].copy(), slot


def distinct(values):
    """(first, slot) for non-negative integer `values`: `first[d]` is the position where the
    d-th distinct value first occurs, `slot[i]` the number d of `values[i]`. Lets a kernel
    compute what depends only on a leaf's word once per word. O(n + max value)."""
    return _distinct(np.ascontiguousarray(values, dtype=np.int64))


@numba.njit(cache=True, nogil=True)
def _first_outside(values, rows):
    for position in range(values.size):
        if values[position] < 0 or values[position] >= rows:
            return position
    return -1


def first_outside(values, rows):
    """The first position whose value is not a row index of a table of `rows` rows, or -1."""
    return int(_first_outside(np.ascontiguousarray(values).reshape(-1), rows))


@numba.njit(cache=True, nogil=True)
def _node_trees(child_ptr, child_idx, roots):
    tree = np.full(child_ptr.size - 1, -1, dtype=np.int64)
    for position in range(roots.size):
        if tree[roots[position]] >= 0:
            return tree, roots[position]
        tree[roots[position]] = position
    for node in range(child_ptr.size - 1):
        for edge in range(child_ptr[node], child_ptr[node + 1]):
            child = child_idx[edge]
            if tree[child] >= 0 and tree[child] != tree[node]:
                return tree, child
            tree[child] = tree[node]
    return tree, -1


def node_trees(linearized):
    """(the tree of every node, its position in `roots`; the first node two trees share, a
    root listed twice among them, or -1), in this numbering. A node's parents come before it
    here (the taller batches first), so one pass in order hands each root's position down."""
    tree, shared = _node_trees(linearized.child_ptr, linearized.child_idx,
                               np.ascontiguousarray(linearized.roots, dtype=np.int64))
    return tree, int(shared)


def edge_parents(linearized):
    """The parent of every edge (a position in `child_idx`), in this numbering: the internal
    node whose children it lists."""
    leaf_begin = linearized.leaf_begin
    return np.repeat(np.arange(leaf_begin), np.diff(linearized.child_ptr[:leaf_begin + 1]))


def parent_edges(linearized):
    """(parent_ptr, parent_edge): node n's edges from its parents are
    parent_edge[parent_ptr[n]:parent_ptr[n + 1]], positions in `child_idx` (a DAG's backward
    gathers what each parent sent it)."""
    edges = linearized.child_idx
    parent_edge = np.argsort(edges, kind="stable").astype(np.int64)
    counts = np.bincount(edges, minlength=linearized.num_nodes)
    parent_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return parent_ptr, parent_edge


def one_node_per_batch(linearized):
    """The same numbering with every internal node a batch of its own, the children's
    batches first (`Schedule(dynamic_batching=False)`); the leaves stay one batch."""
    leaf_begin = linearized.leaf_begin
    batch_begin = np.append(np.arange(leaf_begin + 1, dtype=np.int64), linearized.num_nodes)
    children = np.diff(linearized.child_ptr[:leaf_begin + 1])
    return replace(linearized, batch_begin=batch_begin, max_batch_size=min(leaf_begin, 1),
                   max_batch_edges=int(children.max(initial=0)))
