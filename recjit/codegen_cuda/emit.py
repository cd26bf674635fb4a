"""ILIR kernel → the Python source of numba.cuda kernels (docs/design.md §6).

Fused (the default): one persistent cooperative kernel; every thread of the grid runs the whole
body. A parallel loop over `count` items whose element loops span `n` elements becomes one
grid-stride loop over the `count · n` (item, element) pairs, each element loop a guard on the
element index; a `MatMul` a call of `matmul_rows`, each block computing the weight rows it
owns, the nodes' inputs staged through the block's shared `x_tile` where there are many; an
ILIR barrier `grid.sync()`. Weights multiplied in every batch are copied once per launch into
shared memory, each block its own rows, when they fit. Where the blocks split the
hidden units (`units.py`), a product is a call of `matmul_units`, a loop that reads it runs
over the block's own units, and a barrier between them `cuda.syncthreads()`; in a batch whose
nodes the blocks split in ranges too (`ranges.py`), both run over the block's range of nodes
(`matmul_range`).

An item of a one-worker loop (`Loop.one_worker`, the unrolled recursion) is a block's: the
block's threads share each step of the item (an element loop, a product) and synchronize after
it; its scratch is the block's own slice of an array with a leading block dimension.

Unfused (`Schedule(fusion=False)`): each parallel statement is a kernel of its own, and a host
function runs the rest of the body (the batch loop, the scalars) and launches them in order;
the end of a launch is the barrier."""
from dataclasses import dataclass

from ..lowering.ilir import (Alloc, ArgumentRole, BarrierScope, Call, Const, If, Let, Load,
                             Loop, MatMul, StatementVisitor, Var, nodes)
from ..lowering.activations import fast_tanh_and_sigmoid
from ..lowering.backward import gradient_sums
from ..lowering.pysource import PythonExpressions
from .packs import PACKED_ROW, TILE, TILE_COLUMN
from .runtime import INLINED
from .units import NO_SPLIT, element_extent

# A generated device function: inlined by NVVM, as the runtime's are.
DEVICE_FUNCTION = "@cuda.jit(" + ", ".join(
    ["device=True", *(f"{option}={value}" for option, value in INLINED.items())]) + ")"

# The exact activations, numba-cuda's libdevice functions (in a fast-math kernel, `fastmath`
# would make `math.tanh` the hardware's tanh.approx.f32: fast-math kernels define their own,
# `activations.fast_tanh_and_sigmoid`).
EXACT_MATH = f'''
{DEVICE_FUNCTION}
def tanh(x):
    return math.tanh(x)


{DEVICE_FUNCTION}
def sigmoid(x):
    return real(1.0) / (real(1.0) + math.exp(-x))
'''

# maximum and minimum as NumPy's: a NaN on either side is the result, and at a tie the first
# operand is (Python's max and min, and numba's, drop a NaN in the second).
ORDERING = f'''
{DEVICE_FUNCTION}
def maximum(a, b):
    return a if a >= b or a != a else b


{DEVICE_FUNCTION}
def minimum(a, b):
    return a if a <= b or a != a else b
'''

# The derivatives' own functions, in a backward kernel: NumPy's sign (a NaN its own), and 1
# where NumPy's maximum (minimum) returns its first operand, as at a tie and at a NaN there.
DERIVATIVES = f'''
{DEVICE_FUNCTION}
def sign(x):
    if x > 0:
        return real(1.0)
    if x < 0:
        return real(-1.0)
    return x  # 0 or NaN, as np.sign


{DEVICE_FUNCTION}
def picks_first(a, b):
    return real(1.0) if a >= b or a != a else real(0.0)


{DEVICE_FUNCTION}
def picks_first_min(a, b):
    return real(1.0) if a <= b or a != a else real(0.0)
'''
DERIVATIVE_CALLS = ("sign", "picks_first", "picks_first_min")

CALLS = {"tanh": "tanh({})", "sigmoid": "sigmoid({})", "exp": "math.exp({})",
         "log": "math.log({})", "relu": "maximum({}, real(0.0))", "neg": "-{}",
         "abs": "abs({})", "sqrt": "math.sqrt({})", "maximum": "maximum({}, {})",
         "minimum": "minimum({}, {})", "num_children": "real({} - {})",
         "sign": "sign({})", "picks_first": "picks_first({}, {})",
         "picks_first_min": "picks_first_min({}, {})"}

