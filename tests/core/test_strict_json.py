"""Strict JSON: what msgspec parses fast and what falls back to json, with the same
values and the same refusals (names of where, no crash) either way."""

from __future__ import annotations

import json

import pytest

from hermes.core.strict_json import StrictJSONError, loads


@pytest.mark.parametrize("raw", [
    b'{"a": 1, "a": 2}', b'{"x": 123456789012345678901234567890}', b'[1.5e-5, -0.0, 0.1]',
    b'"\\u00e9\\ud83d\\ude00"', '{"k": "caf\u00e9"}', b' [true, null, {"n": [[]]}] '])
def test_what_msgspec_parses_is_what_json_parses(raw: bytes | str) -> None:
    assert loads(raw) == json.loads(raw)


@pytest.mark.parametrize(("raw", "says"), [
    (b'{"a": "\x80"}', "not UTF-8"),
    (b'{"a": "ok", "b": "\xc4x"}', "not UTF-8"),
    (b'[NaN]', "not a finite number"),
    (b'{"v": 1e400}', "not a finite number"),
    (b'["\\ud800"]', "lone surrogate"),
    (b'{"a": ', "not valid JSON"),
    (b'[' * 100 + b']' * 100, "nested more than"),
])
def test_refusals_name_what_was_wrong(raw: bytes, says: str) -> None:
    with pytest.raises(StrictJSONError, match=says):
        loads(raw)
