"""The hidden units split over a fused kernel's blocks (docs/design.md §6: a node's elementwise
ops run where their rows live), and the grid barriers that this makes block barriers.

A batch of a refactored TreeLSTM is: the elementwise ops, a grid barrier, the products of the
states just computed, a grid barrier, the next batch's elementwise ops. A grid barrier is a
large part of a batch's time (benchmarks/README.md, "Measurements behind the code"). The
second one is there because a block's
elementwise ops at unit e read rows e, e + E and e + 2E of a product (the gates) that other
blocks computed. Let the block that owns unit e compute those rows (`runtime.matmul_units`)
and run the elementwise ops at e (`runtime.owned_units`), and it reads only what it computed:
a block barrier suffices.

An array is *unit-split*, with E units, when
- every statement that writes it is a product of the whole grid whose weight's rows are a
  multiple of E, and every product of that weight writes a unit-split array of E units;
- every statement that reads it is a parallel loop whose elements span E (index e), and it
  reads column e + j·E only.

A barrier is a block barrier when what runs between it and the barrier before it in the same
statements (or the kernel's start) is products only, each writing a unit-split array. After
it, a block reads no array written since that barrier but the rows it computed itself. And no
block that runs ahead may overwrite what the products of another still read: each reads a
state (written once, a node's), a field (never written), or an array that nothing writes on
any path from the barrier to the next that is surely the grid's (TreeGRU's packed inputs,
rewritten in the next batch only after the grid has met)."""
from dataclasses import dataclass, field

from ..lowering.ilir import (Alloc, ArgumentRole, Barrier, BinOp, Comment, Const, If, Let,
                             Load, Loop, MatMul, StatementVisitor, Statements, Store, Var, add,
                             nodes, walk)


def element_extent(body):
    """How many elements the element loops of a parallel loop's body span, and their index
    variable."""
    extent, variable = 1, None
    for statement in body:
        if isinstance(statement, Loop) and statement.element:
            extent, variable = max(extent, int(statement.stop.value)), statement.var
        elif isinstance(statement, Loop):
            inner_extent, inner_variable = element_extent(statement.body)
            if inner_variable is not None:
                extent, variable = max(extent, inner_extent), inner_variable
    return extent, variable


