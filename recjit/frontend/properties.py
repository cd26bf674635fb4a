"""Proving P.1–P.3 (Cortex §2) on the cell function's AST, before anything else happens.

An abstract interpretation over the statements tracks, for every local name, what its value
depends on: the node's structure, the parameters, tensors computed in the node, or the results
of recursive calls. Control flow on anything but structure breaks P.1; a recursive call whose
argument is computed in the node breaks P.2, or P.3 when it comes from another call's result."""
import ast
import builtins
import functools
from dataclasses import dataclass, field, replace

from .. import ops
from ..errors import RecursionPropertyError, UnsupportedError
from .names import OutsideName, dotted, read_outside, resolve
from .interpret import CellInterpreter
from .syntax import is_none_test, positional_arguments

STRUCTURE = "structure"
PARAMETER = "parameter"
COMPUTED = "computed"
CALL_RESULT = "call result"

NODE_ATTRIBUTES_STRUCTURAL = {"is_leaf", "num_children"}
NODE_CHILD_ATTRIBUTES = {"left", "right"}


@dataclass(frozen=True)
class Abstract:
    """What a value depends on, and whether it is the node, a child, or the children list."""

    deps: frozenset = frozenset()
    role: str = ""  # "node", "child", "children", "params", "sequence" or ""
    parts: tuple = ()  # a tuple's or list's: what each of its values depends on
    element: object = None  # an iterable's (zip, enumerate, a comprehension): one element

    def join(self, other):
        """Either value (after an `if`, around a loop): what both depend on, without `parts`
        or `element`, the coarser answer, which refuses more and never less."""
        return Abstract(self.deps | other.deps, self.role if self.role == other.role else "")

    @property
    def data(self):
        return self.deps & {PARAMETER, COMPUTED, CALL_RESULT}


NOTHING = Abstract()


@dataclass
class Usage:
    """What the analysis learnt along the way: parameter and field names the cell reads, the
    names of its context arguments (after the parameters), which count as parameters, and the
    dotted names it and its helpers read from outside their bodies (`OutsideName`s in the
    order read, a dict used as an ordered set; `names.OutsideNames` once the analysis is
    done)."""

    parameters: set = field(default_factory=set)
    fields: set = field(default_factory=set)
    context: tuple = ()
    outside: dict = field(default_factory=dict)


