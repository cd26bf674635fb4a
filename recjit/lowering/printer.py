"""Printing the ILIR for `model.explain()`: loops, batches, matrix products and barriers."""
from .ilir import (Alloc, Barrier, BinOp, Call, Comment, Const, If, Let, Load, Loop, MatMul,
                   Store, Var)


def expression(node):
    if isinstance(node, Var):
        return node.name
    if isinstance(node, Const):
        value = node.value
        return str(int(value)) if float(value).is_integer() else repr(value)
    if isinstance(node, Load):
        return f"{node.array}[{', '.join(expression(i) for i in node.index)}]"
    if isinstance(node, Call):
        return f"{node.function}({', '.join(expression(a) for a in node.args)})"
    if isinstance(node, BinOp):
        return f"({expression(node.left)} {node.operator} {expression(node.right)})"
    raise TypeError(node)


def print_kernel(kernel):
    lines = [(f"kernel {kernel.name}({', '.join(kernel.scalars + kernel.arrays)})  "
              f"dtype={kernel.dtype}")]
    lines += [f"  {view} = {array}.T  (read transposed where it lies; unfused on a GPU, a "
              "copy a run)" for view, array in kernel.transposed]
    _statements(kernel.body, 1, lines)
    return "\n".join(lines)


def _statements(body, depth, lines):
    pad = "  " * depth
    for statement in body:
        if isinstance(statement, Loop):
            kind = "parallel for" if statement.parallel else "for"
            step = "" if statement.step == 1 else f" step {statement.step}"
            order = (f" (column by column, {statement.columns} columns)" if statement.columns
                     else " (one worker per item)" if statement.one_worker else "")
            lines.append(f"{pad}{kind} {statement.var} in [{expression(statement.start)}, "
                         f"{expression(statement.stop)}){step}{order}:")
            _statements(statement.body, depth + 1, lines)
        elif isinstance(statement, Let):
            lines.append(f"{pad}{statement.name} = {expression(statement.value)}")
        elif isinstance(statement, Store):
            index = ", ".join(expression(i) for i in statement.index)
            lines.append(f"{pad}{statement.array}[{index}] = {expression(statement.value)}")
        elif isinstance(statement, Alloc):
            shape = ", ".join(expression(e) for e in statement.shape)
            lines.append(f"{pad}{statement.name} = scratch[{shape}]")
        elif isinstance(statement, If):
            lines.append(f"{pad}if {expression(statement.condition)}:")
            _statements(statement.body, depth + 1, lines)
            if statement.orelse:
                lines.append(f"{pad}else:")
                _statements(statement.orelse, depth + 1, lines)
        elif isinstance(statement, MatMul):
            loop = (f"parallel for r in row blocks of {statement.row_block}" if statement.parallel
                    else "for r in rows")
            lines.append(f"{pad}{loop}: "
                         f"{statement.y}[{_offset(statement.y_row)}s, r] = Σ_k "
                         f"{statement.weight}[r, {_columns(statement.columns)}k] · "
                         f"{statement.x}[{_offset(statement.x_row)}s, k]  "
                         f"for s < {expression(statement.rows)}")
        elif isinstance(statement, Barrier):
            lines.append(f"{pad}── barrier: {statement.reason}")
        elif isinstance(statement, Comment):
            lines.append(f"{pad}# {statement.text}")
        else:
            raise TypeError(statement)


def _offset(first):
    return "" if first is None else f"{expression(first)} + "


def _columns(columns):
    return "" if columns is None else f"{columns[0]} + "
