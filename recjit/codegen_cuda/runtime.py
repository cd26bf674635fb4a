"""Device functions that generated CUDA kernels call.

A weight's rows are split evenly over the grid's blocks: block b owns rows
[b·n, (b+1)·n) with n = ⌈rows / blocks⌉, for the whole launch. `matmul_rows` computes only the
owned rows, so a persistent kernel can keep them in shared memory (`load_rows`) and read them
from there in every batch. Inside a block, each warp computes one node's products with four
rows at a time (`multiply_rows_by_warps`); in numba's simulator, which has no warp shuffles,
each thread does."""
from numba import cuda
from numba.core import config

from recjit.schedule import MAX_THREADS  # absolute: tools/check_ptx.py loads this file alone

WARP = 32
ALL_LANES = 0xFFFFFFFF
# The runtime's kernels run with the schedule's threads a block, so their registers must fit
# the most a schedule may ask for; the simulator's `cuda.jit` takes no launch bound.
BOUNDED = {} if config.ENABLE_CUDASIM else {"launch_bounds": MAX_THREADS}


@cuda.jit(device=True, inline=True)
def rows_per_block(num_rows):
    return (num_rows + cuda.gridDim.x - 1) // cuda.gridDim.x


@cuda.jit(device=True, inline=True)
def first_row(num_rows):
    """The first weight row this block owns."""
    return cuda.blockIdx.x * rows_per_block(num_rows)


@cuda.jit(device=True, inline=True)
def owned_rows(num_rows):
    """The first of a weight's rows this block owns, and how many it owns (none, or fewer
    than the others, at the grid's end)."""
    begin = first_row(num_rows)
    return begin, min(rows_per_block(num_rows), num_rows - begin)


@cuda.jit(device=True, inline=True)
def load_rows(weight, weight_slice):
    """Copy this block's rows of `weight` into `weight_slice` (shared memory); the caller
    synchronizes the block before reading it."""
    begin, owned = owned_rows(weight.shape[0])
    columns = weight.shape[1]
    for item in range(cuda.threadIdx.x, owned * columns, cuda.blockDim.x):
        row = item // columns
        column = item % columns
        weight_slice[row, column] = weight[begin + row, column]


@cuda.jit(device=True, inline=True)
def add_products(totals, value, weight, rows, k):
    """totals[i] + value · weight[rows[i], k] for the four rows."""
    return (totals[0] + value * weight[rows[0], k], totals[1] + value * weight[rows[1], k],
            totals[2] + value * weight[rows[2], k], totals[3] + value * weight[rows[3], k])


@cuda.jit(device=True, inline=True)
def strided_dots(weight, row, last, x, s, first, step):
    """Σ W[r, k] · x[s, k] over k = first, first + step, ... below x's columns for the four
    rows r = row ... row + 3 of `weight`, each x[s, k] loaded once for all four: four
    independent sums, not one chain. Rows past `last` repeat it. Four of x's values are
    loaded before any is multiplied: x was written by other blocks, so each load waits on
    L2, and four in flight wait once. On an H100 this took a TreeLSTM h256 batch from 10.3
    to 8.6 us; eight at a time ran as fast and took 31 s to compile against 20."""
    rows = (row, min(row + 1, last), min(row + 2, last), min(row + 3, last))
    zero = x.dtype.type(0)
    totals = (zero, zero, zero, zero)
    columns = x.shape[1]
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


@cuda.jit(device=True, inline=True)
def store_four(y, s, r, last, totals):
    """y[s, r + i] = totals[i] for the rows up to `last`."""
    y[s, r] = totals[0]
    if r + 1 <= last:
        y[s, r + 1] = totals[1]
    if r + 2 <= last:
        y[s, r + 2] = totals[2]
    if r + 3 <= last:
        y[s, r + 3] = totals[3]


@cuda.jit(device=True, inline=True)
def warp_sum(total):
    """The sum of `total` over the warp's lanes, in lane 0."""
    offset = WARP // 2
    while offset > 0:
        total += cuda.shfl_down_sync(ALL_LANES, total, offset)
        offset //= 2
    return total


@cuda.jit(device=True, inline=True)
def multiply_rows_by_warps(weight, weight_first_row, begin, owned, x, y, rows):
    """y[s, r] = Σ_k W[r, k] · x[s, k] for s < rows and begin <= r < begin + owned, by the
    threads of this block; `weight` holds W's rows from `weight_first_row` on. A warp takes
    one node s and four rows at a time, its lanes every 32nd k, and sums with shuffles: the
    loads of a warp are contiguous, x[s, k] is loaded once for four rows, and a lane keeps
    four independent sums in flight."""
    columns = x.shape[1]
    lane = cuda.threadIdx.x % WARP
    groups = (owned + 3) // 4
    last = begin + owned - 1
    for item in range(cuda.threadIdx.x // WARP, rows * groups, cuda.blockDim.x // WARP):
        s = item // groups
        r = begin + item % groups * 4
        local, local_last = r - weight_first_row, last - weight_first_row
        if columns < WARP:  # too short to share: the first lane alone
            if lane == 0:
                store_four(y, s, r, last, strided_dots(weight, local, local_last, x, s, 0, 1))
        else:
            totals = strided_dots(weight, local, local_last, x, s, lane, WARP)
            sums = (warp_sum(totals[0]), warp_sum(totals[1]), warp_sum(totals[2]),
                    warp_sum(totals[3]))
            if lane == 0:
                store_four(y, s, r, last, sums)


@cuda.jit(device=True, inline=True)
def multiply_rows_by_threads(weight, weight_first_row, begin, owned, x, y, rows):
    """The same products, a thread per node and four rows: numba's simulator has no warp
    shuffles."""
    groups = (owned + 3) // 4
    last = begin + owned - 1
    for item in range(cuda.threadIdx.x, rows * groups, cuda.blockDim.x):
        s = item // groups
        r = begin + item % groups * 4
        store_four(y, s, r, last, strided_dots(weight, r - weight_first_row,
                                               last - weight_first_row, x, s, 0, 1))


multiply_rows = multiply_rows_by_threads if config.ENABLE_CUDASIM else multiply_rows_by_warps


@cuda.jit(device=True, inline=True)
def matmul_rows(weight, weight_first_row, num_rows, x, y, rows):
    """y[s, r] = Σ_k W[r, k] · x[s, k] for s < rows and the rows r this block owns of a
    weight W with `num_rows` rows; `weight` holds W's rows from `weight_first_row` on (W
    itself, or this block's slice of it)."""
    begin, owned = owned_rows(num_rows)
    multiply_rows(weight, weight_first_row, begin, owned, x, y, rows)


@cuda.jit(device=True, inline=True)
def block_matmul(weight, x, y, rows):
    """y[s, r] = Σ_k weight[r, k] · x[s, k] for s < rows and every row r, by this block alone
    (a product of one item of an unrolled batch); the caller synchronizes the block."""
    multiply_rows(weight, 0, 0, weight.shape[0], x, y, rows)


@cuda.jit(**BOUNDED)
def matmul_kernel(weight, x, y, rows):
    """One matrix product as a launch of its own (the unfused schedule)."""
    matmul_rows(weight, 0, weight.shape[0], x, y, rows)


@cuda.jit(**BOUNDED)
def gather_rows(source, order, out):
    """out[i] = source[order[i]]: states from the linearized order into the forest's."""
    columns = out.shape[1]
    for item in range(cuda.grid(1), out.shape[0] * columns, cuda.gridsize(1)):
        out[item // columns, item % columns] = source[order[item // columns], item % columns]
