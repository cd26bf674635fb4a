"""Device functions that generated CUDA kernels call.

A weight's rows are split over the grid's blocks, for the whole launch, in one of three ways:
- by rows: block b owns rows [b·n, (b+1)·n) with n = ⌈rows / blocks⌉ (`matmul_rows`);
- by units: the hidden units (the element index e of a state) are split so, and block b owns
  every row r whose unit r mod units it owns (`matmul_units`): rows e, e + units, e + 2·units
  of a gated weight, the rows a node's elementwise ops at e read. A block that computes the
  elementwise ops of its own units then reads only products it computed itself, and needs no
  grid barrier between the two (`codegen_cuda/units.py`);
- in groups, for a weight of fewer rows than four a block: four rows a group, and each
  group's nodes in ranges over the blocks that share it (`matmul_row_groups`).
By units, a large batch's nodes are split in ranges too, and the units in groups, a block
taking a group's rows of a range's nodes (`range_share`, `matmul_range`,
`codegen_cuda/ranges.py`).
Each product computes only the owned rows, so a persistent kernel can keep them in shared
memory (`load_rows`, `load_unit_rows`) and read them from there in every batch. A block's
owned rows are its local rows 0, 1, ...; a map (run, stride, first) says which row each
stands for (`spread`). Inside a block, each warp computes one node's products with four local
rows at a time (`multiply_direct`); in numba's simulator, which has no warp shuffles, each
thread does.

Under `Schedule(stage_products=True)` (off by default: slower on an H200), a product of more
nodes than the block's warps take in one turn is *staged* (`multiply`): the block copies a
tile of the nodes' inputs into shared memory, all threads at once, and its warps multiply
from there. Read directly, every warp waits on L2 for its node's inputs, one node
after another, and every block asks for the same rows at the same time; an H100 ran such a
product of 1024 nodes at a ninth of cuBLAS's rate (tools/gpu_products.py). Each block starts
at a tile of its own, so that the grid's reads spread over the rows. Where each block can
compute the packed inputs itself, the kernel fills the tile with them and multiplies it
(`multiply_tile`, `codegen_cuda/packs.py`): no grid barrier between the pack and the product."""
from numba import cuda
from numba.core import config

from recjit.schedule import MAX_THREADS  # absolute: tools/check_ptx.py loads this file alone

WARP = 32
ALL_LANES = 0xFFFFFFFF
# The runtime's kernels run with the schedule's threads a block, so their registers must fit
# the most a schedule may ask for; the simulator's `cuda.jit` takes no launch bound.
BOUNDED = {} if config.ENABLE_CUDASIM else {"launch_bounds": MAX_THREADS}
# Device functions are inlined by NVVM (`forceinline`, LLVM's alwaysinline), not in numba's
# IR (`inline="always"`), whose inliner deep-copies each callee's IR at every call: that was
# ~97% of compiling a fused kernel (child-sum TreeLSTM's forward 45 s, its backward 149 s on
# two cores; NVVM itself took 1 s). The simulator's `cuda.jit` takes no `forceinline`.
INLINED = {} if config.ENABLE_CUDASIM else {"forceinline": True}


@cuda.jit(device=True, **INLINED)
def rows_per_block(num_rows):
    return (num_rows + cuda.gridDim.x - 1) // cuda.gridDim.x


@cuda.jit(device=True, **INLINED)
def first_row(num_rows):
    """The first weight row this block owns."""
    return cuda.blockIdx.x * rows_per_block(num_rows)


@cuda.jit(device=True, **INLINED)
def owned_rows(num_rows):
    """The first of a weight's rows this block owns, and how many it owns (none, or fewer
    than the others, at the grid's end)."""
    begin = first_row(num_rows)
    return begin, min(rows_per_block(num_rows), num_rows - begin)


@cuda.jit(device=True, **INLINED)
def owned_units(units):
    """The first of `units` hidden units this block owns, and how many: units are split over
    the blocks as rows are."""
    return owned_rows(units)


@cuda.jit(device=True, **INLINED)
def spread(local, rows):
    """The row that a block's local row `local` stands for under the map `rows` = (run,
    stride, first): runs of `run` consecutive rows, `stride` apart, the first at `first`."""
    run, stride, first = rows
    return local // run * stride + first + local % run


@cuda.jit(device=True, **INLINED)
def unit_rows(units, num_rows):
    """This block's rows of a weight of `num_rows` rows split by units: the map of its local
    rows, and how many it holds."""
    begin, owned = owned_units(units)
    return (owned, units, begin), num_rows // units * owned


