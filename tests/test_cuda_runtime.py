"""The CUDA runtime's matrix products split a weight's rows over the grid's blocks, by rows or
by hidden units; numba's simulator runs a cooperative grid of one block, so the split is
checked here with ordinary launches of several blocks, reading the weight itself and each
block's shared slice. A warp computes one output: columns fewer than a warp's lanes, a
multiple of them, and neither. Products of more (node, four rows) items than a block's
workers stage their inputs through a shared tile: several tiles, the last one partial."""
import numpy as np
import pytest
from numba import cuda, float64

from recjit.codegen_cuda.runtime import (first_row, load_rows, load_unit_rows, matmul_kernel,
                                         matmul_range, matmul_rows, matmul_units,
                                         multiply_staged, node_ranges, owned_rows, owned_units,
                                         range_share)

WEIGHT_ROWS, COLUMNS, NODES = 13, 7, 5
# Two warps per block, so that warps share a block's outputs.
THREADS = 64
# The nodes a tile stages: fewer than NODES, and not a divisor of it.
TILE_NODES = 2


def product_from_shared_slices(columns):
    @cuda.jit
    def product(weight, x, y, rows):
        tile = cuda.shared.array((TILE_NODES, columns), float64)
        weight_slice = cuda.shared.array((WEIGHT_ROWS, columns), float64)
        load_rows(weight, weight_slice)
        cuda.syncthreads()
        matmul_rows(weight_slice, first_row(weight.shape[0]), weight.shape[0], x, y, rows,
                    tile, cuda.blockIdx.x)
    return product


def operands(seed, columns=COLUMNS):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(WEIGHT_ROWS, columns)), rng.normal(size=(NODES, columns))


@pytest.mark.parametrize("columns", [7, 32, 77])
@pytest.mark.parametrize("blocks", [1, 2, 3, 5, 13, 20])
def test_blocks_together_compute_every_row_once(blocks, columns):
    weight, x = operands(blocks, columns)
    y = np.full((NODES, WEIGHT_ROWS), np.nan)
    matmul_kernel[blocks, THREADS](weight, x, y, NODES)
    np.testing.assert_allclose(y, x @ weight.T, rtol=1e-12)


@pytest.mark.parametrize("columns", [7, 77])
@pytest.mark.parametrize("blocks", [1, 2, 3, 5, 13, 20])
def test_each_block_multiplies_its_shared_slice_of_the_rows(blocks, columns):
    weight, x = operands(100 + blocks, columns)
    y = np.full((NODES, WEIGHT_ROWS), np.nan)
    product_from_shared_slices(columns)[blocks, THREADS](weight, x, y, NODES)
    np.testing.assert_allclose(y, x @ weight.T, rtol=1e-12)


def test_only_the_first_rows_of_the_scratch_are_computed():
    weight, x = operands(7)
    y = np.full((NODES, WEIGHT_ROWS), np.nan)
    matmul_kernel[3, THREADS](weight, x, y, 2)
    np.testing.assert_allclose(y[:2], x[:2] @ weight.T, rtol=1e-12)
    assert np.isnan(y[2:]).all()


def staged_product(tile_nodes, columns):
    """Each block its own rows, every product staged, whatever the items' count."""
    @cuda.jit
    def product(weight, x, y, rows):
        tile = cuda.shared.array((tile_nodes, columns), float64)
        begin, owned = owned_rows(weight.shape[0])
        multiply_staged(weight, (owned, 0, begin), (owned, 0, begin), owned, x, y, rows, tile,
                        1)
    return product


@pytest.mark.parametrize("tile_nodes", [1, 2, 3, NODES, NODES + 3])
@pytest.mark.parametrize("blocks", [1, 3, 13])
def test_staged_products_cover_every_node_once_whatever_the_tile(blocks, tile_nodes):
    """Block b starts at its b-th tile: with 1, 2, 3 nodes a tile, 5 nodes are 5, 3 and 2
    tiles, the last one partial but for 1; a tile wider than the product is one turn."""
    weight, x = operands(300 + blocks + tile_nodes, 77)
    y = np.full((NODES, WEIGHT_ROWS), np.nan)
    staged_product(tile_nodes, 77)[blocks, THREADS](weight, x, y, NODES)
    np.testing.assert_allclose(y, x @ weight.T, rtol=1e-12)


def test_a_tile_narrower_than_the_rows_leaves_them_read_directly():
    """A tile of two nodes too narrow for x's columns is not used, though the items (40
    nodes × 2 groups of rows) outnumber the workers (a simulated block's 64 threads, a real
    one's 2 warps)."""
    weight, _ = operands(9)
    x = np.random.default_rng(9).normal(size=(40, COLUMNS))
    y = np.full((40, WEIGHT_ROWS), np.nan)

    @cuda.jit
    def product(weight, x, y, rows):
        tile = cuda.shared.array((2, 1), float64)
        matmul_rows(weight, 0, weight.shape[0], x, y, rows, tile, 0)

    product[2, THREADS](weight, x, y, 40)
    np.testing.assert_allclose(y, x @ weight.T, rtol=1e-12)


UNITS = 4  # the weight's rows: 3 gates of 4 units and one more gate (13 is not a multiple)
GATED_ROWS = 12