expression = PythonExpressions(CALLS)


class Emitter(StatementVisitor):
    """Source lines for the statements of one device function, a fused kernel's planned ILIR
    (`plan.planned_kernel`) printed one to one; `persistent`: each block's slice of the weights
    it keeps in shared memory; `split`: the hidden units the blocks split (a
    `units.UnitSplit`, empty where they split none); `row_groups`: the weights whose products
    go in row groups; `tile_nodes`: the nodes of a block's tile; `labels`: {weight argument:
    what the generated names call it} (`W` for `p_W`)."""

    def __init__(self, persistent=(), split=NO_SPLIT, row_groups=frozenset(), tile_nodes=0,
                 labels=None):
        self.lines = []
        self.labels = labels or {}
        self.runtime = set()  # the runtime functions the lines call, for the imports
        self.synchronized_at = 0  # the length of `lines` when a block barrier last ended them
        self.persistent = persistent
        self.split = split
        self.row_groups = row_groups
        self.tile_nodes = tile_nodes

    def statements(self, body, depth, extent=None):
        for statement in body:
            self.visit(statement, depth, extent)

    def visit_Loop(self, statement, depth, extent):
        if statement.one_worker:
            self.block_per_item(statement, depth)
        elif statement.parallel:
            self.parallel_loop(statement, depth)
        elif statement.element:
            self.element_guard(statement, depth, extent)
        else:
            self.line(depth, f"for {statement.var} in {expression.range(statement)}:")
            self.statements(statement.body, depth + 1, extent)

    def visit_Let(self, statement, depth, extent):
        self.line(depth, f"{statement.name} = {expression.bound(statement.value)}")

    def visit_RangeShare(self, statement, depth, extent):
        """After a ranged batch's node count: its ranges, and this block's units and nodes
        of it (`runtime.node_ranges`, `runtime.range_share`)."""
        pad = "    " * depth
        count = expression.bound(statement.count)
        share = f"range_share({statement.units}, {count}, ranges)"
        self.runtime.update(("node_ranges", "range_share"))
        self.lines += [f"{pad}# the ranges of this batch's nodes, and this block's share of it",
                       f"{pad}ranges = node_ranges({count}, {statement.balance})",
                       f"{pad}unit_begin, units, first_node, nodes = {share}"]

    def visit_Store(self, statement, depth, extent):
        self.line(depth, f"{statement.array}[{expression.index(statement.index)}] = "
                         f"{expression.bound(statement.value)}")

    def visit_If(self, statement, depth, extent):
        expression.branch(statement, "    " * depth, self.lines,
                          lambda body: self.statements(body, depth + 1, extent))

    def visit_MatMul(self, statement, depth, extent):
        if statement.pack is not None:
            self.packed_product(statement, statement.pack, depth)
            return
        kind, operand, share = self.share(statement)
        self.runtime.add(f"matmul_{kind}")
        self.line(depth, f"turn = {matmul_call(statement, kind, operand, share)}")

    def visit_PackedProducts(self, statement, depth, extent):
        self.packed_products(statement.products, depth)

    def visit_GradientSum(self, statement, depth, extent):
        """A parameter's gradient summed over the nodes' columns, each block its part of it
        (`runtime.sum_outer_products`, `runtime.sum_columns`)."""
        if statement.b is None:
            self.runtime.add("sum_columns")
            self.line(depth, f"sum_columns({statement.a}, {statement.total})")
        else:
            self.runtime.add("sum_outer_products")
            self.line(depth, f"sum_outer_products({statement.a}, {statement.b}, "
                             f"{statement.total})")

    def visit_Barrier(self, statement, depth, extent):
        if statement.scope is BarrierScope.MET:
            self.line(depth, f"# no barrier: the grid met after the last writes, so "
                             f"{statement.reason}")
        elif statement.scope is BarrierScope.BLOCK:
            self.block_barrier(depth, f"  # barrier: {statement.reason} (each block its own "
                                      "units)")
        else:
            self.line(depth, f"grid.sync()  # barrier: {statement.reason}")

    def visit_Comment(self, statement, depth, extent):
        self.line(depth, f"# {statement.text}")

    def visit_Alloc(self, statement, depth, extent):
        """Scratch arrays are arguments of the kernel."""

    def line(self, depth, text):
        self.lines.append("    " * depth + text)

    def parallel_loop(self, loop, depth):
        """A grid-stride loop over (item, element) pairs; where the blocks split the units, a
        block-stride loop over the pairs of the block's own units."""
        pad = "    " * depth
        extent, element = element_extent(loop.body)
        count = expression(loop.stop)
        if loop.ranged:
            items = "range(cuda.threadIdx.x, nodes * units, cuda.blockDim.x)"
            self.lines += [f"{pad}for item in {items}:",
                           f"{pad}    {loop.var} = first_node + item // units",
                           f"{pad}    {element} = unit_begin + item % units"]
        elif loop.units:
            items = f"range(cuda.threadIdx.x, {count} * units, cuda.blockDim.x)"
            self.runtime.add("owned_units")
            self.lines += [f"{pad}unit_begin, units = owned_units({extent})",
                           f"{pad}for item in {items}:",
                           f"{pad}    {loop.var} = item // units",
                           f"{pad}    {element} = unit_begin + item % units"]
        elif element is None:
            self.lines.append(f"{pad}for {loop.var} in range(thread, {count}, threads):")
        else:
            self.lines += [f"{pad}for item in range(thread, {count} * {extent}, threads):",
                           f"{pad}    {loop.var} = item // {extent}",
                           f"{pad}    {element} = item % {extent}"]
        self.statements(loop.body, depth + 1, extent)

    def packed_product(self, product, pack, depth):
        """A product whose inputs the `packs.Pack` `pack` computes: each block packs its
        share's rows into its tile itself, a tile at a time, and multiplies them from there;
        a block barrier between, not the grid's (`packs.py`)."""
        pad = "    " * depth
        columns = pack.columns
        kind, operand, share = self.share(product)
        capacity = self.tile_nodes
        self.runtime.update((f"{kind}_plan", "multiply_tile", "tile_span"))
        plan = f"{kind}_plan({', '.join(share)})"
        items = f"range(cuda.threadIdx.x, tile_rows * {columns}, cuda.blockDim.x)"
        multiply = (f"multiply_tile({operand}, weight_rows, y_rows, held, {TILE}, tile_rows, "
                    f"{columns}, {product.y}[first_input + tile_first:], turn)")
        self.lines += [
            f"{pad}# each block packs its nodes' inputs of {product.x} in {TILE} itself",
            f"{pad}weight_rows, y_rows, held, first_input, inputs = {plan}",
            f"{pad}tiles = (inputs + {capacity - 1}) // {capacity} if held > 0 else 0",
            f"{pad}for step in range(tiles):",
            f"{pad}    tile_first, tile_rows = tile_span(step, tiles, {capacity}, inputs)",
            f"{pad}    for item in {items}:",
            f"{pad}        tile_row = item // {columns}",
            f"{pad}        {PACKED_ROW} = first_input + tile_first + tile_row"]
        self.pack_row(pack, depth + 2)
        self.lines += [
            f"{pad}    cuda.syncthreads()",
            f"{pad}    turn = {multiply}"]
        self.block_barrier(depth + 1, "  # before the next tile overwrites this one")

    def pack_row(self, pack, depth):
        """The statements by which a thread fills its element of tile row `tile_row` with row
        `packed_row` of a product's inputs as `pack` computes it, at tile column `item %
        columns`."""
        pad = "    " * depth
        extent, element = element_extent(pack.loop.body)
        self.statements(pack.position, depth, extent)
        if pack.element is None:
            self.lines.append(f"{pad}{element} = item % {pack.columns}")
        else:
            self.lines += [f"{pad}{TILE_COLUMN} = item % {pack.columns}",
                           f"{pad}{element} = {expression(pack.element)}"]
        self.statements(pack.body, depth, extent)

    def packed_products(self, products, depth):
        """Consecutive products whose inputs one pack loop computes (`packs.py`), packed in
        the same tiles, one product's rows after another's: a tile's two block barriers
        serve them all, and the warps that one product leaves idle start the next one's
        items (`turn`), as they did when the grid packed the inputs."""
        pad = "    " * depth
        packs = [product.pack for product in products]
        columns, capacity = packs[0].columns, self.tile_nodes
        names = [self.labels.get(product.weight, product.weight) for product in products]
        if len(set(names)) < len(names):
            names = [str(position) for position in range(len(products))]
        firsts = ["0"] + [" + ".join(f"rows_{name}" for name in names[:end])
                          for end in range(1, len(names))]
        total = " + ".join(f"rows_{name}" for name in names)
        self.lines.append(f"{pad}# each block packs its nodes' inputs of "
                          f"{', '.join(product.x for product in products)} in {TILE} itself, "
                          "in the same tiles")
        shares = [self.share(product) for product in products]
        self.runtime.update(("multiply_tile", "tile_part", "tile_span"))
        for (kind, _, share), name in zip(shares, names):
            self.runtime.add(f"{kind}_plan")
            self.lines += [
                (f"{pad}weight_rows_{name}, y_rows_{name}, held_{name}, first_input_{name}, "
                 f"inputs_{name} = {kind}_plan({', '.join(share)})"),
                f"{pad}rows_{name} = inputs_{name} if held_{name} > 0 else 0"]
        self.lines += [
            f"{pad}tiles = ({total} + {capacity - 1}) // {capacity}",
            f"{pad}for step in range(tiles):",
            f"{pad}    tile_first, tile_rows = tile_span(step, tiles, {capacity}, {total})",
            (f"{pad}    for item in range(cuda.threadIdx.x, tile_rows * {columns}, "
             "cuda.blockDim.x):"),
            f"{pad}        tile_row = item // {columns}",
            f"{pad}        input_row = tile_first + tile_row"]
        for position, (pack, name, first) in enumerate(zip(packs, names, firsts)):
            if position == len(packs) - 1:
                self.lines.append(f"{pad}        else:")
            else:
                keyword = "if" if position == 0 else "elif"
                self.lines.append(f"{pad}        {keyword} input_row < {firsts[position + 1]}:")
            offset = ("" if first == "0" else f" - ({first})" if " + " in first
                      else f" - {first}")
            self.lines.append(f"{pad}            {PACKED_ROW} = first_input_{name} + "
                              f"input_row{offset}")
            self.pack_row(pack, depth + 3)
        self.lines.append(f"{pad}    cuda.syncthreads()")
        for product, (_, operand, _), name, first in zip(products, shares, names, firsts):
            self.lines += [
                (f"{pad}    part_row, part_rows, part_first = tile_part({first}, rows_{name}, "
                 "tile_first, tile_rows)"),
                (f"{pad}    turn = multiply_tile({operand}, weight_rows_{name}, y_rows_{name}, "
                 f"held_{name}, {TILE}[part_row:], part_rows, {columns}, "
                 f"{product.y}[first_input_{name} + part_first:], turn)")]
        self.block_barrier(depth + 1, "  # before the next tile overwrites this one")

    def share(self, product):
        """`product_share` of a product of this kernel, its runtime calls noted."""
        kind, operand, share = product_share(product, self.persistent, self.split,
                                             self.row_groups, product.input_rows)
        if kind == "rows" and share[0] != "0":
            self.runtime.add("first_row")
        return kind, operand, share

    def block_per_item(self, loop, depth):
        """A block-stride loop over the items, each run by the whole block."""
        self.lines.append(f"{'    ' * depth}for {loop.var} in range(cuda.blockIdx.x, "
                          f"{expression(loop.stop)}, cuda.gridDim.x):")
        self.steps(loop.body, depth + 1)

    def steps(self, body, depth):
        """Statements of a block's item: the threads split each element loop and product, and
        the block synchronizes after every step that wrote for the next one to read."""
        pad = "    " * depth
        for statement in body:
            if isinstance(statement, Alloc):
                self.lines.append(f"{pad}{statement.name} = "
                                  f"{statement.name}_blocks[cuda.blockIdx.x]")
            elif isinstance(statement, Loop) and statement.element:
                start = ("cuda.threadIdx.x" if statement.start == Const(0) else
                         f"{expression(statement.start)} + cuda.threadIdx.x")
                self.lines.append(f"{pad}for {statement.var} in range({start}, "
                                  f"{expression(statement.stop)}, cuda.blockDim.x):")
                self.statements(statement.body, depth + 1)
                self.synchronize(depth)
            elif isinstance(statement, Loop):
                self.lines.append(f"{pad}for {statement.var} in {expression.range(statement)}:")
                self.steps(statement.body, depth + 1)
                if has_steps(statement.body):
                    self.synchronize(depth)
            elif isinstance(statement, MatMul):
                weight, x, y = expression.matmul_operands(statement)
                self.lines.append(f"{pad}block_matmul({weight}, {x}, {y}, "
                                  f"{expression.bound(statement.rows)})")
                self.synchronize(depth)
            elif isinstance(statement, If):  # on a value the same for the whole block
                expression.branch(statement, pad, self.lines,
                                  lambda body: self.steps(body, depth + 1))
            else:
                self.visit(statement, depth, None)

    def synchronize(self, depth):
        """`cuda.syncthreads()`, unless the step's own last line already is one."""
        if self.synchronized_at != len(self.lines):
            self.block_barrier(depth)

    def block_barrier(self, depth, comment=""):
        """`cuda.syncthreads()`, remembered as the last line written (`synchronize`)."""
        self.lines.append(f"{'    ' * depth}cuda.syncthreads(){comment}")
        self.synchronized_at = len(self.lines)

    def element_guard(self, loop, depth, extent):
        """The body of an element loop, for the element this thread holds."""
        low, high, variable = int(loop.start.value), int(loop.stop.value), loop.var
        condition = (f"{low} <= {variable} < {high}" if low > 0 and high < extent
                     else f"{variable} >= {low}" if low > 0
                     else f"{variable} < {high}" if high < extent else None)
        if condition:
            self.lines.append(f"{'    ' * depth}if {condition}:")
            depth += 1
        self.statements(loop.body, depth, extent)


