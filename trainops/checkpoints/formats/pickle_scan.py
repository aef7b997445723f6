"""Scan a DCP ``.metadata`` pickle opcode by opcode before anything unpickles it.

A model of the unpickler's stack (each entry's kind, and the text of short strings) refuses what
DCP metadata never holds and what bombs need: a global outside ``ALLOWED_GLOBALS``; REDUCE on
anything but the value constructors (``torch.Size``, layouts, memory formats, paths); NEWOBJ on
anything but the record classes, and BUILD on anything but a record built so (never on a class);
sets, persistent ids, extension codes and buffers; integers outside int64 (so integer keys that
hash alike form chains of at most 8, not a quadratic dict); dict keys other than strings, bytes,
int64s, booleans, None or records (tuples and floats hash alike on demand); containers over
``MAX_ITEMS`` items, and more than ``MAX_OPCODES`` opcodes.
"""

from __future__ import annotations

import pickletools

from trainops.checkpoints.formats.dcp_metadata import (
    ALLOWED_GLOBALS,
    CheckpointPath,
    Layout,
    MemoryFormatEncoding,
    RefusedPickle,
    TorchSize,
    _Record,
)

MAX_OPCODES = 600_000_000  # torch writes ~2 bytes per opcode: above what dcp.METADATA_LIMIT (512 MiB) admits
MAX_ITEMS = 10_000_000  # entries of one list or dict (storage_data holds one per chunk)
MAX_TUPLE = 4096
INT64 = 1 << 63
_CONSTRUCTORS = (TorchSize, Layout, MemoryFormatEncoding, CheckpointPath)
_KEY_KINDS = frozenset({"str", "bytes", "bytes_or_str", "int", "int_or_bool", "bool", "None", "record"})
_REFUSED = frozenset(
    "PERSID BINPERSID EXT1 EXT2 EXT4 INST OBJ EMPTY_SET ADDITEMS FROZENSET BYTEARRAY8 NEXT_BUFFER "
    "READONLY_BUFFER".split()
)
_MARK = ("mark", None)
_GETS = frozenset({"GET", "BINGET", "LONG_BINGET"})
_SPECIAL = frozenset(
    "PUT BINPUT LONG_BINPUT MEMOIZE GET BINGET LONG_BINGET DUP GLOBAL STACK_GLOBAL REDUCE NEWOBJ "
    "NEWOBJ_EX BUILD LONG LONG1 LONG4 INT SETITEM".split()
)


def scan(data: bytes) -> None:
    """Raise RefusedPickle, naming the opcode and its offset, unless ``data`` passes every rule."""
    stack: list[tuple[str, object]] = []
    memo: dict[int, tuple[str, object]] = {}
    op, pos = None, 0
    try:
        for count, (op, arg, pos) in enumerate(pickletools.genops(data)):  # noqa: B007 (pos: for the error)
            if count >= MAX_OPCODES:
                raise RefusedPickle(f"more than {MAX_OPCODES} opcodes")
            name = op.name
            if name == "MEMOIZE":  # the three commonest opcodes, handled inline
                memo[len(memo)] = stack[-1]
                continue
            if name in _GETS:
                stack.append(memo[arg])
                continue
            plan = _PLAIN.get(name)
            if plan is None:
                _step(op, arg, stack, memo)
                continue
            pops, pushes = plan  # the common case, inline: pop, push shared entries (no allocation)
            if pops:
                del stack[-pops:]
            if pushes is None:
                stack.append(("str", arg))
            else:
                stack.extend(pushes)
    except RefusedPickle as error:
        raise RefusedPickle(f"refused by the pre-scan at byte {pos} ({op and op.name}): {error}") from None
    except (ValueError, IndexError, KeyError) as error:  # a malformed opcode stream or stack
        raise RefusedPickle(f"refused by the pre-scan: malformed pickle: {error}") from None


