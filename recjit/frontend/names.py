"""Resolving the names a cell function uses (`rj.tanh`, helper functions, the model itself)."""
import ast
import builtins

UNRESOLVED = object()


def resolve(source, expr):
    """The Python object `expr` (a Name or a dotted Attribute chain) denotes in the function's
    scope, or UNRESOLVED."""
    if isinstance(expr, ast.Name):
        function = source.function
        cells = zip(function.__code__.co_freevars, function.__closure__ or (), strict=True)
        closure = {name: cell.cell_contents for name, cell in cells if _filled(cell)}
        for scope in (closure, function.__globals__, vars(builtins)):
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
        cell.cell_contents  # noqa: B018 (reading an empty cell raises)
    except ValueError:
        return False
    return True


def is_plain_function(obj):
    return callable(obj) and hasattr(obj, "__code__") and hasattr(obj, "__globals__")


def is_user_helper(obj):
    """A plain Python function of the user's (inlined), not one of recjit's, NumPy's or the
    standard library's."""
    module = (getattr(obj, "__module__", "") or "").split(".")[0]
    return is_plain_function(obj) and module not in ("recjit", "numpy", "builtins", "math")