def has_steps(body):
    """Whether a block's statements include work split over its threads."""
    return any(isinstance(statement, MatMul)
               or isinstance(statement, Loop) and (statement.element or has_steps(statement.body))
               for statement in body)


def has_items_per_block(body):
    """Whether any loop of the body is a one-worker loop (its items run one per block)."""
    return any(isinstance(statement, Loop) and (statement.one_worker
                                                or has_items_per_block(statement.body))
               or isinstance(statement, If) and has_items_per_block(statement.body
                                                                    + statement.orelse)
               for statement in body)


def product_share(product, persistent, split, row_groups, ranged=None):
    """How the blocks split a product: (`rows`, `units`, `range` or `row_groups`, the
    weight operand, the arguments that say the block's share, the product's rows last): by
    rows, on the weight itself or on this block's slice in shared memory; by units where the
    blocks split the units; by units and ranges of nodes where the batch is ranged
    (`ranged`, the product's `ranges.InputRows`: the slice serves one range only); in groups
    for a weight of `row_groups`."""
    weight = product.weight
    sliced = weight in persistent  # never a weight of `row_groups`
    whole = expression.matmul_operands(product)[0]
    operand = expression.matmul_operands(product, f"shared_{weight}" if sliced else None)[0]
    rows = f"{weight}.shape[0]"
    count = expression.bound(product.rows)
    if weight in row_groups:
        return "row_groups", operand, [rows, count]
    if ranged is not None:
        if sliced:
            operand, sliced = f"({operand} if ranges == 1 else {whole})", "ranges == 1"
        return "range", operand, [str(sliced), str(split.arrays[product.y]), rows,
                                  "unit_begin", "units", expression.bound(ranged.first()),
                                  expression.bound(ranged.count())]
    if product.y in split.arrays:
        return "units", operand, [str(sliced), str(split.arrays[product.y]), rows, count]
    return "rows", operand, [f"first_row({rows})" if sliced else "0", rows, count]


