"""Kubernetes resource quantities (`"500m"`, `"1.5Gi"`, `"1e3"`), parsed exactly as apimachinery does.

The grammar is `resource.Quantity`'s: an optional sign, digits with an optional fraction, then one
suffix: decimal SI (`n u m "" k M G T P E`), binary SI (`Ki Mi Gi Ti Pi Ei`) or a decimal exponent
(`e3`, `E-2`). Values are computed exactly (no floating point) and rounded up to the unit asked for,
as `Quantity.MilliValue()` and `Quantity.Value()` do. Unlike apimachinery, negative values, values
beyond int64 and inputs without a single digit are errors here: no resource gpupack reads may have them.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import lru_cache

from gpupack.errors import GpupackError

MAX_VALUE = 2**63 - 1  # int64, the largest value Quantity.Value() / MilliValue() can return
MAX_LENGTH = 64  # longer strings are garbage, not quantities
MAX_EXPONENT = 30  # |e| beyond this is absurd for any resource (and keeps the arithmetic small)

_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?P<suffix>[eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?"
)
_DECIMAL_SUFFIX = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SUFFIX = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}


class QuantityError(GpupackError, ValueError):
    """A resource quantity gpupack cannot use; `value` is the offending input."""

    def __init__(self, value: object, reason: str) -> None:
        self.value = value
        self.reason = reason
        super().__init__(f"invalid quantity {value!r}: {reason}")


def parse_quantity(value: object) -> Fraction:
    """The exact, non-negative value of a quantity string (ints and finite floats are accepted too; any
    other value raises).

    Raises QuantityError on anything apimachinery would reject, and on negative or absurd values.
    """
    if isinstance(value, (str, int, float)):
        return _parse_known(value)
    return _parse(value)  # raises the reason


@lru_cache(maxsize=4096, typed=True)  # a cluster's pods repeat a handful of strings ("1", "16Gi")
def _parse_known(value: str | int | float) -> Fraction:
    return _parse(value)


def _parse(value: object) -> Fraction:
    text = _as_text(value)
    match = _QUANTITY.fullmatch(text)
    if match is None or not (match["int"] or match["frac"]):
        raise QuantityError(value, "not a Kubernetes quantity (e.g. 2, 500m, 1.5Gi, 1e3)")
    frac = match["frac"] or ""
    number = Fraction(int(match["int"] + frac or "0"), 10 ** len(frac))
    suffix = match["suffix"] or ""
    if suffix in _BINARY_SUFFIX:
        number *= 2 ** _BINARY_SUFFIX[suffix]
    else:
        exponent = _DECIMAL_SUFFIX[suffix] if suffix in _DECIMAL_SUFFIX else int(suffix[1:])
        if abs(exponent) > MAX_EXPONENT:
            raise QuantityError(value, f"exponent {exponent} is out of range ±{MAX_EXPONENT}")
        number *= Fraction(10) ** exponent
    if match["sign"] == "-" and number:
        raise QuantityError(value, "must not be negative")
    if number > MAX_VALUE:
        raise QuantityError(value, "is absurdly large")
    return number


def parse_cpu_milli(value: str | int | float) -> int:
    """CPU in millicores, rounded up (`"1"` -> 1000, `"250m"` -> 250, `"0.0001"` -> 1)."""
    return _scaled_ceil(value, 1000)


def parse_bytes(value: str | int | float) -> int:
    """Bytes, rounded up (`"1Gi"` -> 1073741824, `"1k"` -> 1000, `"1.5"` -> 2)."""
    return _scaled_ceil(value, 1)


def parse_count(value: str | int | float) -> int:
    """A whole number of devices (`"1"`, `"1000m"` -> 1), as Kubernetes requires of extended resources.

    Raises QuantityError for a fraction (`"1.5"`, `"500m"`).
    """
    number = parse_quantity(value)
    if number.denominator != 1:
        raise QuantityError(value, "must be a whole number (extended resources cannot be fractional)")
    return int(number)


def _scaled_ceil(value: str | int | float, scale: int) -> int:
    if isinstance(value, (str, int, float)):
        return _scaled_ceil_known(value, scale)
    return _scaled_ceil_of(value, scale)  # raises the reason


@lru_cache(maxsize=4096, typed=True)  # every filter parses the pod's cpu and memory again
def _scaled_ceil_known(value: str | int | float, scale: int) -> int:
    return _scaled_ceil_of(value, scale)


def _scaled_ceil_of(value: object, scale: int) -> int:
    result = math.ceil(parse_quantity(value) * scale)
    if result > MAX_VALUE:
        raise QuantityError(value, "is absurdly large")
    return result


def _as_text(value: object) -> str:
    """Quantities arrive as strings from the API; YAML written by hand may give numbers."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise QuantityError(value, f"expected a string or number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise QuantityError(value, "must be a finite number")
    if isinstance(value, int) and abs(value) > MAX_VALUE:
        raise QuantityError(value, "is absurdly large")
    text = value if isinstance(value, str) else str(value)
    if len(text) > MAX_LENGTH:
        raise QuantityError(value, f"longer than {MAX_LENGTH} characters")
    return text
