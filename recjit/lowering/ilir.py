"""The ILIR: loop nests with variable bounds over the linearized forest (Cortex §4.1).

Indirect indices (`child_idx[child_ptr[node] + k]`, `batch_begin[b]`) are plain loads: the
uninterpreted functions of loop variables. Code generators translate these classes one to one,
so generated source carries the same names as the printed ILIR."""
from dataclasses import dataclass, fields, is_dataclass, replace
from enum import Enum


# expressions ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Var:
    name: str


@dataclass(frozen=True)
class Const:
    value: float


@dataclass(frozen=True)
class Load:
    array: str
    index: tuple


@dataclass(frozen=True)
class Call:
    """A scalar math function: tanh sigmoid relu exp log sqrt neg abs maximum minimum, and
    num_children(end, begin): the number of edges between two offsets, in the kernel's
    dtype."""

    function: str
    args: tuple


@dataclass(frozen=True)
class BinOp:
    operator: str  # + - * / // %
    left: object
    right: object


# statements -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Let:
    name: str
    value: object


@dataclass(frozen=True)
class Store:
    array: str
    index: tuple
    value: object


class LoopRole(Enum):
    """What a loop runs over. The lowering says it, and each backend maps it to its own
    parallelism: no backend finds a loop by its variable's name."""

    BATCHES = "batches"  # the batches, from the leaves up (serial; a barrier between them)
    NODES = "nodes"  # the nodes of a pass, or the rows its products read (parallel)
    ITEMS = "items"  # an unrolled batch's items, each a subtree one worker computes (parallel)
    ITEM_NODES = "item nodes"  # an item's nodes, one after another
    WORKER_NODES = "worker nodes"  # a pass over one node inside an item (serial)
    ELEMENTS = "elements"  # the elements of cell values (independent)
    ROWS = "rows"  # the rows of a matrix value, each row's element loops inside (serial)
    EDGES = "edges"  # a node's edges to its children (serial: sums accumulate)
    DOT = "dot"  # the contraction index of a product computed in the node (serial)
    ROOTS = "roots"  # the forest's roots, gathering their states (parallel)
    PARENT_EDGES = "parent edges"  # a DAG node's edges from its parents (serial: sums)
    GROUP_LEAVES = "group leaves"  # the leaves of a group, whose rows it sums (serial: sums)


PARALLEL_ROLES = frozenset({LoopRole.NODES, LoopRole.ITEMS, LoopRole.ROOTS})


@dataclass(frozen=True)
class Loop:
    """`for var in range(start, stop, step)` over what `role` says; a parallel loop runs from 0
    with step 1.

    An element loop (`LoopRole.ELEMENTS`) runs over the elements of cell values inside a
    parallel loop; its iterations are independent. The CPU runs it in order (LLVM vectorizes
    it), the GPU gives each element its own thread. `columns` > 0: the elements are those of a
    matrix with that many columns (flat index = row · columns + column) whose packed copy is
    transposed, and the CPU walks it column by column, so that both sides stay in cache.

    A loop over items (`LoopRole.ITEMS`): each item is a sequence of steps run by one worker,
    in order (an unrolled recursion's item, node after node). The CPU gives an item to a
    thread; the GPU to a block, whose threads share each step's element loops and products and
    synchronize between steps.

    A loop over a node's edges that reduces its children's terms (a sum, a maximum or a
    minimum over them) names the running value in `reduces`: bound to the reduction's start
    just before the loop, set by the loop's last statement from itself and the child's term.

    Written by the CUDA plan (`codegen_cuda.plan.planned_kernel`), for a parallel loop:
    `units`, the hidden units whose elements the blocks split (each block its own); `ranged`,
    the blocks split the batch's nodes in ranges too (`RangeShare`)."""

    var: str
    start: object
    stop: object
    body: tuple
    role: LoopRole
    step: int = 1
    columns: int = 0
    units: int = None
    ranged: bool = False
    reduces: str = None

    @property
    def parallel(self):
        return self.role in PARALLEL_ROLES

    @property
    def element(self):
        return self.role is LoopRole.ELEMENTS

    @property
    def one_worker(self):
        return self.role is LoopRole.ITEMS


