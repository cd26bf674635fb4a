"""Lowering: the cell IR → one ILIR kernel (Cortex §4–5).

- Recursion to loops: states become arrays `state_c[node, e]`; the recursion becomes a loop over
  batches (from the leaves up) with a parallel loop over the nodes of a batch.
- Specialization: the leaf case and the internal case get their own loop nests.
- Hoisting: the leaf case and every matrix-vector product of the internal case that reads no
  child state run as one parallel pass over all their nodes before the batches.
- Fusion: a node's elementwise ops run in one loop body over the element index `e`; only the
  inputs and results of matrix-vector products live in scratch arrays, indexed densely by the
  node's slot in the pass (Cortex §5.1), so that each weight row is read once per block of nodes.
- Barriers: between the phases of a batch where a product reads a value computed in the same
  batch, and between batches.
"""
from ..errors import UnsupportedError
from .ilir import (Alloc, Barrier, BinOp, Call, Comment, Const, Kernel, Let, Load, Loop,
                   MatMul, Store, Var, add, mul)

SCALARS = ("num_nodes", "leaf_begin", "num_batches", "max_batch_size")
STRUCTURE = ("batch_begin", "child_ptr", "child_idx")
BINARY_SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "div": "/"}


def state_name(component):
    return f"state_{component}"


def field_name(name):
    return f"field_{name}"


def param_name(name):
    """Parameter `p.W` is the kernel argument `p_W`: no clash with the kernel's own names."""
    return f"p_{name}"


class ElementEmitter:
    """Scalar code for the elements of cell values inside one loop body. Element `index` of
    value `%i` becomes the local `v{i}` (the cell IR's own number), computed once per body."""

    def __init__(self, pass_lowering):
        self.pass_lowering = pass_lowering
        self.ops = pass_lowering.case.ops
        self.statements = []
        self.names = {}

    def element(self, value, index, position):
        """Element `index` of `value`; `position` is a concrete element of the loop's segment,
        which decides the part of a concatenation."""
        op = self.ops[value]
        if op.shape == ():
            index = Const(0)
        key = (value, index)
        if key in self.names:
            return self.names[key]
        expression = self.compute(value, op, index, position)
        if isinstance(expression, (Call, BinOp)):
            name = f"v{value}" if not any(k[0] == value for k in self.names) \
                else f"v{value}_{sum(k[0] == value for k in self.names)}"
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
        if kind == "param":
            return Load(param_name(op.attrs[0]), _unflatten(index, op.shape))
        if kind in ("const", "fill"):
            return Const(op.attrs[0])
        if kind == "child_state":
            child, component = op.attrs
            return Load(state_name(component), (lowering.child(child), index))
        if kind == "gather":
            table, field = op.attrs
            row = lowering.field_value(field)
            return Load(param_name(table), (row,) + _unflatten(index, op.shape))
        if kind == "field":
            return Load(field_name(op.attrs[0]), (Var("node"), index))
        if kind == "unary":
            argument = self.element(op.args[0], index, position)
            return Call(op.attrs[0], (argument,))
        if kind == "binary":
            left, right = (self.element(a, index, position) for a in op.args)
            function = op.attrs[0]
            if function in BINARY_SYMBOLS:
                return BinOp(BINARY_SYMBOLS[function], left, right)
            return Call(function, (left, right))
        if kind == "slice":
            start = op.attrs[0]
            return self.element(op.args[0], add(index, start), position + start)
        if kind == "concat":
            offset = 0
            for part in op.args:
                size = self.ops[part].size
                if offset <= position < offset + size:
                    return self.element(part, add(index, -offset), position - offset)
                offset += size
        raise lowering.unsupported(f"`{kind}` of shape {op.shape} is not compiled yet", op)


def _unflatten(index, shape):
    if len(shape) <= 1:
        return (index,) if shape else ()
    columns = shape[-1]
    return (BinOp("//", index, Const(columns)), BinOp("%", index, Const(columns)))


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
        start, stop = op.attrs
        return {p - start for p in breakpoints(ops, op.args[0]) if start < p < stop}
    if op.kind in ("unary", "binary"):
        return set().union(*(breakpoints(ops, a) for a in op.args if ops[a].shape != ()))
    return set()