class PropertyChecker(CellInterpreter):
    """The cell's statements run over what values depend on (`Abstract`): both branches of
    every `if`, every loop body until its dependences stop growing, every helper inlined."""

    def __init__(self, model, source, usage, depth=0):
        super().__init__(model, source, depth)
        self.usage = usage

    def error(self, prop, message, node):
        return RecursionPropertyError(prop, message, **self.source.where(node))

    # statements ------------------------------------------------------------------------
    def join(self, first, second):
        return first.join(second)

    def returned(self, value, node):
        return NOTHING if value is None else value

    def other_statement(self, node, env):
        """Refused, if ever run, when the cell IR is built: a branch that no structural case
        takes may hold it."""

    def assign_other(self, target, value, env):
        """As `other_statement`."""

    def stmt_AugAssign(self, node, env):
        value = self.expr(node.value, env).join(self.expr(node.target, env))
        self.bind(node.target, Abstract(value.deps | self.computed_if_data(value)), env)

    def stmt_If(self, node, env):
        self.condition(node.test, env)
        then_env, else_env = dict(env), dict(env)
        returned = [self.run_body(node.body, then_env), self.run_body(node.orelse, else_env)]
        self.merge(env, then_env, else_env)
        returned = [r for r in returned if r is not None]
        return returned[0].join(returned[-1]) if returned else None

    def stmt_While(self, node, env):
        self.condition(node.test, env)
        return self.loop(node, None, env)

    def stmt_For(self, node, env):
        return self.loop(node, self.iterated(node.iter, env), env)

    def loop(self, node, element, env):
        """A loop's body, run until loop-carried dependences reach a fixed point (two
        rounds); `element`: what a `for` loop's target takes."""
        returned = None
        for _ in range(2):
            body_env = dict(env)
            if element is not None:
                self.bind(node.target, element, body_env)
            result = self.run_body(node.body + node.orelse, body_env)
            if result is not None:
                returned = result if returned is None else returned.join(result)
            self.merge(env, env, body_env)
        return returned

    def merge(self, env, first, second):
        for name in set(first) | set(second):
            a, b = first.get(name), second.get(name)
            env[name] = a.join(b) if a is not None and b is not None else (a or b)

    def unpacked(self, value, target):
        """What each of `target`'s names takes: the parts of a tuple of as many values
        (`c, g = child, gate`), else the whole's dependences (`l, r = node.children`)."""
        if len(value.parts) == len(target.elts) and not any(
                isinstance(element, ast.Starred) for element in target.elts):
            return value.parts
        role = "child" if value.role in ("child", "children") else ""
        return [Abstract(value.deps, role)] * len(target.elts)

    def condition(self, test, env):
        value = self.expr(test, env)
        if value.data:
            raise self.error("P.1", "control flow depends on a " + self.describe(value) +
                             ", not only on the node's structure", test)

    @staticmethod
    def describe(value):
        if CALL_RESULT in value.deps:
            return "recursive call's result"
        if COMPUTED in value.deps:
            return "computed tensor"
        return "parameter value"

    @staticmethod
    def computed_if_data(value):
        return frozenset({COMPUTED}) if value.data else frozenset()

    # expressions -----------------------------------------------------------------------
    def other_expression(self, node, env):
        """What an expression depends on: what its parts do, computed in the node if any
        part is data."""
        value = NOTHING
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                value = value.join(self.expr(child, env))
        return Abstract(value.deps | self.computed_if_data(value))

    def expr_Lambda(self, node, env):
        """Its body is not the cell's: the build refuses a lambda at its line."""
        return NOTHING

    def expr_Constant(self, node, env):
        return NOTHING

    def expr_Name(self, node, env):
        self.note_outside(node, env)
        return env.get(node.id, NOTHING)

    def note_outside(self, expr, env):
        """Remember a dotted name whose root is not bound in the body (a global, a closure
        variable, a builtin): the kernel is compiled for what it denotes now."""
        chain = dotted(expr)
        if chain is not None and chain[0] not in env:
            self.usage.outside[OutsideName(self.source.function, chain)] = None

    def expr_Attribute(self, node, env):
        self.note_outside(node, env)
        base = self.expr(node.value, env)
        if base.role in ("node", "child"):
            if node.attr in NODE_CHILD_ATTRIBUTES:
                return Abstract(frozenset({STRUCTURE}), "child")
            if node.attr == "children":
                return Abstract(frozenset({STRUCTURE}), "children")
            if node.attr not in NODE_ATTRIBUTES_STRUCTURAL and base.role == "node":
                self.usage.fields.add(node.attr)
            return Abstract(frozenset({STRUCTURE}))
        if base.role == "params":
            self.usage.parameters.add(node.attr)
            return Abstract(frozenset({PARAMETER}))
        return Abstract(base.deps)

    def expr_Subscript(self, node, env):
        base = self.expr(node.value, env)
        index = self.expr(node.slice, env)
        sliced = isinstance(node.slice, ast.Slice)
        if base.role == "children":  # a child, or some of the children (`[::-1]`)
            return Abstract(frozenset({STRUCTURE}) | index.deps, "children" if sliced else "child")
        if base.role == "sequence" and not index.data:  # `states[0]`, `kids[1:]`
            element = self.element_of(base, node.value)
            if sliced:
                return Abstract(base.deps | index.deps, "sequence", element=element)
            position = node.slice.value if isinstance(node.slice, ast.Constant) else None
            if isinstance(position, int) and -len(base.parts) <= position < len(base.parts):
                return base.parts[position]
            return element
        value = base.join(index)
        if base.data:
            return Abstract(value.deps | {COMPUTED})
        return Abstract(value.deps)

    def expr_Compare(self, node, env):
        """`b is None` (an argument a helper was given or not) is decided by the call, not by a
        tensor's value."""
        if is_none_test(node):
            for operand in [node.left, *node.comparators]:
                self.expr(operand, env)
            return Abstract(frozenset({STRUCTURE}))
        return self.other_expression(node, env)

    def expr_IfExp(self, node, env):
        self.condition(node.test, env)
        return self.expr(node.body, env).join(self.expr(node.orelse, env))

    def iterated(self, iterable, env):
        """What one element of a loop's iterable depends on. A tuple or list has a fixed
        length; anything else must be structure (node.children, a range)."""
        return self.element_of(self.expr(iterable, env), iterable)

    def element_of(self, value, iterable):
        """What one element of `value`, the value of `iterable`, depends on."""
        if value.element is not None:
            return value.element
        if value.role == "sequence" and value.parts:  # a tuple or list: any of its values
            return functools.reduce(Abstract.join, value.parts)
        if value.role == "sequence":
            return Abstract(value.deps)
        if value.role == "children":  # node.children, or zip or enumerate over them
            return Abstract(value.deps | {STRUCTURE}, "child")
        if value.data:
            raise self.error("P.1", "a loop runs over a tensor, so its trip count is not a "
                             "property of the node's structure", iterable)
        return Abstract(frozenset({STRUCTURE}))

    def comprehension(self, node, env):
        inner = dict(env)
        for generator in node.generators:
            self.bind(generator.target, self.iterated(generator.iter, inner), inner)
            for test in generator.ifs:
                self.condition(test, inner)
        return inner

    def expr_GeneratorExp(self, node, env):
        return self.expr(node.elt, self.comprehension(node, env))

    def expr_ListComp(self, node, env):
        """A list of as many values as its loops run, which structure decides: a loop over
        it runs a fixed number of times, whatever its values hold."""
        element = self.expr_GeneratorExp(node, env)
        return Abstract(element.deps, "sequence", element=element)

    def expr_Tuple(self, node, env):
        elements = [self.expr(element, env) for element in node.elts]
        return Abstract(functools.reduce(Abstract.join, elements, NOTHING).deps, "sequence",
                        parts=tuple(elements))

    expr_List = expr_Tuple

    def callee(self, node, env):
        self.note_outside(node.func, env)
        return resolve(self.source, node.func)

    def call_arguments(self, node, env):
        arguments = [self.expr(a.value if isinstance(a, ast.Starred) else a, env)
                     for a in node.args]
        return arguments, {k.arg: self.expr(k.value, env) for k in node.keywords}

    def library_call(self, function, arguments, keywords, node, env):
        if function is builtins.reversed and len(arguments) == 1 and arguments[0].role in (
                "children", "sequence"):  # the same values, the other way round
            return replace(arguments[0], parts=arguments[0].parts[::-1])
        if function in (builtins.list, builtins.tuple, builtins.sorted) and arguments and \
                arguments[0].role in ("children", "sequence"):  # the same values
            return arguments[0]
        if function is builtins.len and arguments and arguments[0].role == "sequence":
            return Abstract(frozenset({STRUCTURE}))  # how many values, not what they hold
        if function in (builtins.zip, builtins.enumerate) and all(
                argument.role in ("sequence", "children") or not argument.data
                for argument in arguments):  # as many values as its shortest argument has
            deps = functools.reduce(Abstract.join, arguments, NOTHING).deps
            role = ("children" if any(argument.role == "children" for argument in arguments)
                    else "sequence")
            return Abstract(deps, role, element=replace(
                self.element_of(Abstract(deps, role), node),
                parts=self.zipped_parts(function, arguments, node.args)))
        if isinstance(node.func, ast.Attribute):
            self.expr(node.func.value, env)
        value = functools.reduce(Abstract.join, [*arguments, *keywords.values()], NOTHING)
        elementwise = ops.as_cell_function(function)
        if any(elementwise is known for known in (*ops.UNARY, *ops.BINARY)) or value.data:
            return Abstract(value.deps | {COMPUTED})
        return Abstract(value.deps)

    def zipped_parts(self, function, arguments, syntax):
        """What each value of one of zip's (enumerate's) tuples depends on, so that a child
        paired with a value computed for it (`zip(node.children, gates)`) stays a child."""
        if any(isinstance(argument, ast.Starred) for argument in syntax):
            return ()
        if function is builtins.enumerate:
            return ((Abstract(frozenset({STRUCTURE})), self.element_of(arguments[0], syntax[0]))
                    if arguments else ())
        return tuple(self.element_of(argument, item) for argument, item in zip(arguments, syntax))

    def recursive_call(self, arguments, node):
        for argument, syntax in zip(arguments, node.args):
            if CALL_RESULT in argument.deps:
                raise self.error("P.3", "an argument of a recursive call depends on the result "
                                 "of another recursive call, so the calls are not independent",
                                 syntax)
            if COMPUTED in argument.deps:
                raise self.error("P.2", "an argument of a recursive call is computed in the "
                                 "node; it must be known before the node's computation", syntax)
        if not arguments or arguments[0].role != "child":
            raise UnsupportedError("a recursive call must take a child of the node "
                                   "(node.left, node.right, node.children[k] or a loop over "
                                   "node.children) as its first argument",
                                   **self.source.where(node))
        return Abstract(frozenset({CALL_RESULT}))

    def helper_call(self, source, env):
        returned = PropertyChecker(self.model, source, self.usage,
                                   self.depth + 1).run_body(source.tree.body, env)
        return returned if returned is not None else NOTHING

    def method_object(self, method):
        return NOTHING  # read from outside: it depends on nothing the node computes

    def defaults(self, function, node):
        """A helper's default arguments: constants."""
        return ((NOTHING,) * len(function.__defaults__ or ()),
                dict.fromkeys(function.__kwdefaults__ or {}, NOTHING))


def check_properties(model, source):
    """Prove P.1–P.3 for the cell function; returns the parameters and fields it reads."""
    usage = Usage()
    arguments = positional_arguments(source.tree.args)
    if len(arguments) < 2:
        raise UnsupportedError("a cell function takes the node and the parameters: "
                               "def cell(node, p, ...)", filename=source.filename,
                               lineno=source.lineno(source.tree))
    env = {arguments[0]: Abstract(frozenset({STRUCTURE}), "node"),
           arguments[1]: Abstract(frozenset({PARAMETER}), "params")}
    usage.context = tuple(arguments[2:])
    usage.parameters.update(usage.context)
    for context in usage.context:
        env[context] = Abstract(frozenset({PARAMETER}))
    PropertyChecker(model, source, usage).run_body(source.tree.body, env)
    usage.outside = read_outside(usage.outside)
    return usage
