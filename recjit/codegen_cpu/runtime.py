"""Hand-tuned building blocks that generated CPU kernels call.

`matmul_rows` is every matrix-vector product of one weight in one pass: each weight row is
loaded once and multiplied with four nodes' inputs at a time while they sit in L1, and the
k loop is a plain reduction that LLVM vectorizes under fastmath."""
import numba


@numba.njit(fastmath=True, cache=True, nogil=True)
def matmul_rows(weight, x, y, rows, row_begin, row_end):
    """y[s, r] = Σ_k weight[r, k] · x[s, k] for s < rows and row_begin <= r < row_end."""
    columns = x.shape[1]
    zero = y.dtype.type(0)
    s = 0
    while s + 4 <= rows:
        for r in range(row_begin, row_end):
            acc0 = zero
            acc1 = zero
            acc2 = zero
            acc3 = zero
            for k in range(columns):
                w = weight[r, k]
                acc0 += w * x[s, k]
                acc1 += w * x[s + 1, k]
                acc2 += w * x[s + 2, k]
                acc3 += w * x[s + 3, k]
            y[s, r] = acc0
            y[s + 1, r] = acc1
            y[s + 2, r] = acc2
            y[s + 3, r] = acc3
        s += 4
    while s < rows:
        for r in range(row_begin, row_end):
            acc0 = zero
            for k in range(columns):
                acc0 += weight[r, k] * x[s, k]
            y[s, r] = acc0
        s += 1
