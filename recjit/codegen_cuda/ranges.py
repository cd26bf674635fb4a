"""Node ranges: at a large batch the blocks split its nodes as well as its hidden units.

With the units split (`units.py`) and E units on B blocks, each block owns ⌈E / B⌉ units
(TreeFC h256 on an H100: 2) and multiplies every node of the batch: it reads every node's
inputs, and a warp's four-row item computes two rows twice. At a batch of 640 nodes (ten
perfect trees of height 7, the first level up) each of 128 blocks stages 640 nodes' inputs
of 2 KiB from L2 for its two rows: 27 tiles, 168 MB read by the grid, for products a tenth
of that would feed.

So a batch of `count` nodes is split in r ranges of nodes, and the units in ⌊B / r⌋ groups:
block b computes group b mod ⌊B / r⌋'s units for range ⌊b / ⌊B / r⌋⌋'s nodes, the products'
rows and the elementwise ops both (`runtime.range_share`), so it still reads only the
products it computed and the block barrier between them stands. The grid reads the inputs
once per group and the weights once per range; r balances the two, the most with
r² · balance ≤ B · count, `balance` the weights' elements per input column a node
multiplies (TreeFC: 256, so r = 18 at 640 nodes, r = 1 below 4 nodes; `runtime.node_ranges`).
At r = 1 the split is the units' alone, as before. A block's slice of a weight kept in shared
memory holds its units at r = 1; at r > 1 the products read the weight's rows through L1 and
L2 instead.

A kernel's batches are ranged when every product of a unit-split array in the batch loop
multiplies a row per node of the batch (`count`), `a` rows per node (a binary TreeLSTM's
U_f), or a row per edge of the batch's nodes (a child-sum model's U_f), writing y's rows as
they are; when every loop that reads one runs over the batch's nodes and reads the rows of
its own node; and when the batch loop runs no unrolled items. Refactored products, which a
parent in the next batch reads, leave the kernel unranged."""
from dataclasses import dataclass, field

from ..lowering.ilir import BinOp, Const, If, Let, Load, Loop, MatMul, Var, add, walk
from .packs import item_part
from .units import edge_loop_node, loads, places

# How many input columns a node's row per edge stands for, in the balance: a binary node's.
EDGES_A_NODE = 2


@dataclass(frozen=True)
class InputRows:
    """The rows of a product's inputs that the nodes first_node ... first_node + nodes - 1 of
    a batch stand for: `per_node` rows each (a row per node, or a binary TreeLSTM's two), or,
    with `edges_of` set, their edges' rows, the edges counted from child_ptr[`edges_of`]
    (the batch's first node), which the kernel names `edge_base`."""

    per_node: int = 1
    edges_of: object = None
    edge_base: str = None

    def first(self):
        """The first row, an ILIR expression of `first_node`."""
        if self.edges_of is None:
            return _times(Var("first_node"), self.per_node)
        return BinOp("-", self._edge(Var("first_node")), Var(self.edge_base))

    def count(self):
        """How many rows, an ILIR expression of `first_node` and `nodes`."""
        if self.edges_of is None:
            return _times(Var("nodes"), self.per_node)
        return BinOp("-", self._edge(add(Var("first_node"), Var("nodes"))),
                     self._edge(Var("first_node")))

    def _edge(self, node):
        return Load("child_ptr", (add(self.edges_of, node),))


@dataclass(frozen=True)
class NodeRanges:
    """`after`: the place (`units.Statements.place`) of the `Let` of the batch's node count,
    past which the kernel computes the ranges and its block's share; `units`: the units the
    ranged statements split; `products`: {the place of a ranged product: its `InputRows`};
    `loops`: the places of the ranged loops; `balance`: the weights' elements per input column
    a node multiplies. Empty: the kernel's batches are not ranged."""

    after: tuple = None
    units: int = None
    products: dict = field(default_factory=dict)
    loops: frozenset = frozenset()
    balance: int = 1


NO_RANGES = NodeRanges()


