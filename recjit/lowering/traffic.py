"""An estimate of the memory traffic of one internal batch, read off the ILIR, for
`explain()`: the bytes of weights the batch's products stream (once per batch, whatever its
size: what model persistence keeps on chip) and the bytes each node of the batch moves
(states and children's states read and written, products' packed inputs and outputs)."""
from .ilir import (ArgumentRole, BinOp, Call, Const, If, Let, Load, Loop, LoopRole, MatMul,
                   Statements, Store)


def batch_traffic(kernel, weight_shapes, itemsize):
    """(weight bytes per batch, bytes per node) of the kernel's internal batches;
    `weight_shapes` maps each weight argument to its shape."""
    batch_loop = next(statement for statement in kernel.body
                      if isinstance(statement, Loop) and statement.role is LoopRole.BATCHES)
    counter = _Counter(weight_shapes, set(kernel.arrays_of(ArgumentRole.PARAMETER)))
    counter.visit(internal_path(batch_loop.body), 1)
    return counter.weights * itemsize, counter.per_node * itemsize


def internal_path(body):
    """The statements an internal batch (not the last) runs."""
    return [statements[index] for statements, index in internal_positions(Statements(body))]


def internal_positions(body):
    """(statements, index) of each statement of `body` (`Statements`) that an internal batch
    (not the last) runs: of a branch on the batch's case, the `else` side; of a guard (an `if`
    without `else`: not the last batch), the body."""
    positions = []
    for index, statement in enumerate(body):
        if isinstance(statement, If):
            positions += internal_positions(body.inner(index,
                                                       "orelse" if statement.orelse else "body"))
        else:
            positions.append((body, index))
    return positions


class _Counter:
    def __init__(self, weight_shapes, parameters):
        self.weight_shapes = weight_shapes
        self.parameters = parameters  # the weights' arguments, whose loads are no node's
        self.weights = 0
        self.per_node = 0

    def visit(self, body, repeat):
        for statement in body:
            if isinstance(statement, MatMul):
                self.product(statement)
            elif isinstance(statement, Loop):
                extent = _extent(statement)
                self.visit(statement.body, repeat if statement.parallel else repeat * extent)
            elif isinstance(statement, Store):
                self.per_node += repeat
                self.expression(statement.value, repeat)
            elif isinstance(statement, Let):
                self.expression(statement.value, repeat)

    def expression(self, node, repeat):
        if isinstance(node, Load) and node.array not in self.parameters:
            self.per_node += repeat
        elif isinstance(node, BinOp):
            self.expression(node.left, repeat)
            self.expression(node.right, repeat)
        elif isinstance(node, Call):
            for argument in node.args:
                self.expression(argument, repeat)

    def product(self, product):
        rows, columns = self.weight_shapes[product.weight]
        if product.columns is not None:
            columns = product.columns[1] - product.columns[0]
        if product.parallel:
            self.weights += rows * columns
        else:  # one worker per node (unrolled): the weight streams for every node
            self.per_node += rows * columns
        self.per_node += _rows_per_node(product.rows) * (rows + columns)


def _rows_per_node(rows):
    """A product's rows per node: `count * stride` (or `num_edges * stride`) has `stride`."""
    if isinstance(rows, BinOp) and isinstance(rows.right, Const):
        return int(rows.right.value)
    return int(rows.value) if isinstance(rows, Const) else 1


def _extent(loop):
    """Iterations of a sequential loop: its constant extent, or 1 where it depends on the node
    (a loop over children counts once per child)."""
    if isinstance(loop.start, Const) and isinstance(loop.stop, Const):
        return int(abs(loop.stop.value - loop.start.value) // abs(loop.step))
    return 1
