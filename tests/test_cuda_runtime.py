"""The CUDA runtime's matrix products split a weight's rows over the grid's blocks; numba's
simulator runs a cooperative grid of one block, so the split is checked here with ordinary
launches of several blocks, reading the weight itself and each block's shared slice."""
import numpy as np
import pytest
from numba import cuda, float64

from recjit.codegen_cuda.runtime import first_row, load_rows, matmul_kernel, matmul_rows

WEIGHT_ROWS, COLUMNS, NODES = 13, 7, 5


@cuda.jit
def product_from_shared_slices(weight, x, y, rows):
    weight_slice = cuda.shared.array((WEIGHT_ROWS, COLUMNS), float64)
    load_rows(weight, weight_slice)
    cuda.syncthreads()
    matmul_rows(weight_slice, first_row(weight.shape[0]), weight.shape[0], x, y, rows)


def operands(seed):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(WEIGHT_ROWS, COLUMNS)), rng.normal(size=(NODES, COLUMNS))


@pytest.mark.parametrize("blocks", [1, 2, 3, 5, 13, 20])
def test_blocks_together_compute_every_row_once(blocks):
    weight, x = operands(blocks)
    y = np.full((NODES, WEIGHT_ROWS), np.nan)
    matmul_kernel[blocks, 32](weight, x, y, NODES)
    np.testing.assert_allclose(y, x @ weight.T, rtol=1e-12)


@pytest.mark.parametrize("blocks", [1, 2, 3, 5, 13, 20])
def test_each_block_multiplies_its_shared_slice_of_the_rows(blocks):
    weight, x = operands(100 + blocks)
    y = np.full((NODES, WEIGHT_ROWS), np.nan)
    product_from_shared_slices[blocks, 32](weight, x, y, NODES)
    np.testing.assert_allclose(y, x @ weight.T, rtol=1e-12)


def test_only_the_first_rows_of_the_scratch_are_computed():
    weight, x = operands(7)
    y = np.full((NODES, WEIGHT_ROWS), np.nan)
    matmul_kernel[3, 32](weight, x, y, 2)
    np.testing.assert_allclose(y[:2], x[:2] @ weight.T, rtol=1e-12)
    assert np.isnan(y[2:]).all()