@dataclass(frozen=True)
class If:
    """`if condition: body else: orelse`. Kernels branch only on values that are the same for
    every node of a batch, so the whole grid takes one side and a barrier inside is safe."""

    condition: object
    body: tuple
    orelse: tuple = ()


@dataclass(frozen=True)
class Alloc:
    name: str
    shape: tuple


@dataclass(frozen=True)
class MatMul:
    """`y[y_row + s, r] = Σ_k weight[r, columns_begin + k] · x[x_row + s, k]` for s < rows:
    every matrix-vector product of one weight in one pass, done together so each weight row is
    read once per block of nodes. `columns` (begin, end) multiplies a block of the weight's
    columns (a refactored product of one child of a concatenation); None, all of them.
    `value_columns`: the columns of the widest value it multiplies, each a row of x (a matrix
    state's; 1 for vectors).

    Written by the CUDA plan: `pack`, how each block packs the product's inputs into its
    tile itself (`codegen_cuda.packs.Pack`), in place of the grid's pack loop; `input_rows`,
    the rows of its inputs a ranged batch's nodes stand for (`codegen_cuda.ranges.InputRows`)."""

    weight: str
    x: str
    y: str
    rows: object
    row_block: int
    x_row: object = None
    y_row: object = None
    columns: tuple = None
    value_columns: int = 1
    parallel: bool = True   # False: one worker computes it, inside a parallel loop of its own
    pack: object = None
    input_rows: object = None


@dataclass(frozen=True)
class PackedProducts:
    """Products of one pack loop whose inputs each block packs into the same tiles, one
    product's rows after another's (the CUDA plan, `Schedule(shared_tiles=True)`): each a
    `MatMul` with its `pack`."""

    products: tuple


@dataclass(frozen=True)
class RangeShare:
    """After a batch's node count `count`, the CUDA plan's ranges of the batch's nodes and
    each block's share of them and of the `units` hidden units (`runtime.node_ranges`, with
    `balance`: the weights' elements per input column a node multiplies)."""

    count: object
    units: int
    balance: int


class BarrierScope(Enum):
    """Who meets at a barrier, as a backend's plan decides: no plan, the grid (or a CPU
    kernel's threads)."""

    BLOCK = "block"  # a block's threads only: each reads only the rows it computed
    MET = "met"  # no one: the grid met after the last writes


@dataclass(frozen=True)
class Barrier:
    reason: str
    scope: BarrierScope = None  # None: every thread of the kernel


@dataclass(frozen=True)
class Comment:
    text: str


class ArgumentRole(Enum):
    """What a kernel's array argument holds. The lowering says it, so that no stage tells a
    parameter from a field by the prefix of its name."""

    STRUCTURE = "structure"  # the linearized forest: batches, children, items, roots
    FIELD = "field"  # a field of the forest, a row per node
    PARAMETER = "parameter"  # a parameter the cell reads
    STATE = "state"  # a state the kernel writes, a row per node (or per root, gathered)
    COTANGENT = "cotangent"  # a state's cotangent, a row per node, that the backward adds to
    EDGE_COTANGENT = "edge cotangent"  # a DAG's: what a parent sends a child, a row per edge
    KEPT = "kept"  # a forward's products kept for the backward (`KeptProduct`)
    GRADIENT = "gradient"  # what the backward sends to a parameter, row or field (`GradientRows`)
    GRADIENT_SUM = "gradient sum"  # a parameter's gradient, summed by the kernel (`GradientSum`)


