"""Packs that each block computes for itself, into its tile, with no grid barrier.

An unrefactored TreeFC batch is: pack every node's [h_l; h_r] into `batch_x_W`, a grid
barrier, the product `W · batch_x_W`, the elementwise ops, a grid barrier. The first barrier
is there because a block's product reads every node's packed inputs, which the whole grid
wrote. But the pack reads only the children's states, which the grid had met on before the
batch began, and a staged product copies each tile of packed inputs into shared memory anyway:
each block can as well compute the tile's packed inputs there itself (`Emitter.packed_product`,
`runtime.multiply_tile`). The grid barrier becomes a block barrier per tile, and the packed
array is never written to global memory.

A pack loop P followed by a barrier B and products is *packed per block* when
- P is a parallel loop that writes, at [P's item, P's element] only, the inputs x of some of
  those products (each product M then packs its own in its tile: TreeRNN's W and U), over as
  many elements as x has columns, and as many items as M multiplies nodes; or, for an x of
  `a` rows an item, at [a · item + j, element] for each j < a, as many rows as M multiplies
  (a binary TreeLSTM's U_f, a row per child: a tile row then packs the child it stands for);
  or, for an x of a row per edge, at [edge - base, element] inside P's loop over a node's
  edges, from values that iteration computes alone (a child-sum model's per-child products:
  a tile row then packs the edge it stands for, whichever node it is); or, transposing, at
  [a · item + element mod a, element div a] (MV-RNN's [A; B], a row per column of the
  children's matrices: a tile row then packs column j of them, each tile column c from
  element c · a + j);
- P's element loops around those stores span x's columns (a · x's columns, transposing);
- nothing but M reads x, and M multiplies all of a weight's columns into y's rows as they are;
- the grid surely met at a barrier after everything P reads was written: only names and
  comments lie between that barrier and P (or, at the start of the batch loop, the loop's
  last statement and the statement before the loop are such barriers);
- nothing P reads but the states (written once, a node's) is written after P before the grid
  next meets, so that no block overwrites what a slower one still packs;
- and taking B for a block barrier turns no other barrier's reasoning (`units.UnitSplit`)
  from a block's into the grid's.
"""
from dataclasses import dataclass, field, replace

from ..lowering.ilir import (Alloc, Barrier, BinOp, Const, If, Let, Loop, MatMul, Store,
                             Var, nodes, walk)
from .units import barrier_positions, edge_loop_node, element_extent, loads, written_by

# The fused kernel's shared array that the products stage their inputs through, the row and
# the column of it a thread fills, and the row of the product's inputs that row stands for.
TILE = "x_tile"
TILE_ROW = "tile_row"
TILE_COLUMN = "tile_column"
PACKED_ROW = "packed_row"


@dataclass(frozen=True)
class Pack:
    """How a block fills row `TILE_ROW` of its tile with row `PACKED_ROW` of a product's
    inputs: `loop`, the grid's pack loop it stands in for; `position`, the statements that
    bind the loop's variables for that row (its item, the item's part, or its edge); `body`,
    the loop's statements that compute the row, storing into the tile; `columns`, the
    inputs' columns; `element`, the loop's element for tile column `TILE_COLUMN` (an ILIR
    expression of it), or None where it is the tile column itself."""

    loop: Loop
    position: tuple
    body: tuple
    columns: int
    element: object = None


@dataclass(frozen=True)
class BlockPacks:
    """`products`: {the place of a product M (`units.Statements.place`): its `Pack`};
    `skipped`: the places of the pack loops and barriers that the packed products replace; `arrays`: the packed arrays, which are no
    longer scratch; `shared_tiles`: whether products of one pack loop share their tiles.
    Empty: every pack is the grid's."""

    products: dict = field(default_factory=dict)
    skipped: frozenset = frozenset()
    arrays: frozenset = frozenset()
    shared_tiles: bool = True  # `Schedule.shared_tiles`


NO_PACKS = BlockPacks()