def matmul_call(product, kind, operand, share):
    """`matmul_rows`, `matmul_units`, `matmul_range` or `matmul_row_groups` as
    `product_share` said (`kind`, `operand`, `share`), staging the inputs through `TILE`; it
    returns the warp whose turn it is next (`runtime.multiply`)."""
    _, x, y = expression.matmul_operands(product)
    *before, count = share
    return (f"matmul_{kind}({operand}, {', '.join(before)}, {x}, {y}, {count}, {TILE}, "
            "turn)")


@dataclass(frozen=True)
class Scratch:
    """A scratch array of the kernel. `per_block`: allocated inside a one-worker item, so
    each block has its own; the argument `<name>_blocks` has a leading block dimension."""

    name: str
    shape: tuple
    per_block: bool = False

    @property
    def argument(self):
        return f"{self.name}_blocks" if self.per_block else self.name


def scratch_arrays(kernel):
    """The scratch arrays the kernel's body allocates, in order."""
    found = []

    def visit(body, per_block):
        for statement in body:
            if isinstance(statement, Alloc):
                found.append(Scratch(statement.name, statement.shape, per_block))
            elif isinstance(statement, Loop):
                visit(statement.body, per_block or statement.one_worker)
            elif isinstance(statement, If):
                visit(statement.body + statement.orelse, per_block)

    visit(kernel.body, False)
    return found


