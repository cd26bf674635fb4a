"""Resolving the names a cell function uses (`rj.tanh`, helper functions, the model itself,
constants), and remembering those it reads from outside its body: a kernel is compiled for
their values, so a run must see when one is bound to another."""
import ast
import builtins
import operator
import sys
import types

import numpy as np

UNRESOLVED = object()


def resolve(source, expr):
    """The Python object `expr` (a Name or a dotted Attribute chain) denotes in the function's
    scope, or UNRESOLVED."""
    chain = dotted(expr)
    return UNRESOLVED if chain is None else OutsideName(source.function, chain).value()


def dotted(expr):
    """("config", "scale") for `config.scale`; None for anything but a dotted name."""
    attributes = []
    while isinstance(expr, ast.Attribute):
        attributes.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    return (expr.id, *reversed(attributes))


class OutsideName:
    """A dotted name a function reads from its closure, its module's globals or the builtins
    (`rj.tanh`, `SCALE`, `helper`). Every run reads what it denotes (`value`), so the scope
    it is looked up in is found once."""

    __slots__ = ("_cell", "_globals", "chain", "function")

    def __init__(self, function, chain):
        self.function = function
        self.chain = chain
        code = function.__code__
        self._cell = (function.__closure__[code.co_freevars.index(chain[0])]
                      if chain[0] in code.co_freevars else None)
        self._globals = function.__globals__

    def __eq__(self, other):
        return (isinstance(other, OutsideName) and other.function is self.function
                and other.chain == self.chain)

    def __hash__(self):
        return hash((id(self.function), self.chain))

    def value(self):
        value = _EMPTY
        if self._cell is not None:
            try:
                value = self._cell.cell_contents
            except ValueError:  # a closure variable not assigned yet
                pass
        if value is _EMPTY:
            value = self._globals.get(self.chain[0], _EMPTY)
        if value is _EMPTY:
            value = getattr(builtins, self.chain[0], UNRESOLVED)
        for attribute in self.chain[1:]:
            value = getattr(value, attribute, UNRESOLVED)
        return value


_EMPTY = object()


def read_outside(names):
    """The dotted names a cell reads from outside its body (an `OutsideNames`), less each
    module that is read only for its attributes (`rj` of `rj.tanh`: those are read
    themselves)."""
    extended = {(name.function, name.chain[:-1]) for name in names if len(name.chain) > 1}
    return OutsideNames(tuple(name for name in names
                              if not ((name.function, name.chain) in extended
                                      and isinstance(name.value(), types.ModuleType))))


class OutsideNames:
    """`OutsideName`s, and what they denote now (`values`), which every run reads: the names
    rooted at a module's globals in one `attrgetter` call a module (`rj.tanh`, `SCALE` and
    `helper` at once), the others (closure variables, builtins) one by one."""

    def __init__(self, names):
        by_module, others = {}, []
        for name in names:
            module = sys.modules.get(getattr(name.function, "__module__", None) or "")
            if name._cell is None and module is not None and vars(module) is name._globals \
                    and name.chain[0] in name._globals:
                by_module.setdefault(module, []).append(name)
            else:
                others.append(name)
        self.names = tuple(name for group in by_module.values() for name in group) + tuple(
            others)
        self._getters = tuple((module, operator.attrgetter(*(".".join(name.chain)
                                                              for name in group)), len(group))
                              for module, group in by_module.items())
        self._others = tuple(others)

    def values(self):
        """What the names denote now, in the order of `names`, as objects to compare by
        identity."""
        values = []
        try:
            for module, getter, count in self._getters:
                got = getter(module)
                values.extend(got if count > 1 else (got,))
        except AttributeError:  # a global deleted, or an attribute: read each as Python does
            return tuple(name.value() for name in self.names)
        values.extend(name.value() for name in self._others)
        return tuple(values)


def frozen_values(values):
    """`values` (from `OutsideNames.values`) as a key that two bindings of the names share
    when they compile the same kernel: numbers and strings by type and value (floats by repr,
    so NaN equals itself and -0.0 is not 0.0), tuples and lists element by element, anything
    else (functions, modules, models) by identity."""
    return tuple(_frozen(value) for value in values)


class Binding:
    """What the outside names denoted when a cell was analysed (`values`, in the order of
    `OutsideNames.names`). A run asks whether they still do (`holds`): each by identity, and a
    list (which can change without being bound again), or a tuple holding one, by value."""

    def __init__(self, values):
        self.values = values
        self.key = frozen_values(values)  # equal for bindings that compile the same kernel
        self._lists = tuple((index, self.key[index]) for index, value in enumerate(values)
                            if _holds_list(value))

    def holds(self, now):
        return all(map(operator.is_, now, self.values)) and (
            not self._lists or all(_frozen(now[index]) == then for index, then in self._lists))


def _holds_list(value):
    return isinstance(value, list) or (isinstance(value, tuple)
                                       and any(_holds_list(element) for element in value))


def _frozen(value):
    if isinstance(value, (float, complex)):
        return (type(value), repr(value))
    if isinstance(value, (bool, int, str, bytes, type(None))):
        return (type(value), value)
    if isinstance(value, np.generic):
        return (type(value), repr(value.item()))
    if isinstance(value, (tuple, list)):
        return (type(value), frozen_values(value))
    return _Identity(value)


class _Identity:
    """Compares equal to another only for the same object, whatever the object's own `==`
    (a NumPy array's is elementwise); keeps the object alive, so its id is not reused."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, _Identity) and other.value is self.value

    def __hash__(self):
        return id(self.value)


def is_plain_function(obj):
    return callable(obj) and hasattr(obj, "__code__") and hasattr(obj, "__globals__")


def is_user_helper(obj):
    """A plain Python function of the user's (inlined), not one of recjit's, NumPy's or the
    standard library's."""
    module = (getattr(obj, "__module__", "") or "").split(".")[0]
    return is_plain_function(obj) and module not in ("recjit", "numpy", "builtins", "math")
