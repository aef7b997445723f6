"""CEL as kube-apiserver evaluates it for admission policies, on cel-python (``celpy``).

``compile_expression(text, names)`` parses an expression and refuses what the API server's compiler
refuses: a syntax error, a name that is not declared (``names``: the policy's variables such as
``object``, ``request``, ``variables``), a function the environment does not have.  The result's
``evaluate(activation)`` runs it on JSON values (``to_cel``) and raises ``CelError`` with cel-go's
wording for what fails at run time (``no such key: subResource`` for an absent field).

cel-python implements the CEL standard; Kubernetes adds libraries to it.  Of those the devcluster
has cel-go's string extension (``ext.Strings``, on in every Kubernetes CEL environment):
``charAt``, ``indexOf``, ``lastIndexOf``, ``lowerAscii``, ``upperAscii``, ``replace``, ``split``,
``substring``, ``trim`` and ``join``, written here with cel-go's semantics (code points, its error
texts).  An expression that calls another Kubernetes function (``isSorted``, ``quantity``, ``url``,
``authorizer`` ...) is refused when the policy is created, saying so, instead of passing unchecked.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping

import celpy
import lark
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError, base_functions

#: macros and functions of the CEL standard (celpy's own), and the string extension below
_MACROS = {"has", "dyn", "all", "exists", "exists_one", "map", "filter"}
_STANDARD = {
    "size",
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "int",
    "uint",
    "double",
    "string",
    "bytes",
    "bool",
    "type",
    "duration",
    "timestamp",
    "list",
    "map",
    "null_type",
    *(f"get{part}" for part in ("Date", "DayOfMonth", "DayOfWeek", "DayOfYear", "FullYear", "Month")),
    *(f"get{part}" for part in ("Hours", "Milliseconds", "Minutes", "Seconds")),
}


class CelError(Exception):
    """A CEL expression that does not compile, or fails when evaluated; ``str()`` is cel-go's text."""


# ---- cel-go's string extension (ext/strings.go), on code points --------------------------------------
def _index_error(index: int) -> CELEvalError:
    return CELEvalError(f"index out of range: {index}", IndexError, None)


def _char_at(text: str, index: int) -> object:
    if index < 0 or index > len(text):
        return _index_error(index)
    return celtypes.StringType(text[index : index + 1])


def _index_of(text: str, sub: str, start: int = 0) -> object:
    if start < 0 or start > len(text):
        return _index_error(start)
    return celtypes.IntType(text.find(sub, start))


def _last_index_of(text: str, sub: str, end: int | None = None) -> object:
    if end is None:
        return celtypes.IntType(text.rfind(sub))
    if end < 0 or end > len(text):
        return _index_error(end)
    return celtypes.IntType(text.rfind(sub, 0, end + len(sub)))


def _substring(text: str, start: int, end: int | None = None) -> object:
    end = len(text) if end is None else end
    if start < 0 or start > len(text):
        return _index_error(start)
    if end < 0 or end > len(text):
        return _index_error(end)
    if start > end:
        return CELEvalError(f"invalid substring range. start: {start}, end: {end}", IndexError, None)
    return celtypes.StringType(text[start:end])


def _replace(text: str, old: str, new: str, count: int = -1) -> object:
    return celtypes.StringType(text.replace(old, new, count if count >= 0 else -1))


def _split(text: str, separator: str, limit: int = -1) -> object:
    if limit == 0:
        parts: list[str] = []
    elif separator == "":
        chars = list(text)
        parts = chars if limit < 0 or limit >= len(chars) else [*chars[: limit - 1], text[limit - 1 :]]
    else:
        parts = text.split(separator, limit - 1 if limit > 0 else -1)
    return celtypes.ListType([celtypes.StringType(p) for p in parts])


def _join(items: Iterable, separator: str = "") -> object:
    return celtypes.StringType(separator.join(str(i) for i in items))


def _ascii(convert: Callable[[str], str]) -> Callable[[str], object]:
    def change(text: str) -> object:
        return celtypes.StringType("".join(convert(c) if c.isascii() else c for c in text))

    return change


def _conditional(condition: object, left: object, right: object) -> object:
    """``c ? a : b`` whose condition is an error is that error (celpy reports a missing overload)."""
    if isinstance(condition, CELEvalError):
        return condition
    if not isinstance(condition, celtypes.BoolType):
        raise TypeError(f"no such overload: {type(condition).__name__} ? ...")
    return left if condition else right


_EXTENSION: dict[str, Callable] = {
    "_?_:_": _conditional,
    "charAt": _char_at,
    "indexOf": _index_of,
    "lastIndexOf": _last_index_of,
    "lowerAscii": _ascii(str.lower),
    "upperAscii": _ascii(str.upper),
    "replace": _replace,
    "split": _split,
    "substring": _substring,
    "trim": lambda text: celtypes.StringType(text.strip()),
    "join": _join,
}
_KNOWN = _MACROS | _STANDARD | set(_EXTENSION)


def _strict(function: Callable) -> Callable:
    """CEL functions are strict: an argument that is an error makes the call that error (cel-go passes
    it on; celpy reports a missing overload for most operators and functions)."""

    @functools.wraps(function)
    def call(*args: object) -> object:
        error = next((a for a in args if isinstance(a, CELEvalError)), None)
        return error if error is not None else function(*args)

    return call