def node_ranges(kernel, split, weight_shapes):
    """The `NodeRanges` of a fused kernel whose blocks split the units as `split` says
    (`units.UnitSplit`), for `weight_shapes` {weight: (rows, columns)}."""
    if not split.arrays:
        return NO_RANGES
    batch_loops = [index for index, statement in enumerate(kernel.body)
                   if isinstance(statement, Loop) and not statement.parallel]
    if len(batch_loops) != 1:
        return NO_RANGES
    body = split.kernel_body.inner(batch_loops[0])
    if any(isinstance(loop, Loop) and loop.one_worker for loop in walk(body.items)):
        return NO_RANGES
    lets = {statement.name: (index, statement) for index, statement in enumerate(body)
            if isinstance(statement, Let)}
    products = {statements.place(index): statements[index] for statements, index in places(body)
                if isinstance(statements[index], MatMul) and statements[index].y in split.arrays}
    loops = {place: loop for place, loop in _parallel_loops(body) if split.loop_units(loop)}
    counts = {loop.stop for loop in loops.values()}
    if not products or len(counts) != 1 or not isinstance(next(iter(counts)), Var) \
            or next(iter(counts)).name not in lets:
        return NO_RANGES
    count = counts.pop()
    values = {name: statement for name, (_, statement) in lets.items()}
    rows = {place: _input_rows(product, count, values) for place, product in products.items()}
    units = {split.arrays[product.y] for product in products.values()}
    if None in rows.values() or any(product.y_row is not None for product in products.values()) \
            or len(units) != 1 or any(split.loop_units(loop) not in units
                                      for loop in loops.values()):
        return NO_RANGES
    by_array = {product.y: rows[place] for place, product in products.items()}
    # What the batches read of the units split before them, the grid met on before they began.
    before = set(split.arrays) - set(by_array)
    if before and not split.grid_met_before(split.kernel_body, batch_loops[0]):
        return NO_RANGES
    readers = {statements.place(index) for statements, index in places(split.kernel_body)
               if isinstance(statements[index], Loop) and statements[index].parallel
               and any(load.array in by_array for load in loads(statements[index].body))}
    if readers - set(loops) or not all(_reads_own_rows(loop, by_array, values)
                                       for loop in loops.values()):
        return NO_RANGES
    return NodeRanges(body.place(lets[count.name][0]), units.pop(), rows, frozenset(loops),
                      balance(products, rows, weight_shapes))


def _parallel_loops(body):
    """(place, loop) of the parallel loops in `body` (`units.Statements`), inside branches
    too."""
    for index, statement in enumerate(body):
        if isinstance(statement, Loop) and statement.parallel:
            yield body.place(index), statement
        elif isinstance(statement, If):
            yield from _parallel_loops(body.inner(index, "body"))
            yield from _parallel_loops(body.inner(index, "orelse"))


def _input_rows(product, count, lets):
    """The `InputRows` of a product of `count`'s nodes, or None where its rows are none of
    those the module names."""
    rows = product.rows
    if rows == count:
        return InputRows()
    if (isinstance(rows, BinOp) and rows.operator == "*" and rows.left == count
            and isinstance(rows.right, Const)):
        return InputRows(per_node=int(rows.right.value))
    if not isinstance(rows, Var) or rows.name not in lets:
        return None
    edges = lets[rows.name].value  # child_ptr[first + count] - edge_base
    if not (isinstance(edges, BinOp) and edges.operator == "-" and isinstance(edges.right, Var)
            and edges.right.name in lets and isinstance(edges.left, Load)
            and edges.left.array == "child_ptr"):
        return None
    base = lets[edges.right.name].value  # child_ptr[first]
    if not (isinstance(base, Load) and base.array == "child_ptr"
            and edges.left.index == (add(base.index[0], count),)):
        return None
    return InputRows(edges_of=base.index[0], edge_base=edges.right.name)


def _reads_own_rows(loop, by_array, lets):
    """Whether `loop`, over the batch's nodes (index `loop.var`), reads every ranged product's
    output at a row its own node stands for: slot, a · slot + j for a per-node `a` > j, or
    edge - edge_base inside the loop over the node's edges (node = first + slot)."""
    node_lets = {statement.name: statement.value for statement in walk(loop.body)
                 if isinstance(statement, Let)}
    edge_loops = {statement.var: statement for statement in walk(loop.body)
                  if isinstance(statement, Loop) and edge_loop_node(statement) is not None}
    for load in loads(loop.body):
        rows = by_array.get(load.array)
        if rows is None:
            continue
        row = load.index[0]
        if rows.edges_of is None:
            part = item_part(row, loop.var)
            if part is None or part[0] != rows.per_node:
                return False
        elif not _edge_of_own_node(row, rows, loop.var, node_lets, edge_loops):
            return False
    return True


def _edge_of_own_node(row, rows, slot, node_lets, edge_loops):
    """Whether `row` is edge - edge_base, `edge` the variable of a loop from child_ptr[node]
    to child_ptr[node + 1], node bound to first + slot."""
    if not (isinstance(row, BinOp) and row.operator == "-" and row.right == Var(rows.edge_base)
            and isinstance(row.left, Var) and row.left.name in edge_loops):
        return False
    node = edge_loop_node(edge_loops[row.left.name])
    return isinstance(node, Var) and node_lets.get(node.name) == add(rows.edges_of, Var(slot))


def balance(products, rows, weight_shapes):
    """The ranged weights' elements per input column that a node multiplies, at least 1:
    `products` {place: product}, `rows` {place: its `InputRows`}."""
    elements = sum(weight_shapes[weight][0] * weight_shapes[weight][1]
                   for weight in {product.weight for product in products.values()})
    columns = sum(weight_shapes[product.weight][1]
                  * (EDGES_A_NODE if rows[place].edges_of is not None else rows[place].per_node)
                  for place, product in products.items())
    return max(1, round(elements / columns))


def _times(expression, factor):
    return expression if factor == 1 else BinOp("*", expression, Const(factor))