def _step(op: pickletools.OpcodeInfo, arg: object, stack: list, memo: dict) -> None:
    name = op.name
    if name in _REFUSED:
        raise RefusedPickle("DCP metadata has no sets, persistent ids, extension codes or buffers")
    if name in ("PUT", "BINPUT", "LONG_BINPUT"):
        memo[arg] = stack[-1]
    elif name == "DUP":
        stack.append(stack[-1])
    elif name == "GLOBAL":
        stack.append(_global(*str(arg).split(" ", 1)))
    elif name == "STACK_GLOBAL":
        (_, module), (_, qualname) = stack.pop(-2), stack.pop()
        stack.append(_global(str(module), str(qualname)))
    elif name == "REDUCE":
        stack.pop()
        target = _target(stack.pop())
        if not (isinstance(target, type) and issubclass(target, _CONSTRUCTORS)):
            raise RefusedPickle(f"REDUCE calls only {', '.join(c.__name__ for c in _CONSTRUCTORS)}")
        stack.append(("value", None))
    elif name in ("NEWOBJ", "NEWOBJ_EX"):
        del stack[-1 if name == "NEWOBJ" else -2 :]
        target = _target(stack.pop())
        if not (isinstance(target, type) and issubclass(target, _Record)):
            raise RefusedPickle("NEWOBJ builds only DCP metadata records")
        stack.append(("record", None))
    elif name == "BUILD":
        stack.pop()
        if stack[-1][0] != "record":
            raise RefusedPickle("BUILD sets state only on a DCP metadata record")
    elif name in ("LONG", "LONG1", "LONG4", "INT"):
        if type(arg) is int and not -INT64 <= arg < INT64:
            raise RefusedPickle("an integer outside int64")
        stack.append((op.stack_after[0].name, None))
    elif name == "SETITEM":
        stack.pop()
        _check_keys([stack.pop()])
    elif op.stack_before and op.stack_before[-1] is pickletools.stackslice:
        items = _pop_to_mark(stack)
        if len(items) > (MAX_TUPLE if name == "TUPLE" else 2 * MAX_ITEMS):
            raise RefusedPickle(f"a container of {len(items)} items")
        if name in ("DICT", "SETITEMS"):
            _check_keys(items[::2])
        if name in ("LIST", "TUPLE", "DICT"):
            stack.append((op.stack_after[0].name, None))  # APPENDS and SETITEMS leave theirs in place
    else:
        raise RefusedPickle("an opcode the pre-scan does not know")


def _plan(op: pickletools.OpcodeInfo) -> tuple[int, tuple | None]:
    """How many entries ``op`` pops and the entries it pushes (None: one string, kept with its text)."""
    if [produced.name for produced in op.stack_after] == ["str"]:
        return len(op.stack_before), None
    pushes = tuple(_MARK if s is pickletools.markobject else (s.name, None) for s in op.stack_after)
    return len(op.stack_before), pushes


def _pop_to_mark(stack: list) -> list:
    """The entries above the topmost mark, removed with it (each entry is passed over once)."""
    index = len(stack) - 1
    while index >= 0 and stack[index] is not _MARK:
        index -= 1
    if index < 0:
        raise RefusedPickle("an opcode that needs a MARK found none")
    items = stack[index + 1 :]
    del stack[index:]
    return items


def _global(module: str, qualname: str) -> tuple[str, object]:
    if (module, qualname) not in ALLOWED_GLOBALS:
        raise RefusedPickle(
            f"refused to load {module[:100]}.{qualname[:100]}: it is not a DCP metadata class"
        )
    return ("global", (module, qualname))


def _target(entry: tuple[str, object]) -> object:
    kind, value = entry
    return ALLOWED_GLOBALS[value] if kind == "global" else None


def _check_keys(keys: list) -> None:
    for kind, _ in keys:
        if kind not in _KEY_KINDS:
            raise RefusedPickle(f"a dict key of kind {kind}: DCP metadata keys are strings or records")


_PLAIN = {
    op.name: _plan(op)
    for op in pickletools.opcodes
    if op.name not in _SPECIAL | _REFUSED and pickletools.stackslice not in op.stack_before
}  # opcodes with no rule of their own: pop and push by their stack effect
