"""Lowering: the cell IR → one ILIR kernel (Cortex §4–5).

- Recursion to loops: states become arrays `state_c[node, e]`; the recursion becomes a loop over
  batches (from the leaves up) with a parallel loop over the nodes of a batch.
- Specialization: the leaf case and the internal case get their own loop nests (or, with
  `Schedule(specialize=False)`, one loop nest over every batch that branches on its case).
- Hoisting: the leaf case and every matrix-vector product of the internal case that reads no
  child state run as one parallel pass over all their nodes before the batches.
- Fusion: a node's elementwise ops run in one loop body over the element index `e`; only the
  inputs and results of matrix-vector products live in scratch arrays, indexed densely by the
  node's slot in the pass (Cortex §5.1), so that each weight row is read once per block of nodes.
- Barriers: between the phases of a batch where a product reads a value computed in the same
  batch, and between batches.
- Refactoring (`Schedule(refactor=True)`, `refactor.py`): products of child states move to the
  end of the child's own iteration.
- Unrolling (`Schedule(unroll=k)`): a batch of k heights is a parallel loop over subtrees, each
  computed node after node by one worker (`unrolled_batch`).
"""
import functools
import math
from dataclasses import dataclass, fields, is_dataclass, replace

from ..errors import ScheduleError, UnsupportedError
from ..frontend.cell_ir import EACH, OVER_CHILDREN, attribute, label
from .ilir import (Alloc, Argument, ArgumentRole, Barrier, BinOp, Call, Comment, Const, If, Kernel,
                   KeptProduct, Let, Load, Loop, LoopRole, MatMul, RowsOf, Store, Var, add, mul,
                   nodes, walk)
from .refactor import refactor

SCALARS = ("num_nodes", "leaf_begin", "num_batches", "max_batch_size", "max_batch_edges")
STRUCTURE = ("batch_begin", "child_ptr", "child_idx")
# The batch loop counts b down to 0; batch 0, the last, holds roots only.
NOT_LAST_BATCH = BinOp(">", Var("b"), Const(0))
BINARY_SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
LOOPED_NUMBERS = ("inner", "sum", *OVER_CHILDREN)  # numbers computed by a loop: once a node
# Each reduction over the children: its start, and its step from the running value `total`
# and the child's `term` (`child_max`'s and `child_min`'s by the side that wins a tie).
REDUCTIONS = {
    ("child_sum",): (0.0, lambda total, term: BinOp("+", total, term)),
    ("child_max", "earliest"): (-math.inf, lambda total, term: Call("maximum", (total, term))),
    ("child_max", "latest"): (-math.inf, lambda total, term: Call("maximum", (term, total))),
    ("child_min", "earliest"): (math.inf, lambda total, term: Call("minimum", (total, term))),
    ("child_min", "latest"): (math.inf, lambda total, term: Call("minimum", (term, total)))}


def state_name(component):
    return f"state_{component}"


def cotangent_name(component):
    """The backward's cotangent of state component `component`, a row per node."""
    return f"cot_{component}"


def field_name(name):
    return f"field_{name}"


def param_name(name):
    """Parameter `p.W` is the kernel argument `p_W`: no clash with the kernel's own names.
    Read transposed (`W.T`), it is `pT_W`, the kernel's view of `p_W` (`Kernel.transposed`)."""
    if name != attribute(name):
        return f"pT_{attribute(name)}"
    return f"p_{name}"


class ElementEmitter:
    """Scalar code for the elements of cell values inside one loop body. Element `index` of
    value `%i` becomes the local `v{i}` (the cell IR's own number), computed once per body.

    Reductions open an inner loop with a child emitter: `child_sum` a loop over the node's
    children (`scope="child"`: what is the same for every child is computed before the loop,
    by the parent), a product with a computed matrix a loop over the contraction index
    (`scope="dot"`, which leaves numbers to its parent: they are the same for every k). An
    element loop's emitter (`scope="node"`) leaves the numbers that take a loop of their own
    (an inner product, a sum over children of numbers) to the node's emitter, whose
    statements run once a node, before the element loops: read in every element, they would
    be computed again in each."""

    def __init__(self, pass_lowering, parent=None, scope=None):
        self.pass_lowering = pass_lowering
        self.ops = pass_lowering.case.ops
        self.parent = parent
        self.scope = scope
        self.used = {} if parent is None or scope == "node" else parent.used
        self.statements = []
        self.names = {}

    def fresh(self, base):
        count = self.used.get(base, 0)
        self.used[base] = count + 1
        return base if count == 0 else f"{base}_{count}"

    def element(self, value, index, position):
        """Element `index` of `value`; `position` is a concrete element of the loop's segment,
        which decides the part of a concatenation."""
        op = self.ops[value]
        if self.scope == "child" and not op.per_child:
            return self.parent.element(value, index, position)
        if self.scope == "node" and op.shape == () and op.kind in LOOPED_NUMBERS or (
                self.scope == "dot" and op.shape == ()):  # the same for every k
            return self.parent.element(value, index, position)
        if op.shape == ():
            index = Const(0)
        key = (value, index)
        if key in self.names:
            return self.names[key]
        expression = self.compute(value, op, index, position)
        if isinstance(expression, (Call, BinOp)):
            name = self.fresh(f"v{value}")
            self.statements.append(Let(name, expression))
            expression = Var(name)
        self.names[key] = expression
        return expression

    def compute(self, value, op, index, position):
        lowering = self.pass_lowering
        location = lowering.matvec_location(value)
        if location is not None:
            return location(index)
        kind = op.kind
        if kind == "param":  # a scalar parameter is passed as a vector of one element
            return Load(param_name(op.attrs[0]), _unflatten(index, op.shape) or (index,))
        if kind in ("const", "fill"):
            return Const(op.attrs[0])
        if kind == "num_children":  # end - begin of the node's edges, in the kernel's dtype
            node = Var("node")
            return Call("num_children", (Load("child_ptr", (add(node, 1),)),
                                          Load("child_ptr", (node,))))
        if kind == "child_state":
            child, component = op.attrs
            node = Var("child") if child == EACH else lowering.child(child)
            return Load(state_name(component), (node, index))
        if kind == "child_projection":
            child, projection = op.attrs
            node = Var("child") if child == EACH else lowering.child(child)
            return Load(projection, (node, index))
        if kind in OVER_CHILDREN:
            return self.over_children(value, op, index, position)
        if kind == "child_position":  # the edges before the child's among the node's
            return Call("num_children", (Var("edge"), Load("child_ptr", (Var("node"),))))
        if kind in ("matvec", "matmul", "inner"):
            return self.dot(value, op, index, position)
        if kind == "gather":
            table, field = op.attrs
            row = lowering.field_value(field)
            return Load(param_name(table), (row,) + _unflatten(index, op.shape))
        if kind == "field":
            return Load(field_name(op.attrs[0]), (Var("node"),) + _unflatten(index, op.shape))
        if kind == "unary":
            argument = self.element(op.args[0], index, position)
            return Call(op.attrs[0], (argument,))
        if kind == "binary":
            function = op.attrs[0]
            first, second = op.args
            if function == "add" and padded_zero(self.ops, first, position):
                return self.element(second, index, position)
            if function in ("add", "sub") and padded_zero(self.ops, second, position):
                return self.element(first, index, position)
            left, right = (self.element(a, index, position) for a in op.args)
            if function in BINARY_SYMBOLS:
                return BinOp(BINARY_SYMBOLS[function], left, right)
            return Call(function, (left, right))
        if kind == "slice":
            start = op.attrs[0] * _row_size(self.ops[op.args[0]])
            return self.element(op.args[0], add(index, start), position + start)
        if kind in ADJOINT_KINDS:
            return ADJOINT_KINDS[kind](self, value, op, index, position)
        if kind == "concat":
            offset = 0
            for part in op.args:
                size = self.ops[part].size
                if offset <= position < offset + size:
                    return self.element(part, add(index, -offset), position - offset)
                offset += size
        raise lowering.unsupported(f"`{kind}` of shape {op.shape} is not compiled yet", op)

    def over_children(self, value, op, index, position):
        """A reduction over the node's children (`REDUCTIONS`): a loop over its edges."""
        term_emitter = ElementEmitter(self.pass_lowering, self, "child")
        term = term_emitter.element(op.args[0], index, position)
        total = self.fresh(f"v{value}")
        start, step = REDUCTIONS[(op.kind, *op.attrs)]
        self.statements += [Let(total, Const(start)), over_children(
            term_emitter.statements + [Let(total, step(Var(total), term))], reduces=total)]
        return Var(total)

    def dot(self, value, op, index, position):
        """Element (i, j) of a product whose matrix is computed in the node: Σ_k A[i,k] B[k,j],
        one loop per segment of k in which neither operand changes definition; the inner
        product of two vectors is its one element, Σ_k a[k] b[k]."""
        matrix, operand = op.args
        inner = self.ops[matrix].shape[-1]
        columns = op.shape[1] if op.kind == "matmul" else 1
        if op.kind == "inner":
            row, column, row_position, column_position = None, None, 0, 0
        elif columns == 1:
            row, column, row_position, column_position = index, None, position, 0
        else:
            row, column = BinOp("//", index, Const(columns)), BinOp("%", index, Const(columns))
            row_position, column_position = divmod(position, columns)
        total = self.fresh(f"v{value}")
        self.statements.append(Let(total, Const(0.0)))
        k = f"k{value}"
        for low, high in contraction_segments(self.ops, matrix, operand, columns):
            emitter = ElementEmitter(self.pass_lowering, self, "dot")
            left = emitter.element(matrix, Var(k) if row is None
                                   else add(mul(row, inner), Var(k)), row_position * inner + low)
            right = emitter.element(operand, Var(k) if column is None else
                                    add(mul(Var(k), columns), column),
                                    low * columns + column_position)
            self.statements.append(Loop(k, Const(low), Const(high), tuple(emitter.statements) + (
                Let(total, BinOp("+", Var(total), BinOp("*", left, right))),), LoopRole.DOT))
        return Var(total)