def emit_scratch_shapes(kernel, scratch):
    """The host function `scratch_shapes(<the kernel's scalars>, blocks)`: the shape of each
    scratch array for one forest's sizes, in the order of `scratch`, its first extent after
    the block dimension (a block's own scratch has one, `blocks` long) bucketed, so that
    forests of nearby sizes share the arrays (`buffers.bucket`). Generated once, so that a
    run computes the shapes in one call, not by walking the ILIR."""
    def extent(node):
        if isinstance(node, Const):
            return str(max(node.value, 1))
        return f"max({expression.bound(node)}, 1)"

    lines = [f"def scratch_shapes({', '.join(kernel.scalars + ('blocks',))}):",
             '    """The scratch arrays\' shapes for these sizes."""']
    lines += [f"    {statement.name} = {expression.bound(statement.value)}"
              for statement in kernel.body
              if isinstance(statement, Let) and not isinstance(statement.value, Load)]
    lines.append("    return (")
    for array in scratch:
        first, *rest = array.shape
        extents = ["blocks"] * array.per_block + [f"bucket({expression.bound(first)})"]
        extents += [extent(node) for node in rest]
        lines.append(f"        ({', '.join(extents)}{',' if len(extents) == 1 else ''}),"
                     f"  # {array.argument}")
    lines.append("    )")
    return lines


