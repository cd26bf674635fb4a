"""The hand-tuned building blocks of generated CPU kernels equal their plain definitions."""
import numpy as np
from hypothesis import given, strategies as st

from recjit.codegen_cpu.runtime import matmul_rows, matmul_share


@given(st.integers(0, 20), st.integers(1, 9), st.integers(1, 40),
       st.sampled_from(["float32", "float64"]), st.data())
def test_matmul_rows_equals_numpy_for_every_block_remainder(nodes, weight_rows, inner, dtype,
                                                            data):
    """Every register block and remainder: 0-20 nodes (6, 4, 3, 2 and 1 at a time), row
    ranges of every length, columns below, at and past a vector's lanes."""
    rng = np.random.default_rng(nodes * 1000 + weight_rows * 50 + inner)
    weight = rng.normal(size=(weight_rows, inner)).astype(dtype)
    x = rng.normal(size=(nodes + 2, inner)).astype(dtype)
    row_begin = data.draw(st.integers(0, weight_rows - 1))
    row_end = data.draw(st.integers(row_begin, weight_rows))
    y = np.full((nodes + 2, weight_rows), np.nan, dtype=dtype)
    matmul_rows(weight, x, y, nodes, row_begin, row_end)
    expected = x[:nodes].astype(np.float64) @ weight[row_begin:row_end].T.astype(np.float64)
    tolerance = 1e-12 if dtype == "float64" else 1e-5
    np.testing.assert_allclose(y[:nodes, row_begin:row_end], expected,
                               rtol=tolerance, atol=tolerance * np.sqrt(inner))
    untouched = np.ones_like(y, dtype=bool)
    untouched[:nodes, row_begin:row_end] = False
    assert np.isnan(y[untouched]).all()


@given(st.integers(1, 14), st.integers(1, 20), st.data())
def test_matmul_rows_reads_column_slices_and_strided_columns(nodes, inner, data):
    """Generated code passes column slices of a weight (`p_W[:, 0:3]`); any other stride takes
    the scalar path and still gives the product."""
    rng = np.random.default_rng(nodes * 100 + inner)
    step = data.draw(st.sampled_from([1, 2]))
    first = data.draw(st.integers(0, 3))
    weight_rows = 7
    full_weight = rng.normal(size=(weight_rows, first + inner * step + 2)).astype(np.float32)
    full_x = rng.normal(size=(nodes, first + inner * step + 1)).astype(np.float32)
    weight = full_weight[:, first:first + inner * step:step]
    x = full_x[:, first:first + inner * step:step]
    y = np.full((nodes, weight_rows), np.nan, dtype=np.float32)
    matmul_rows(weight, x, y, nodes, 0, weight_rows)
    expected = x.astype(np.float64) @ weight.T.astype(np.float64)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5 * np.sqrt(inner))


@given(st.integers(1, 9), st.integers(1, 70), st.integers(1, 4), st.sampled_from([1, 8, 32]),
       st.booleans())
def test_the_workers_shares_of_matmul_share_cover_every_row_once(nodes, weight_rows, workers,
                                                                 row_block, forward):
    """However many workers and whichever direction, the shares together are the product."""
    rng = np.random.default_rng(nodes * 1000 + weight_rows)
    weight = rng.normal(size=(weight_rows, 12))
    x = rng.normal(size=(nodes, 12))
    y = np.full((nodes, weight_rows), np.nan)
    for worker in range(workers):
        matmul_share(weight, x, y, nodes, row_block, worker, workers, forward)
    np.testing.assert_allclose(y, x @ weight.T, rtol=1e-12, atol=1e-12)
