"""ILIR kernel → the Python source of one `@njit(parallel=True)` function (docs/design.md §5).

The translation is one to one: a parallel ILIR loop is a `prange` (inside the batch loop, with
a serial twin for batches of a few nodes), consecutive `MatMul`s one `prange` over workers,
which claim blocks of every weight's rows, consecutive `GradientSum`s one too, each worker
summing its columns of every bias, every other statement the Python line it prints as. Three
things are the CPU's own: the weights of those products are packed into panels once per run,
first thing (`_weight_panels`); element loops over a transposed matrix walk it column by
column (`_column_walk`); sums over a node's children go first, each into a row of its own
(`child_sums`)."""
from ..errors import RecJitError
from ..lowering.ilir import (
    ArgumentRole,
    BinOp,
    Call,
    Const,
    GradientSum,
    LoopRole,
    MatMul,
    StatementVisitor,
    Var,
    nodes,
    substitute,
    walk,
)
from ..lowering.activations import fast_tanh_and_sigmoid
from ..lowering.pysource import PythonExpressions

# The kernels' helpers are called, not inlined in numba's IR (`inline="always"` copies the
# callee's IR at every call site: a first vjp of child-sum TreeLSTM compiled in 16.9 s so, in
# 12.5 s without); LLVM inlines them. Each takes its kernel's fast-math flags, which an
# inlined one had.
EXACT_MATH = '''
{decorator}
def tanh(x):
    return np.tanh(x)


{decorator}
def sigmoid(x):
    return real(1.0) / (real(1.0) + np.exp(-x))
'''

# NumPy's maximum and minimum: a NaN on either side is the result, and at a tie the first
# operand is (Python's max and min, and numba's, drop a NaN in the second).
ORDERING = '''
{decorator}
def maximum(a, b):
    return a if a >= b or a != a else b


{decorator}
def minimum(a, b):
    return a if a <= b or a != a else b
'''

# The derivatives' own functions, in a backward kernel: 1 where NumPy's maximum (minimum)
# returns its first operand, as at a tie and at a NaN there, else 0.
PICKS = '''
{decorator}
def picks_first(a, b):
    return real(1.0) if a >= b or a != a else real(0.0)


{decorator}
def picks_first_min(a, b):
    return real(1.0) if a <= b or a != a else real(0.0)
'''

CALLS = {"tanh": "tanh({})", "sigmoid": "sigmoid({})", "exp": "np.exp({})",
         "log": "np.log({})", "relu": "maximum({}, real(0.0))", "neg": "-{}", "abs": "abs({})",
         "sqrt": "np.sqrt({})",
         "maximum": "maximum({}, {})", "minimum": "minimum({}, {})",
         "num_children": "real({} - {})", "sign": "np.sign({})",
         "picks_first": "picks_first({}, {})", "picks_first_min": "picks_first_min({}, {})"}

# The flags of a kernel's own arithmetic. Fast math (float32 only) lets LLVM assume no NaN or
# infinity and reorder sums; exact kernels keep IEEE semantics and the cell's order of
# operations, and only let a multiply and an add fuse into one rounding (`contract`). Fast
# math leaves out `nsz` (no signed zeros): with it and `contract`, a kernel that numba had just
# compiled and the same kernel loaded from its disk cache fused multiplies and adds
# differently, and their results differed in the last bits (docs/fast_math.md).
FAST_FLAGS = '{"nnan", "ninf", "arcp", "contract", "afn", "reassoc"}'
EXACT_FLAGS = '{"contract"}'


ROW_TILE = 16
SERIAL_ITEMS = 4
expression = PythonExpressions(CALLS)
_bound = expression.bound