def weight_labels(kernel):
    """{parameter argument: its attribute}: `p_W` is `W` in the names generated for it (a view
    read transposed, `pT_W`, keeps its own)."""
    return {name: kernel.source(name) for name in kernel.arrays_of(ArgumentRole.PARAMETER)}


def _module_header(kernel, header, runtime_names, fast_math):
    """The imports and helpers: `block_matmul` too where the kernel runs items per block, the
    derivatives' functions where a backward kernel calls them."""
    if has_items_per_block(kernel.body):
        runtime_names = ["block_matmul", *runtime_names]
    imports = ([f"from recjit.codegen_cuda.runtime import {', '.join(runtime_names)}"]
               if runtime_names else [])
    if scratch_arrays(kernel):
        imports.insert(0, "from recjit.codegen_cuda.buffers import bucket")
    derivatives = any(call.function in DERIVATIVE_CALLS for call in nodes(kernel.body, Call))
    return [f'"""{header}"""', "import math", "", "import numpy as np", "from numba import cuda",
            "", *imports, "", f"real = np.{kernel.dtype}",
            fast_tanh_and_sigmoid(DEVICE_FUNCTION) if fast_math else EXACT_MATH, ORDERING,
            *([DERIVATIVES] if derivatives else []), ""]


def _jit(fast_math, launch_bound):
    bound = "" if launch_bound is None else f", launch_bounds={launch_bound}"
    return f"@cuda.jit(fastmath={fast_math}, cache=True{bound})"


RUNTIME_CALLS = ("first_row", "load_rows", "load_unit_rows", "matmul_range", "matmul_rows",
                 "matmul_row_groups", "matmul_units", "multiply_tile", "node_ranges",
                 "owned_units", "range_plan", "range_share", "row_groups_plan", "rows_plan",
                 "sum_columns", "sum_outer_products", "tile_part", "tile_span", "units_plan")


def _transposed_views(kernel):
    """The parameters a cell reads transposed, as views of the arguments (on the host, a
    launch's copy: numba transposes a device array into a new one)."""
    return [f"    {view} = {array}.T" for view, array in kernel.transposed]


