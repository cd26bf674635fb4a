"""Reading a cell function's source, from a module file or a notebook cell."""
import ast
import functools
import inspect
import textwrap
from dataclasses import dataclass

from ..errors import UnsupportedError


@dataclass(frozen=True)
class FunctionSource:
    """A function's AST with what is needed to point errors at the user's own lines."""

    function: object
    tree: ast.FunctionDef
    filename: str
    first_line: int
    text: str

    def lineno(self, node):
        return self.first_line + getattr(node, "lineno", 1) - 1

    def segment(self, node):
        return ast.get_source_segment(self.text, node) or ast.unparse(node)

    def where(self, node):
        """Keyword arguments locating `node` for a `SourceLocated` error."""
        return {"filename": self.filename, "lineno": self.lineno(node),
                "expression": self.segment(node)}



def require_code(function):
    """The code object `function` runs; a callable without one (`functools.lru_cache`'s
    wrapper, a `functools.partial`) is refused, naming what it wraps."""
    code = getattr(function, "__code__", None)
    if code is None:
        name = getattr(function, "__qualname__", repr(function))
        wrapped = getattr(function, "__wrapped__", None)
        what = (f"a {type(function).__name__} wrapped around {wrapped.__qualname__}"
                if hasattr(wrapped, "__qualname__") else f"a {type(function).__name__}")
        raise UnsupportedError(f"{name} is {what}, not a plain function: recjit compiles the "
                               "source of the function a call runs, so decorate the cell (or "
                               "helper) with plain functions only")
    return code


@functools.lru_cache(maxsize=1024)
def read_source(function):
    """The parsed source of `function` itself: of a decorator's wrapper, not of the function
    it wraps (`functools.wraps` points `__wrapped__` there, and `inspect` follows it), since the
    wrapper is what a call runs. IPython keeps cell sources in linecache, so this works in
    notebooks too. Functions made by exec or typed at a bare interpreter prompt have none.
    Read once a function (of the last 1024): a file edited since it was defined no longer
    holds its source, and a cell is analysed again when a name it reads is bound again."""
    name = getattr(function, "__qualname__", repr(function))
    code = require_code(function)
    not_a_def = (f"{name} is not defined by a plain `def` statement (lambdas and async "
                 "functions are not cell functions)")
    if code.co_name == "<lambda>":  # its lines may be no statement of their own
        raise UnsupportedError(not_a_def)
    try:
        lines, first_line = inspect.getsourcelines(code)
    except (OSError, TypeError) as error:
        raise UnsupportedError(
            f"cannot read the source of {name} ({error}); recjit analyses a cell function's "
            f"source, so define it in a file, a module or a notebook cell") from None
    text = textwrap.dedent("".join(lines))
    module = ast.parse(text)
    definitions = [node for node in module.body if isinstance(node, ast.FunctionDef)]
    if not definitions:
        raise UnsupportedError(not_a_def)
    filename = inspect.getsourcefile(code) or code.co_filename
    return FunctionSource(function, definitions[0], filename, max(first_line, 1), text)