class KernelBody(StatementVisitor):
    """The kernel's statements as lines, one ILIR statement to one line or block. `labels`:
    {weight argument: what the generated names call it} (`W` of `p_W`); `transposed`: the
    weights read transposed (`pT_W`), whose products read their last rows from a copy
    (`tail_rows`); `products`: how many `matmul_share` calls were written, the next one's row
    of `claimed`."""

    def __init__(self, labels, transposed):
        self.labels = labels
        self.transposed = transposed
        self.lines = []
        self.products = 0

    def statements(self, body, depth, forward="True", batched=False):
        """`forward`: the direction in which this code walks a weight's rows (see
        `shared_products`); `batched`: inside the loop over batches (see `parallel_loop`)."""
        pad = "    " * depth
        products, sums = [], []
        for statement in body:
            if isinstance(statement, MatMul) and statement.parallel:
                products.append(statement)
                continue
            if isinstance(statement, GradientSum):
                sums.append(statement)
                continue
            if products:
                self.shared_products(products, pad, forward)
                products = []
            if sums:
                self.shared_sums(sums, pad)
                sums = []
            self.visit(statement, depth, forward, batched)
        if products:
            self.shared_products(products, pad, forward)
        if sums:
            self.shared_sums(sums, pad)

    def visit_Loop(self, statement, depth, forward, batched):
        if statement.columns:
            self.column_walk(statement, depth)
        elif statement.parallel:
            self.parallel_loop(statement, depth, forward, batched)
        else:
            self.line(depth, f"for {statement.var} in {expression.range(statement)}:")
            if statement.role is LoopRole.BATCHES:  # a worker's rows alternate with the batch
                self.statements(statement.body, depth + 1, f"{statement.var} % 2 == 0", True)
            else:
                self.statements(statement.body, depth + 1, forward, batched)

    def visit_Let(self, statement, depth, *_):
        self.line(depth, f"{statement.name} = {_bound(statement.value)}")

    def visit_Store(self, statement, depth, *_):
        index = ", ".join(_bound(i) for i in statement.index)
        self.line(depth, f"{statement.array}[{index}] = {_bound(statement.value)}")

    def visit_Alloc(self, statement, depth, *_):
        shape = ", ".join(_bound(e) for e in statement.shape)
        self.line(depth, f"{statement.name} = np.empty(({shape}), dtype=real)")

    def visit_If(self, statement, depth, forward, batched):
        expression.branch(statement, "    " * depth, self.lines, lambda body: self.statements(
            body, depth + 1, forward, batched))

    def visit_MatMul(self, statement, depth, *_):
        """A product one worker computes (its parallel ones go to `shared_products`)."""
        weight, x, y = expression.matmul_operands(statement)
        self.line(depth, f"matmul_rows({weight}, {x}, {y}, {_bound(statement.rows)}, 0, "
                         f"{statement.weight}.shape[0])")

    def visit_Barrier(self, statement, depth, *_):
        self.line(depth, f"# barrier: {statement.reason}")

    def visit_Comment(self, statement, depth, *_):
        self.line(depth, f"# {statement.text}")

    def line(self, depth, text):
        self.lines.append("    " * depth + text)

    def parallel_loop(self, loop, depth, forward, batched):
        """A `prange`; in the batch loop, a plain `range` too, taken by batches of at most
        `SERIAL_ITEMS` items: waking the other threads costs more than packing or the
        elementwise code of a few nodes (2 and 8 items did worse than 4). The products stay
        parallel."""
        pad, stop = "    " * depth, _bound(loop.stop)
        if not batched:
            self.lines.append(f"{pad}for {loop.var} in prange({stop}):")
            self.statements(loop.body, depth + 1, forward, batched)
            return
        self.lines += [f"{pad}if {stop} > {SERIAL_ITEMS}:",
                       f"{pad}    for {loop.var} in prange({stop}):"]
        self.statements(loop.body, depth + 2, forward, batched)
        self.lines += [f"{pad}else:  # too few to wake the other threads for",
                       f"{pad}    for {loop.var} in range({stop}):"]
        self.statements(loop.body, depth + 2, forward, batched)

    def shared_products(self, products, pad, forward):
        """Consecutive products with no barrier between them, in one parallel loop over
        workers: pairs of workers take and claim blocks of every weight's rows
        (`matmul_share`), each product with a counter and a start of its own (row `site` of
        `claimed` and `claim_starts`). In the batch loop the direction alternates with the
        batch, so a worker starts on rows it read last, still in its L2; and one parallel
        region runs them all instead of one per product."""
        self.lines.append(f"{pad}for worker in prange(workers):")
        for product in products:
            weight, x, y = expression.matmul_operands(product)
            site = self.products
            self.products += 1
            tail = (panels_name(product, self.labels, "tail")
                    if product.weight in self.transposed else "no_tail")
            self.lines.append(
                f"{pad}    matmul_share({weight}, {panels_name(product, self.labels)}, {tail}, "
                f"{x}, {y}, "
                f"{_bound(product.rows)}, {product.row_block}, worker, workers, {forward}, "
                f"claimed[{site}], claim_starts[{site}])")

    def shared_sums(self, sums, pad):
        """Consecutive `GradientSum`s, each a bias's rows summed (`with_bias_sums`), in one
        parallel loop over workers, each summing its share of every bias's columns
        (`sum_rows_share`). A weight's gradient is the host's product of its rows."""
        self.lines.append(f"{pad}for worker in prange(workers):")
        for total in sums:
            if total.b is not None or total.summed[0].columns:
                raise RecJitError(f"the CPU's kernels sum a bias's rows, not {total.total}: "
                                  "the host multiplies a weight's rows")
            self.lines.append(f"{pad}    sum_rows_share({total.a}, {total.total}, worker, "
                              "workers)")

    def column_walk(self, loop, depth):
        """An element loop over whole rows of a matrix, column by column in tiles of 16 rows:
        the packed side is transposed, and this order reads and writes each cache line once
        (16 float32 rows of a packed column are one 64-byte line). The body's `var // columns`
        and `var % columns` are the walk's own row and column: numba's floor division and
        modulo of a signed index cost more than the copy."""
        pad, columns, var = "    " * depth, loop.columns, loop.var
        first_row, end_row = loop.start.value // columns, loop.stop.value // columns
        row, column = Var(f"{var}_row"), Var(f"{var}_column")
        self.lines += [f"{pad}for {var}_tile in range({first_row}, {end_row}, {ROW_TILE}):",
                       f"{pad}    for {column.name} in range({columns}):",
                       (f"{pad}        for {row.name} in range({var}_tile, "
                        f"min({var}_tile + {ROW_TILE}, {end_row})):"),
                       f"{pad}            {var} = {row.name} * {columns} + {column.name}"]
        whole = {BinOp("//", Var(var), Const(columns)): row,
                 BinOp("%", Var(var), Const(columns)): column}
        self.statements(substitute(loop.body, whole), depth + 3)


