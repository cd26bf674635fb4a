"""Device functions that generated CUDA kernels call.

A weight's rows are split evenly over the grid's blocks: block b owns rows
[b·n, (b+1)·n) with n = ⌈rows / blocks⌉, for the whole launch. `matmul_rows` computes only the
owned rows, so a persistent kernel can keep them in shared memory (`load_rows`) and read them
from there in every batch. Inside a block, each warp computes one output at a time
(`multiply_rows_by_warps`); in numba's simulator, which has no warp shuffles, each thread
does."""
from numba import cuda
from numba.core import config

WARP = 32
ALL_LANES = 0xFFFFFFFF


@cuda.jit(device=True, inline=True)
def rows_per_block(num_rows):
    return (num_rows + cuda.gridDim.x - 1) // cuda.gridDim.x


@cuda.jit(device=True, inline=True)
def first_row(num_rows):
    """The first weight row this block owns."""
    return cuda.blockIdx.x * rows_per_block(num_rows)


@cuda.jit(device=True, inline=True)
def load_rows(weight, weight_slice):
    """Copy this block's rows of `weight` into `weight_slice` (shared memory); the caller
    synchronizes the block before reading it."""
    begin = first_row(weight.shape[0])
    owned = min(rows_per_block(weight.shape[0]), weight.shape[0] - begin)
    columns = weight.shape[1]
    for item in range(cuda.threadIdx.x, owned * columns, cuda.blockDim.x):
        row = item // columns
        column = item % columns
        weight_slice[row, column] = weight[begin + row, column]


@cuda.jit(device=True, inline=True)
def strided_dot(weight, local, x, s, first, step):
    """Σ W[local, k] · x[s, k] over k = first, first + step, ... below x's columns
    (first < columns)."""
    total = x[s, first] * weight[local, first]
    for k in range(first + step, x.shape[1], step):
        total += x[s, k] * weight[local, k]
    return total


@cuda.jit(device=True, inline=True)
def multiply_rows_by_warps(weight, weight_first_row, begin, owned, x, y, rows):
    """y[s, r] = Σ_k W[r, k] · x[s, k] for s < rows and begin <= r < begin + owned, by the
    threads of this block; `weight` holds W's rows from `weight_first_row` on. A warp takes
    one (s, r) at a time, its lanes every 32nd k, and sums them with shuffles: the loads of a
    warp are contiguous, and a dot product waits on columns / 32 loads in turn, not columns."""
    columns = x.shape[1]
    lane = cuda.threadIdx.x % WARP
    for item in range(cuda.threadIdx.x // WARP, rows * owned, cuda.blockDim.x // WARP):
        s = item // owned
        r = begin + item % owned
        local = r - weight_first_row
        if columns < WARP:  # too short to share: the first lane alone
            if lane == 0:
                y[s, r] = strided_dot(weight, local, x, s, 0, 1)
        else:
            total = strided_dot(weight, local, x, s, lane, WARP)
            offset = WARP // 2
            while offset > 0:
                total += cuda.shfl_down_sync(ALL_LANES, total, offset)
                offset //= 2
            if lane == 0:
                y[s, r] = total


@cuda.jit(device=True, inline=True)
def multiply_rows_by_threads(weight, weight_first_row, begin, owned, x, y, rows):
    """The same products, a thread per (s, r): numba's simulator has no warp shuffles."""
    for item in range(cuda.threadIdx.x, rows * owned, cuda.blockDim.x):
        s = item // owned
        r = begin + item % owned
        y[s, r] = strided_dot(weight, r - weight_first_row, x, s, 0, 1)


multiply_rows = multiply_rows_by_threads if config.ENABLE_CUDASIM else multiply_rows_by_warps


@cuda.jit(device=True, inline=True)
def matmul_rows(weight, weight_first_row, num_rows, x, y, rows):
    """y[s, r] = Σ_k W[r, k] · x[s, k] for s < rows and the rows r this block owns of a
    weight W with `num_rows` rows; `weight` holds W's rows from `weight_first_row` on (W
    itself, or this block's slice of it)."""
    begin = first_row(num_rows)
    owned = min(rows_per_block(num_rows), num_rows - begin)
    multiply_rows(weight, weight_first_row, begin, owned, x, y, rows)


@cuda.jit(device=True, inline=True)
def block_matmul(weight, x, y, rows):
    """y[s, r] = Σ_k weight[r, k] · x[s, k] for s < rows and every row r, by this block alone
    (a product of one item of an unrolled batch); the caller synchronizes the block."""
    multiply_rows(weight, 0, 0, weight.shape[0], x, y, rows)


@cuda.jit
def matmul_kernel(weight, x, y, rows):
    """One matrix product as a launch of its own (the unfused schedule)."""
    matmul_rows(weight, 0, weight.shape[0], x, y, rows)


@cuda.jit
def gather_rows(source, order, out):
    """out[i] = source[order[i]]: states from the linearized order into the forest's."""
    columns = out.shape[1]
    for item in range(cuda.grid(1), out.shape[0] * columns, cuda.gridsize(1)):
        out[item // columns, item % columns] = source[order[item // columns], item % columns]