def product_by_units(sliced, columns):
    """Each block computes its rows into y[block] alone, then reads back, from there only,
    the rows of the units it owns into `gathered`."""
    @cuda.jit
    def product(weight, x, y, gathered, rows):
        block = cuda.blockIdx.x
        tile = cuda.shared.array((TILE_NODES, columns), float64)
        if sliced:
            weight_slice = cuda.shared.array((GATED_ROWS, columns), float64)
            load_unit_rows(weight, UNITS, weight_slice)
            cuda.syncthreads()
            matmul_units(weight_slice, True, UNITS, weight.shape[0], x, y[block], rows, tile, 3)
        else:
            matmul_units(weight, False, UNITS, weight.shape[0], x, y[block], rows, tile, 3)
        cuda.syncthreads()
        begin, owned = owned_units(UNITS)
        for item in range(cuda.threadIdx.x, rows * max(owned, 0), cuda.blockDim.x):
            s = item // owned
            unit = begin + item % owned
            for gate in range(GATED_ROWS // UNITS):
                gathered[s, gate * UNITS + unit] = y[block, s, gate * UNITS + unit]
    return product


@pytest.mark.parametrize("sliced", [False, True], ids=["weight", "shared slice"])
@pytest.mark.parametrize("columns", [7, 77])
@pytest.mark.parametrize("blocks", [1, 2, 3, 4, 6])
def test_a_block_computes_the_rows_its_units_read(blocks, columns, sliced):
    """Rows u, u + 4 and u + 8 of a gated weight are computed by the block that owns unit u,
    which reads them back from its own output alone; 4 units over 3 blocks are 2, 2 and
    none, over 6 blocks one each and none."""
    weight, x = operands(200 + blocks, columns)
    weight = weight[:GATED_ROWS]
    y = np.full((blocks, NODES, GATED_ROWS), np.nan)
    gathered = np.full((NODES, GATED_ROWS), np.nan)
    product_by_units(sliced, columns)[blocks, THREADS](weight, x, y, gathered, NODES)
    np.testing.assert_allclose(gathered, x @ weight.T, rtol=1e-12)


def product_by_ranges(balance, columns):
    """Each block computes its units' rows of its range of nodes into y[block] alone, then
    reads back, from there only, those rows into `gathered`, counting in `owners` the blocks
    that read each (node, unit) and noting the ranges in `used` and its first node in
    `firsts`."""
    @cuda.jit
    def product(weight, x, y, gathered, owners, used, firsts, rows):
        block = cuda.blockIdx.x
        tile = cuda.shared.array((TILE_NODES, columns), float64)
        ranges = node_ranges(rows, balance)
        unit_begin, units, first_node, nodes = range_share(UNITS, rows, ranges)
        matmul_range(weight, False, UNITS, weight.shape[0], unit_begin, units, first_node, x,
                     y[block], nodes, tile, 1)
        cuda.syncthreads()
        for item in range(cuda.threadIdx.x, nodes * units, cuda.blockDim.x):
            s = first_node + item // units
            unit = unit_begin + item % units
            owners[s, unit] += 1
            for gate in range(GATED_ROWS // UNITS):
                gathered[s, gate * UNITS + unit] = y[block, s, gate * UNITS + unit]
        used[block] = ranges
        firsts[block] = first_node
    return product


def expected_ranges(blocks, count, balance):
    """One, or the most r up to the blocks and the nodes with r² · balance ≤ blocks · count."""
    return max([1] + [r for r in range(2, min(blocks, count) + 1)
                      if r * r * balance <= blocks * count])


@pytest.mark.parametrize("balance", [1, 2, 4, 100])
@pytest.mark.parametrize("blocks", [1, 2, 3, 6, 7])
def test_a_block_computes_the_rows_its_units_read_for_its_range_of_nodes(blocks, balance):
    """A batch of 5 nodes in r ranges, the 4 units of each over ⌊blocks / r⌋ blocks: on 6
    blocks, balance 1 gives 5 ranges on one block each (one block idle), 2 gives 3 ranges of
    2, 2 and 1 nodes on 2 blocks each (units 2 and 2), 4 gives 2 ranges on 3 blocks (units
    2, 2 and none), 100 one range, the units alone split. Every (node, unit) is one block's,
    and a block past the last range starts at the batch's end, not past it (7 blocks, 2
    ranges of 3 blocks: the seventh's range would start at node 6 of 5)."""
    weight, x = operands(300 + blocks, 9)
    weight = weight[:GATED_ROWS]
    y = np.full((blocks, NODES, GATED_ROWS), np.nan)
    gathered = np.full((NODES, GATED_ROWS), np.nan)
    owners = np.zeros((NODES, UNITS), np.int64)
    used, firsts = np.zeros(blocks, np.int64), np.zeros(blocks, np.int64)
    product_by_ranges(balance, 9)[blocks, THREADS](weight, x, y, gathered, owners, used, firsts,
                                                   NODES)
    np.testing.assert_array_equal(used, expected_ranges(blocks, NODES, balance))
    assert firsts.max() <= NODES
    np.testing.assert_array_equal(owners, 1)
    np.testing.assert_allclose(gathered, x @ weight.T, rtol=1e-12)