def _cotangent(emitter, value, op, index, position):
    return Load(cotangent_name(op.attrs[0]), (Var("node"), index))


def _each_child(emitter, value, op, index, position):
    """A value of the node's read in each child's term: the parent's element."""
    return emitter.element(op.args[0], index, position)


def _transpose(emitter, value, op, index, position):
    rows, columns = op.shape
    row, column = _unflatten(index, op.shape)
    position_row, position_column = divmod(position, columns)
    return emitter.element(op.args[0], add(mul(column, rows), row),
                           position_column * rows + position_row)


def _outer(emitter, value, op, index, position):
    columns = op.shape[1]
    row, column = _unflatten(index, op.shape)
    return BinOp("*", emitter.element(op.args[0], row, position // columns),
                 emitter.element(op.args[1], column, position % columns))


def _pad(emitter, value, op, index, position):
    """Zero outside rows start..stop; the segments split there, so each knows which."""
    start, stop = (bound * _row_size(op) for bound in op.attrs)
    if not start <= position < stop:
        return Const(0.0)
    return emitter.element(op.args[0], add(index, -start), position - start)


def padded_zero(ops, value, position):
    """Whether element `position` of `value` is a zero that an adjoint's `pad` put outside its
    rows (or a sum of such zeros): the cotangent of one part of a split or concatenation,
    summed with the others', adds nothing there, and its sum is the other operand, not
    `x + 0.0`. The segments split at a pad's rows, so this holds for the whole segment."""
    op = ops[value]
    if op.kind == "pad":
        start, stop = (bound * _row_size(op) for bound in op.attrs)
        return not start <= position < stop
    if op.kind == "binary" and op.attrs[0] == "add":
        return all(padded_zero(ops, argument, position) for argument in op.args)
    return False


def _sum(emitter, value, op, index, position):
    """Σ_k x[k], one loop per segment of x."""
    (vector,) = op.args
    total = emitter.fresh(f"v{value}")
    emitter.statements.append(Let(total, Const(0.0)))
    k = f"k{value}"
    for low, high in segments(emitter.ops, [vector], emitter.ops[vector].size):
        terms = ElementEmitter(emitter.pass_lowering, emitter, "dot")
        term = terms.element(vector, Var(k), low)
        emitter.statements.append(Loop(k, Const(low), Const(high), tuple(terms.statements) + (
            Let(total, BinOp("+", Var(total), term)),), LoopRole.DOT))
    return Var(total)


# The op kinds only an adjoint case has (`autodiff.adjoint`), element by element.
ADJOINT_KINDS = {"cotangent": _cotangent, "each_child": _each_child, "transpose": _transpose,
                 "outer": _outer, "pad": _pad, "sum": _sum}


def over_children(body, reduces=None):
    """`for edge in child_ptr[node]..child_ptr[node+1]`, with `child` the edge's child,
    reducing the children into `reduces` where it names a reduction's running value. A loop
    over the edges inside `body` (a sum over the children of a value read per child, as a
    backward pass's cotangent is) takes the names a level deeper, `edge_1` and `child_1`, so
    that it leaves this loop's as they were."""
    node = Var("node")
    return Loop("edge", Load("child_ptr", (node,)), Load("child_ptr", (add(node, 1),)),
                (Let("child", Load("child_idx", (Var("edge"),))),) + _edge_loops_deeper(body),
                LoopRole.EDGES, reduces=reduces)


def _edge_loops_deeper(body):
    """`body` with each loop over edges in it renamed a level deeper (`_deeper`)."""
    result = []
    for statement in body:
        if isinstance(statement, Loop) and statement.role is LoopRole.EDGES:
            statement = _deeper(statement)
        elif isinstance(statement, Loop):
            statement = replace(statement, body=_edge_loops_deeper(statement.body))
        elif isinstance(statement, If):
            statement = replace(statement, body=_edge_loops_deeper(statement.body),
                                orelse=_edge_loops_deeper(statement.orelse))
        result.append(statement)
    return tuple(result)


def _deeper(node):
    """An edge loop's statements with every edge and child name one level deeper: `edge` is
    `edge_1`, `child_1` is `child_2`. Inside the loop, each names its own loop's edge."""
    if isinstance(node, tuple):
        return tuple(_deeper(item) for item in node)
    if isinstance(node, Var) and _is_edge_name(node.name):
        return Var(_one_deeper(node.name))
    if isinstance(node, Let) and _is_edge_name(node.name):
        return Let(_one_deeper(node.name), _deeper(node.value))
    if isinstance(node, Loop) and _is_edge_name(node.var):
        return replace(node, var=_one_deeper(node.var), body=_deeper(node.body))
    if is_dataclass(node):
        return replace(node, **{field.name: _deeper(getattr(node, field.name))
                                for field in fields(node)})
    return node


def _is_edge_name(name):
    base, _, level = name.partition("_")
    return base in ("edge", "child") and (level == "" or level.isdigit())


def _one_deeper(name):
    base, _, level = name.partition("_")
    return f"{base}_{int(level or 0) + 1}"


def _packed_index(slot, stride, row, columns, index):
    """Where element `index` (flat) of a packed operand goes: vector elements along a row of
    the scratch, a matrix operand's column j in row `row + j`."""
    if columns == 1:
        return (add(mul(slot, stride), row), index)
    return (add(add(mul(slot, stride), row), BinOp("%", index, Const(columns))),
            BinOp("//", index, Const(columns)))


def _unflatten(index, shape):
    """The multi-index of flat element `index` of an array of `shape`; `i * n + k` of an
    array with n columns is read back as `[i, k]`."""
    if len(shape) <= 1:
        return (index,) if shape else ()
    columns = shape[-1]
    if isinstance(index, BinOp) and index.operator == "+" and isinstance(index.left, BinOp) \
            and index.left.operator == "*" and index.left.right == Const(columns):
        outer, inner = index.left.left, index.right
    else:
        outer, inner = BinOp("//", index, Const(columns)), BinOp("%", index, Const(columns))
    return _unflatten(outer, shape[:-1]) + (inner,)


def breakpoints(ops, value):
    """Element positions where a value's definition changes (the joints of a concatenation)."""
    op = ops[value]
    if op.kind == "concat":
        points, offset = set(), 0
        for part in op.args:
            points |= {offset + p for p in breakpoints(ops, part)}
            points.add(offset)
            offset += ops[part].size
        return points - {0}
    if op.kind == "slice":
        start, stop = (bound * _row_size(ops[op.args[0]]) for bound in op.attrs)
        return {p - start for p in breakpoints(ops, op.args[0]) if start < p < stop}
    if op.kind == "pad":
        start, stop = (bound * _row_size(op) for bound in op.attrs)
        return ({start, stop} | {p + start for p in breakpoints(ops, op.args[0])}) - {0, op.size}
    if op.kind == "outer":
        columns = op.shape[1]
        inner = breakpoints(ops, op.args[1])
        return ({p * columns for p in breakpoints(ops, op.args[0])}
                | {row * columns + p for row in range(op.shape[0]) for p in inner}) - {0}
    if op.kind == "transpose":
        return _transposed_breakpoints(op.shape, breakpoints(ops, op.args[0]))
    if op.kind in ("unary", "binary", "each_child", *OVER_CHILDREN):
        return set().union(*(breakpoints(ops, a) for a in op.args if ops[a].shape != ()))
    if op.kind in ("matvec", "matmul"):
        matrix, operand = op.args
        columns = op.shape[1] if op.kind == "matmul" else 1
        points = {row * columns for row in _rows_split(breakpoints(ops, matrix),
                                                       ops[matrix].shape[1])}
        splits = {point % columns for point in breakpoints(ops, operand)} - {0}
        if splits:  # column j of the result reads column j of the operand: split where it does
            points |= {row * columns + split for row in range(op.shape[0])
                       for split in splits | {0}}
        return points - {0, op.size}
    return set()


def _rows_split(points, columns):
    """The rows of a matrix with `columns` columns at which segments begin, for breakpoints
    `points`: a row where one begins, and a row holding one within it by itself (with the
    row after it), since its columns change definition where the rows around it may not."""
    rows = set()
    for point in points:
        row, column = divmod(point, columns)
        rows |= {row} if column == 0 else {row, row + 1}
    return rows


def _row_size(op):
    """How many elements one row of `op`'s value holds: slices and pads of a matrix count rows."""
    return op.size // op.shape[0] if len(op.shape) == 2 else 1


def _transposed_breakpoints(shape, points):
    """The breakpoints of a matrix of `shape` that is another transposed, whose own are
    `points`: where two neighbours of the transposed come from different segments."""
    if not points:
        return set()
    rows, columns = shape
    edges = sorted(points)

    def segment(position):  # of element (i, j) of the transposed: (j, i) of the original
        row, column = divmod(position, columns)
        original = column * rows + row
        return sum(1 for edge in edges if edge <= original)

    return {p for p in range(1, rows * columns) if segment(p) != segment(p - 1)}


def contraction_segments(ops, matrix, operand, columns):
    """Ranges of the contraction index k over which both operands keep one definition."""
    inner = ops[matrix].shape[-1]
    points = {point % inner for point in breakpoints(ops, matrix)}
    points |= _operand_rows_split(ops, operand, columns)
    return _ranges({0, inner} | {point for point in points if 0 < point < inner})


def _operand_rows_split(ops, operand, columns):
    """The rows of a product's `operand` (k, the contraction index) where the sum down one
    of its columns must split, because the operand's definition changes there. A transposed
    matrix's column is a row of the original, which changes only where the original does
    within a row: the transposed concatenation of two children's matrices (the cotangent
    g Mᵀ of a computed matrix times them, Σ_k g[i, k] M[j, k]) splits none, where every
    row holds a change, and `_rows_split` split the sum at every k (64 one-term loops an
    element at H = 64). Any other operand: `_rows_split`."""
    op = ops[operand]
    if op.kind == "transpose" and columns > 1:
        inner = op.shape[0]
        return {point % inner for point in breakpoints(ops, op.args[0])}
    return _rows_split(breakpoints(ops, operand), columns)


def segments(ops, values, size):
    return _ranges({0, size}.union(*(breakpoints(ops, v) for v in values)))


def _row_segments(ops, values, shape):
    """The segments of one row of matrix `values` (of `shape`), where every row of it breaks
    at the same columns (the transposed concatenation of two children's matrices: at each
    child's part of every row); else None."""
    rows, columns = shape
    points = set(range(0, rows * columns, columns)).union(
        *(breakpoints(ops, value) for value in values))
    in_row = {point for point in points if point < columns}
    if points != {row * columns + point for row in range(rows) for point in in_row}:
        return None
    return _ranges(in_row | {columns})


def _ranges(points):
    """Consecutive (low, high) ranges between the sorted points."""
    points = sorted(points)
    return list(zip(points[:-1], points[1:]))


class PassLowering:
    """One pass over a range of nodes of one structural case: phases of packed inputs and
    matrix products, then the fused elementwise loop that stores the outputs."""

    def __init__(self, cell, case, prefix, count, node_of_slot, capacity, available, row_block,
                 edge_capacity=None, distinct=None, first_node=None, children_inside=False,
                 shared_segments=False, keep=None, operands_in_place=False):
        self.cell = cell
        # Products read an available value (`available`) where it lies, a row a slot, with
        # no packed copy (`rows_in_place`): a backward's sums over groups of leaves.
        self.operands_in_place = operands_in_place
        # The products' rows written where the backward reads them (`Schedule(remat=False)`):
        # `keep`, what a row of the arrays the kernel returns stands for (`RowsOf`: an
        # internal node, a leaf, a distinct key; an edge for a product per child), each
        # value's a `KeptProduct` in `kept`, not scratch rows a slot of the pass. None: scratch.
        self.keep = keep
        self.kept = []
        # Values per child packed inside each element loop, a loop over the edges within it,
        # not the element loops inside a loop over the edges: the node's own values (a
        # backward pass's cotangents, themselves sums over the children) are then computed
        # once an element, not once an edge.
        self.children_inside = children_inside
        # Segments of equal length in one element loop (`shared_element_loops`), which
        # computes what they have in common once: a backward pass's chain of cotangents,
        # which every gate's segment reads.
        self.shared_segments = shared_segments
        self.first_node = first_node or Var("begin")  # the pass's first node: its edges begin there
        self.case = case
        self.row_block = row_block
        self.prefix = prefix
        self.count = count
        self.capacity = capacity
        self.edge_capacity = edge_capacity
        self.locations = dict(available)
        self.preamble = {}
        self.node_emitter = None  # the numbers the next parallel loop computes once a node
        self.depth_memo = {}
        self.uses_edges = False
        # The products' rows: one per slot, or with `distinct` = (how many, node of one, the
        # number of a slot's) one per distinct key, read back at `distinct` by every slot.
        self.product_slot, self.product_count, self.product_node = "slot", count, node_of_slot
        self.slot_lets = [Let("node", node_of_slot)]
        if distinct:
            self.product_count, self.product_node, slot_of = distinct
            self.product_slot = "distinct"
            self.slot_lets.append(Let("distinct", slot_of))

    def unsupported(self, message, op):
        return UnsupportedError(message, filename=self.cell.filename, lineno=op.line)

    # where values live -----------------------------------------------------------------
    def matvec_location(self, value):
        if value not in self.locations:
            return None
        array, stride, row, slot, columns = self.locations[value]
        return lambda index: Load(array, _packed_index(slot, stride, row, columns, index))

    def child(self, k):
        name = f"child{k}"
        self.preamble[name] = Load("child_idx", (add(Load("child_ptr", (Var("node"),)), k),))
        return Var(name)

    def field_value(self, field):
        self.preamble[f"node_{field}"] = Load(field_name(field), (Var("node"),))
        return Var(f"node_{field}")

    # phases ----------------------------------------------------------------------------
    def is_packed(self, value):
        """A product of a parameter matrix: packed with its peers into one `MatMul`, a matrix
        operand as one packed vector per column. Products with a matrix computed in the node
        are dot loops in the element code instead."""
        op = self.case.ops[value]
        return op.kind in ("matvec", "matmul") and self.case.ops[op.args[0]].kind == "param"

    def depth(self, value):
        """How many packed matrix products lie between the pass's inputs and this value."""
        if value in self.locations:
            return 0
        if value not in self.depth_memo:
            op = self.case.ops[value]
            if self.is_packed(value):
                self.depth_memo[value] = 1 + self.depth(op.args[1])
            else:
                self.depth_memo[value] = max((self.depth(a) for a in op.args), default=0)
        return self.depth_memo[value]

    def needed_matvecs(self, roots):
        needed, seen, stack = [], set(), list(roots)
        while stack:
            value = stack.pop()
            if value in seen or value in self.locations:
                continue
            seen.add(value)
            op = self.case.ops[value]
            if self.is_packed(value):
                needed.append(value)
            stack.extend(op.args)
        return sorted(needed)

    def slot_loop(self, body):
        """The elementwise loop over every slot of the pass."""
        return self._parallel_loop("slot", self.count, self.slot_lets, body)

    def product_loop(self, body):
        """The loop packing the products' inputs: one iteration per row of the products."""
        return self._parallel_loop(self.product_slot, self.product_count,
                                   [Let("node", self.product_node)], body)

    def _parallel_loop(self, variable, count, lets, body):
        preamble = [Let(name, value) for name, value in self.preamble.items()]
        if self.node_emitter is not None:
            preamble += self.node_emitter.statements
        self.preamble, self.node_emitter = {}, None
        return Loop(variable, Const(0), count, tuple(lets) + tuple(preamble) + tuple(body),
                    LoopRole.NODES)

    def lower(self, outputs, extra_matvecs=()):
        """Statements computing `outputs` ((value, target) pairs: a `StateRow`, or another
        target with its own `stores`) and the products `extra_matvecs`; returns
        (allocations, statements)."""
        matvecs = self.needed_matvecs([v for v, _ in outputs] + list(extra_matvecs))
        phases = sorted({self.depth(m) for m in matvecs})
        early = self.early_outputs(outputs) if phases else []
        allocations, statements = [], []
        for phase in phases:
            if phase > 1:
                statements.append(Barrier(f"phase {phase} multiplies values computed in "
                                          f"phase {phase - 1} of the same nodes"))
            phase_allocations, phase_statements = self.phase(
                [m for m in matvecs if self.depth(m) == phase], phase,
                early if phase == phases[0] else ())
            allocations += phase_allocations
            statements += phase_statements
        late = [output for output in outputs if output not in early]
        if late:
            if matvecs:
                statements.append(Barrier("the elementwise ops read the products"))
            statements.append(self.elementwise(late))
        if self.uses_edges:
            edge_base = Load("child_ptr", (self.first_node,))
            edge_end = Load("child_ptr", (add(self.first_node, self.count),))
            statements = [Let("edge_base", edge_base),
                          Let("num_edges", BinOp("-", edge_end, Var("edge_base")))] + statements
        return allocations, statements

    def lower_states(self, projections, first, count, last_batch_skips=False):
        """`lower` of the case's states, then the refactored products of the pass's nodes
        first..first+count, read straight from the states just stored. `last_batch_skips`:
        the pass is a whole batch, and the last one (roots only) multiplies nothing, since
        no parent reads its products."""
        allocations, statements = self.lower(
            [(v, StateRow(state_name(c))) for c, v in enumerate(self.case.outputs)])
        if projections:
            products = [Barrier("the refactored products read the states just computed")]
            products += [MatMul(param_name(projection.weight),
                                state_name(projection.component), projection.name, count,
                                self.row_block, x_row=first, y_row=first,
                                columns=projection.columns)
                         for projection in projections]
            statements += ([If(NOT_LAST_BATCH, tuple(products))] if last_batch_skips
                           else products)
        return allocations, statements

    def early_outputs(self, outputs):
        """The outputs that read none of the pass's products (with `shared_segments`, where a
        slot is a node): stored in the first phase's loop, which computes what they read for
        its packs anyway, not computed again in the elementwise loop."""
        if not self.shared_segments or self.product_slot != "slot":
            return []
        return [(value, target) for value, target in outputs
                if self.depth(value) == 0 and not self.transposed_columns([value])]

    def phase(self, matvecs, phase, outputs=()):
        """Pack the vectors of this phase's products, then one `MatMul` per weight and per
        kind of vector: one per node (indexed by slot) or one per child (indexed by edge);
        `outputs` (`early_outputs`) are stored in the same loop."""
        groups = {}
        for value in matvecs:
            matrix, vector = self.case.ops[value].args
            key = (self.case.ops[matrix].attrs[0], self.case.ops[vector].per_child)
            groups.setdefault(key, []).append((value, vector))
        allocations, node_packs, edge_packs, products, shared = [], [], [], [], []
        stored = self.rows_stored(outputs)
        for (weight, per_child), uses in groups.items():
            suffix = ("" if phase == 1 else str(phase)) + ("_child" if per_child else "")
            x, y = (f"{self.prefix}{side}{suffix}_{label(weight)}" for side in "xy")
            rows, inner = self.case.ops[self.case.ops[uses[0][0]].args[0]].shape
            in_place = None if per_child else self.rows_in_place(uses, stored)
            if in_place:
                products.append(self.product_in_place(in_place, weight, uses[0][0], y, suffix,
                                                      rows, allocations))
                continue
            widths = [self.case.ops[value].shape[1:] or (1,) for value, _ in uses]
            stride = sum(width[0] for width in widths)
            capacity = self.edge_capacity if per_child else self.capacity
            if not per_child and self.keeps_gathered_rows(uses):
                x = f"{self.prefix}kept_x{suffix}_{label(weight)}"
                row = 0
                for (_, operand), (columns,) in zip(uses, widths):
                    if self.case.ops[operand].kind == "gather":
                        self.kept.append(KeptProduct(operand, x, self.keep, stride, row,
                                                     columns, inner,
                                                     self.case.ops[operand].attrs))
                    row += columns
            else:
                allocations.append(Alloc(x, (mul(capacity, stride), Const(inner))))
            y, y_row, y_slot = self.product_rows(
                y, suffix, weight, [(product, columns) for (product, _), (columns,)
                                    in zip(uses, widths)], rows, per_child, allocations)
            slot = self.scratch_slot(per_child)
            row = 0
            for (product, operand), (columns,) in zip(uses, widths):
                def pack(emitter, position, element, operand=operand, row=row, x=x,
                         stride=stride, slot=slot, columns=columns, per_child=per_child):
                    at = _packed_index(slot, stride, row, columns, element)
                    if per_child and self.children_inside:
                        return for_each_child(self, emitter, position, element, [
                            (operand, lambda term, at=at, x=x: Store(x, at, term))])
                    return [Store(x, at, emitter.element(operand, element, position))]

                self.uses_edges |= per_child
                inside = per_child and not self.children_inside
                if self.shared_segments and not inside and columns == 1:
                    shared.append(([operand], inner, pack))
                else:
                    (edge_packs if inside else node_packs).extend(self.element_loops(
                        "k", [operand], inner * columns, pack, columns if columns > 1 else 0))
                self.locations[product] = (y, stride, row, y_slot, columns)
                row += columns
            count = Var("num_edges") if per_child else self.product_count
            products.append(MatMul(param_name(weight), x, y, mul(count, stride),
                                   self.row_block, y_row=y_row,
                                   value_columns=max(columns for columns, in widths)))
        node_packs += self.shared_element_loops("k", shared + self.output_requests(outputs))
        if edge_packs:
            self.uses_edges = True
            node_packs.append(over_children(edge_packs))
        if not node_packs:
            return allocations, products
        return allocations, [self.product_loop(node_packs),
                             Barrier("the products read the packed inputs")] + products

    def keeps_gathered_rows(self, uses):
        """Whether the packed operands of a leaf pass's products, `uses`, are kept for the
        backward (`keep`) as the forward packed them: where one is a table's row gathered by
        a field (`p.E[node.word]`), the backward reads the rows the forward read there, never
        the table, which a training loop may update before the pullback."""
        return self.keep in (RowsOf.LEAVES, RowsOf.DISTINCT_LEAVES) and any(
            self.case.ops[operand].kind == "gather" for _, operand in uses)

    def product_in_place(self, in_place, weight, value, y, suffix, rows, allocations):
        """The product of `weight` with vectors read where they lie (`rows_in_place`)."""
        x, first_row = in_place
        y, y_row, y_slot = self.product_rows(y, suffix, weight, [(value, 1)], rows, False,
                                             allocations)
        self.locations[value] = (y, 1, 0, y_slot, 1)
        return MatMul(param_name(weight), x, y, self.product_count, self.row_block,
                      x_row=first_row, y_row=y_row)

    def rows_in_place(self, uses, stored=None):
        """(array, its first row) where a weight's only product here multiplies vectors that
        lie a row a slot, in order, in an array: a vector field of consecutive nodes
        (`field_rows`); a value this phase's loop stores a row a node before the product
        (`stored`, from `rows_stored`: a backward's gradient rows); or, with
        `operands_in_place`, a value the pass reads from its own row of an array
        (`available`); no packed copy then."""
        in_place = self.field_rows(uses)
        if in_place or len(uses) != 1:
            return in_place
        if stored and uses[0][1] in stored:
            return stored[uses[0][1]]
        if not self.operands_in_place:
            return None
        location = self.locations.get(uses[0][1])
        if self.product_slot == "slot" and location and location[1:] == (1, 0, Var("slot"), 1):
            return location[0], None
        return None

    def rows_stored(self, outputs):
        """{vector: (array, its first row)} for the `outputs` stored in the packing loop whose
        target puts a vector's elements in order in the node's row of an array
        (`node_row`), the pass's nodes consecutive: a product after that loop's barrier can
        read them there (a backward's `Wᵀ g`, whose g is also a row of W's gradient), and
        the loop stores one array fewer: LLVM vectorized binary TreeLSTM's backward loop
        only without the packed copy beside the gradient rows (benchmarks/README.md)."""
        first = self.first_of_slots()
        if first is False:
            return {}
        stored = {}
        for value, target in outputs:
            row = getattr(target, "node_row", None)
            if row is not None and len(self.case.ops[value].shape) == 1:
                stored.setdefault(value, (row, first))
        return stored

    def first_of_slots(self):
        """The first node of the pass's products' rows when a slot's node is that node plus
        the slot (None: the slot itself), or False when its nodes are not consecutive."""
        node = self.product_node
        if self.product_slot != "slot":
            return False
        if node == Var("slot"):
            return None
        if isinstance(node, BinOp) and node.operator == "+" and node.right == Var("slot"):
            return node.left
        return False

    def product_rows(self, y, suffix, weight, values, width, per_child, allocations):
        """(the array a weight's products write, their first row there, the expression of a
        value's row a node or edge reads them at) for `values` ((value, its columns), packed
        in that order a slot or edge): scratch rows a slot or edge of the pass, allocated
        into `allocations`; or, keeping them (`keep`), rows of every internal node or edge
        of the forest, in an array the kernel returns."""
        stride = sum(columns for _, columns in values)
        if self.keep is None:
            capacity = self.edge_capacity if per_child else self.capacity
            allocations.append(Alloc(y, (mul(capacity, stride), Const(width))))
            return y, None, self.scratch_slot(per_child)
        kept = f"{self.prefix}kept{suffix}_{label(weight)}"
        rows = RowsOf.EDGES if per_child else self.keep
        row = 0
        for value, columns in values:
            self.kept.append(KeptProduct(value, kept, rows, stride, row, columns, width))
            row += columns
        first, slot = {RowsOf.INTERNAL: (self.first_node, Var("node")),
                       RowsOf.EDGES: (Var("edge_base"), Var("edge")),
                       RowsOf.LEAVES: (Const(0), Var("slot")),
                       RowsOf.DISTINCT_LEAVES: (Const(0), Var("distinct"))}[rows]
        return kept, None if first == Const(0) else mul(first, stride), slot

    def scratch_slot(self, per_child):
        """A product row's slot in the pass's scratch: the edge's, counted from the pass's
        first edge, or the slot's (or distinct key's)."""
        return (BinOp("-", Var("edge"), Var("edge_base")) if per_child
                else Var(self.product_slot))

    def field_rows(self, uses):
        """(the field's array, first node) when a weight's only product here multiplies a
        vector field of the pass's nodes and those are consecutive: the product reads the
        field's rows where they are, with no packed copy (DAG-RNN's `W @ node.x`)."""
        if len(uses) != 1:
            return None
        operand = self.case.ops[uses[0][1]]
        first = self.first_of_slots()
        if operand.kind != "field" or len(operand.shape) != 1 or first is False:
            return None
        return field_name(operand.attrs[0]), first

    def element_loops(self, variable, values, size, stores, columns=0):
        """One element loop per segment of `values`; walked column by column (`columns`) when
        every segment is made of whole rows of the matrix."""
        loops = []
        ranges = segments(self.case.ops, values, size)
        if columns and any(low % columns or high % columns for low, high in ranges):
            columns = 0
        if self.node_emitter is None:
            self.node_emitter = ElementEmitter(self)
        for low, high in ranges:
            emitter = ElementEmitter(self, self.node_emitter, "node")
            body = stores(emitter, low, Var(variable))
            loops.append(Loop(variable, Const(low), Const(high),
                              tuple(emitter.statements) + tuple(body), LoopRole.ELEMENTS,
                              columns=columns))
        return loops

    def shared_element_loops(self, variable, requests):
        """One element loop per segment length of `requests` ((values, size, stores) each):
        segments of one length share the loop and its emitter, each storing at its own
        offset (element `variable` + its first), so that a value two segments read at the
        same element is computed once. Their stores write rows that no value reads."""
        if requests and self.node_emitter is None:
            self.node_emitter = ElementEmitter(self)
        loops, by_length = [], {}
        for values, size, stores in requests:
            by_rows = self.row_loops(variable, values, stores)
            if by_rows is not None:
                loops += by_rows
                continue
            for low, high in segments(self.case.ops, values, size):
                by_length.setdefault(high - low, []).append((low, stores))
        for length, parts in by_length.items():
            emitter = ElementEmitter(self, self.node_emitter, "node")
            body = []
            for low, stores in parts:
                body += stores(emitter, low, add(Var(variable), low))
            loops.append(Loop(variable, Const(0), Const(length),
                              tuple(emitter.statements) + tuple(body), LoopRole.ELEMENTS))
        return loops

    def row_loops(self, variable, values, stores):
        """For matrix `values` that break at the same columns in every row, more than once
        (the transposed concatenation of two children's matrices), a loop over the rows
        holding an element loop per segment of a row (element row · columns + column): a
        loop for each child's part, where the flat element loops took a segment each (2H
        of them, each index a division and a remainder). Else None. Each row's segment is
        emitted and must come out the same as the first row's, or None: a part of a
        concatenation, or a pad, that changes from row to row needs the flat loops."""
        ops = self.case.ops
        shapes = {ops[value].shape for value in values}
        if len(shapes) != 1:
            return None
        (shape,) = shapes
        if len(shape) != 2 or min(shape) < 2:
            return None
        ranges = _row_segments(ops, values, shape)
        if ranges is None or len(ranges) == 1:  # one segment a row: one flat loop already
            return None
        rows, columns = shape
        row = Var(f"{variable}_row")
        element = add(mul(row, columns), Var(variable))
        loops = []
        for low, high in ranges:
            first = None
            for position in range(low, rows * columns, columns):
                emitter = ElementEmitter(self, self.node_emitter, "node")
                stored = stores(emitter, position, element)
                body = tuple(emitter.statements) + tuple(stored)
                if first is None:
                    first = body
                elif body != first:
                    return None
            loops.append(Loop(variable, Const(low), Const(high), first, LoopRole.ELEMENTS))
        return [Loop(row.name, Const(0), Const(rows), tuple(loops), LoopRole.ROWS)]

    def transposed_columns(self, values):
        """The column count of matrix `values` that read a packed product's transposed rows
        (a parameter times a matrix), else 0."""
        ops = self.case.ops
        shapes = {ops[value].shape for value in values}
        if len(shapes) != 1:
            return 0
        (shape,) = shapes
        if len(shape) != 2:
            return 0
        seen, pending = set(), list(values)
        while pending:
            value = pending.pop()
            if value in seen:
                continue
            seen.add(value)
            if value in self.locations:
                *_, packed_columns = self.locations[value]
                if packed_columns > 1:
                    return shape[1]
            if ops[value].kind in ("unary", "binary"):
                pending += ops[value].args
        return 0

    def elementwise(self, outputs):
        body, shared = [], []
        for values, size, stores in self.output_requests(outputs):
            columns = self.transposed_columns(values)
            if self.shared_segments and not columns:
                shared.append((values, size, stores))
            else:
                body += self.element_loops("e", values, size, stores, columns)
        body += self.shared_element_loops("e", shared)
        return self.slot_loop(body)

    def output_requests(self, outputs):
        """(values, size, their stores) for the outputs of each size."""
        by_size = {}
        for value, target in outputs:
            by_size.setdefault(self.case.ops[value].size, []).append((value, target))
        return [([value for value, _ in group], size,
                 functools.partial(self.stores, group)) for size, group in by_size.items()]

    def stores(self, group, emitter, position, element):
        """The statements that put each (value, target) of `group` at `element` (an element
        loop's index, plus its segment's offset); the targets with a value per child
        (`each_child`) share one loop over the edges."""
        statements, each_child = [], []
        for value, target in group:
            if getattr(target, "each_child", False):
                each_child.append((value, functools.partial(target.store, element=element)))
            else:
                statements += target.stores(self, emitter, value, position, element)
        if each_child:
            statements += for_each_child(self, emitter, position, element, each_child)
        return statements


def for_each_child(lowering, emitter, position, element, stores):
    """A loop over the node's edges inside an element loop, at index `element`: each (value,
    store) of `stores` gives the store of its value's element for each child, computed once
    an edge by a child emitter whose parent computes the node's own values, once an
    element."""
    terms = ElementEmitter(lowering, emitter, "child")
    body = [store(terms.element(value, element, position)) for value, store in stores]
    return [over_children(tuple(terms.statements) + tuple(body))]


@dataclass(frozen=True)
class StateRow:
    """Where a pass puts an output: element e of the node's row of `array` (a state)."""

    array: str

    def stores(self, lowering, emitter, value, position, element):
        return [Store(self.array, (Var("node"), element),
                      emitter.element(value, element, position))]


def depends_on_children(ops):
    result = []
    for op in ops:
        result.append(op.kind in ("child_state", "child_projection")
                      or any(result[a] for a in op.args))
    return result


def lower(cell, schedule):
    """The whole model as one kernel: hoisted passes, then the batch loop. `schedule` is a
    complete one (`choose_schedule`); with `remat=False`, the kernel also keeps the internal
    case's products for the backward (`Kernel.kept`)."""
    keep = schedule.remat is False
    if keep and (schedule.refactor or schedule.unroll > 1):
        raise ScheduleError("Schedule(remat=False) keeps the products of unrefactored batches "
                            "of one height: it takes neither refactor=True nor unroll > 1")
    projections = ()
    if schedule.refactor:
        refactored = refactor(cell)
        cell, projections = refactored.cell, refactored.projections
    leaf, internal = cell.case("leaf"), cell.case("internal")
    body = [Let("num_leaves", BinOp("-", Var("num_nodes"), Var("leaf_begin")))]
    body += [Alloc(projection.name, (Var("num_nodes"), Const(projection.rows)))
             for projection in projections]
    key = distinct_key(leaf) if schedule.specialize else None
    scalars, structure = SCALARS, STRUCTURE
    kept = []
    if schedule.specialize:
        statements, kept = _hoisted_leaves(cell, leaf, key, projections, schedule.row_block,
                                           keep)
        body += statements
        if key:
            scalars += ("num_distinct_leaves",)
            structure += ("leaf_distinct", "leaf_slot")
    available = {}
    if schedule.hoist:
        statements, available, hoisted_kept = _hoisted_products(cell, internal,
                                                                schedule.row_block, keep)
        body += statements
        kept += hoisted_kept
    if schedule.specialize or available:
        body.append(Barrier("the batches read the hoisted values"))
    statements, batch_scalars, batch_structure, batch_kept = _batches(cell, schedule, available,
                                                                      projections, keep)
    body += statements
    return _kernel(cell, tuple(body), scalars + batch_scalars, structure + batch_structure,
                   key, tuple(kept + batch_kept))


def _hoisted_leaves(cell, leaf, key, projections, row_block, keep=False):
    """(statements, `KeptProduct`s): every leaf at once, before the batches; its products
    once per distinct value of `key` where there is one (kept for the backward, with
    `keep`)."""
    distinct = key and (Var("num_distinct_leaves"),
                        add(Var("leaf_begin"), Load("leaf_distinct", (Var("distinct"),))),
                        Load("leaf_slot", (Var("slot"),)))
    leaf_pass = PassLowering(cell, leaf, "leaf_", Var("num_leaves"),
                             add(Var("leaf_begin"), Var("slot")),
                             distinct[0] if distinct else Var("num_leaves"), {}, row_block,
                             distinct=distinct, keep=(None if not keep else RowsOf.DISTINCT_LEAVES
                                                      if distinct else RowsOf.LEAVES))
    allocations, statements = leaf_pass.lower_states(projections, Var("leaf_begin"),
                                                     Var("num_leaves"))
    return ([Comment("hoisted: every leaf at once" + (
        f"; the products once per distinct `{key}`" if key else ""))]
        + allocations + statements), leaf_pass.kept


def _hoisted_products(cell, internal, row_block, keep=False):
    """(statements, where each hoisted value lies for the batches, the `KeptProduct`s among
    them): the products of the internal case that read no child state, every internal node at
    once."""
    recurrent = depends_on_children(internal.ops)
    hoist_pass = PassLowering(cell, internal, "hoisted_", Var("leaf_begin"),
                              Var("slot"), Var("leaf_begin"), {}, row_block,
                              first_node=Const(0), keep=RowsOf.INTERNAL if keep else None)
    hoisted = [v for v in range(len(internal.ops))
               if hoist_pass.is_packed(v) and not recurrent[v]]
    if not hoisted:
        return [], {}, []
    allocations, statements = hoist_pass.lower([], hoisted)
    available = {v: location[:3] + (Var("node"),) + location[4:]
                 for v, location in hoist_pass.locations.items() if v in hoisted}
    return ([Comment("hoisted: products that read no child state, every internal node at "
                     "once")] + allocations + statements), available, hoist_pass.kept


def _batches(cell, schedule, available, projections, keep=False):
    """(statements, scalars, structure arrays, `KeptProduct`s) of the loop over batches, from
    the leaves up, and the scratch it allocates first."""
    leaf, internal = cell.case("leaf"), cell.case("internal")
    scalars, structure = (), ()
    if schedule.unroll > 1:
        allocations, statements = unrolled_batch(cell, internal, available, projections,
                                                 schedule.row_block)
        structure += ("batch_item", "item_begin")
        scalars += ("max_children",)
        kept = []
    else:
        batch_pass = PassLowering(cell, internal, "batch_", Var("count"),
                                  add(Var("begin"), Var("slot")), Var("max_batch_size"),
                                  available, schedule.row_block, Var("max_batch_edges"),
                                  keep=RowsOf.INTERNAL if keep else None)
        allocations, statements = batch_pass.lower_states(
            projections, Var("begin"), Var("count"), last_batch_skips=True)
        kept = batch_pass.kept
    first_batch = 2
    if not schedule.specialize:
        leaf_pass = PassLowering(cell, leaf, "leaf_", Var("count"), add(Var("begin"), Var("slot")),
                                 Var("max_level_size"), {}, schedule.row_block)
        leaf_allocations, leaf_statements = leaf_pass.lower_states(
            projections, Var("begin"), Var("count"), last_batch_skips=True)
        allocations = leaf_allocations + allocations
        statements = [If(BinOp(">=", Var("begin"), Var("leaf_begin")),
                         tuple(leaf_statements), tuple(statements))]
        scalars += ("max_level_size",)
        first_batch = 1
    batch_loop = Loop("b", BinOp("-", Var("num_batches"), Const(first_batch)), Const(-1), tuple(
        [Let("begin", Load("batch_begin", (Var("b"),))),
         Let("count", BinOp("-", Load("batch_begin", (add(Var("b"), 1),)), Var("begin")))]
        + _then_unless_last_batch(statements,
                                  Barrier("the next batch reads this batch's states"))),
        LoopRole.BATCHES, step=-1)
    comment = Comment("the batches, from the leaves up" if schedule.specialize else
                      "the batches, leaves included: one loop nest that branches on the "
                      "batch's case (not specialized)")
    return [comment] + allocations + [batch_loop], scalars, structure, kept


def _kernel(cell, body, scalars, structure, key, kept=()):
    """The kernel of `body`: its arguments (the forest's scalars and structure arrays, the
    fields, parameters and states the cell reads) and the transposed views it reads."""
    states = tuple((state_name(c), _size(shape)) for c, shape in enumerate(cell.state_shapes))
    roles = (tuple(Argument(name, ArgumentRole.STRUCTURE) for name in structure)
             + tuple(Argument(field_name(f), ArgumentRole.FIELD, f) for f in sorted(cell.fields))
             + tuple(Argument(param_name(p), ArgumentRole.PARAMETER, p)
                     for p in sorted(cell.parameters))
             + tuple(Argument(name, ArgumentRole.STATE) for name, _ in states)
             + tuple(Argument(name, ArgumentRole.KEPT)
                     for name in dict.fromkeys(product.array for product in kept)))
    return Kernel(f"{cell.name}_kernel", cell.dtype, scalars,
                  tuple(argument.name for argument in roles), states, body, distinct_key=key,
                  transposed=transposed_views(cell.cases, body), roles=roles, kept=kept)


def transposed_views(cases, body):
    """(view, argument) for each parameter the cases read transposed (`pT_W`, `p_W`) that
    `body` reads."""
    read = ({load.array for load in nodes(body, Load)}
            | {product.weight for product in walk(body) if isinstance(product, MatMul)})
    views = {(param_name(op.attrs[0]), param_name(attribute(op.attrs[0])))
             for case in cases for op in case.ops
             if op.kind == "param" and op.attrs[0] != attribute(op.attrs[0])}
    return tuple(sorted(view for view in views if view[0] in read))


def _then_unless_last_batch(statements, barrier):
    """`statements`, then `barrier`: inside their own guard against the last batch (b = 0)
    where they end with one, since nothing runs after that batch."""
    last = statements[-1] if statements else None
    if isinstance(last, If) and last.condition == NOT_LAST_BATCH and not last.orelse:
        return statements[:-1] + [replace(last, body=last.body + (barrier,))]
    return statements + [barrier]


def unrolled_batch(cell, internal, available, projections, row_block):
    """(allocations, statements) of one batch of an unrolled recursion: a parallel loop over
    its items, each computing its nodes one after another, children (higher numbers) first,
    in scratch of its own."""
    node_pass = PassLowering(cell, internal, "node_", Const(1), Var("node"), Const(1),
                             available, row_block, Var("max_children"), first_node=Var("node"))
    allocations, statements = node_pass.lower_states(projections, Var("node"), Const(1))
    item = add(Var("first_item"), Var("item"))
    item_loop = Loop("item", Const(0), BinOp("-", Load("batch_item", (add(Var("b"), 1),)),
                                             Var("first_item")), tuple(
        [Let("first_node", Load("item_begin", (item,))),
         Let("last_node", add(Load("item_begin", (add(item, 1),)), -1))] + allocations
        + [Loop("node", Var("last_node"), add(Var("first_node"), -1),
                tuple(_one_worker(statements)), LoopRole.ITEM_NODES, step=-1)]), LoopRole.ITEMS)
    return [], [Let("first_item", Load("batch_item", (Var("b"),))), item_loop]


def _one_worker(statements):
    """Statements of a pass over one node, run by one worker: its loops in order, its products
    serial, no barriers (the worker's own order keeps them)."""
    result = []
    for statement in statements:
        if isinstance(statement, Loop):
            role = LoopRole.WORKER_NODES if statement.role is LoopRole.NODES else statement.role
            result.append(replace(statement, role=role, body=tuple(_one_worker(statement.body))))
        elif isinstance(statement, MatMul):
            result.append(replace(statement, parallel=False))
        elif isinstance(statement, Let) and statement.value == Var(statement.name):
            continue
        elif not isinstance(statement, Barrier):
            result.append(statement)
    return result


def distinct_key(leaf):
    """The field whose value alone decides a leaf's products, when the leaf case has products
    and reads one field, only as an index into tables (`p.E[node.word]`): those products are
    computed once per distinct value, since SST's leaves repeat words."""
    reads = {op.attrs[1] if op.kind == "gather" else op.attrs[0]
             for op in leaf.ops if op.kind in ("gather", "field")}
    gathered = all(op.kind != "field" for op in leaf.ops)
    has_products = any(op.kind in ("matvec", "matmul") and leaf.ops[op.args[0]].kind == "param"
                       for op in leaf.ops)
    return reads.pop() if len(reads) == 1 and gathered and has_products else None


def _size(shape):
    size = 1
    for extent in shape:
        size *= extent
    return size
