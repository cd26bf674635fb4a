"""The hand-tuned building blocks of generated CPU kernels equal their plain definitions."""
import os
import subprocess
import sys
import threading

import numba
import numpy as np
import pytest
from hypothesis import assume, given, strategies as st

from recjit.codegen_cpu import calls
from recjit.codegen_cpu.runtime import (OUTER_CHUNK, VECTOR_BYTES, _dot_walk, matmul_rows,
                                       matmul_share, pack_share, panel_rows, panel_width,
                                       row_panels, tail_rows, target_vector_bytes,
                                       weight_panels)


def no_tail(weight):
    """The tail of a weight whose columns are adjacent: none (`tail_rows`)."""
    return np.empty((0, 0), dtype=weight.dtype)


@given(st.integers(0, 20), st.integers(1, 9), st.integers(1, 40),
       st.sampled_from(["float32", "float64"]), st.data())
def test_matmul_rows_equals_numpy_for_every_block_remainder(nodes, weight_rows, inner, dtype,
                                                            data):
    """Every register block and remainder: 0-20 nodes (6 at a time, then 5, 4, 3, 2 or 1), row
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
       st.booleans(), st.randoms(use_true_random=False))
def test_the_workers_claims_in_matmul_share_cover_every_row_once_product_after_product(
        nodes, weight_rows, workers, row_block, packed, random):
    """However many workers, in whichever order they come, with panels or without, their claims
    together are the product, in both directions from wherever the last product left the
    starts, and leave every counter at zero."""
    rng = np.random.default_rng(nodes * 1000 + weight_rows)
    weight = rng.normal(size=(weight_rows, 12))
    x = rng.normal(size=(nodes, 12))
    panels = weight_panels(weight, packed)
    for worker in range(workers):
        pack_share(weight, panels, row_block, worker, workers)
    claimed, starts = np.zeros(workers, dtype=np.int64), np.zeros(workers, dtype=np.int64)
    for product in range(4):
        y = np.full((nodes, weight_rows), np.nan)
        for worker in random.sample(range(workers), workers):
            matmul_share(weight, panels, no_tail(weight), x, y, nodes, row_block, worker, workers,
                         product % 2 == 0, claimed, starts)
        np.testing.assert_allclose(y, x @ weight.T, rtol=1e-12, atol=1e-12)
        assert not claimed.any()


def test_two_threads_claiming_blocks_at_once_cover_every_row_once_product_after_product():
    """Two workers on two threads at once (`matmul_share` releases the GIL) split a product's
    blocks wherever they meet, a different split each time (a product is long enough here for
    both threads to be claiming at once); every split is the whole product."""
    rng = np.random.default_rng(5)
    weight = rng.normal(size=(4096, 256)).astype(np.float32)
    x = rng.normal(size=(12, 256)).astype(np.float32)
    panels = weight_panels(weight, True)
    pack_share(weight, panels, 8, 0, 1)
    claimed, starts = np.zeros(2, dtype=np.int64), np.zeros(2, dtype=np.int64)
    expected = x @ weight.T
    for product in range(20):
        y = np.full((12, 4096), np.nan, dtype=np.float32)
        threads = [threading.Thread(target=matmul_share, args=(
            weight, panels, no_tail(weight), x, y, 12, 8, worker, 2, product % 2 == 0, claimed,
            starts))
            for worker in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
        assert not claimed.any() and 0 <= starts[0] < 4096 // 8


@numba.njit
def transposed_product(parameter, x, y):
    """y = x @ parameter as a kernel computes `h @ p.W`: through the rows of `p_W.T` as
    panels and the rows after them copied, by the products' exported symbol (compiled once
    per dtype, not for this test)."""
    weight = parameter.T
    panels = calls.row_panels(weight)
    claimed, starts = np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    calls.matmul_share(weight, panels, calls.tail_rows(weight, panels), x, y, x.shape[0], 8,
                       0, 1, True, claimed, starts)


@given(st.integers(1, 50), st.integers(1, 40), st.integers(1, 13),
       st.sampled_from(["float32", "float64"]))
def test_products_through_a_transposed_parameters_rows_as_panels_equal_numpy(
        weight_rows, inner, nodes, dtype):
    """`row_panels` of `pT_W = p_W.T` are views of p_W's rows (a read-only parameter's too),
    and the rows after the last whole panel go through the dot blocks, from their copy."""
    rng = np.random.default_rng(weight_rows * 100 + inner)
    parameter = rng.normal(size=(inner, weight_rows)).astype(dtype)
    parameter.flags.writeable = False
    panels = row_panels(parameter.T)
    assert panels.shape[0] == weight_rows // panel_width(np.dtype(dtype).itemsize)
    assert np.shares_memory(panels, parameter) or panels.size == 0
    x = rng.normal(size=(nodes, inner)).astype(dtype)
    y = np.full((nodes, weight_rows), np.nan, dtype=dtype)
    transposed_product(parameter, x, y)
    np.testing.assert_allclose(y, x @ parameter, rtol=1e-4, atol=1e-4)


def test_a_weight_whose_rows_are_not_adjacent_has_no_row_panels():
    """Its products read its rows as they are, through the dot blocks."""
    assert row_panels(np.ones((40, 8))).shape[0] == 0


@given(st.integers(1, 50), st.integers(1, 40), st.sampled_from(["float32", "float64"]))
def test_pack_share_transposes_every_whole_panel_of_the_weight(weight_rows, inner, dtype):
    """Panel p holds rows p·width .. p·width + width - 1, column k at panels[p, k]; the rows
    after the last whole panel are left to `matmul_rows`."""
    weight = np.random.default_rng(weight_rows * 100 + inner).normal(
        size=(weight_rows, inner)).astype(dtype)
    panels = weight_panels(weight, True)
    width = panel_width(np.dtype(dtype).itemsize)
    assert panels.shape == (weight_rows // width, inner, width)
    pack_share(weight, panels, width, 0, 1)
    whole = panels.shape[0] * width
    np.testing.assert_array_equal(
        panels, weight[:whole].reshape(-1, width, inner).transpose(0, 2, 1))


@given(st.integers(0, 20), st.integers(1, 5), st.integers(0, 140),
       st.sampled_from(["float32", "float64"]), st.booleans(), st.data())
def test_panel_rows_equals_numpy_for_every_block_remainder(nodes, num_panels, inner, dtype,
                                                           as_they_lie, data):
    """Every outer-product block and remainder: 0-20 nodes (6 at a time, then 5, 4, 3, 2 or
    1), any number of columns: none, within a chunk of `OUTER_CHUNK`, past it, and columns
    left over after a chunk's split into accumulator sets; packed panels, and panels that are
    a parameter's rows as they lie, which are walked `PANEL_DEPTH` columns at a time."""
    assume(inner > 0 or as_they_lie)  # NumPy gives a weight of no columns no row stride
    rng = np.random.default_rng(nodes * 1000 + num_panels * 50 + inner)
    width = panel_width(np.dtype(dtype).itemsize)
    if as_they_lie:  # sliced, so that a parameter of no rows keeps its rows' stride
        parameter = rng.normal(size=(max(inner, 1), num_panels * width)).astype(dtype)
        weight = parameter[:inner].T
        panels = row_panels(weight)
    else:
        weight = rng.normal(size=(num_panels * width, inner)).astype(dtype)
        panels = weight_panels(weight, True)
        pack_share(weight, panels, width, 0, 1)
    assert panels.shape == (num_panels, inner, width)
    panel_begin = data.draw(st.integers(0, num_panels - 1))
    panel_end = data.draw(st.integers(panel_begin, num_panels))
    x = rng.normal(size=(nodes + 2, inner)).astype(dtype)
    y = np.full((nodes + 2, weight.shape[0]), np.nan, dtype=dtype)
    panel_rows(panels, x, y, nodes, panel_begin, panel_end)
    rows = slice(panel_begin * width, panel_end * width)
    expected = x[:nodes].astype(np.float64) @ weight[rows].T.astype(np.float64)
    tolerance = 1e-12 if dtype == "float64" else 1e-5
    np.testing.assert_allclose(y[:nodes, rows], expected,
                               rtol=tolerance, atol=tolerance * np.sqrt(inner))
    untouched = np.ones_like(y, dtype=bool)
    untouched[:nodes, rows] = False
    assert np.isnan(y[untouched]).all()


