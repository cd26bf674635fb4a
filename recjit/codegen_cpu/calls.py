"""The runtime's products as generated kernels call them: by a symbol that is resolved when the
kernel's machine code is loaded, not by linking the runtime into the kernel.

A call from one numba function to another links the callee's LLVM IR into the caller's module
and optimizes it there again, and numba compiles every prange region as a function of its own.
A kernel whose regions call the products a dozen times (TreeLSTM's) took nearly three times
as long to compile that way as calling them by symbol. Here each product is compiled once per
dtype, for arrays of any layout (numba keeps it in its disk cache), and its machine code is
registered under a symbol (`export`); the kernel declares that symbol and calls it with
numba's calling convention. A kernel that numba loads from its cache is not typed again, so
nothing in it registers the symbols: `CpuKernel` exports its dtype's before it loads the
kernel."""
import threading

import llvmlite.binding as llvm
import numba
import numpy as np
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

from ..generated import compiling
from . import runtime

_lock = threading.Lock()
_exported = set()


def _parameters(name, dtype):
    """The types each product is compiled for: the kernel's arguments converted to these."""
    matrix, panels, index = (types.Array(dtype, 2, "A"), types.Array(dtype, 3, "A"),
                             types.intp)
    read = types.Array(dtype, 2, "A", readonly=True)  # a user's weights may be read-only,
    read_panels = types.Array(dtype, 3, "A", readonly=True)  # and panels that are their rows
    counters = types.Array(types.int64, 1, "A")
    return {"matmul_rows": (read, read, matrix, index, index, index),
            "matmul_share": (read, read_panels, read, read, matrix, index, index, index,
                             index, types.boolean, counters, counters),
            "pack_share": (read, panels, index, index, index),
            "panel_rows": (read_panels, read, matrix, index, index, index)}[name]


PRODUCTS = ("matmul_rows", "matmul_share", "pack_share", "panel_rows")


def _symbol(name, dtype):
    return f"recjit_cpu_{name}_{dtype}"


def export(dtype):
    """Compile (or load from numba's cache) every product for `dtype` (a NumPy dtype or its
    name) and register the symbols kernels call them by, once a process."""
    dtype = numba.from_dtype(np.dtype(dtype))
    with _lock:
        for name in PRODUCTS:
            symbol = _symbol(name, dtype)
            if symbol in _exported:
                continue
            dispatcher, parameters = getattr(runtime, name), _parameters(name, dtype)
            with compiling(symbol):
                dispatcher.compile(parameters)
            compiled = dispatcher.overloads[parameters]
            llvm.add_symbol(symbol, compiled.library.get_pointer_to_function(
                compiled.fndesc.llvm_func_name))
            _exported.add(symbol)


def _call_by_symbol(name, typingctx, arguments):
    """The signature and code of an intrinsic with the product's parameters that calls it by
    symbol."""
    arrays = [a for a in arguments if isinstance(a, types.Array)]
    if not arrays or arrays[0].dtype not in (types.float32, types.float64):
        raise TypingError(f"{name} needs float32 or float64 arrays, not {arguments}")
    parameters = _parameters(name, arrays[0].dtype)
    if not all(typingctx.can_convert(a, p) for a, p in zip(arguments, parameters)):
        raise TypingError(f"{name} takes {parameters}, not {arguments}")
    export(str(arrays[0].dtype))
    symbol = _symbol(name, arrays[0].dtype)

    def codegen(context, builder, signature, values):
        converted = [context.cast(builder, value, argument, parameter)
                     for value, argument, parameter in zip(values, signature.args, parameters)]
        function = cgutils.get_or_insert_function(
            builder.module, context.call_conv.get_function_type(types.none, parameters), symbol)
        context.call_conv.call_function(builder, function, types.none, parameters, converted)
        return context.get_dummy_value()

    return types.void(*arguments), codegen


@intrinsic
def matmul_rows(typingctx, weight, x, y, rows, row_begin, row_end):
    return _call_by_symbol("matmul_rows", typingctx, (weight, x, y, rows, row_begin, row_end))


@intrinsic
def matmul_share(typingctx, weight, panels, tail, x, y, rows, row_block, worker, workers,
                 forward, claimed, starts):
    return _call_by_symbol("matmul_share", typingctx,
                           (weight, panels, tail, x, y, rows, row_block, worker, workers,
                            forward, claimed, starts))


@intrinsic
def panel_rows(typingctx, panels, x, y, rows, panel_begin, panel_end):
    return _call_by_symbol("panel_rows", typingctx, (panels, x, y, rows, panel_begin, panel_end))


@intrinsic
def pack_share(typingctx, weight, panels, row_block, worker, workers):
    return _call_by_symbol("pack_share", typingctx, (weight, panels, row_block, worker, workers))


weight_panels, row_panels = runtime.weight_panels, runtime.row_panels
transposed_room, pack_rows_share = runtime.transposed_room, runtime.pack_rows_share
transposed_panels, tail_rows = runtime.transposed_panels, runtime.tail_rows
sum_rows_share = runtime.sum_rows_share