def emit_fused(kernel, fast_math, header, plan, launch_bound):
    """One cooperative kernel of `kernel`, planned by `plan` (`plan.LaunchPlan`, its
    statements' decisions written into `kernel` by `plan.planned_kernel`): the weights each
    block keeps in shared memory, the tile the products stage inputs through, the products
    split in row groups (`runtime.matmul_row_groups`), the packed arrays, which are not
    scratch, and the units the blocks split; `launch_bound`: the threads a block it is
    compiled for (None: no bound)."""
    persistent, tile, split, packs = plan.persistent, plan.tile, plan.split, plan.packs
    scratch = [array for array in scratch_arrays(kernel) if array.name not in packs.arrays]
    arguments = kernel.scalars + kernel.arrays + tuple(array.argument for array in scratch)
    body = ["    grid = cuda.cg.this_grid()", "    thread = cuda.grid(1)",
            "    threads = cuda.gridsize(1)"] + _transposed_views(kernel)
    if tile:
        body += [f"    # the products stage the inputs of up to {tile[0]} nodes here",
                 f"    {TILE} = cuda.shared.array({tile}, real)",
                 "    # the warp that takes the next product's first item",
                 "    turn = 0"]
    if persistent:
        body.append("    # model persistence: each block keeps its rows of the weights "
                    "multiplied in every batch")
    loads = {"load_unit_rows" if weight in split.weights else "load_rows"
             for weight in persistent}
    for weight, (rows, columns) in persistent.items():
        body.append(f"    shared_{weight} = cuda.shared.array(({rows}, {columns}), real)")
        body.append(f"    load_unit_rows({weight}, {split.weights[weight]}, shared_{weight})"
                    if weight in split.weights else f"    load_rows({weight}, shared_{weight})")
    if persistent:
        body.append("    cuda.syncthreads()")
    emitter = Emitter(persistent, split, plan.row_groups, tile[0] if tile else 0,
                      weight_labels(kernel))
    emitter.statements(kernel.body, 1)
    body += emitter.lines
    called = [name for name in RUNTIME_CALLS if name in emitter.runtime | loads]
    return "\n".join(_module_header(kernel, header, called, fast_math) + [
        _jit(fast_math, launch_bound), f"def {kernel.name}({', '.join(arguments)}):"]
        + body + ["", ""] + emit_scratch_shapes(kernel, scratch)) + "\n"


def free_names(statement):
    """The names a statement reads that it does not bind itself: its kernel's arguments when
    it runs as a launch of its own."""
    names = _FreeNames()
    names.visit(statement)
    used = names.used
    if isinstance(statement, Loop) and statement.parallel:
        element = element_extent(statement.body)[1]
        used = [name for name in used if name not in (statement.var, element)]
    return used


class _FreeNames(StatementVisitor):
    """`free_names`' walk: every kind of statement has its rule, so that a new kind cannot
    leave an array it reads out of a launch's arguments."""

    def __init__(self):
        self.used, self.bound = [], set()

    def note(self, name):
        if name not in self.bound and name not in self.used:
            self.used.append(name)

    def read(self, expressions):
        """Note the names and arrays that `expressions` (an expression, a tuple of them, or
        None) read, in the order they appear."""
        for node in nodes(expressions, (Var, Load)):
            self.note(node.name if isinstance(node, Var) else node.array)

    def visit_Loop(self, statement):
        self.read((statement.start, statement.stop))
        self.bound.add(statement.var)
        self.visit_all(statement.body)

    def visit_If(self, statement):
        self.read(statement.condition)
        self.visit_all(statement.body)
        self.visit_all(statement.orelse)

    def visit_Let(self, statement):
        self.read(statement.value)
        self.bound.add(statement.name)

    def visit_Store(self, statement):
        self.note(statement.array)
        self.read(statement.index + (statement.value,))

    def visit_Alloc(self, statement):  # inside a one-worker item: the block's slice
        self.note(f"{statement.name}_blocks")
        self.bound.add(statement.name)

    def visit_MatMul(self, statement):
        for name in (statement.weight, statement.x, statement.y):
            self.note(name)
        self.read((statement.rows, statement.x_row, statement.y_row))

    def visit_PackedProducts(self, statement):
        self.visit_all(statement.products)

    def visit_RangeShare(self, statement):
        self.read(statement.count)

    def visit_GradientSum(self, statement):
        for name in (statement.a, statement.b, statement.total):
            if name is not None:
                self.note(name)

    def visit_Barrier(self, statement):
        """A barrier reads nothing."""

    def visit_Comment(self, statement):
        """A comment reads nothing."""