#: every function and operator but the logical ones (``&&``/``||`` absorb errors, as CEL says)
_FUNCTIONS = {
    name: function if name in ("_&&_", "_||_", "_?_:_") else _strict(function)
    for name, function in {**base_functions, **_EXTENSION}.items()
}


# ---- compiling --------------------------------------------------------------------------------------
@functools.cache
def _environment() -> celpy.Environment:
    return celpy.Environment()


class Program:
    """One compiled expression (``text``); ``evaluate(values)`` returns a celpy value or raises.
    ``names``: the declared names it reads (only those are looked up in ``values``)."""

    def __init__(self, text: str, tree: lark.Tree, names: frozenset[str]) -> None:
        self.text, self.tree, self.names = text, tree, names
        self._runner = _environment().program(tree, functions=_FUNCTIONS)

    def evaluate(self, values: Mapping[str, object]) -> object:
        try:
            result = self._runner.evaluate({name: values[name] for name in self.names})
        except CELEvalError as error:
            raise CelError(describe(error)) from None
        if isinstance(result, CELEvalError):
            raise CelError(describe(result))
        return result


def compile_expression(text: str, names: Iterable[str]) -> Program:
    """``text`` compiled, or ``CelError`` with the compiler's complaint (``ERROR: <input>:L:C: ...``)."""
    try:
        tree = _environment().compile(text)
    except CELParseError as error:
        line, column = getattr(error, "line", None) or 1, getattr(error, "column", None) or 1
        raise CelError(
            issue(text, line, column, "Syntax error: " + str(error.args[0]).splitlines()[0])
        ) from None
    return Program(text, tree, _check_names(text, tree, set(names)))


def _check_names(text: str, tree: lark.Tree, declared: set[str]) -> frozenset[str]:
    """The declared names ``tree`` reads; refuses a free identifier that is not declared and a
    function the environment lacks."""
    bound: set[str] = set()
    for node in tree.iter_subtrees_topdown():
        if node.data == "member_dot_arg" and str(node.children[1]) in (
            "all",
            "exists",
            "exists_one",
            "map",
            "filter",
        ):
            args = (
                node.children[2].children if len(node.children) > 2 and node.children[2] is not None else []
            )
            if args:
                bound.update(_identifiers(args[0]))
    for node in tree.iter_subtrees_topdown():
        if node.data in ("ident_arg", "member_dot_arg"):
            token = node.children[0] if node.data == "ident_arg" else node.children[1]
            if str(token) not in _KNOWN:
                raise CelError(
                    issue(
                        text,
                        token.line,
                        token.column,
                        f"undeclared reference to '{token}' (in container '') (the devcluster's CEL has "
                        "CEL's standard functions and Kubernetes' string extension only)",
                    )
                )
        elif node.data == "ident":
            token = node.children[0]
            if str(token) not in declared | bound:
                raise CelError(
                    issue(
                        text, token.line, token.column, f"undeclared reference to '{token}' (in container '')"
                    )
                )
    return frozenset(_identifiers(tree) & declared)


def _identifiers(tree: lark.Tree) -> set[str]:
    return {str(node.children[0]) for node in tree.iter_subtrees() if node.data == "ident"}


def issue(text: str, line: int, column: int, message: str) -> str:
    """cel-go's rendering of a problem at ``line``/``column`` (1-based): the message, the source
    line and a caret under the column."""
    source = text.splitlines()[line - 1] if text.splitlines() else ""
    return f"ERROR: <input>:{line}:{column}: {message}\n | {source}\n | {'.' * (column - 1)}^"


# ---- values -----------------------------------------------------------------------------------------
def to_cel(value: object) -> object:
    """A JSON value (dicts, lists, strings, numbers, booleans, None) as CEL sees it."""
    return celpy.json_to_cel(value)


def from_cel(value: object) -> object:
    """A CEL result as plain Python (bool, int, float, str, list, dict, None)."""
    if isinstance(value, celtypes.BoolType):
        return bool(value)
    if isinstance(value, celtypes.IntType | celtypes.UintType):
        return int(value)
    if isinstance(value, celtypes.DoubleType):
        return float(value)
    if isinstance(value, celtypes.StringType):
        return str(value)
    if isinstance(value, list):
        return [from_cel(v) for v in value]
    if isinstance(value, dict):
        return {from_cel(k): from_cel(v) for k, v in value.items()}
    return value


class LazyMap(celtypes.MapType):
    """A map whose entries are computed on first use, once (kube-apiserver's ``variables``); an entry
    whose computation fails holds the error, so only the expressions that read it fail."""

    def __init__(self, compute: dict[str, Callable[[], object]]) -> None:
        super().__init__()
        self._compute = compute
        self._done: dict[str, object] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._compute

    def __getitem__(self, key: object) -> object:
        if key not in self._compute:
            raise KeyError(key)
        if key not in self._done:
            try:
                self._done[key] = self._compute[key]()
            except CelError as error:
                self._done[key] = CELEvalError(f'composited variable "{key}" fails to evaluate: {error}')
        return self._done[key]


def describe(error: CELEvalError) -> str:
    """cel-go's words for a run-time error celpy raised."""
    message = str(error.args[0]) if error.args else str(error)
    if message.startswith("no such member in mapping: "):
        return "no such key: " + message.removeprefix("no such member in mapping: ").strip("'\"")
    return message
