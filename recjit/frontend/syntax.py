"""Facts about a cell's syntax that proving P.1–P.3 and building the cell IR both need."""
import ast

from ..errors import UnsupportedError


def is_none_test(node):
    """`x is None`, `x is not None`: whether a helper's argument was given is decided where
    it is called, not by a tensor's value."""
    return (isinstance(node, ast.Compare)
            and all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops)
            and any(isinstance(operand, ast.Constant) and operand.value is None
                    for operand in [node.left, *node.comparators]))


def cell_arguments(model, arguments, keywords, node, source):
    """The arguments of a recursive call in the order of the cell's parameters, keywords
    (`cell(node=node.left, p=p)`) put in their places."""
    code = model.function.__code__
    names = code.co_varnames[:code.co_argcount]
    unknown = [name for name in keywords if name not in names[len(arguments):]]
    if unknown:
        raise UnsupportedError(f"a recursive call names {unknown[0]!r}, which is not one of "
                               f"the cell's parameters after the first {len(arguments)} "
                               f"({', '.join(names)})", **source.where(node))
    ordered = list(arguments)
    for name in names[len(arguments):]:
        if name not in keywords:
            break
        ordered.append(keywords[name])
    return ordered


def positional_arguments(arguments):
    """The names of a `def`'s positional parameters, positional-only ones first."""
    return [a.arg for a in arguments.posonlyargs + arguments.args]