class RowsOf(Enum):
    """What the rows of a `GradientRows` array are: where the backward's pass writes them."""

    INTERNAL = "internal nodes"  # row = node, for nodes 0..leaf_begin
    LEAVES = "leaves"  # row = node - leaf_begin
    EDGES = "edges"  # row = edge, the child_idx position of a node's edge to a child
    DISTINCT_LEAVES = "distinct leaves"  # row = a leaf's `leaf_slot`: its distinct key's index
    LEAF_GROUPS = "leaf groups"  # row = a group of leaves (`group_ptr`), summed: see `group_key`


@dataclass(frozen=True)
class GradientRows:
    """An array the backward kernel fills, a row per node or edge (`rows`), for the host to
    reduce: an effect of an adjoint case (`autodiff.adjoint`): `effect` is its kind,
    `attrs` its attributes (the parameter, the table and field, the field), and `side`, for
    a weight gradient's `grad_param_outer`, which of its two vectors this is (0: a, 1: b of
    Σ a ⊗ b; the pair shares `pair`). `columns`: the array holds a row's vector in a column,
    shape (size, rows) where the others' is (rows, size): on the GPU
    (`lower_backward(gradient_columns=True)`), a weight gradient's vectors, and a bias's
    gradient that reads its weight's first vector (its `name`, filled once). `vectors`: for
    a pair of matrices (the weight gradient of a matrix product, Σ over their rows), the
    matrix's rows a node's row holds, one after another, each `size // vectors` long."""

    name: str
    effect: str
    attrs: tuple
    rows: RowsOf
    size: int
    side: int = 0
    pair: str = None
    columns: bool = False
    vectors: int = 1


@dataclass(frozen=True)
class GradientSum:
    """`total[r, c] = Σ_n a[r, n] · b[c, n]` over every column n of `a` and `b`, the column
    arrays of a weight gradient's `GradientRows` pair (a node's or an edge's each); with no
    `b`, a bias's gradient: `total[r] = Σ_n a[r, n]` from its weight's first vector (the
    GPU's columns), or `total[c] = Σ_n a[n, c]` from its rows (the CPU's; the `GradientRows`
    it sums, `summed`, says which). A parameter's whole gradient (`total`, of `shape`), summed
    by the kernel itself once its passes are done, so that the host reads it in place of the
    rows it sums; a per-tree gradient still reads the rows."""

    total: str
    parameter: str
    a: str
    b: str
    shape: tuple
    summed: tuple


@dataclass(frozen=True)
class KeptProduct:
    """A product of a case that a forward kernel keeps for the backward
    (`Schedule(remat=False)`): value `value` of the case, in rows `row`, `row` + `stride`, ...
    of `array`, one per internal node (`rows` INTERNAL, row = node · stride + row), per edge
    from one (EDGES), per leaf (LEAVES) or per distinct key of the leaves (DISTINCT_LEAVES),
    `width` columns (`columns` > 1: the value is a matrix of that many columns, a packed row
    each, as its product wrote it). `gathered`: (table, field) where the value is not a
    product but a product's operand, a row of `table` gathered by `field`, as it was packed."""

    value: int
    array: str
    rows: RowsOf
    stride: int
    row: int
    columns: int
    width: int
    gathered: tuple = None


@dataclass(frozen=True)
class Argument:
    """An array argument of a kernel, its role, and what it stands for: the parameter's
    attribute (`W` of `p_W`) or the field's name (`word` of `field_word`)."""

    name: str
    role: ArgumentRole
    source: str = None


@dataclass(frozen=True)
class Kernel:
    """One fused kernel: scalar and array arguments, then the statements."""

    name: str
    dtype: str
    scalars: tuple
    arrays: tuple
    states: tuple      # (name, per-node size)
    body: tuple
    distinct_key: str = None  # the field of `leaf_distinct`/`leaf_slot`, when the kernel reads them
    transposed: tuple = ()    # (view, argument): `pT_W` is `p_W.T`, bound before anything runs
    roles: tuple = ()         # an `Argument` for each of `arrays`
    gradients: tuple = ()     # a backward kernel's `GradientRows`, each also in `arrays`
    kept: tuple = ()          # the `KeptProduct`s a forward keeps, or a backward reads
    # A backward's: the field whose value its leaves share in a group (`group_ptr`,
    # `group_leaves`), whose rows it sums before its leaves' products (`lowering.backward`).
    group_key: str = None

    def arrays_of(self, *roles):
        """The array arguments of these roles, in the order of `arrays`."""
        return tuple(argument.name for argument in self.roles if argument.role in roles)

    def source(self, name):
        """What array argument `name` stands for (`W` of `p_W`), or None."""
        return next((argument.source for argument in self.roles if argument.name == name),
                    None)


