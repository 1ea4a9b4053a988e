"""Kubernetes quantities parsed as apimachinery's resource.Quantity does."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupack.kube.quantity import (
    MAX_VALUE,
    QuantityError,
    parse_bytes,
    parse_count,
    parse_cpu_milli,
    parse_quantity,
)

BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


@pytest.mark.parametrize(
    ("text", "milli"),
    [
        ("1", 1000),
        ("192", 192000),
        ("250m", 250),
        ("0.5", 500),
        (".5", 500),
        ("1.", 1000),
        ("+2", 2000),
        ("0", 0),
        ("-0", 0),
        ("0.0001", 1),  # rounded up, like Quantity.MilliValue()
        ("1500u", 2),
        ("100n", 1),
        ("1e3", 1_000_000),
        ("1E3", 1_000_000),
        ("1e-3", 1),
        ("2.5e+2", 250_000),
        ("1k", 1_000_000),
        (2, 2000),
        (0.25, 250),
    ],
)
def test_cpu_milli(text: str | int | float, milli: int) -> None:
    assert parse_cpu_milli(text) == milli


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1Gi", 2**30),
        ("1.5Gi", 3 * 2**29),
        ("2Ti", 2 * 2**40),
        ("512Mi", 512 * 2**20),
        ("1Ki", 1024),
        ("1k", 1000),
        ("1M", 10**6),
        ("1E", 10**18),
        ("1Ei", 2**60),
        ("1e9", 10**9),
        ("1.5", 2),  # rounded up, like Quantity.Value()
        ("100m", 1),
        ("123", 123),
    ],
)
def test_bytes(text: str, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize(("text", "count"), [("1", 1), ("8", 8), ("1000m", 1), ("2e0", 2), ("0", 0), (4, 4)])
def test_count(text: str | int, count: int) -> None:
    assert parse_count(text) == count


@pytest.mark.parametrize("text", ["1.5", "500m", "0.1", "1e-1"])
def test_count_rejects_fractions(text: str) -> None:
    with pytest.raises(QuantityError, match="whole number") as caught:
        parse_count(text)
    assert caught.value.value == text
    assert repr(text) in str(caught.value)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "not a Kubernetes quantity"),
        ("-", "not a Kubernetes quantity"),
        (".", "not a Kubernetes quantity"),
        ("abc", "not a Kubernetes quantity"),
        ("1K", "not a Kubernetes quantity"),  # kilo is lower-case k
        ("1e", "not a Kubernetes quantity"),
        ("1gi", "not a Kubernetes quantity"),
        ("1 Gi", "not a Kubernetes quantity"),
        (" 1", "not a Kubernetes quantity"),
        ("1.2.3", "not a Kubernetes quantity"),
        ("0x10", "not a Kubernetes quantity"),
        ("١", "not a Kubernetes quantity"),  # Unicode digits are not digits to apimachinery
        ("NaN", "not a Kubernetes quantity"),
        ("Infinity", "not a Kubernetes quantity"),
        ("-1", "negative"),
        ("-100m", "negative"),
        ("-1Gi", "negative"),
        (-3, "negative"),
        ("1e99", "exponent"),
        ("1e-99", "exponent"),
        ("99999999999999999999", "absurdly large"),
        ("16Ei", "absurdly large"),
        (10**30, "absurdly large"),
        ("1" * 65, "longer than"),
        (float("nan"), "finite"),
        (float("inf"), "finite"),
        (True, "expected a string or number"),
        (None, "expected a string or number"),
        ([1], "expected a string or number"),
    ],
)
def test_rejects_garbage(value: object, reason: str) -> None:
    with pytest.raises(QuantityError, match=reason) as caught:
        parse_quantity(value)
    assert caught.value.value is value
    assert isinstance(caught.value, ValueError)


def test_overflow_after_scaling_is_rejected() -> None:
    assert parse_bytes("8E") == 8 * 10**18
    with pytest.raises(QuantityError, match="absurdly large"):
        parse_cpu_milli("8E")  # 8e21 millicores do not fit in int64


@given(st.integers(0, 2**40), st.sampled_from(sorted(BINARY)))
def test_binary_suffix_round_trip(n: int, suffix: str) -> None:
    value = n * BINARY[suffix]
    if value > MAX_VALUE:
        with pytest.raises(QuantityError):
            parse_bytes(f"{n}{suffix}")
    else:
        assert parse_bytes(f"{n}{suffix}") == value


@given(st.integers(0, 10**12), st.sampled_from(sorted(DECIMAL)))
def test_decimal_suffix_round_trip(n: int, suffix: str) -> None:
    value = n * DECIMAL[suffix]
    if value > MAX_VALUE:
        with pytest.raises(QuantityError):
            parse_bytes(f"{n}{suffix}")
    else:
        assert parse_bytes(f"{n}{suffix}") == value


@given(st.integers(0, 10**15))
def test_milli_round_trip(milli: int) -> None:
    assert parse_cpu_milli(f"{milli}m") == milli
    assert parse_cpu_milli(str(Decimal(milli) / 1000)) == milli


@given(
    st.decimals(min_value=0, max_value=10**9, allow_nan=False, allow_infinity=False, places=6),
    st.integers(-6, 6),
)
def test_exponent_forms_match_exact_decimal(mantissa: Decimal, exponent: int) -> None:
    text = f"{mantissa:f}e{exponent}"
    exact = mantissa.scaleb(exponent)
    assert parse_cpu_milli(text) == math.ceil(exact * 1000)
    assert parse_bytes(text) == math.ceil(exact)


@given(st.integers(0, 10**6))
def test_count_accepts_whole_numbers_in_any_form(n: int) -> None:
    for text in (str(n), f"{n}000m", f"{n}e0", f"{n}.0"):
        assert parse_count(text) == n