@numba.njit(parallel=True, fastmath=True, nogil=True, cache=True)
def weight_gradient(workers, a_rows, b_rows, y, row_block):
    """y[j, i] = Σ_n a[n, i] · b[n, j], a weight's gradient Σ a ⊗ b over every node, with the
    kernels' own product (`matmul_share`), both sides a node's vector a row, as the CPU's
    backward kernel writes them. Read transposed, `a_rows` are the product's weight and its
    panels as they lie (`transposed_panels`: no transposition, no packing, unless the rows
    are a multiple of 1 KiB apart, whose products ran 4–10% faster packed at 512 floats:
    `transposed_room`), and `b_rows` its x: an outer-product block reads x an element at a
    time, six adjacent ones of a row of b per node, so b needs no transposition. a's columns
    after its whole panels, which the dot blocks would read an element at a time, are
    zero-padded panels of their own (`padded_panels`), multiplied into scratch columns in
    shares of whole passes of six rows, so that every row takes the pass it takes on one
    thread: the same sums on any count. Its threads are the kernels' own, so it does not
    wait on another pool's threads spinning on the same cores, as a NumPy product after a
    kernel did. Over many rows, or rows that lie in few cache sets, the host calls
    `weight_gradient_by_chunks` or `apart_rows` first (`codegen_cpu.sum_of_outer_products`)."""
    weight = a_rows.T
    x = b_rows.T
    room = transposed_room(weight, True)
    if room.shape[0] > 0:
        for worker in numba.prange(workers):
            pack_rows_share(weight, room, worker, workers)
    panels = transposed_panels(weight, room)
    width = runtime.panel_width(a_rows.itemsize)
    whole = panels.shape[0] * width
    columns = x.shape[0]
    if whole > 0:
        claimed = np.zeros(workers, dtype=np.int64)
        starts = np.zeros(workers, dtype=np.int64)
        no_tail = weight[:0]
        for worker in numba.prange(workers):
            matmul_share(weight[:whole], panels, no_tail, x, y[:, :whole], columns, row_block,
                         worker, workers, True, claimed, starts)
    if whole < weight.shape[0]:
        last = padded_panels(a_rows, whole, width)
        passes = columns // 6
        for worker in numba.prange(workers):
            first = worker * passes // workers * 6
            end = columns if worker == workers - 1 else (worker + 1) * passes // workers * 6
            _padded_product(last, x[first:end], y[first:end, whole:])


# The nodes from which a weight gradient's product reads b's rows from a copy that puts them
# apart where they lie in few cache sets: reading six elements of each node's row, down the
# nodes, a product's blocks found those rows in L1 no more, and at 1,000 nodes and more the
# copy cost less than that.
APART_FROM_ROWS = 960


def rows_in_few_sets(rows):
    """Whether the rows lie a power of two of `ALIASED_STRIDE` apart (1, 2, 4 KiB...): the
    same few sets of a cache hold all of them. Three KiB apart they spread."""
    multiple = rows.strides[0] // runtime.ALIASED_STRIDE
    return (rows.strides[0] % runtime.ALIASED_STRIDE == 0 and multiple > 0
            and multiple & (multiple - 1) == 0)