def block_packs(kernel, split, tile_columns):
    """(the packs of `kernel` that each block computes for itself, the `split` that knows
    their barriers are a block's). `split`: the kernel's `units.UnitSplit`; `tile_columns`:
    the columns of the shared tile, 0 where the products stage nothing."""
    widths = {statement.name: statement.shape[1] for statement in walk(kernel.body)
              if isinstance(statement, Alloc) and len(statement.shape) == 2}
    readers = {}
    for statement in walk(kernel.body):
        if isinstance(statement, MatMul):
            readers[statement.x] = readers.get(statement.x, 0) + 1
    for load in loads(kernel.body):
        readers[load.array] = readers.get(load.array, 0) + 1
    found = []

    def visit(body):
        for index, statement in enumerate(body):
            if isinstance(statement, Loop) and not statement.parallel:
                visit(body.inner(index))
            products = _candidate(body, index, widths, readers, tile_columns)
            if products and split.grid_met_before(body, index):
                found.append((body, index, products))

    visit(split.kernel_body)
    barriers = frozenset(body.place(index + 1) for body, index, _ in found)
    packed_split = replace(split, block_only=barriers)
    if not found or any(
            split.block_barrier(body, index) != packed_split.block_barrier(body, index)
            for body, index in barrier_positions(split.kernel_body)):
        return NO_PACKS, split
    if not all(packed_split.grid_met_before(body, index)
               and all(array in split.unchanging or not packed_split.written_later(body, index, array)
                       for array in {load.array for load in loads(body[index])})
               for body, index, _ in found):
        return NO_PACKS, split
    packs = BlockPacks(products={body.place(position): pack for body, _, products in found
                                 for position, _, pack in products},
                       skipped=barriers | {body.place(index) for body, index, _ in found},
                       arrays=frozenset(product.x for _, _, products in found
                                        for _, product, _ in products))
    return packs, packed_split


def _candidate(body, index, widths, readers, tile_columns):
    """[(a product's index in `body`, the product, its `Pack`)] for the products whose inputs
    `body[index]` packs, if the pack, its barrier and they are as the module says (the grid's
    meeting before it aside); else None."""
    pack = body[index]
    if not (isinstance(pack, Loop) and pack.parallel and not pack.one_worker
            and index + 2 < len(body) and isinstance(body[index + 1], Barrier)
            and all(isinstance(inner, (Let, Store, Loop, If)) for inner in walk(pack.body))):
        return None  # a pack's rows are read off its stores: anything else writing, no pack
    element = element_extent(pack.body)[1]
    following = []
    for position in range(index + 2, len(body)):
        if not isinstance(body[position], MatMul):
            break
        following.append((position, body[position]))
    products = [(position, product) for position, product in following
                if product.x in written_by(pack)]
    if element is None or {product.x for _, product in products} != written_by(pack):
        return None
    packed = []
    for position, product in products:
        width = widths.get(product.x)
        if (not product.parallel or product.columns is not None or product.x_row is not None
                or product.y_row is not None or readers.get(product.x) != 1
                or not isinstance(width, Const) or width.value > tile_columns):
            return None
        others = written_by(pack) - {product.x}
        stores = [(store, loops) for store, loops in _stores(pack.body)
                  if store.array == product.x]
        if all(store.index[1] == Var(element) for store, _ in stores):
            rows = (_spans(stores, element, width.value)
                    and (_rows_per_item(pack, product, others, stores, width.value)
                         or _row_per_edge(pack, product, others, stores, element,
                                          width.value)))
        else:
            rows = _transposed(pack, product, others, stores, element, width.value)
        if not rows:
            return None
        packed.append((position, product, rows))
    return packed


def _spans(stores, element, extent):
    """Whether the element loops around `stores` (each inside one over `element`) together
    span the elements 0 ... extent - 1 and no others."""
    spans = set()
    for _, loops in stores:
        around = [loop for loop in loops if loop.element and loop.var == element]
        if len(around) != 1 or not isinstance(around[0].start, Const):
            return False
        spans.add((around[0].start.value, around[0].stop.value))
    reached = 0
    for start, stop in sorted(spans):
        if start != reached:
            return False
        reached = stop
    return reached == extent