def segments(ops, values, size):
    points = sorted({0, size}.union(*(breakpoints(ops, v) for v in values)))
    return list(zip(points[:-1], points[1:]))


class PassLowering:
    """One pass over a range of nodes of one structural case: phases of packed inputs and
    matrix products, then the fused elementwise loop that stores the outputs."""

    def __init__(self, cell, case, prefix, count, node_of_slot, capacity, available, row_block):
        self.cell = cell
        self.case = case
        self.row_block = row_block
        self.prefix = prefix
        self.count = count
        self.node_of_slot = node_of_slot
        self.capacity = capacity
        self.locations = dict(available)
        self.preamble = {}
        self.depth_memo = {}

    def unsupported(self, message, op):
        return UnsupportedError(message, filename=self.cell.filename, lineno=op.line)

    # where values live -----------------------------------------------------------------
    def matvec_location(self, value):
        if value not in self.locations:
            return None
        array, stride, row, variable = self.locations[value]
        return lambda index: Load(array, (add(mul(Var(variable), stride), row), index))

    def child(self, k):
        name = f"child{k}"
        self.preamble[name] = Load("child_idx", (add(Load("child_ptr", (Var("node"),)), k),))
        return Var(name)

    def field_value(self, field):
        self.preamble[f"node_{field}"] = Load(field_name(field), (Var("node"),))
        return Var(f"node_{field}")

    # phases ----------------------------------------------------------------------------
    def depth(self, value):
        """How many matrix products lie between the pass's inputs and this value."""
        if value in self.locations:
            return 0
        if value not in self.depth_memo:
            op = self.case.ops[value]
            if op.kind == "matvec":
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
            if op.kind == "matmul":
                raise self.unsupported("matrix @ matrix is not compiled yet", op)
            if op.kind == "matvec":
                matrix = self.case.ops[op.args[0]]
                if matrix.kind != "param":
                    raise self.unsupported("a matrix-vector product whose matrix is computed "
                                           "in the node is not compiled yet", op)
                needed.append(value)
            stack.extend(op.args)
        return sorted(needed)

    def slot_loop(self, body):
        preamble = [Let(name, value) for name, value in self.preamble.items()]
        self.preamble = {}
        return Loop("slot", Const(0), self.count,
                    (Let("node", self.node_of_slot),) + tuple(preamble) + tuple(body),
                    parallel=True)

    def lower(self, outputs, extra_matvecs=()):
        """Statements computing `outputs` ((value, array) pairs stored at [node, e]) and the
        products `extra_matvecs`; returns (allocations, statements)."""
        matvecs = self.needed_matvecs([v for v, _ in outputs] + list(extra_matvecs))
        allocations, statements = [], []
        for phase in sorted({self.depth(m) for m in matvecs}):
            if phase > 1:
                statements.append(Barrier(f"phase {phase} multiplies values computed in "
                                          f"phase {phase - 1} of the same nodes"))
            phase_allocations, phase_statements = self.phase(
                [m for m in matvecs if self.depth(m) == phase], phase)
            allocations += phase_allocations
            statements += phase_statements
        if outputs:
            statements.append(self.elementwise(outputs))
        return allocations, statements

    def phase(self, matvecs, phase):
        by_weight = {}
        for value in matvecs:
            matrix, vector = self.case.ops[value].args
            by_weight.setdefault(self.case.ops[matrix].attrs[0], []).append((value, vector))
        allocations, pack_body, products = [], [], []
        for weight, uses in by_weight.items():
            suffix = "" if phase == 1 else str(phase)
            x, y = f"{self.prefix}x{suffix}_{weight}", f"{self.prefix}y{suffix}_{weight}"
            rows, columns = self.case.ops[self.case.ops[uses[0][0]].args[0]].shape
            stride = len(uses)
            allocations += [Alloc(x, (mul(self.capacity, stride), Const(columns))),
                            Alloc(y, (mul(self.capacity, stride), Const(rows)))]
            for row, (_, vector) in enumerate(uses):
                pack_body += self.element_loops(
                    "k", [vector], columns,
                    lambda emitter, position, vector=vector, row=row, x=x, stride=stride: [
                        Store(x, (add(mul(Var("slot"), stride), row), Var("k")),
                              emitter.element(vector, Var("k"), position))])
            products.append(MatMul(param_name(weight), x, y, mul(self.count, stride),
                                   self.row_block))
            for row, (product, _) in enumerate(uses):
                self.locations[product] = (y, stride, row, "slot")
        return allocations, [self.slot_loop(pack_body)] + products

    def element_loops(self, variable, values, size, stores):
        loops = []
        for low, high in segments(self.case.ops, values, size):
            emitter = ElementEmitter(self)
            body = stores(emitter, low)
            loops.append(Loop(variable, Const(low), Const(high),
                              tuple(emitter.statements) + tuple(body)))
        return loops

    def elementwise(self, outputs):
        by_size = {}
        for value, array in outputs:
            by_size.setdefault(self.case.ops[value].size, []).append((value, array))
        body = []
        for size, group in by_size.items():
            body += self.element_loops(
                "e", [v for v, _ in group], size,
                lambda emitter, position, group=group: [
                    Store(array, (Var("node"), Var("e")),
                          emitter.element(value, Var("e"), position))
                    for value, array in group])
        return self.slot_loop(body)