@cuda.jit(device=True, **INLINED)
def copy_rows(weight, weight_slice, rows, held):
    """weight_slice[local] = weight[spread(local, rows)] for the `held` local rows."""
    columns = weight.shape[1]
    for item in range(cuda.threadIdx.x, held * columns, cuda.blockDim.x):
        local = item // columns
        column = item % columns
        weight_slice[local, column] = weight[spread(local, rows), column]


@cuda.jit(device=True, **INLINED)
def load_rows(weight, weight_slice):
    """Copy this block's rows of `weight` into `weight_slice` (shared memory); the caller
    synchronizes the block before reading it."""
    begin, owned = owned_rows(weight.shape[0])
    copy_rows(weight, weight_slice, (owned, 0, begin), owned)


@cuda.jit(device=True, **INLINED)
def load_unit_rows(weight, units, weight_slice):
    """`load_rows` for a weight split by units."""
    rows, held = unit_rows(units, weight.shape[0])
    copy_rows(weight, weight_slice, rows, held)


@cuda.jit(device=True, **INLINED)
def next_row(group, offset, run):
    """The local row after (group, offset) in runs of `run`."""
    if offset + 1 == run:
        return group + 1, 0
    return group, offset + 1


@cuda.jit(device=True, **INLINED)
def four_rows(local, last, rows):
    """The rows that local rows local … local + 3 stand for under the map `rows` (`spread`),
    those past `last` repeating it: one division for the four."""
    run, stride, first = rows
    group, offset = local // run, local % run
    row0 = group * stride + first + offset
    if local + 1 <= last:
        group, offset = next_row(group, offset, run)
    row1 = group * stride + first + offset
    if local + 2 <= last:
        group, offset = next_row(group, offset, run)
    row2 = group * stride + first + offset
    if local + 3 <= last:
        group, offset = next_row(group, offset, run)
    return row0, row1, row2, group * stride + first + offset


@cuda.jit(device=True, **INLINED)
def add_products(totals, value, weight, rows, k):
    """totals[i] + value · weight[rows[i], k] for the four rows."""
    return (totals[0] + value * weight[rows[0], k], totals[1] + value * weight[rows[1], k],
            totals[2] + value * weight[rows[2], k], totals[3] + value * weight[rows[3], k])


@cuda.jit(device=True, **INLINED)
def strided_dots(weight, rows, x, s, first, step, columns):
    """Σ W[r, k] · x[s, k] over k = first, first + step, ... below `columns` for the four
    rows r of `rows`, each x[s, k] loaded once for all four: four independent sums, not one
    chain. Four of x's values are loaded before any is multiplied: x was written by other
    blocks, so each load waits on L2, and four in flight wait once; eight at a time ran no
    faster and took half as long again to compile."""
    zero = x.dtype.type(0)
    totals = (zero, zero, zero, zero)
    k = first
    while k + 3 * step < columns:
        value0 = x[s, k]
        value1 = x[s, k + step]
        value2 = x[s, k + 2 * step]
        value3 = x[s, k + 3 * step]
        totals = add_products(totals, value0, weight, rows, k)
        totals = add_products(totals, value1, weight, rows, k + step)
        totals = add_products(totals, value2, weight, rows, k + 2 * step)
        totals = add_products(totals, value3, weight, rows, k + 3 * step)
        k += 4 * step
    while k < columns:
        totals = add_products(totals, x[s, k], weight, rows, k)
        k += step
    return totals


@cuda.jit(device=True, **INLINED)
def store_four(y, s, rows, valid, totals):
    """y[s, rows[i]] = totals[i] for the first `valid` of the four."""
    y[s, rows[0]] = totals[0]
    if valid > 1:
        y[s, rows[1]] = totals[1]
    if valid > 2:
        y[s, rows[2]] = totals[2]
    if valid > 3:
        y[s, rows[3]] = totals[3]


@cuda.jit(device=True, **INLINED)
def warp_sum(total):
    """The sum of `total` over the warp's lanes, in lane 0."""
    offset = WARP // 2
    while offset > 0:
        total += cuda.shfl_down_sync(ALL_LANES, total, offset)
        offset //= 2
    return total


