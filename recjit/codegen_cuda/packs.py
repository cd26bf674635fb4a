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

from ..lowering.ilir import Alloc, Barrier, BinOp, Const, Loop, MatMul, Store, Var, walk
from .units import barrier_positions, element_extent, loads, written_by


@dataclass(frozen=True)
class Pack:
    """The loop that packs a product's inputs, and the rows of them each of its items packs:
    row `rows_per_item` · item + j holds the item's part j."""

    loop: Loop
    rows_per_item: int = 1


@dataclass(frozen=True)
class BlockPacks:
    """`products`: {id of a product M: its `Pack`}; `skipped`: the ids of the pack loops and
    barriers that the packed products replace; `arrays`: the packed arrays, which are no
    longer scratch. Empty: every pack is the grid's."""

    products: dict = field(default_factory=dict)
    skipped: frozenset = frozenset()
    arrays: frozenset = frozenset()


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
                visit(statement.body)
            products = _candidate(body, index, widths, readers, tile_columns)
            if products and split.grid_met_before(body, index):
                found.append((body, index, products))

    visit(kernel.body)
    barriers = frozenset(id(body[index + 1]) for body, index, _ in found)
    packed_split = replace(split, block_only=barriers)
    if not found or any(
            split.block_barrier(body, index) != packed_split.block_barrier(body, index)
            for body, index in barrier_positions(kernel.body)):
        return NO_PACKS, split
    if not all(packed_split.grid_met_before(body, index)
               and all(array in split.states or not packed_split.written_later(body, index, array)
                       for array in {load.array for load in loads(body[index])})
               for body, index, _ in found):
        return NO_PACKS, split
    packs = BlockPacks(products={id(product): Pack(body[index], rows_per_item)
                                 for body, index, products in found
                                 for product, rows_per_item in products},
                       skipped=barriers | {id(body[index]) for body, index, _ in found},
                       arrays=frozenset(product.x for _, _, products in found
                                        for product, _ in products))
    return packs, packed_split


def _candidate(body, index, widths, readers, tile_columns):
    """[(product, the rows of its inputs an item packs)] for the products whose inputs
    `body[index]` packs, if the pack, its barrier and they are as the module says (the grid's
    meeting before it aside); else None."""
    pack = body[index]
    if not (isinstance(pack, Loop) and pack.parallel and not pack.one_worker
            and index + 2 < len(body) and isinstance(body[index + 1], Barrier)):
        return None
    extent, element = element_extent(pack.body)
    following = []
    for statement in body[index + 2:]:
        if not isinstance(statement, MatMul):
            break
        following.append(statement)
    stores = [store for store in walk(pack.body) if isinstance(store, Store)]
    products = [product for product in following if product.x in written_by(pack)]
    if (element is None or extent > tile_columns
            or {product.x for product in products} != written_by(pack)
            or any(store.index[1:] != (Var(element),) for store in stores)):
        return None
    packed = []
    for product in products:
        parts = {item_part(store.index[0], pack.var) for store in stores
                 if store.array == product.x}
        per_item = {part[0] for part in parts if part is not None}
        if None in parts or len(per_item) != 1:
            return None
        per_item = per_item.pop()
        if (not product.parallel or product.columns is not None or product.x_row is not None
                or product.y_row is not None
                or {part for _, part in parts} != set(range(per_item))
                or product.rows != (pack.stop if per_item == 1
                                    else BinOp("*", pack.stop, Const(per_item)))
                or readers.get(product.x) != 1 or widths.get(product.x) != Const(extent)):
            return None
        packed.append((product, per_item))
    return packed


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
