"""Strict JSON for what clients send: what the gateway accepts, it can store and answer with.

Python's :mod:`json` accepts more than JSON: ``NaN`` and ``Infinity``, numbers that overflow to
``inf`` (``1e400``) and strings with lone surrogates (``"\\ud800"``), which cannot be encoded
as UTF-8. A value like that, once accepted, fails later: when the gateway stores it, or
answers with it (a 500 after the work was done). :func:`loads` and :func:`check` refuse them
up front with a :class:`StrictJSONError` naming where (``path``), and bound the nesting depth.
Messages never contain the offending text itself (it may not be encodable): names are shown
with :func:`ascii`.
"""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec

#: deeper documents are refused (JSON's own parser stops near Python's recursion limit)
MAX_DEPTH = 64


class StrictJSONError(ValueError):
    """Not strict JSON; ``path`` is where (``"input.items.3"``, or ``""`` for the whole)."""

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path


def _constant(name: str) -> float:
    """``NaN``/``Infinity`` as floats, so that :func:`check` refuses them naming where."""
    return float(name)


def loads(raw: str | bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse ``raw`` (bytes must be UTF-8) as strict JSON (see the module docstring).

    msgspec parses first (every request body passes here: it is several times faster than
    :mod:`json` and accepts only JSON proper); what it refuses is parsed again by
    :mod:`json`, whose refusal or value (``NaN``, ``1e400``, a lone surrogate) then meets the
    same checks and messages as before. A document both accept is the same value."""
    try:
        value = msgspec.json.decode(raw)
    except (ValueError, RecursionError):  # msgspec's errors, and bytes that are not UTF-8
        pass
    else:
        # msgspec refuses NaN/Infinity, numbers out of range and lone surrogates (escaped,
        # or in bytes or a str that are not UTF-8) itself, and yields str keys and JSON
        # types only: of :func:`check`'s rules only the depth is left to look at, which
        # needs the containers alone (a full walk visits every string: a tenth of the
        # gateway's own work on a chat request); a document too deep gets check's message
        if not _within_depth(value, max_depth):
            check(value, max_depth=max_depth)
        return value
    if isinstance(raw, bytes | bytearray):
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as e:
            raise StrictJSONError(f"not UTF-8 (byte {e.start})") from None
    else:
        text = raw
    try:
        value = json.loads(text, parse_constant=_constant)
    except RecursionError:
        raise StrictJSONError(f"nested more than {max_depth} levels deep") from None
    except json.JSONDecodeError as e:
        raise StrictJSONError(f"not valid JSON: {e.msg} (line {e.lineno} column {e.colno})") from None
    check(value, max_depth=max_depth)
    return value


def _within_depth(value: Any, max_depth: int) -> bool:
    """Whether no container of ``value`` (parsed JSON) is nested ``max_depth`` levels deep
    or more (:func:`check`'s depth rule: the outermost container is at level 0), looking at
    containers only, one level at a time."""
    level = [value] if type(value) is dict or type(value) is list else []
    depth = 0
    while level:
        if depth >= max_depth:
            return False
        depth += 1
        below: list[Any] = []
        for v in level:
            for item in (v.values() if type(v) is dict else v):
                if type(item) is dict or type(item) is list:
                    below.append(item)
        level = below
    return True


def _where(path: tuple[Any, ...], root: str) -> str:
    parts = [root] if root else []
    for p in path:
        parts.append(str(p) if isinstance(p, int) or _plain(p) else ascii(p))
    return ".".join(parts)


def _plain(s: str) -> bool:
    return s.isascii() and s.isprintable() and "." not in s and len(s) <= 64


def check(value: Any, *, where: str = "", max_depth: int = MAX_DEPTH) -> None:
    """Raise :class:`StrictJSONError` unless ``value`` (parsed JSON: dicts, lists, strings,
    numbers, booleans, None) serialises to strict JSON: finite numbers, strings and keys that
    are valid Unicode, at most ``max_depth`` levels of nesting. ``where`` prefixes the path."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        v, path = stack.pop()
        if isinstance(v, str):
            _check_str(v, path, where)
        elif isinstance(v, bool) or v is None or isinstance(v, int):
            continue
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise StrictJSONError(f"{v!r} is not a finite number (JSON has no "
                                      "NaN/Infinity; too large?)", _where(path, where))
        elif isinstance(v, dict | list | tuple):
            if len(path) >= max_depth:
                raise StrictJSONError(f"nested more than {max_depth} levels deep",
                                      _where(path, where))
            if isinstance(v, dict):
                for k, item in v.items():
                    if not isinstance(k, str):
                        raise StrictJSONError("object keys must be strings", _where(path, where))
                    _check_str(k, path, where, key=True)
                    stack.append((item, (*path, k)))
            else:
                stack.extend((item, (*path, i)) for i, item in enumerate(v))
        else:
            raise StrictJSONError(f"{type(v).__name__} is not a JSON value", _where(path, where))


def _check_str(s: str, path: tuple[Any, ...], where: str, key: bool = False) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        what = "a key" if key else "a string"
        raise StrictJSONError(f"{what} holds a lone surrogate (\\u{ord(s[e.start]):04x}) at "
                              f"character {e.start}: not valid Unicode", _where(path, where)) from None