class StatementVisitor:
    """The one walk of ILIR statements that the printer and the code generators share:
    `visit(statement, *context)` calls the subclass's `visit_<Kind>` (`visit_Loop`,
    `visit_MatMul`, ...), and a kind it has no method for is a `TypeError`, so a new kind of
    statement cannot be skipped unseen."""

    def visit(self, statement, *context):
        method = getattr(self, f"visit_{type(statement).__name__}", None)
        if method is None:
            raise TypeError(f"{type(self).__name__} has no rule for {statement!r}")
        return method(statement, *context)

    def visit_all(self, body, *context):
        for statement in body:
            self.visit(statement, *context)


def add(left, right):
    """left + right, folding constants so indices stay readable."""
    if isinstance(right, int):
        right = Const(right)
    if isinstance(right, Const) and right.value == 0:
        return left
    if isinstance(left, Const) and isinstance(right, Const):
        return Const(left.value + right.value)
    if isinstance(left, BinOp) and left.operator == "+" and isinstance(left.right, Const) \
            and isinstance(right, Const):
        return add(left.left, Const(left.right.value + right.value))
    if isinstance(right, Const) and right.value < 0:
        return BinOp("-", left, Const(-right.value))
    return BinOp("+", left, right)


def mul(left, right):
    if isinstance(right, int):
        right = Const(right)
    if isinstance(right, Const) and right.value == 1:
        return left
    if isinstance(left, Const) and left.value == 1:
        return right
    return BinOp("*", left, right)


@dataclass(frozen=True)
class Statements:
    """A list of a kernel's statements and where it lies: `path`, the steps (index, `body`
    or `orelse`) from the kernel's body through the loops and branches that hold it. A
    statement's place is (its list's path, its index): what the analyses key their decisions
    by, since equal statements may stand in several places."""

    items: tuple
    path: tuple = ()

    def __getitem__(self, index):
        return self.items[index]

    def __len__(self):
        return len(self.items)

    def inner(self, index, branch="body"):
        """The statements of `self[index]`'s `branch`, a loop's or a branch's."""
        return Statements(getattr(self.items[index], branch), self.path + ((index, branch),))

    def place(self, index):
        return self.path, index


def walk(body):
    """Every statement of `body`, those inside loops and branches included, in order."""
    for statement in body:
        yield statement
        if isinstance(statement, Loop):
            yield from walk(statement.body)
        elif isinstance(statement, If):
            yield from walk(statement.body)
            yield from walk(statement.orelse)


def nodes(node, kind):
    """Every instance of `kind` in an ILIR statement, expression or tuple of them, each before
    those it holds."""
    if isinstance(node, tuple):
        for item in node:
            yield from nodes(item, kind)
    elif is_dataclass(node):
        if isinstance(node, kind):
            yield node
        for item in fields(node):
            yield from nodes(getattr(node, item.name), kind)


def substitute(node, replacements):
    """`node` (a statement, an expression or a tuple of them) with every expression that is a
    key of `replacements` replaced by its value."""
    if isinstance(node, tuple):
        return tuple(substitute(item, replacements) for item in node)
    if isinstance(node, (Var, Const, Load, Call, BinOp)) and node in replacements:
        return replacements[node]
    if is_dataclass(node):
        return replace(node, **{field.name: substitute(getattr(node, field.name), replacements)
                                for field in fields(node)})
    return node