def panels_name(product, labels, prefix="panels"):
    """The panels of a product's weight (of its block of columns, when it has one); with
    `prefix="room"`, the room its transposed weight is packed into (`transposed_room`); with
    `prefix="tail"`, its transposed weight's rows after the whole panels (`tail_rows`)."""
    name = f"{prefix}_{labels.get(product.weight, product.weight)}"
    return name if product.columns is None else f"{name}_{product.columns[0]}_{product.columns[1]}"


def value_columns(kernel):
    """The most columns of a value one parallel product of `kernel` multiplies, each a row of
    its x: a matrix state's (MV-RNN's), or 1."""
    return max((product.value_columns for product in walk(kernel.body)
                if isinstance(product, MatMul) and product.parallel), default=1)


def weight_panels(kernel, pack_from_nodes, labels):
    """Lines packing each weight of a `matmul_share` product (a column block of it, for a
    refactored one) into panels for the outer-product blocks, once a run, each worker packing
    the panels of its own rows; forests of fewer than `pack_from_nodes` nodes skip it, each
    node counted once per column of the widest value a product multiplies (a matrix state
    makes a product of many rows a node; see `runtime`)."""
    weights = {}
    for product in walk(kernel.body):
        if isinstance(product, MatMul) and product.parallel:
            weights.setdefault(panels_name(product, labels), product)
    if not weights:
        return []
    views = {view for view, _ in kernel.transposed}
    columns = value_columns(kernel)
    rows = "num_nodes" if columns == 1 else f"num_nodes * {columns}"
    lines = ["    # the weights transposed into panels for the outer-product blocks, when "
             + (f"the forest has {pack_from_nodes} nodes or more" if columns == 1 else
                f"the products multiply {pack_from_nodes} rows or more ({columns} a node, a "
                "matrix state's columns)")
             + ("; those read transposed are panels as they lie, packed only where their "
                "rows alias in the cache" if views else ""),
             f"    pack = {rows} >= {pack_from_nodes}"]
    # a user's parameter may be read-only: never packed in place
    room = {name: panels_name(product, labels, "room") for name, product in weights.items()
            if product.weight in views}
    lines += [f"    {room[name]} = transposed_room({expression.matmul_operands(product)[0]}, pack)"
              if name in room else
              f"    {name} = weight_panels({expression.matmul_operands(product)[0]}, pack)"
              for name, product in weights.items()]
    lines += ["    if pack:", "        for worker in prange(workers):"]
    lines += [f"            pack_rows_share({expression.matmul_operands(product)[0]}, "
              f"{room[name]}, worker, workers)" if name in room else
              f"            pack_share({expression.matmul_operands(product)[0]}, {name}, "
              f"{product.row_block}, worker, workers)" for name, product in weights.items()]
    lines.append("    # barrier: the products read the panels")
    lines += [f"    {name} = transposed_panels({expression.matmul_operands(product)[0]}, "
              f"{room[name]})" for name, product in weights.items() if name in room]
    lines += [f"    {panels_name(product, labels, 'tail')} = tail_rows("
              f"{expression.matmul_operands(product)[0]}, {name})"
              for name, product in weights.items() if name in room]
    if len(room) < len(weights):
        lines.append("    no_tail = np.empty((0, 0), dtype=real)  # the others read every row "
                     "as it lies")
    return lines