@dataclass(frozen=True)
class UnitSplit:
    """`arrays`: {unit-split array: its units}; `weights`: {weight: units} for the weights
    whose products write them; `unchanging`: the kernel's states (written once, a node's) and
    fields (never written), which no block overwrites while another reads; `kernel_body`: its
    statements (`Statements`, the root of every path). Empty: no split."""

    arrays: dict = field(default_factory=dict)
    weights: dict = field(default_factory=dict)
    unchanging: frozenset = frozenset()
    kernel_body: Statements = field(default_factory=lambda: Statements(()))
    block_only: frozenset = frozenset()  # the places of barriers a block's alone (`packs.py`)

    def loop_units(self, loop):
        """The units a parallel loop's blocks split, or None: it reads no unit-split array."""
        if any(load.array in self.arrays for load in loads(loop.body)):
            return element_extent(loop.body)[0]
        return None

    def block_barrier(self, body, index):
        """Whether `body[index]`, a barrier, may be a block barrier."""
        products = self._products_before(body, index)
        return bool(products) and all(
            product.y in self.arrays and product.parallel
            and (product.x in self.unchanging
                 or not self.written_later(body, index, product.x))
            for product in products)

    def grid_meets(self, body, index):
        """Whether the grid surely meets at `body[index]`, a barrier: no products run before
        it, for which it could be a block's, and it is no barrier of a block's own packs
        (`block_only`)."""
        return (body.place(index) not in self.block_only
                and not self._products_before(body, index))

    def grid_met_before(self, body, index):
        """Whether everything written before `body[index]` was written before a barrier at
        which the grid surely met: only names and comments lie between that barrier and
        it; at the start of a sequential loop's statements, the loop's last statement and
        the last before the loop are such barriers; after a sequential loop, its last
        statement and the last before it (it may run no iteration)."""
        position = index - 1
        while position >= 0 and isinstance(body[position], (Let, Comment, Alloc)):
            position -= 1
        if position >= 0 and isinstance(body[position], Loop) and not body[position].parallel:
            loop_body = body.inner(position)
            return (self.grid_met_before(loop_body, len(loop_body))
                    and self.grid_met_before(body, position))
        if position >= 0:
            return isinstance(body[position], Barrier) and self.grid_meets(body, position)
        if not body.path:
            return True
        holder = self.holder(body)
        if not isinstance(holder[0][holder[1]], Loop) or holder[0][holder[1]].parallel:
            return False
        last = len(body) - 1
        return (isinstance(body[last], Barrier) and self.grid_meets(body, last)
                and self.grid_met_before(*holder))

    def _products_before(self, body, index):
        """The products between `body[index]` and the barrier before it in `body` (or the
        kernel's start); None where anything else but names and comments runs there."""
        products = []
        for statement in reversed(body[:index]):
            if isinstance(statement, Barrier):
                return products
            if isinstance(statement, MatMul):
                products.append(statement)
            elif not isinstance(statement, (Comment, Let, Alloc)):
                return None
        return products if not body.path else None

    def written_later(self, body, index, array):
        """Whether a statement that may run after `body[index]` before the grid next meets
        at a barrier writes `array`. A barrier that another barrier's products do not
        precede is the grid's; any other counts as a block's, on the safe side."""
        pending, seen = [(body, index + 1)], set()
        while pending:
            statements, position = pending.pop()
            if statements.place(position) in seen:
                continue
            seen.add(statements.place(position))
            if position == len(statements):
                after = self._after(statements)
                if after is None:
                    return True
                pending += after
                continue
            statement = statements[position]
            if isinstance(statement, Barrier) and self.grid_meets(statements, position):
                continue
            if isinstance(statement, If):
                pending += [(statements.inner(position, branch), 0)
                            for branch in ("body", "orelse") if getattr(statement, branch)]
                if not statement.orelse:
                    pending.append(self._skipping(statements, position))
            elif isinstance(statement, Loop) and not statement.parallel:
                pending += [(statements.inner(position), 0), (statements, position + 1)]
            elif array in written_by(statement):
                return True
            else:
                pending.append((statements, position + 1))
        return False

    def _after(self, statements):
        """Where a path goes at the end of `statements`: a sequential loop's body again or
        what follows the loop; what follows a branch; nowhere after the kernel's own."""
        if not statements.path:
            return []
        holder, index = self.holder(statements)
        if isinstance(holder[index], Loop):
            return [(statements, 0), (holder, index + 1)]
        return [(holder, index + 1)]

    def _skipping(self, statements, position):
        """Where a path goes past an `If` not taken. The batch loop's last statement,
        `if b > 0:` (the last batch multiplies nothing), is not taken in its last batch only:
        past it the loop ends."""
        condition = statements[position].condition
        holder = self.holder(statements) if statements.path else None
        if holder and position == len(statements) - 1:
            loop = holder[0][holder[1]]
            if (isinstance(loop, Loop) and loop.step == -1 and loop.stop == Const(-1)
                    and condition == BinOp(">", Var(loop.var), Const(0))):
                return holder[0], holder[1] + 1
        return statements, position + 1

    def holder(self, statements):
        """(the statements holding the loop or branch that `statements` are of, its index
        there)."""
        holder = self.kernel_body
        for index, branch in statements.path[:-1]:
            holder = holder.inner(index, branch)
        return holder, statements.path[-1][0]


# The blocks split no units: every product by rows, every barrier the grid's.
NO_SPLIT = UnitSplit()


def _unchanging(kernel):
    return frozenset(name for name, _ in kernel.states) | set(
        kernel.arrays_of(ArgumentRole.FIELD))


def split_units(kernel, weight_shapes, enabled=True):
    """The unit-split arrays of a fused kernel, for `weight_shapes` {weight: (rows, columns)};
    none unless `enabled` (`Schedule(split_units=False)`), the kernel's statements known
    still, for the barriers' reasoning (`packs.py`)."""
    if not enabled:
        return UnitSplit(unchanging=_unchanging(kernel), kernel_body=Statements(kernel.body))
    reads, writes = {}, {}
    _accesses(kernel.body, reads, writes, None)
    arrays = {}
    for array, readers in reads.items():
        units = {_read_units(loop, load) for loop, load in readers}
        if len(units) != 1 or None in units or array not in writes:
            continue
        units = units.pop()
        if all(isinstance(writer, MatMul) and writer.parallel
               and weight_shapes[writer.weight][0] % units == 0 for writer in writes[array]):
            arrays[array] = units
    products = [writer for writers in writes.values() for writer in writers
                if isinstance(writer, MatMul)]
    mixed = True
    while mixed:  # a weight's products all write arrays split by the same units, or none does
        mixed = False
        for weight in {product.weight for product in products}:
            outputs = [product.y for product in products if product.weight == weight]
            if len({arrays.get(y) for y in outputs}) > 1:
                for y in outputs:
                    mixed = arrays.pop(y, None) is not None or mixed
    weights = {product.weight: arrays[product.y] for product in products if product.y in arrays}
    return UnitSplit(arrays, weights, _unchanging(kernel), Statements(kernel.body))