def _rows_per_item(pack, product, others, stores, columns):
    """The `Pack` of a product whose inputs each item of `pack` packs in `a` rows, a · item +
    j for each j < a (`stores`, with the loops around each), and that multiplies a rows an
    item; else None."""
    parts = {item_part(store.index[0], pack.var) for store, _ in stores}
    if None in parts or len({per_item for per_item, _ in parts}) != 1:
        return None
    per_item = next(iter(parts))[0]
    if ({part for _, part in parts} != set(range(per_item))
            or product.rows != (pack.stop if per_item == 1
                                else BinOp("*", pack.stop, Const(per_item)))):
        return None
    if per_item == 1:
        position = (Let(pack.var, Var(PACKED_ROW)),)
    else:
        position = (Let(pack.var, BinOp("//", Var(PACKED_ROW), Const(per_item))),
                    Let("part", BinOp("%", Var(PACKED_ROW), Const(per_item))))
    body = _into_tile(pack.body, product.x, others,
                      lambda store: (None if per_item == 1 else
                                     item_part(store.index[0], pack.var)[1]))
    return Pack(pack, position, _live_only(body), columns)


def _transposed(pack, product, others, stores, element, columns):
    """The `Pack` of a product whose inputs each item of `pack` packs transposed, element k
    at [a · item + k mod a, k div a] (`stores`), and that multiplies a rows an item; else
    None."""
    per_item = None
    for store, _ in stores:
        row, column = store.index
        if not (isinstance(column, BinOp) and column.operator == "//"
                and column.left == Var(element) and isinstance(column.right, Const)):
            return None
        per_item = per_item or column.right.value
        if (column.right.value != per_item
                or row != BinOp("+", BinOp("*", Var(pack.var), Const(per_item)),
                                BinOp("%", Var(element), Const(per_item)))):
            return None
    if (not _spans(stores, element, per_item * columns)
            or product.rows != BinOp("*", pack.stop, Const(per_item))):
        return None
    position = (Let(pack.var, BinOp("//", Var(PACKED_ROW), Const(per_item))),
                Let("part", BinOp("%", Var(PACKED_ROW), Const(per_item))))
    body = _into_tile(pack.body, product.x, others, lambda store: None)
    return Pack(pack, position, _live_only(body), columns,
                BinOp("+", BinOp("*", Var(TILE_COLUMN), Const(per_item)), Var("part")))


def item_part(row, item):
    """(a, j) where `row` is a · `item` + j, the variable `item` times a constant a and plus
    a constant j (a = 1, j = 0: the item itself); else None."""
    if row == Var(item):
        return 1, 0
    part = 0
    if isinstance(row, BinOp) and row.operator == "+" and isinstance(row.right, Const):
        row, part = row.left, row.right.value
    if (isinstance(row, BinOp) and row.operator == "*" and row.left == Var(item)
            and isinstance(row.right, Const) and 0 <= part < row.right.value):
        return row.right.value, part
    return None


def _row_per_edge(pack, product, others, stores, element, columns):
    """The `Pack` of a product whose inputs `pack` packs a row per edge, at [edge - base, k]
    (`stores`) inside its loop over a node's edges (`child_ptr[node]` to
    `child_ptr[node + 1]`), `base` and the rows the product multiplies named outside the
    pack, the row computed from that iteration's values alone; else None."""
    bound = _bound_names(pack.body) | {pack.var}
    edges = {_edge_loop(store.index[0], loops, bound) for store, loops in stores}
    if len(edges) != 1 or None in edges or not isinstance(product.rows, Var) \
            or product.rows.name in bound:
        return None
    edge, base = edges.pop()
    body = _live_only(_edge_rows(pack.body, edge, product.x, others))
    free = set(_names_read(body)) - _bound_names(body) - {edge.var, element, TILE_ROW}
    if free & bound:
        return None
    return Pack(pack, (Let(edge.var, BinOp("+", Var(base), Var(PACKED_ROW))),), body, columns)


def _edge_loop(row, loops, bound):
    """(the loop over a node's edges among `loops`, the name of the base) where `row` is
    that loop's variable less a name not in `bound`; else None."""
    if not (isinstance(row, BinOp) and row.operator == "-" and isinstance(row.left, Var)
            and isinstance(row.right, Var) and row.right.name not in bound):
        return None
    for loop in loops:
        if loop.var == row.left.name and edge_loop_node(loop) is not None:
            return loop, row.right.name
    return None