@numba.njit(parallel=True, nogil=True, cache=True)
def apart_rows(workers, rows):
    """A copy of `rows` whose rows lie a cache line further apart than its columns take. A
    row a task: the same copy on any count of `workers`, which a `Launcher` passes."""
    columns = rows.shape[1]
    padded = np.empty((rows.shape[0], columns + 64 // rows.itemsize), dtype=rows.dtype)
    for row in numba.prange(rows.shape[0]):
        padded[row, :columns] = rows[row]
    return padded[:, :columns]


# The rows of a and b one task of a weight gradient over many rows takes: a panel's and a pass's
# share of them, 64 KiB each in float32, stay in a core's L2 for every pass over them.
WEIGHT_GRADIENT_CHUNK = 1024


@numba.njit(parallel=True, fastmath=True, nogil=True, cache=True)
def weight_gradient_by_chunks(workers, a_rows, b_rows, y):
    """`weight_gradient` over more than two chunks of rows (MV-RNN's W_M: a row per node and
    k, 64 a node): each chunk's product into a partial of its own, the chunks shared among
    the threads, then the partials summed in order. Its one product over all the rows
    walked every row once per pass and panel, more than L2 holds: the rows came from L3
    each time. A chunk a task: the same sums on any count of `workers`, which a `Launcher`
    passes."""
    nodes = a_rows.shape[0]
    chunks = -(-nodes // WEIGHT_GRADIENT_CHUNK)
    columns = y.shape[0]
    partials = np.empty((chunks,) + y.shape, dtype=y.dtype)
    for chunk in numba.prange(chunks):
        first = chunk * WEIGHT_GRADIENT_CHUNK
        end = min(nodes, first + WEIGHT_GRADIENT_CHUNK)
        _panel_product(a_rows[first:end], b_rows[first:end].T, partials[chunk])
    for column in numba.prange(columns):
        y[column] = partials[0, column]
        for chunk in range(1, chunks):
            y[column] += partials[chunk, column]


@numba.njit(fastmath=True, nogil=True, inline="always")
def _panel_product(rows, x, y):
    """y[s, c] = Σ_k rows[k, c] · x[s, k] for every row s of y and column c of `rows` (a
    node's vector each): its whole panels as they lie (`row_panels`), the columns after them
    through zero-padded panels of their own (`padded_panels`)."""
    panels = row_panels(rows.T)
    panel_rows(panels, x, y, y.shape[0], 0, panels.shape[0])
    whole = panels.shape[0] * panels.shape[2]
    if whole < rows.shape[1]:
        _padded_product(padded_panels(rows, whole, runtime.panel_width(rows.itemsize)), x,
                        y[:, whole:])


@numba.njit(fastmath=True, nogil=True, inline="always")
def _padded_product(panels, x, y):
    """y[s, c] = Σ_k panels[c // width, k, c % width] · x[s, k] for the columns c of y, fewer
    than the panels': their products into scratch rows, then the columns y has."""
    width = panels.shape[2]
    scratch = np.empty((y.shape[0], panels.shape[0] * width), dtype=y.dtype)
    panel_rows(panels, x, scratch, y.shape[0], 0, panels.shape[0])
    y[:, :] = scratch[:, :y.shape[1]]


@numba.njit(nogil=True, cache=True)
def padded_panels(rows, first, width):
    """Columns `first` on of `rows` as panels of `width` columns, the last padded with zeros:
    panels[p, n, c] = rows[n, first + p · width + c]."""
    left = rows.shape[1] - first
    panels = np.zeros((-(-left // width), rows.shape[0], width), dtype=rows.dtype)
    for n in range(rows.shape[0]):
        for column in range(left):
            panels[column // width, n, column % width] = rows[n, first + column]
    return panels


@numba.njit(parallel=True, fastmath=True, nogil=True, cache=True)
def weight_gradients_by_tree(workers, a_rows, b_rows, order, bounds, totals):
    """totals[t] = Σ a[n] ⊗ b[n] over the rows n = order[bounds[t]:bounds[t + 1]] of tree
    t: per-tree weight gradients, each tree's a product whose contraction runs over its
    rows, through the kernels' outer-product blocks (`panel_rows`). The rows are gathered in
    tree order first, b's zero-padded to whole panels, so that tree t's b rows, cut in two
    vectors' worth of columns, are its product's panels as they lie (`row_panels`), and its
    a rows, read transposed, the product's x. The padded panel after the whole ones writes
    scratch rows, each worker's its own, whose first columns are the gradient's last.

    A task is a whole tree: its panels, a few KiB, stay in L1 while every row of its
    gradient passes through them (blocks of 48 rows, each tree's taken in turn, ran a
    quarter to a half slower). The `workers` claim the trees one at a time, the largest
    first, from a counter they share, so that neither waits long for the other however the
    trees' sizes fall. Which worker takes a tree does not change its sums: the same on any
    count."""
    rows, columns = a_rows.shape[1], b_rows.shape[1]
    width = runtime.panel_width(b_rows.itemsize)
    whole = columns // width
    padded = -(-columns // width)
    a = np.empty((order.size, rows), dtype=a_rows.dtype)
    b = np.empty((order.size, padded * width), dtype=b_rows.dtype)
    for row in numba.prange(order.size):
        a[row] = a_rows[order[row]]
        b[row, :columns] = b_rows[order[row]]
        b[row, columns:] = 0
    trees = totals.shape[0]
    largest_first = np.argsort(bounds[:-1] - bounds[1:], kind="mergesort")
    claimed = np.zeros(1, dtype=np.int64)
    scratch = np.empty((workers if padded > whole else 0, rows, width), dtype=totals.dtype)
    for worker in numba.prange(workers):
        claim = runtime.fetch_add(claimed, 0, 1)
        while claim < trees:
            tree = largest_first[claim]
            first, end = bounds[tree], bounds[tree + 1]
            x = a[first:end].T
            y = totals[tree]
            panels = row_panels(b[first:end].T)
            panel_rows(panels, x, y, rows, 0, whole)
            if padded > whole:
                tail = scratch[worker]
                panel_rows(panels[whole:], x, tail, rows, 0, 1)
                y[:, whole * width:] = tail[:, :columns - whole * width]
            claim = runtime.fetch_add(claimed, 0, 1)


@numba.njit(parallel=True, nogil=True, cache=True)
def segment_sums(workers, values, order, bounds, totals):
    """totals[s] = Σ values[n] over the rows n = order[bounds[s]:bounds[s + 1]] of segment
    s, in that order: a bias's gradient per tree, a table's gathered rows summed by row
    index; a segment a task, read where the rows lie (NumPy's `reduceat` needed them gathered
    first, and took a tenth of a per-tree pullback; for a table's wide rows, NumPy added a
    row at a time). The tasks do not depend on `workers`, numba's count: the same sums on
    any."""
    for segment in numba.prange(totals.shape[0]):
        total = totals[segment]
        total[:] = 0
        for position in range(bounds[segment], bounds[segment + 1]):
            row = values[order[position]]
            for column in range(total.size):
                total[column] += row[column]
