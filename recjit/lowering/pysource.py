"""ILIR expressions as Python source, for the code generators that emit Python (numba CPU and
numba.cuda): the same text on both, except for the math functions each target calls."""
import math

from .ilir import BinOp, Call, Const, Load, Var


class PythonExpressions:
    """The one printer of ILIR expressions. `calls` maps each ILIR math function to a format
    string, e.g. `"math.exp({})"`; `array_name` gives the name an ILIR array has in the
    emitted code (by default its own). `explain()`'s printer prints constants and calls its
    own way (`lowering.printer`)."""

    def __init__(self, calls=None, array_name=None):
        self.calls = calls
        self.array_name = array_name or (lambda array: array)

    def __call__(self, node):
        if isinstance(node, Var):
            return node.name
        if isinstance(node, Const):
            return self.constant(node.value)
        if isinstance(node, Load):
            return f"{self.array_name(node.array)}[{', '.join(self(i) for i in node.index)}]"
        if isinstance(node, Call):
            return self.call(node.function, [self(a) for a in node.args])
        if isinstance(node, BinOp):
            return f"({self(node.left)} {node.operator} {self(node.right)})"
        raise TypeError(node)

    def constant(self, value):
        return str(value) if isinstance(value, int) else real_constant(value)

    def call(self, function, arguments):
        return self.calls[function].format(*arguments)

    def bound(self, node):
        """An expression that stands alone (a bound, an index, a right-hand side): no outer
        parentheses."""
        if isinstance(node, BinOp):
            return f"{self(node.left)} {node.operator} {self(node.right)}"
        return self(node)

    def index(self, indices):
        return ", ".join(self.bound(i) for i in indices)

    def range(self, loop):
        """`range(...)` of a sequential loop, as short as its bounds allow."""
        start, stop = self.bound(loop.start), self.bound(loop.stop)
        if loop.step != 1:
            return f"range({start}, {stop}, {loop.step})"
        return f"range({stop})" if loop.start == Const(0) else f"range({start}, {stop})"

    def matmul_operands(self, product, weight=None):
        """The weight, x and y of a `MatMul` as source: views of the rows and columns it
        reads (`weight`: the name the weight has, when not its own)."""
        weight = weight or product.weight
        if product.columns is not None:
            weight = f"{weight}[:, {product.columns[0]}:{product.columns[1]}]"
        return weight, self.rows_from(product.x, product.x_row), \
            self.rows_from(product.y, product.y_row)

    def rows_from(self, array, first):
        return array if first is None else f"{array}[{self.bound(first)}:]"

    def branch(self, statement, pad, lines, emit_body):
        """An ILIR `If` as `if ...:` / `else:` lines; `emit_body(body)` writes each side."""
        lines.append(f"{pad}if {self.bound(statement.condition)}:")
        emit_body(statement.body)
        if statement.orelse:
            lines.append(f"{pad}else:")
            emit_body(statement.orelse)


def real_constant(value):
    """A float constant in the kernel's dtype: `real(0.5)`; an infinity or a NaN through NumPy's
    names for them, since the repr of one (`inf`, `nan`) names nothing."""
    if math.isnan(value):
        return "real(np.nan)"
    if math.isinf(value):
        return f"real({'-' if value < 0 else ''}np.inf)"
    return f"real({value!r})"
