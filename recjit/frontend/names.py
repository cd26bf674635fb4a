"""Resolving the names a cell function uses (`rj.tanh`, helper functions, the model itself)."""
import ast
import builtins

UNRESOLVED = object()


def resolve(source, expr):
    """The Python object `expr` (a Name or a dotted Attribute chain) denotes in the function's
    scope, or UNRESOLVED."""
    if isinstance(expr, ast.Name):
        closure = source.function.__closure__ and dict(zip(
            source.function.__code__.co_freevars,
            (cell.cell_contents for cell in source.function.__closure__ if _filled(cell))))
        for scope in (closure or {}, source.function.__globals__, vars(builtins)):
            if expr.id in scope:
                return scope[expr.id]
        return UNRESOLVED
    if isinstance(expr, ast.Attribute):
        base = resolve(source, expr.value)
        if base is UNRESOLVED:
            return UNRESOLVED
        return getattr(base, expr.attr, UNRESOLVED)
    return UNRESOLVED


def _filled(cell):
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def is_plain_function(obj):
    return callable(obj) and hasattr(obj, "__code__") and hasattr(obj, "__globals__")