def _edge_rows(body, edge, array, others):
    """What of `body` packs one edge's row of `array`: the body of `edge`, its loop over a
    node's edges, inside the element loops and branches that hold it, storing into the tile."""
    kept = []
    for statement in body:
        if statement is edge:
            kept += _into_tile(statement.body, array, others, lambda store: None)
        elif isinstance(statement, (Loop, If)):
            inner = _with_bodies(statement, lambda body: _edge_rows(body, edge, array, others))
            if inner is not None:
                kept.append(inner)
    return tuple(kept)


def _into_tile(body, array, others, part_of):
    """`body` with its stores of `array`[row, k] made stores of `TILE`[`TILE_ROW`, k] (where
    `part_of(store)` is a number j, only where the tile row's `part` is j), and those of the
    arrays `others` (packed for other products) left out."""
    rewritten = []
    for statement in body:
        if isinstance(statement, Store) and statement.array == array:
            part = part_of(statement)
            statement = replace(statement, array=TILE,
                                index=(Var(TILE_ROW), statement.index[1]))
            if part is not None:
                statement = If(BinOp("==", Var("part"), Const(part)), (statement,))
        elif isinstance(statement, Store) and statement.array in others:
            continue
        elif isinstance(statement, (Loop, If)):
            statement = _with_bodies(statement,
                                     lambda body: _into_tile(body, array, others, part_of))
            if statement is None:
                continue
        rewritten.append(statement)
    return tuple(rewritten)


def _with_bodies(statement, rewrite):
    """`statement`, a loop or a branch, with `rewrite` applied to its statements; None where
    it leaves none."""
    if isinstance(statement, Loop):
        body = rewrite(statement.body)
        return replace(statement, body=body) if body else None
    body, orelse = rewrite(statement.body), rewrite(statement.orelse)
    return replace(statement, body=body, orelse=orelse) if body or orelse else None


def _live_only(body):
    """`body` without the `Let`s whose values no store, bound or condition needs (what a pack
    computed for another product's inputs), and the loops and branches left empty."""
    live = set()
    while True:
        needed = set(_names_read(tuple(_not_lets(body))))
        for let in walk(body):
            if isinstance(let, Let) and let.name in live | needed:
                needed |= set(_names_read(let.value))
        if needed <= live:
            return _drop_lets(body, live)
        live |= needed


def _not_lets(body):
    """The parts of `body`'s statements that are not `Let`s: stores, and the bounds and
    conditions of its loops and branches."""
    for statement in body:
        if isinstance(statement, Loop):
            yield (statement.start, statement.stop)
            yield from _not_lets(statement.body)
        elif isinstance(statement, If):
            yield statement.condition
            yield from _not_lets(statement.body + statement.orelse)
        elif not isinstance(statement, Let):
            yield statement


def _drop_lets(body, live, after=frozenset()):
    """`body` without the `Let`s of names not `live`, nor loops that store nothing and bind
    nothing that what follows them (in `body`, then `after`) reads."""
    kept = []
    for index, statement in enumerate(body):
        if isinstance(statement, Let) and statement.name not in live:
            continue
        if isinstance(statement, (Loop, If)):
            following = set(_names_read(body[index + 1:])) | after
            statement = _with_bodies(statement,
                                     lambda inner: _drop_lets(inner, live, following))
            if statement is None or (
                    isinstance(statement, Loop)
                    and not any(isinstance(inner, Store) for inner in walk(statement.body))
                    and not _bound_names(statement.body) & following):
                continue
        kept.append(statement)
    return tuple(kept)


def _stores(body, loops=()):
    """(each store in `body`, the loops around it there, innermost last)."""
    for statement in body:
        if isinstance(statement, Store):
            yield statement, loops
        elif isinstance(statement, Loop):
            yield from _stores(statement.body, loops + (statement,))
        elif isinstance(statement, If):
            yield from _stores(statement.body + statement.orelse, loops)


def _bound_names(body):
    """The names that `body`'s `Let`s and loops bind."""
    return {statement.name if isinstance(statement, Let) else statement.var
            for statement in walk(body) if isinstance(statement, (Let, Loop))}


def _names_read(node):
    """The name of every `Var` in an ILIR statement, expression or tuple of them."""
    return (variable.name for variable in nodes(node, Var))
