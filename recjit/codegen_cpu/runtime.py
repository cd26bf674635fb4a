"""Hand-tuned building blocks that generated CPU kernels call.

`matmul_rows` is every matrix-vector product of one weight in one pass. Its register block is
6 nodes × 2 weight rows: per step of k it loads 2 weight values and 6 inputs for 12
multiply-adds, and LLVM vectorizes the k loop (a plain reduction under fastmath). Measured
on the 2-core EPYC, one thread, 768×256 weight: 6×2 runs at 70–76 GFLOP/s where 4×1 ran at
35–64, 4×2 at 60–66, and 6×3 or 8×2 spill registers (45–52). Nodes are the outer loop: six
inputs stay in L1 while the block's weight rows stream from L2; with the rows outer, a 640-node
level re-read its inputs from L3 for every pair of rows (TreeFC h512 took 12 ms, now 9)."""
import numba


@numba.njit(fastmath=True, inline="always")
def _six_by_two(weight, x, y, s, r, columns):
    zero = y.dtype.type(0)
    a00 = a01 = a10 = a11 = a20 = a21 = a30 = a31 = a40 = a41 = a50 = a51 = zero
    for k in range(columns):
        w0 = weight[r, k]
        w1 = weight[r + 1, k]
        x0 = x[s, k]
        x1 = x[s + 1, k]
        x2 = x[s + 2, k]
        x3 = x[s + 3, k]
        x4 = x[s + 4, k]
        x5 = x[s + 5, k]
        a00 += w0 * x0
        a01 += w1 * x0
        a10 += w0 * x1
        a11 += w1 * x1
        a20 += w0 * x2
        a21 += w1 * x2
        a30 += w0 * x3
        a31 += w1 * x3
        a40 += w0 * x4
        a41 += w1 * x4
        a50 += w0 * x5
        a51 += w1 * x5
    y[s, r], y[s, r + 1] = a00, a01
    y[s + 1, r], y[s + 1, r + 1] = a10, a11
    y[s + 2, r], y[s + 2, r + 1] = a20, a21
    y[s + 3, r], y[s + 3, r + 1] = a30, a31
    y[s + 4, r], y[s + 4, r + 1] = a40, a41
    y[s + 5, r], y[s + 5, r + 1] = a50, a51


@numba.njit(fastmath=True, inline="always")
def _four_by_two(weight, x, y, s, r, columns):
    zero = y.dtype.type(0)
    a00 = a01 = a10 = a11 = a20 = a21 = a30 = a31 = zero
    for k in range(columns):
        w0 = weight[r, k]
        w1 = weight[r + 1, k]
        x0 = x[s, k]
        x1 = x[s + 1, k]
        x2 = x[s + 2, k]
        x3 = x[s + 3, k]
        a00 += w0 * x0
        a01 += w1 * x0
        a10 += w0 * x1
        a11 += w1 * x1
        a20 += w0 * x2
        a21 += w1 * x2
        a30 += w0 * x3
        a31 += w1 * x3
    y[s, r], y[s, r + 1] = a00, a01
    y[s + 1, r], y[s + 1, r + 1] = a10, a11
    y[s + 2, r], y[s + 2, r + 1] = a20, a21
    y[s + 3, r], y[s + 3, r + 1] = a30, a31


@numba.njit(fastmath=True, inline="always")
def _three_by_two(weight, x, y, s, r, columns):
    zero = y.dtype.type(0)
    a00 = a01 = a10 = a11 = a20 = a21 = zero
    for k in range(columns):
        w0 = weight[r, k]
        w1 = weight[r + 1, k]
        x0 = x[s, k]
        x1 = x[s + 1, k]
        x2 = x[s + 2, k]
        a00 += w0 * x0
        a01 += w1 * x0
        a10 += w0 * x1
        a11 += w1 * x1
        a20 += w0 * x2
        a21 += w1 * x2
    y[s, r], y[s, r + 1] = a00, a01
    y[s + 1, r], y[s + 1, r + 1] = a10, a11
    y[s + 2, r], y[s + 2, r + 1] = a20, a21


@numba.njit(fastmath=True, inline="always")
def _two_by_two(weight, x, y, s, r, columns):
    zero = y.dtype.type(0)
    a00 = a01 = a10 = a11 = zero
    for k in range(columns):
        w0 = weight[r, k]
        w1 = weight[r + 1, k]
        x0 = x[s, k]
        x1 = x[s + 1, k]
        a00 += w0 * x0
        a01 += w1 * x0
        a10 += w0 * x1
        a11 += w1 * x1
    y[s, r], y[s, r + 1] = a00, a01
    y[s + 1, r], y[s + 1, r + 1] = a10, a11


@numba.njit(fastmath=True, inline="always")
def _one_by_two(weight, x, y, s, r, columns):
    zero = y.dtype.type(0)
    a00 = a01 = zero
    for k in range(columns):
        x0 = x[s, k]
        a00 += weight[r, k] * x0
        a01 += weight[r + 1, k] * x0
    y[s, r], y[s, r + 1] = a00, a01


@numba.njit(fastmath=True, cache=True, nogil=True)
def matmul_rows(weight, x, y, rows, row_begin, row_end):
    """y[s, r] = Σ_k weight[r, k] · x[s, k] for s < rows and row_begin <= r < row_end."""
    columns = x.shape[1]
    pairs_end = row_begin + (row_end - row_begin) // 2 * 2
    s = 0
    while s + 6 <= rows:
        for r in range(row_begin, pairs_end, 2):
            _six_by_two(weight, x, y, s, r, columns)
        s += 6
    # The last 1-5 nodes in at most two passes: 5 = 3 + 2, 4, 3, 2, 1.
    if s + 4 == rows:
        for r in range(row_begin, pairs_end, 2):
            _four_by_two(weight, x, y, s, r, columns)
        s += 4
    if s + 3 <= rows:
        for r in range(row_begin, pairs_end, 2):
            _three_by_two(weight, x, y, s, r, columns)
        s += 3
    if s + 2 <= rows:
        for r in range(row_begin, pairs_end, 2):
            _two_by_two(weight, x, y, s, r, columns)
        s += 2
    if s < rows:
        for r in range(row_begin, pairs_end, 2):
            _one_by_two(weight, x, y, s, r, columns)
    if pairs_end < row_end:
        for s in range(rows):
            total = y.dtype.type(0)
            for k in range(columns):
                total += weight[pairs_end, k] * x[s, k]
            y[s, pairs_end] = total