def test_dot_blocks_add_their_sums_to_y_when_told_to():
    """`added`: y plus the sums, for every block of a walk over 0-20 nodes."""
    walk = numba.njit(lambda weight, x, y, rows: _dot_walk(weight, x, y, rows, 0,
                                                          weight.shape[0], True))
    rng = np.random.default_rng(5)
    weight = rng.normal(size=(9, 37)).astype(np.float32)
    for nodes in range(21):
        x = rng.normal(size=(nodes, 37)).astype(np.float32)
        y = rng.normal(size=(nodes, 9)).astype(np.float32)
        expected = y + x @ weight.T
        walk(weight, x, y, nodes)
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_weights_are_not_packed_when_the_run_says_no_or_their_columns_are_strided():
    """No panels: `matmul_share` multiplies every row through `matmul_rows`."""
    weight = np.ones((4 * panel_width(4), 16), dtype=np.float32)
    assert weight_panels(weight, False).shape[0] == 0
    assert weight_panels(weight[:, ::2], True).shape[0] == 0
    assert weight_panels(weight, True).shape[0] == 4


def test_matmul_share_with_panels_writes_a_y_whose_columns_are_strided():
    """Vector stores need adjacent columns; any other y takes `matmul_rows` for every row."""
    rng = np.random.default_rng(3)
    width = panel_width(4)
    weight = rng.normal(size=(2 * width, 8)).astype(np.float32)
    x = rng.normal(size=(5, 8)).astype(np.float32)
    panels = weight_panels(weight, True)
    pack_share(weight, panels, width, 0, 1)
    y = np.full((5, 4 * width), np.nan, dtype=np.float32)
    matmul_share(weight, panels, no_tail(weight), x, y[:, ::2], 5, width, 0, 1, True,
                 np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64))
    np.testing.assert_allclose(y[:, ::2], x @ weight.T, rtol=1e-5, atol=1e-5)
    assert np.isnan(y[:, 1::2]).all()


