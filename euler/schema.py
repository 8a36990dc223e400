"""Reading files that strangers wrote: every field checked for type and range before use.

Each JSON document we parse (a data manifest, run.json, checkpoint metadata, tokenizer
JSON, a Hugging Face config, a safetensors header, SFT records) goes through `read_json`
or `parse_json`, and its values through a `Fields` view that knows where it came from, so
that an error reads `FILE: FIELD: expected WHAT, found WHAT` in one line:

    m = Fields(read_json(path), str(path))
    vocab = m.obj("tokenizer").int("vocab_size", lo=1, hi=MAX_VOCAB)

Numbers that arrive from the command line go through `check_number`, which names the flag.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from euler.errors import EulerError

MISSING: Any = object()
MAX_JSON_BYTES = 256 << 20  # larger "JSON" is refused before it is read


def describe(value: Any) -> str:
    """A JSON value as an error message shows it: `the string 'x'`, `a list`, `3.5`."""
    if value is MISSING:
        return "nothing (the field is missing)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {shown!r}"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def parse_json(data: bytes | str, where: str) -> Any:
    """JSON from bytes (strict UTF-8) or text; EulerError naming `where` and the line."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise EulerError(f"{where}: not UTF-8 text (byte {e.start})") from None
    try:
        return json.loads(data, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise EulerError(f"{where}:{e.lineno}: invalid JSON ({e.msg})") from None
    except RecursionError:
        raise EulerError(f"{where}: invalid JSON (nested too deeply)") from None


def _no_constant(name: str) -> Any:
    """NaN and Infinity are not JSON; Python's parser accepts them unless told."""
    raise json.JSONDecodeError(f"{name} is not a JSON value", name, 0)


def _read_document(path: Path, what: str) -> bytes:
    """A file's bytes; a missing file, a folder, or an oversized one is refused by name."""
    if path.is_dir():
        raise EulerError(f"{path}: is a folder, expected a {what}")
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise EulerError(f"{path}: {size:,} bytes is too large for a {what}")
        return path.read_bytes()
    except FileNotFoundError:
        raise EulerError(f"{path}: {what} not found") from None
    except OSError as e:
        raise EulerError(f"{path}: cannot read ({e.strerror})") from None


def read_json(path: Path, what: str = "file") -> Any:
    """Parse a JSON file; a missing file, a folder, or an oversized one is refused by name."""
    path = Path(path)
    return parse_json(_read_document(path, what), str(path))


def read_toml(path: Path, what: str = "file") -> dict:
    """Parse a TOML file (a table: TOML's top level always is), refused as read_json's are;
    Python 3.10 has no TOML parser, so there the file is refused with the JSON it could be."""
    path = Path(path)
    data = _read_document(path, what)
    try:
        import tomllib
    except ImportError:  # Python 3.10
        raise EulerError(f"{path}: TOML needs Python 3.11 or later; write it as JSON") from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise EulerError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except tomllib.TOMLDecodeError as e:
        raise EulerError(f"{path}: invalid TOML ({e})") from None


class Fields:
    """A JSON object under inspection: typed getters that raise `WHERE: FIELD: ...`.

    where: the file (or file and key) the object came from; prefix: the dotted path of the
    object inside it, so nested errors name `sources[1].weight`.
    """

    def __init__(self, value: Any, where: str, prefix: str = "") -> None:
        self.where, self.prefix = where, prefix
        if not isinstance(value, dict):
            self.fail("", "a JSON object", value)
        self.data: dict = value

    def name(self, key: str) -> str:
        """The dotted path of `key` in the document (the object's own path for "")."""
        return f"{self.prefix}.{key}" if self.prefix and key else self.prefix or key

    def fail(self, key: str, expected: str, found: Any) -> typing.NoReturn:
        """Raise the one-line error for `key`: expected vs what was found."""
        field = f" {self.name(key)}:" if (key or self.prefix) else ""
        raise EulerError(f"{self.where}:{field} expected {expected}, found {describe(found)}")

    def get(self, key: str, default: Any = MISSING) -> Any:
        """The raw value (no check); a missing key without a default is an error."""
        value = self.data.get(key, default)
        if value is MISSING:
            self.fail(key, "a value", MISSING)
        return value

    def has(self, key: str) -> bool:
        return key in self.data

    def int(self, key: str, lo: int | None = None, hi: int | None = None,
            default: Any = MISSING) -> int:  # fmt: skip
        """An integer (not a bool, not 3.0) in [lo, hi]."""
        value = self.get(key, default)
        if value is default and default is not MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(key, "an integer" + _range(lo, hi), value)
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            self.fail(key, "an integer" + _range(lo, hi), value)
        return value

    def float(self, key: str, lo: float | None = None, hi: float | None = None,
              default: Any = MISSING) -> float:  # fmt: skip
        """A finite number in [lo, hi] (an integer is accepted and converted)."""
        value = self.get(key, default)
        if value is default and default is not MISSING:
            return value
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok or not math.isfinite(value):
            self.fail(key, "a finite number" + _range(lo, hi), value)
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            self.fail(key, "a number" + _range(lo, hi), value)
        return float(value)

    def str(self, key: str, choices: tuple[str, ...] | None = None,
            default: Any = MISSING) -> str:  # fmt: skip
        """A string, one of `choices` if given."""
        value = self.get(key, default)
        if value is default and default is not MISSING:
            return value
        if not isinstance(value, str):
            self.fail(key, "a string", value)
        if choices is not None and value not in choices:
            self.fail(key, "one of " + ", ".join(repr(c) for c in choices), value)
        return value

    def bool(self, key: str, default: Any = MISSING) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            self.fail(key, "true or false", value)
        return value

    def obj(self, key: str, default: Any = MISSING) -> Fields:
        """A nested object, as Fields."""
        value = self.get(key, default)
        return Fields(value, self.where, self.name(key))

    def list(self, key: str, default: Any = MISSING) -> list:
        value = self.get(key, default)
        if not isinstance(value, list):
            self.fail(key, "a list", value)
        return value

    def objects(self, key: str) -> Iterator[Fields]:
        """The items of a list of objects, each as Fields named `key[i]`."""
        for i, item in enumerate(self.list(key)):
            yield Fields(item, self.where, f"{self.name(key)}[{i}]")

    def only(self, allowed: typing.Iterable[str]) -> None:
        """Refuse a key outside `allowed` (a file from another version or a typo)."""
        unknown = sorted(set(self.data) - set(allowed))
        if unknown:
            raise EulerError(f"{self.where}: {self.name(unknown[0])}: unknown field")


def _range(lo: float | None, hi: float | None) -> str:
    if lo is not None and hi is not None:
        return f" in [{lo}, {hi}]"
    if lo is not None:
        return f" >= {lo}"
    if hi is not None:
        return f" <= {hi}"
    return ""


def dataclass_values(cls: type, f: Fields, required: bool = True) -> dict[str, Any]:
    """The fields of dataclass `cls` read from `f`, each checked against its annotation
    (int, float, str, bool, or one of those or None); unknown keys refused; a missing key is
    an error when `required`, else left to the dataclass's default."""
    hints = typing.get_type_hints(cls)
    names = [field.name for field in dataclasses.fields(cls)]
    f.only(names)
    values = {}
    for name in names:
        if not f.has(name):
            if required:
                f.fail(name, "a value", MISSING)
            continue
        values[name] = _typed(f, name, hints[name])
    return values


def _typed(f: Fields, key: str, hint: Any) -> Any:
    """f's `key` checked against a simple annotation."""
    args = typing.get_args(hint)
    if (typing.get_origin(hint) in (typing.Union, types.UnionType)) and type(None) in args:
        if f.get(key) is None:
            return None
        (hint,) = [a for a in args if a is not type(None)]
    readers = {int: f.int, float: f.float, str: f.str, bool: f.bool}
    return readers[hint](key)


def check_number(value: float, flag: str, lo: float | None = None, hi: float | None = None,
                 lo_open: bool = False) -> float:  # fmt: skip
    """A command-line number: finite and in range, else EulerError naming the flag."""
    bad = not isinstance(value, int) and not math.isfinite(value)
    bad = bad or (lo is not None and (value <= lo if lo_open else value < lo))
    bad = bad or (hi is not None and value > hi)
    if bad:
        if lo_open and hi is None:
            want = f"greater than {lo:g}"
        elif lo is not None and hi is not None:
            want = f"in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
        elif lo is not None:
            want = f"at least {lo:g}"
        else:
            want = f"at most {hi:g}" if hi is not None else "finite"
        raise EulerError(f"{flag} must be a finite number {want}, got {value}")
    return value