def emit_source(kernel, fast_math, pack_from_nodes, header):
    """The module text: imports, the math helpers, and the kernel. The kernel's first argument
    is `workers`, numba's thread count at the call (read inside the kernel, it would keep
    numba from caching it)."""
    panels = ("pack_rows_share, tail_rows, transposed_panels,\n"
              "                                      transposed_room, weight_panels"
              if kernel.transposed else "weight_panels")
    if any(isinstance(statement, GradientSum) for statement in kernel.body):
        panels += ",\n                                      sum_rows_share"
    flags = FAST_FLAGS if fast_math else EXACT_FLAGS
    helper = f'@njit(fastmath={flags}, error_model="numpy")'  # the kernel's semantics
    labels = {name: kernel.source(name) for name in kernel.arrays_of(ArgumentRole.PARAMETER)}
    lines = [f'"""{header}"""', "import numpy as np", "from numba import njit, prange", "",
             "from recjit.codegen_cpu.calls import (matmul_rows, matmul_share, pack_share,",
             f"                                      {panels})", "",
             f"real = np.{kernel.dtype}",
             (fast_tanh_and_sigmoid(helper) if fast_math else EXACT_MATH.format(decorator=helper)),
             ORDERING.format(decorator=helper)]
    if any(call.function.startswith("picks_first") for call in nodes(kernel.body, Call)):
        lines.append(PICKS.format(decorator=helper))
    lines += ["",
              f'@njit(parallel=True, fastmath={flags}, cache=True, nogil=True, error_model="numpy")',
              f"def {kernel.name}({', '.join(['workers', *kernel.scalars, *kernel.arrays])}):"]
    lines += [f"    {view} = {array}.T  # read transposed where it lies"
              for view, array in kernel.transposed]
    lines += weight_panels(kernel, pack_from_nodes, labels)
    body = KernelBody(labels, {view for view, _ in kernel.transposed})
    body.statements(kernel.body, 1)
    if body.products:
        lines += ["    # each parallel product's block counters and the blocks its walks start from",
                  f"    claimed = np.zeros(({body.products}, workers), dtype=np.int64)",
                  f"    claim_starts = np.zeros(({body.products}, workers), dtype=np.int64)"]
    return "\n".join(lines + body.lines) + "\n"