def test_the_tail_of_a_weight_read_transposed_is_its_rows_after_the_whole_panels():
    """Copied so that their columns are adjacent; a weight whose columns already are has none."""
    parameter = np.arange(450 * 150, dtype=np.float32).reshape(450, 150)
    weight = parameter.T
    tail = tail_rows(weight, row_panels(weight))
    whole = 150 - 150 % panel_width(4)
    assert tail.flags.c_contiguous
    np.testing.assert_array_equal(tail, weight[whole:])
    assert tail_rows(parameter, weight_panels(parameter, True)).shape[0] == 0


def test_matmul_share_reads_a_transposed_weights_tail_rows_into_a_y_whose_columns_are_strided():
    """Without panels (y's columns are not adjacent), the rows before the tail are read as
    they lie and the tail's from its copy, each into its own columns of y."""
    rng = np.random.default_rng(4)
    parameter = rng.normal(size=(24, 40)).astype(np.float32)
    weight = parameter.T
    panels = row_panels(weight)
    x = rng.normal(size=(7, 24)).astype(np.float32)
    y = np.full((7, 80), np.nan, dtype=np.float32)
    matmul_share(weight, panels, tail_rows(weight, panels), x, y[:, ::2], 7, 8, 0, 1, True,
                 np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64))
    np.testing.assert_allclose(y[:, ::2], x @ parameter, rtol=1e-5, atol=1e-5)
    assert np.isnan(y[:, 1::2]).all()


def test_outer_blocks_keep_the_small_terms_of_a_long_row_behind_a_large_first_one():
    """A row of 1 then 511 terms of 2^-25, below half a float32 ulp of 1: one running sum
    loses them all; sums of `OUTER_CHUNK` columns added to y lose at most the first chunk's
    (a one-node block splits a chunk over several accumulators, and keeps some of those)."""
    tiny = 2.0 ** -25
    width = panel_width(4)
    weight = np.full((width, 512), tiny, dtype=np.float32)
    weight[:, 0] = 1
    panels = weight_panels(weight, True)
    pack_share(weight, panels, width, 0, 1)
    y = np.zeros((1, width), dtype=np.float32)
    panel_rows(panels, np.ones((1, 512), dtype=np.float32), y, 1, 0, 1)
    exact = 1 + 511 * tiny
    assert np.all(y <= exact)
    assert np.all(exact - y <= OUTER_CHUNK * tiny)


def test_a_vector_is_one_register_of_the_cpu_numba_compiles_for():
    """64 bytes where the target has AVX-512, 32 (AVX2's) anywhere else."""
    assert target_vector_bytes("+avx,+avx2,+avx512f,+fma") == 64
    assert target_vector_bytes("+avx,+avx2,-avx512f,+fma") == 32
    assert target_vector_bytes("+avx512fp16") == 32
    assert target_vector_bytes("") == 32


@pytest.mark.skipif(VECTOR_BYTES == 32, reason="the suite itself runs the 32-byte vectors here")
def test_the_32_byte_vectors_give_numpys_products_and_the_recursions_states():
    """Where the suite runs the AVX-512 vectors, the AVX2 ones are checked in a process that
    compiles for this CPU without AVX-512: the blocks and panels against NumPy, and a
    TreeLSTM's float32 states through packed weights against the recursion (its backward
    multiplies through the same blocks)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    environment = dict(os.environ, NUMBA_CPU_FEATURES="-avx512f")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "tests/test_runtime.py", "-k", "not 32_byte and not claim",
         "tests/test_zoo.py::test_weights_packed_into_panels_give_the_reference_in_float32"
         + "[tree_lstm]"],
        cwd=root, env=environment, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