def depends_on_children(ops):
    result = []
    for op in ops:
        result.append(op.kind == "child_state" or any(result[a] for a in op.args))
    return result


def lower(cell, schedule):
    """The whole model as one kernel: hoisted passes, then the batch loop."""
    leaf, internal = cell.case("leaf"), cell.case("internal")
    states = tuple((state_name(c), _size(shape)) for c, shape in enumerate(cell.state_shapes))
    row_block = schedule.row_block
    body = [Let("num_leaves", BinOp("-", Var("num_nodes"), Var("leaf_begin")))]

    leaf_pass = PassLowering(cell, leaf, "leaf_", Var("num_leaves"),
                             add(Var("leaf_begin"), Var("slot")), Var("num_leaves"), {},
                             row_block)
    leaf_allocations, leaf_statements = leaf_pass.lower(
        [(v, state_name(c)) for c, v in enumerate(leaf.outputs)])
    body += [Comment("hoisted: every leaf at once")] + leaf_allocations + leaf_statements

    available = {}
    if schedule.hoist:
        recurrent = depends_on_children(internal.ops)
        hoisted = [v for v, op in enumerate(internal.ops)
                   if op.kind == "matvec" and not recurrent[v]]
        if hoisted:
            hoist_pass = PassLowering(cell, internal, "hoisted_", Var("leaf_begin"),
                                      Var("slot"), Var("leaf_begin"), {}, row_block)
            hoist_allocations, hoist_statements = hoist_pass.lower([], hoisted)
            body += [Comment("hoisted: products that read no child state, every internal "
                             "node at once")] + hoist_allocations + hoist_statements
            available = {v: location[:3] + ("node",)
                         for v, location in hoist_pass.locations.items() if v in hoisted}
    body.append(Barrier("the batches read the hoisted values"))

    batch_pass = PassLowering(cell, internal, "batch_", Var("count"),
                              add(Var("begin"), Var("slot")), Var("max_batch_size"), available,
                              row_block)
    batch_allocations, batch_statements = batch_pass.lower(
        [(v, state_name(c)) for c, v in enumerate(internal.outputs)])
    batch_loop = Loop("b", BinOp("-", Var("num_batches"), Const(2)), Const(-1), tuple(
        [Let("begin", Load("batch_begin", (Var("b"),))),
         Let("count", BinOp("-", Load("batch_begin", (add(Var("b"), 1),)), Var("begin")))]
        + batch_statements
        + [Barrier("the next batch reads this batch's states")]), step=-1)
    body += [Comment("the batches, from the leaves up")] + batch_allocations + [batch_loop]

    fields = tuple(field_name(f) for f in sorted(cell.fields))
    params = tuple(param_name(p) for p in sorted(cell.parameters))
    return Kernel(f"{cell.name}_kernel", cell.dtype, SCALARS,
                  STRUCTURE + fields + params + tuple(name for name, _ in states), states,
                  tuple(body))


def _size(shape):
    size = 1
    for extent in shape:
        size *= extent
    return size