def places(body):
    """(statements, index) of every statement of `body` (`Statements`), those inside loops
    and branches included, in order."""
    for index, statement in enumerate(body):
        yield body, index
        if isinstance(statement, Loop):
            yield from places(body.inner(index))
        elif isinstance(statement, If):
            yield from places(body.inner(index, "body"))
            yield from places(body.inner(index, "orelse"))


def barrier_positions(body):
    """(statements, index) of every barrier in `body` (`Statements`), inside loops and
    branches too."""
    return [(statements, index) for statements, index in places(body)
            if isinstance(statements[index], Barrier)]


def written_by(statement):
    """The arrays a statement (a loop with all it holds) writes."""
    inside = tuple(walk((statement,)))
    return ({product.y for product in inside if isinstance(product, MatMul)}
            | {store.array for store in inside if isinstance(store, Store)})


def _accesses(body, reads, writes, loop, item=None):
    """reads {array: [(the parallel loop it is read in, or None; the load)]} and writes
    {array: [the statements writing it]}, from `body` inside the parallel loop `loop`. Inside
    an unrolled item (`item`, a one-worker loop), the item's block does it all: the item is
    recorded as the statement, and its loads as read outside any parallel loop."""
    _Accesses(reads, writes).visit_all(body, loop, item)


class _Accesses(StatementVisitor):
    """`_accesses`' walk, a rule for every kind of statement: a kind it passed over could hide
    a read from the barriers' reasoning, and a block's barrier would then stand where the
    grid must meet."""

    def __init__(self, reads, writes):
        self.reads, self.writes = reads, writes

    def visit_Loop(self, statement, loop, item):
        if statement.one_worker:
            self.visit_all(statement.body, None, statement)
            return
        _read((statement.start, statement.stop), self.reads, loop)
        inner = statement if statement.parallel and loop is None and item is None else loop
        self.visit_all(statement.body, inner, item)

    def visit_If(self, statement, loop, item):
        _read((statement.condition,), self.reads, loop)
        self.visit_all(statement.body + statement.orelse, loop, item)

    def visit_MatMul(self, statement, loop, item):
        self.writes.setdefault(statement.y, []).append(item or statement)
        self.reads.setdefault(statement.x, []).append((None, None))
        _read((statement.rows, statement.x_row, statement.y_row), self.reads, loop)

    def visit_GradientSum(self, statement, loop, item):
        self.writes.setdefault(statement.total, []).append(statement)
        for array in filter(None, (statement.a, statement.b)):
            self.reads.setdefault(array, []).append((None, None))

    def visit_Let(self, statement, loop, item):
        _read((statement.value,), self.reads, loop)

    def visit_Store(self, statement, loop, item):
        self.writes.setdefault(statement.array, []).append(item or statement)
        _read(statement.index + (statement.value,), self.reads, loop)

    def visit_Alloc(self, statement, loop, item):
        """Scratch allocated: nothing read or written yet."""

    def visit_Barrier(self, statement, loop, item):
        """A barrier reads and writes nothing."""

    def visit_Comment(self, statement, loop, item):
        """A comment reads and writes nothing."""


def _read(expressions, reads, loop):
    for load in loads(expressions):
        reads.setdefault(load.array, []).append((loop, load))


def loads(node):
    """Every `Load` in an ILIR statement, expression or tuple of them."""
    return nodes(node, Load)


def edge_loop_node(loop):
    """The node whose edges `loop` runs over, from child_ptr[node] to child_ptr[node + 1] as
    the lowering writes it, an ILIR expression; None where `loop` is no such loop."""
    start = loop.start
    if (not loop.parallel and not loop.element and isinstance(start, Load)
            and start.array == "child_ptr"
            and loop.stop == Load("child_ptr", (add(start.index[0], Const(1)),))):
        return start.index[0]
    return None


def _read_units(loop, load):
    """E when `load`, inside the parallel loop `loop` whose elements span E (index e), reads
    column e + j·E of a two-dimensional array; else None."""
    if loop is None or len(load.index) != 2:
        return None
    extent, element = element_extent(loop.body)
    column = load.index[1]
    if element is None:
        return None
    if column == Var(element):
        return extent
    if (isinstance(column, BinOp) and column.operator == "+" and column.left == Var(element)
            and isinstance(column.right, Const) and column.right.value % extent == 0):
        return extent
    return None
