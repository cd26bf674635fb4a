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


MAX_INLINE_DEPTH = 20  # helpers inlined within helpers, at most: deeper is a recursive helper


def bind_helper_call(function, helper, arguments, keywords, defaults, where):
    """{parameter: value} of a call of `function`, whose source is `helper` (a
    `FunctionSource`), as Python binds them: `arguments` by position (a bound method's object
    first), then `keywords`, then `defaults` ((positional defaults, {keyword-only default})),
    whatever values the caller's domain gives each. `where`: the call's location, for errors."""
    signature = helper.tree.args
    name = helper_name(function, helper)
    if signature.vararg or signature.kwarg:
        raise UnsupportedError(f"helper {name} takes *args or **kwargs, which the cell "
                               "language does not (a decorator's wrapper usually does: give "
                               "the wrapper the arguments it passes on)", **where)
    positional = positional_arguments(signature)
    names = positional + [a.arg for a in signature.kwonlyargs]
    if len(arguments) > len(positional):
        raise UnsupportedError(f"helper {name} is called with more arguments than it takes",
                               **where)
    env = dict(zip(positional, arguments))
    positional_defaults, keyword_defaults = defaults
    for parameter, default in zip(positional[len(positional) - len(positional_defaults):],
                                  positional_defaults):
        env.setdefault(parameter, default)
    for parameter, default in keyword_defaults.items():
        env.setdefault(parameter, default)
    by_position = set(keywords) & {a.arg for a in signature.posonlyargs}
    if by_position:
        raise UnsupportedError(f"helper {name} takes {min(by_position)!r} by position only",
                               **where)
    for parameter, value in keywords.items():
        if parameter not in names:
            raise UnsupportedError(f"helper {name} has no argument {parameter!r}", **where)
        env[parameter] = value
    missing = [parameter for parameter in names if parameter not in env]
    if missing:
        raise UnsupportedError(f"helper {name} is missing arguments {missing}", **where)
    return env


def helper_name(function, helper):
    """How an error names a helper: by its name, and where a decorator's wrapper (whose name
    `functools.wraps` made the wrapped function's) stands in its place, by the wrapper too."""
    name = getattr(function, "__name__", repr(function))
    if helper.tree.name != name:
        return f"{name} (a decorator's `{helper.tree.name}`, {helper.filename}:{helper.first_line})"
    return name
