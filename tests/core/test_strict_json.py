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


def _nested(levels: int) -> bytes:
    """``levels`` containers inside each other, lists and objects alternating."""
    raw = b"1"
    for i in range(levels):
        raw = b'{"k": [0, ' + raw + b']}' if i % 2 else b'[' + raw + b']'
    return raw


@pytest.mark.parametrize("levels", [1, 2, 63, 64, 65, 66, 90])
def test_the_fast_path_refuses_the_depth_the_full_check_refuses(levels: int) -> None:
    """msgspec's values meet only the depth rule (its own refusals cover the others): the
    containers-only look agrees with :func:`check` at the limit and names the same place."""
    from hermes.core.strict_json import MAX_DEPTH, _within_depth, check

    raw = _nested(levels)
    value = json.loads(raw)
    containers = levels + levels // 2  # each object holds a list
    try:
        check(value)
        full = None
    except StrictJSONError as e:
        full = str(e)
    assert _within_depth(value, MAX_DEPTH) is (full is None)
    assert (full is None) is (containers <= MAX_DEPTH)
    if full is None:
        assert loads(raw) == value
    else:
        with pytest.raises(StrictJSONError) as got:
            loads(raw)
        assert str(got.value) == full and "nested more than 64" in full


@pytest.mark.parametrize("raw", [
    '["\ud800"]', '{"\udc00": 1}', b'{"\\udc00": 1}', b'["\xed\xa0\x80"]'])
def test_lone_surrogates_anywhere_are_refused_by_name(raw: bytes | str) -> None:
    """In a str, escaped, as a key, or encoded in bytes (not UTF-8): refused with a message
    (msgspec refuses each; the json path says what and where)."""
    with pytest.raises(StrictJSONError, match="lone surrogate|not UTF-8"):
        loads(raw)