def emit_unfused(kernel, fast_math, header, launch_bound):
    """(source, host arrays): a kernel per parallel statement and the host function that
    launches them, `launch(kernel, items, arguments)` running one over `items` work items (or
    over `items` blocks, `one_block_per_item=True`); it takes host copies of the structure
    arrays it reads (`host_batch_begin`) last."""
    host = _UnfusedHost(kernel, _jit(fast_math, launch_bound))
    host.lines += _transposed_views(kernel)
    host.visit_all(kernel.body, 1)
    scratch = scratch_arrays(kernel)
    arguments = (("launch",) + kernel.scalars + kernel.arrays
                 + tuple(array.argument for array in scratch)
                 + tuple(f"host_{name}" for name in host.arrays))
    sums = gradient_sums(kernel)
    lines = _module_header(kernel, header, ["matmul_kernel"]
                           + ["sum_columns_kernel"] * any(total.b is None for total in sums)
                           + ["sum_outer_products_kernel"] * any(total.b for total in sums),
                           fast_math)
    for kernel_lines in host.kernels:
        lines += kernel_lines + ["", ""]
    lines += [f"def {kernel.name}({', '.join(arguments)}):"] + host.lines + ["", ""]
    lines += emit_scratch_shapes(kernel, scratch)
    return "\n".join(lines) + "\n", tuple(host.arrays)


class _UnfusedHost(StatementVisitor):
    """The unfused schedule's host function, statement by statement: a parallel loop becomes a
    kernel of its own (`kernels`) and its launch, a product a launch of `matmul_kernel`, the
    rest host code; `arrays` are the structure arrays the host reads (as `host_<name>`)."""

    def __init__(self, kernel, decorator):
        self.kernel = kernel
        self.decorator = decorator
        self.kernels, self.lines, self.arrays = [], [], []
        self.expression = PythonExpressions(CALLS, self.host_array)

    def host_array(self, array):
        if array not in self.arrays:
            self.arrays.append(array)
        return f"host_{array}"

    def visit_Loop(self, statement, depth):
        if statement.parallel:
            self.launch_loop(statement, "    " * depth)
            return
        self.line(depth, f"for {statement.var} in {self.expression.range(statement)}:")
        self.visit_all(statement.body, depth + 1)

    def visit_MatMul(self, statement, depth):
        rows = self.expression.bound(statement.rows)
        operands = ", ".join(self.expression.matmul_operands(statement))
        self.line(depth, f"launch(matmul_kernel, ({rows}) * {statement.weight}.shape[0], "
                         f"[{operands}, {rows}])")

    def visit_GradientSum(self, statement, depth):
        a, total = statement.a, statement.total
        if statement.b is None:
            self.line(depth, f"launch(sum_columns_kernel, {a}.shape[0], [{a}, {total}])")
        else:
            b = statement.b
            self.line(depth, f"launch(sum_outer_products_kernel, {a}.shape[0] * {b}.shape[0], "
                             f"[{a}, {b}, {total}])")

    def visit_If(self, statement, depth):
        self.expression.branch(statement, "    " * depth, self.lines,
                               lambda body: self.visit_all(body, depth + 1))

    def visit_Let(self, statement, depth):
        self.line(depth, f"{statement.name} = {self.expression.bound(statement.value)}")

    def visit_Barrier(self, statement, depth):
        self.line(depth, f"# barrier (launches run in order): {statement.reason}")

    def visit_Comment(self, statement, depth):
        self.line(depth, f"# {statement.text}")

    def visit_Alloc(self, statement, depth):
        """Scratch arrays are arguments of the launches, allocated by the host."""

    def line(self, depth, text):
        self.lines.append("    " * depth + text)

    def launch_loop(self, statement, pad):
        """A kernel of its own for parallel loop `statement`, and the line that launches it."""
        name = f"{self.kernel.name}_{len(self.kernels)}"
        arguments = free_names(statement)
        signature = [self.decorator, f"def {name}({', '.join(arguments)}):"]
        emitter = Emitter()
        if statement.one_worker:
            emitter.block_per_item(statement, 1)
            items, per_block = self.expression(statement.stop), ", one_block_per_item=True"
        else:
            signature += ["    thread = cuda.grid(1)", "    threads = cuda.gridsize(1)"]
            emitter.parallel_loop(statement, 1)
            extent = element_extent(statement.body)[0]
            items = self.expression(statement.stop) + (f" * {extent}" if extent > 1 else "")
            per_block = ""
        self.kernels.append(signature + emitter.lines)
        self.lines.append(f"{pad}launch({name}, {items}, [{', '.join(arguments)}]{per_block})")
