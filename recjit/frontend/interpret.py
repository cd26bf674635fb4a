"""The one walk of a cell's AST that the frontend's two interpreters share.

Proving P.1–P.3 (`properties.PropertyChecker`: what each value depends on) and building the
cell IR (`build.Interpreter`: tensors, numbers and views, one structural case at a time) run
the same statements in the same order, bind names as Python binds them, and sort calls the
same way: the recursive call, a user helper (inlined: its source read, its arguments bound as
Python binds them, its body run one level deeper), or anything else. That walk lives here
once; a domain supplies what its values are and how its branches, loops and calls compute
them."""
import ast
import inspect

from ..errors import UnsupportedError
from .names import is_user_helper
from .source import read_source
from .syntax import MAX_INLINE_DEPTH, bind_helper_call, cell_arguments


class CellInterpreter:
    """Runs a cell's (or an inlined helper's) statements over `env`, {name: value} in the
    domain's values. `model`: the recursive model whose calls are the recursion; `source`:
    the function's `FunctionSource`; `depth`: how many helpers deep.

    A domain implements `returned` and `unpacked`, `join` if its bodies run past a `return`,
    the `stmt_` methods of the statements whose meaning is its own (`if`, loops, `+=`), the
    `expr_` methods, and the call hooks `callee`, `call_arguments`, `recursive_call`,
    `library_call`, `helper_call`, `method_object` and `defaults`."""

    def __init__(self, model, source, depth=0):
        self.model = model
        self.source = source
        self.depth = depth

    def unsupported(self, message, node):
        return UnsupportedError(message, **self.source.where(node))

    # statements ------------------------------------------------------------------------
    def run_body(self, body, env):
        """What the body's `return` statements return, joined (None if none returned)."""
        returned = None
        for statement in body:
            value = self.statement(statement, env)
            if value is not None:
                returned = value if returned is None else self.join(returned, value)
        return returned

    def statement(self, node, env):
        return getattr(self, "stmt_" + type(node).__name__, self.other_statement)(node, env)

    def stmt_Pass(self, node, env):
        return None

    def stmt_Assign(self, node, env):
        value = self.expr(node.value, env)
        for target in node.targets:
            self.bind(target, value, env)

    def stmt_AnnAssign(self, node, env):
        if node.value is not None:
            self.bind(node.target, self.expr(node.value, env), env)

    def stmt_Return(self, node, env):
        return self.returned(self.expr(node.value, env) if node.value is not None else None,
                             node)

    def stmt_Expr(self, node, env):
        if not isinstance(node.value, ast.Constant):  # a docstring
            self.expr(node.value, env)

    def other_statement(self, node, env):
        raise self.unsupported(f"`{type(node).__name__}` statements are not part of the cell "
                               "language", node)

    def bind(self, target, value, env):
        """`target = value`: a name, or a tuple or list of targets that `value` unpacks into
        (`unpacked`)."""
        if isinstance(target, ast.Name):
            env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element, part in zip(target.elts, self.unpacked(value, target)):
                self.bind(element.value if isinstance(element, ast.Starred) else element,
                          part, env)
        else:
            self.assign_other(target, value, env)

    def assign_other(self, target, value, env):
        raise self.unsupported("only names and tuples of names can be assigned", target)

    # expressions -----------------------------------------------------------------------
    def expr(self, node, env):
        return getattr(self, "expr_" + type(node).__name__, self.other_expression)(node, env)

    def expr_Call(self, node, env):
        """The recursive call, a user helper's (inlined), or a call the domain computes."""
        function = self.callee(node, env)
        arguments, keywords = self.call_arguments(node, env)
        if self.is_recursion(function):
            return self.recursive_call(cell_arguments(self.model, arguments, keywords, node,
                                                      self.source), node)
        if is_user_helper(function):
            return self.inline(function, arguments, keywords, node)
        return self.library_call(function, arguments, keywords, node, env)

    def other_expression(self, node, env):
        raise self.unsupported(f"`{type(node).__name__}` expressions are not part of the cell "
                               "language", node)

    def is_recursion(self, function):
        return function is self.model or function is self.model.function

    def inline(self, function, arguments, keywords, node):
        """A helper's call: its body run over its arguments, bound as Python binds them."""
        if self.depth >= MAX_INLINE_DEPTH:
            raise self.unsupported("helper functions nest too deeply (recursive helper?)", node)
        source = read_source(function)
        if inspect.ismethod(function):  # `obj.method(h)`: its first argument is obj
            arguments = [self.method_object(function), *arguments]
        env = bind_helper_call(function, source, arguments, keywords,
                               self.defaults(function, node), self.source.where(node))
        return self.helper_call(source, env)
