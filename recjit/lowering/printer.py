"""Printing the ILIR for `model.explain()`: loops, batches, matrix products and barriers."""
from .ilir import BarrierScope, StatementVisitor
from .pysource import PythonExpressions


class IlirExpressions(PythonExpressions):
    """Expressions as `explain()` prints them: whole numbers without a decimal point, math
    functions by their ILIR names."""

    def constant(self, value):
        return str(int(value)) if float(value).is_integer() else repr(value)

    def call(self, function, arguments):
        return f"{function}({', '.join(arguments)})"


expression = IlirExpressions()


def print_kernel(kernel):
    lines = [(f"kernel {kernel.name}({', '.join(kernel.scalars + kernel.arrays)})  "
              f"dtype={kernel.dtype}")]
    lines += [f"  {view} = {array}.T  (read transposed where it lies; unfused on a GPU, a "
              "copy a run)" for view, array in kernel.transposed]
    IlirPrinter(lines).visit_all(kernel.body, 1)
    return "\n".join(lines)


class IlirPrinter(StatementVisitor):
    """Each statement as a line of `explain()` (a block for a loop or a branch)."""

    def __init__(self, lines):
        self.lines = lines

    def visit_Loop(self, statement, depth):
        kind = "parallel for" if statement.parallel else "for"
        step = "" if statement.step == 1 else f" step {statement.step}"
        order = (f" (column by column, {statement.columns} columns)" if statement.columns
                 else " (one worker per item)" if statement.one_worker
                 else " (each block its range of nodes and its units)" if statement.ranged
                 else f" (each block its own of {statement.units} units)" if statement.units
                 else "")
        reduces = f" (reducing the children into {statement.reduces})" if statement.reduces \
            else ""
        self.line(depth, f"{kind} {statement.var} in [{expression(statement.start)}, "
                         f"{expression(statement.stop)}){step}{order}{reduces}:")
        self.visit_all(statement.body, depth + 1)

    def visit_Let(self, statement, depth):
        self.line(depth, f"{statement.name} = {expression(statement.value)}")

    def visit_Store(self, statement, depth):
        index = ", ".join(expression(i) for i in statement.index)
        self.line(depth, f"{statement.array}[{index}] = {expression(statement.value)}")

    def visit_Alloc(self, statement, depth):
        shape = ", ".join(expression(e) for e in statement.shape)
        self.line(depth, f"{statement.name} = scratch[{shape}]")

    def visit_If(self, statement, depth):
        self.line(depth, f"if {expression(statement.condition)}:")
        self.visit_all(statement.body, depth + 1)
        if statement.orelse:
            self.line(depth, "else:")
            self.visit_all(statement.orelse, depth + 1)

    def visit_MatMul(self, statement, depth):
        loop = (f"parallel for r in row blocks of {statement.row_block}" if statement.parallel
                else "for r in rows")
        how = (" (each block packs its inputs into its tile itself)" if statement.pack
               else "") + (" (by ranges of the batch's nodes)" if statement.input_rows else "")
        self.line(depth, f"{loop}: "
                         f"{statement.y}[{_offset(statement.y_row)}s, r] = Σ_k "
                         f"{statement.weight}[r, {_columns(statement.columns)}k] · "
                         f"{statement.x}[{_offset(statement.x_row)}s, k]  "
                         f"for s < {expression(statement.rows)}{how}")

    def visit_GradientSum(self, statement, depth):
        b = "" if statement.b is None else f" ⊗ {statement.b}[:, n]"
        a = f"{statement.a}[:, n]" if statement.summed[0].columns else f"{statement.a}[n, :]"
        self.line(depth, f"{statement.total} = Σ_n {a}{b}  (the gradient of "
                         f"{statement.parameter}, summed over the nodes)")

    def visit_PackedProducts(self, statement, depth):
        self.line(depth, "products whose inputs each block packs into the same tiles:")
        self.visit_all(statement.products, depth + 1)

    def visit_RangeShare(self, statement, depth):
        self.line(depth, f"ranges of the {expression(statement.count)} nodes: each block its "
                         f"share of them and of the {statement.units} units (balance "
                         f"{statement.balance})")

    def visit_Barrier(self, statement, depth):
        if statement.scope is BarrierScope.MET:
            self.line(depth, f"── no barrier (the grid met after the last writes): "
                             f"{statement.reason}")
        elif statement.scope is BarrierScope.BLOCK:
            self.line(depth, f"── block barrier (each block its own units): {statement.reason}")
        else:
            self.line(depth, f"── barrier: {statement.reason}")

    def visit_Comment(self, statement, depth):
        self.line(depth, f"# {statement.text}")

    def line(self, depth, text):
        self.lines.append("  " * depth + text)


def _offset(first):
    return "" if first is None else f"{expression(first)} + "


def _columns(columns):
    return "" if columns is None else f"{columns[0]} + "