@cuda.jit(device=True, **INLINED)
def warp_products(weight, weight_rows, y_rows, held, x, s, columns, y, y_row, local):
    """y[y_row, r] = Σ_k W[r, k] · x[s, k] for the four rows r from local row `local` on, by
    one warp: its lanes take every 32nd k and sum with shuffles, x[s, k] loaded once for the
    four rows, four independent sums in flight."""
    lane = cuda.threadIdx.x % WARP
    weight_four = four_rows(local, held - 1, weight_rows)
    if columns < WARP:  # too short to share: the first lane alone
        if lane == 0:
            store_four(y, y_row, four_rows(local, held - 1, y_rows), held - local,
                       strided_dots(weight, weight_four, x, s, 0, 1, columns))
    else:
        totals = strided_dots(weight, weight_four, x, s, lane, WARP, columns)
        sums = (warp_sum(totals[0]), warp_sum(totals[1]), warp_sum(totals[2]),
                warp_sum(totals[3]))
        if lane == 0:
            store_four(y, y_row, four_rows(local, held - 1, y_rows), held - local, sums)


@cuda.jit(device=True, **INLINED)
def thread_products(weight, weight_rows, y_rows, held, x, s, columns, y, y_row, local):
    """The same four products by one thread: numba's simulator has no warp shuffles."""
    store_four(y, y_row, four_rows(local, held - 1, y_rows), held - local,
               strided_dots(weight, four_rows(local, held - 1, weight_rows), x, s, 0, 1,
                            columns))


# How a block's threads take (node, four rows) items: a warp each, or in numba's simulator,
# which has no warp shuffles, a thread each.
products_of_four = thread_products if config.ENABLE_CUDASIM else warp_products
ITEM_WORKERS = 1 if config.ENABLE_CUDASIM else WARP


@cuda.jit(device=True, **INLINED)
def first_item(turn):
    """This thread's worker's first item, and the block's workers: items go round the
    workers from worker `turn` on."""
    workers = cuda.blockDim.x // ITEM_WORKERS
    return (cuda.threadIdx.x // ITEM_WORKERS + workers - turn % workers) % workers, workers


@cuda.jit(device=True, **INLINED)
def multiply_direct(weight, weight_rows, y_rows, held, x, y, rows, turn):
    """y[s, r] = Σ_k W[r, k] · x[s, k] for s < rows and the rows r that this block's `held`
    local rows stand for under the map `y_rows`; `weight` holds them as the map `weight_rows`
    says (W itself, or this block's slice of it). A worker takes one node s and four local
    rows at a time (`products_of_four`), the first item worker `turn`'s."""
    groups = (held + 3) // 4
    mine, workers = first_item(turn)
    for item in range(mine, rows * groups, workers):
        s = item // groups
        products_of_four(weight, weight_rows, y_rows, held, x, s, x.shape[1], y, s,
                         item % groups * 4)


@cuda.jit(device=True, **INLINED)
def stage_rows(x, first, count, tile):
    """tile[i, k] = x[first + i, k] for i < count, by every thread of the block: the loads
    are independent, so all are in flight at once."""
    columns = x.shape[1]
    for item in range(cuda.threadIdx.x, count * columns, cuda.blockDim.x):
        tile[item // columns, item % columns] = x[first + item // columns, item % columns]


@cuda.jit(device=True, **INLINED)
def tile_span(step, tiles, capacity, rows):
    """The first node and the nodes of a block's `step`-th tile of `rows` nodes, `capacity`
    a tile: block b takes the tiles from its b-th on, so that the blocks do not all read the
    same rows at once."""
    first = (step + cuda.blockIdx.x) % tiles * capacity
    return first, min(capacity, rows - first)


@cuda.jit(device=True, **INLINED)
def tile_part(part_first, part_rows, tile_first, tile_rows):
    """(the tile row it starts at, its rows in the tile, its first row) of one product's part
    of a tile filled from the rows tile_first ... tile_first + tile_rows - 1 of several
    products' inputs, packed one product after another: the product's are part_first ...
    part_first + part_rows - 1 (`Emitter.packed_products`)."""
    first = max(tile_first, part_first)
    last = min(tile_first + tile_rows, part_first + part_rows)
    return first - tile_first, max(0, last - first), first - part_first


@cuda.jit(device=True, **INLINED)
def multiply_tile(weight, weight_rows, y_rows, held, tile, count, columns, y, turn):
    """y[s, r] = Σ_k W[r, k] · tile[s, k] for s < count, the first `columns` of the tile's
    rows (shared memory, filled by the block), and the rows r of `multiply_direct`'s maps.
    The items go four rows by four rows, each four through the tile's nodes: the workers of a
    turn read the same rows, so a weight read through L1 (a ranged batch's, `ranges.py`) is
    read from L2 once a tile, not once a node. Returns the worker whose turn comes next."""
    groups = (held + 3) // 4
    mine, workers = first_item(turn)
    for item in range(mine, count * groups, workers):
        s = item % count
        products_of_four(weight, weight_rows, y_rows, held, tile, s, columns, y, s,
                         item // count * 4)
    return (turn + count * groups) % workers


@cuda.jit(device=True, **INLINED)
def multiply_staged(weight, weight_rows, y_rows, held, x, y, rows, tile, turn):
    """The products of `multiply_direct`, the nodes' inputs staged through `tile` (shared
    memory) `tile.shape[0]` nodes at a time (`tile_span`)."""
    capacity = tile.shape[0]
    tiles = (rows + capacity - 1) // capacity
    for step in range(tiles):
        first, count = tile_span(step, tiles, capacity, rows)
        stage_rows(x, first, count, tile)
        cuda.syncthreads()
        turn = multiply_tile(weight, weight_rows, y_rows, held, tile, count, x.shape[1],
                             y[first:], turn)
        cuda.syncthreads()  # before the next tile overwrites this one


@cuda.jit(device=True, **INLINED)
def multiply(weight, weight_rows, y_rows, held, x, y, rows, tile, turn):
    """`multiply_direct`, staged through `tile` where the block's items outnumber its
    workers: a product that each worker finishes in one turn reads its inputs directly,
    without the block barriers of a stage; so does one whose tile is unused (one node, which
    a stage would only slow, or narrower than the rows).
    Returns the worker whose turn comes next: consecutive products with no barrier between
    them pass it on, so that the workers a product leaves idle start the next one's items
    at once (TreeLSTM at one node: U_iou's two items and U_f's one run side by side)."""
    # Read before the calls: numba's simulator points a device function's `cuda` back at the
    # real module when the first thread leaves one, under the threads still in this frame.
    workers = cuda.blockDim.x // ITEM_WORKERS
    items = rows * ((held + 3) // 4)
    if items <= workers or tile.shape[0] < 2 or tile.shape[1] < x.shape[1]:
        multiply_direct(weight, weight_rows, y_rows, held, x, y, rows, turn)
    else:
        multiply_staged(weight, weight_rows, y_rows, held, x, y, rows, tile, turn)
    return (turn + items) % workers


# A block's share of a product, by each way of splitting the weight (a plan): (the map of
# the rows `weight` holds, the map of the rows y gets, how many, the first node, the nodes).
@cuda.jit(device=True, **INLINED)
def rows_plan(weight_first_row, num_rows, rows):
    """By rows: this block's rows of a weight of `num_rows` rows, `weight` holding them from
    `weight_first_row` on (W itself, or this block's slice of it); every node."""
    begin, owned = owned_rows(num_rows)
    return (owned, 0, begin - weight_first_row), (owned, 0, begin), owned, 0, rows


@cuda.jit(device=True, **INLINED)
def units_plan(sliced, units, num_rows, rows):
    """By units: the rows whose unit r mod `units` this block owns; `weight` is W, or
    (`sliced`) this block's rows of it as `load_unit_rows` left them; every node."""
    y_rows, held = unit_rows(units, num_rows)
    return ((held, 0, 0) if sliced else y_rows), y_rows, held, 0, rows


@cuda.jit(device=True, **INLINED)
def node_ranges(count, balance):
    """The ranges of nodes the grid splits a batch of `count` nodes in: the most r, up to
    the blocks and the nodes, with r² · `balance` ≤ blocks · count (`codegen_cuda/ranges.py`).
    The same in every thread of the grid."""
    blocks = cuda.gridDim.x
    ranges = 1
    while (ranges < min(blocks, count)
           and (ranges + 1) * (ranges + 1) * balance <= blocks * count):
        ranges += 1
    return ranges


@cuda.jit(device=True, **INLINED)
def range_share(units, count, ranges):
    """(first unit, units, first node, nodes) of this block's share of a batch of `count`
    nodes split in `ranges` ranges, and `units` hidden units in as many groups as the grid
    has blocks for each range: block b takes group b mod groups of range b // groups (at one
    range, `owned_units` and every node). Blocks past the last range take none, from the
    batch's end: their first node still indexes the batch's `child_ptr` (a range's edges)."""
    groups = cuda.gridDim.x // ranges
    group, node_range = cuda.blockIdx.x % groups, cuda.blockIdx.x // groups
    units_a_group = (units + groups - 1) // groups
    nodes_a_range = (count + ranges - 1) // ranges
    unit_begin = group * units_a_group
    first_node = min(node_range * nodes_a_range, count)
    return (unit_begin, max(0, min(units_a_group, units - unit_begin)), first_node,
            max(0, min(nodes_a_range, count - first_node)))


@cuda.jit(device=True, **INLINED)
def range_plan(sliced, units, num_rows, unit_begin, unit_count, first_row, rows):
    """By units, in a ranged batch: the rows whose unit r mod `units` lies in this block's
    group (`unit_count` from `unit_begin` on, `range_share`), for the rows first_row ...
    first_row + rows - 1 of the inputs; `weight` is W, or (`sliced`, at one range) this
    block's rows of it as `load_unit_rows` left them."""
    y_rows, held = (unit_count, units, unit_begin), num_rows // units * unit_count
    return ((held, 0, 0) if sliced else y_rows), y_rows, held, first_row, rows


def fits_row_groups(num_rows, blocks):
    """Whether a grid of `blocks` blocks has two, at least, for each group of four of a
    weight's `num_rows` rows: the rule under which the products of a weight not split by
    units go in row groups (`row_group`, on the host at code generation)."""
    return 2 * ((num_rows + 3) // 4) <= blocks


@cuda.jit(device=True, **INLINED)
def row_group(num_rows, rows):
    """(first row, rows, first node, nodes) of this block's share of a product that the grid
    splits in groups: the weight's rows four to a group (a worker's item), and each group's
    nodes in ranges over the blocks that share it. Blocks past the last group's last range
    get no nodes. Needs twice as many blocks as groups, at least (`fits_row_groups`)."""
    groups = (num_rows + 3) // 4
    ranges = cuda.gridDim.x // groups
    group, node_range = cuda.blockIdx.x % groups, cuda.blockIdx.x // groups
    nodes_a_range = (rows + ranges - 1) // ranges
    first_node = node_range * nodes_a_range
    return (4 * group, min(4, num_rows - 4 * group), first_node,
            max(0, min(nodes_a_range, rows - first_node)))


@cuda.jit(device=True, **INLINED)
def row_groups_plan(num_rows, rows):
    """In groups (`row_group`), for a weight of fewer rows than four a block: split by
    blocks alone, each block would hold fewer rows than a worker's four-row item (computing
    some twice) and read every node's inputs; split so, it holds four and reads its range of
    nodes. `weight` is W itself."""
    first_row, held, first_node, nodes = row_group(num_rows, rows)
    owned = (held, 0, first_row)
    return owned, owned, held, first_node, nodes


@cuda.jit(device=True, **INLINED)
def multiply_share(weight, plan, x, y, tile, turn):
    """y[s, r] = Σ_k W[r, k] · x[s, k] for this block's share of the product, as `plan`
    says; `tile`: shared memory to stage x's rows through; `turn`: the worker to take the
    first item (`multiply`, which returns the next)."""
    weight_rows, y_rows, held, first_node, nodes = plan
    return multiply(weight, weight_rows, y_rows, held, x[first_node:], y[first_node:], nodes,
                    tile, turn)


@cuda.jit(device=True, **INLINED)
def matmul_rows(weight, weight_first_row, num_rows, x, y, rows, tile, turn):
    """y[s, r] = Σ_k W[r, k] · x[s, k] for s < rows and the rows r this block owns
    (`rows_plan`)."""
    return multiply_share(weight, rows_plan(weight_first_row, num_rows, rows), x, y, tile, turn)


@cuda.jit(device=True, **INLINED)
def matmul_row_groups(weight, num_rows, x, y, rows, tile, turn):
    """The same for this block's rows and nodes of a weight split in groups
    (`row_groups_plan`)."""
    return multiply_share(weight, row_groups_plan(num_rows, rows), x, y, tile, turn)


@cuda.jit(device=True, **INLINED)
def matmul_units(weight, sliced, units, num_rows, x, y, rows, tile, turn):
    """The same for the rows of a weight split by units (`units_plan`)."""
    return multiply_share(weight, units_plan(sliced, units, num_rows, rows), x, y, tile, turn)


@cuda.jit(device=True, **INLINED)
def matmul_range(weight, sliced, units, num_rows, unit_begin, unit_count, first_row, x, y,
                 rows, tile, turn):
    """The same for this block's units and rows of a ranged batch (`range_plan`)."""
    return multiply_share(weight, range_plan(sliced, units, num_rows, unit_begin, unit_count,
                                             first_row, rows), x, y, tile, turn)


@cuda.jit(device=True, **INLINED)
def block_matmul(weight, x, y, rows):
    """y[s, r] = Σ_k weight[r, k] · x[s, k] for s < rows and every row r, by this block alone
    (a product of one item of an unrolled batch); the caller synchronizes the block."""
    every_row = (weight.shape[0], 0, 0)
    multiply_direct(weight, every_row, every_row, weight.shape[0], x, y, rows, 0)


@cuda.jit(**BOUNDED)
def matmul_kernel(weight, x, y, rows):
    """One matrix product as a launch of its own (the unfused schedule): a block per few
    nodes' rows, not a persistent grid, so its inputs are read directly."""
    begin, owned = owned_rows(weight.shape[0])
    multiply_direct(weight, (owned, 0, begin), (owned, 0, begin), owned, x, y, rows, 0)


@cuda.jit(device=True, **INLINED)
def sum_outer_products(a, b, total):
    """total[r, c] = Σ_n a[r, n] · b[c, n]: a weight's gradient from the columns of its two
    vectors, a node's each, summed over the nodes: a product whose contraction runs over the
    nodes (`multiply_direct`: y[s, r] = Σ_k W[r, k] · x[s, k]). The blocks split the longer
    vector's rows, each computing the gradient's rows (or columns) it owns and reading the
    other vector whole: TreeLSTM's U_iou (a of 768 rows, b of 256) on 132 blocks, split by b,
    would give each block two of b's rows, half a four-row item, and make every block read
    all of a. No block adds to another's part."""
    if a.shape[0] >= b.shape[0]:
        begin, owned = owned_rows(a.shape[0])
        multiply_direct(a, (owned, 0, begin), (owned, 0, begin), owned, b, total.T,
                        b.shape[0], 0)
    else:
        begin, owned = owned_rows(b.shape[0])
        multiply_direct(b, (owned, 0, begin), (owned, 0, begin), owned, a, total,
                        a.shape[0], 0)


@cuda.jit(**BOUNDED)
def sum_outer_products_kernel(a, b, total):
    """`sum_outer_products` as a launch of its own (the unfused schedule)."""
    sum_outer_products(a, b, total)


@cuda.jit(device=True, **INLINED)
def sum_columns(a, total):
    """total[r] = Σ_n a[r, n] for the rows r this block owns, a thread a row: a bias's
    gradient from its weight's first vector, a node's each column."""
    begin, owned = owned_rows(a.shape[0])
    for row in range(begin + cuda.threadIdx.x, begin + owned, cuda.blockDim.x):
        value = a.dtype.type(0)
        for column in range(a.shape[1]):
            value += a[row, column]
        total[row] = value


@cuda.jit(**BOUNDED)
def sum_columns_kernel(a, total):
    """`sum_columns` as a launch of its own (the unfused schedule)."""
    sum_columns(a, total)


@cuda.jit(**BOUNDED)
def gather_rows(source, order, out, rows):
    """out[i] = source[order[i]] for i < rows: states from the linearized order into the
    forest's, GPU fields from the forest's into the linearized."""
    columns = out.shape[1]
    for item in range(cuda.grid(1), rows * columns, cuda.gridsize(1)):
        out[item // columns, item % columns] = source[order[item // columns], item % columns]


@cuda.jit(**BOUNDED)
def rows_differ(values, rows, kept, flags, slot, mark):
    """flags[slot] = mark if row rows[i] of `values` differs from row i of `kept` anywhere,
    for i < len(rows) (both seen as unsigned integers, so that a NaN equals itself): a GPU
    parameter changed in place since a vjp's forward read it (`snapshot.py`). A new `mark`
    each check, so that the flags need no clearing."""
    columns = kept.shape[1]
    for item in range(cuda.grid(1), rows.size * columns, cuda.gridsize(1)):
        if values[rows[item // columns], item % columns] != kept[item // columns, item % columns]:
            flags[slot] = mark


@cuda.jit(**BOUNDED)
def add_into(total, part):
    """total[i] += part[i], flat arrays of one size: a parameter's gradient summed from its
    parts on the device (`backward.DeviceGradients`)."""
    for item in range(cuda.grid(1), total.size, cuda.gridsize(1)):
        total[item] += part[item]
