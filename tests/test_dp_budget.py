"""Budgets: exact arithmetic, validation, composition, comparison and splitting."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest

from privpipe.dp.budget import ApproxBudget, PureBudget, RhoBudget
from privpipe.errors import ConfigError


def test_float_composition_is_exact() -> None:
    total = PureBudget(0.1) + PureBudget(0.2)
    assert total.epsilon == Fraction(3, 10)
    assert total == PureBudget("0.3")
    assert sum([PureBudget(0.1)] * 10) == PureBudget(1)


@pytest.mark.parametrize("value", [1, 0.5, "0.5", "1/2", Fraction(1, 2), "5e-1"])
def test_number_forms(value: object) -> None:
    expected = Fraction(1) if value == 1 else Fraction(1, 2)
    assert PureBudget(value).epsilon == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda: PureBudget(float("nan")), "epsilon"),
        (lambda: PureBudget(float("inf")), "epsilon"),
        (lambda: PureBudget("inf"), "epsilon"),
        (lambda: PureBudget("nan"), "epsilon"),
        (lambda: PureBudget(-1), "epsilon"),
        (lambda: PureBudget("abc"), "epsilon"),
        (lambda: PureBudget(True), "epsilon"),
        (lambda: PureBudget(None), "epsilon"),  # type: ignore[arg-type]
        (lambda: ApproxBudget(1, 1), "delta"),
        (lambda: ApproxBudget(1, 1.5), "delta"),
        (lambda: ApproxBudget(1, -1e-9), "delta"),
        (lambda: ApproxBudget(1, float("nan")), "delta"),
        (lambda: RhoBudget(-0.1), "rho"),
        (lambda: RhoBudget(float("-inf")), "rho"),
    ],
)
def test_validation_names_parameter(make: object, name: str) -> None:
    with pytest.raises(ConfigError, match=name) as err:
        make()  # type: ignore[operator]
    assert err.value.exit_code == 2


def test_mixed_composition() -> None:
    total = PureBudget(1) + ApproxBudget("0.5", "1e-6") + ApproxBudget(0.25, 1e-7)
    assert total == ApproxBudget("1.75", "11/10000000")
    assert RhoBudget(0.1) + RhoBudget(0.2) == RhoBudget("3/10")
    with pytest.raises(ConfigError, match="to_approx"):
        RhoBudget(1) + PureBudget(1)
    with pytest.raises(TypeError):
        PureBudget(1) + 1.0


def test_comparisons_are_component_wise() -> None:
    assert PureBudget(1) <= PureBudget(1)
    assert PureBudget(1) < PureBudget(2)
    assert PureBudget(1) <= ApproxBudget(1, 1e-6)
    assert ApproxBudget(1, 1e-6) > PureBudget(1)
    assert not ApproxBudget(1, 1e-6) <= PureBudget(2)  # delta does not fit
    assert not PureBudget(2) <= ApproxBudget(1, 1e-6)
    assert PureBudget(1) == ApproxBudget(1, 0)
    assert RhoBudget(0.1) < RhoBudget(0.2)
    with pytest.raises(TypeError):
        _ = RhoBudget(1) <= PureBudget(1)


def test_split_sums_exactly() -> None:
    whole = ApproxBudget(1, "1e-6")
    parts = whole.split([1, 1, 1])
    assert parts[0] == ApproxBudget("1/3", "1/3000000")
    assert sum(parts) == whole
    pure_parts = PureBudget(0.7).split([0.1, 0.2, 0.3, "0.4"])
    assert sum(pure_parts) == PureBudget(0.7)
    assert pure_parts[3].epsilon == Fraction(7, 25)
    assert sum(RhoBudget(0.5).split([2, 3])) == RhoBudget(0.5)
    with pytest.raises(ConfigError):
        whole.split([])
    with pytest.raises(ConfigError):
        whole.split([0, 0])
    with pytest.raises(ConfigError, match="weight"):
        whole.split([1, -1])


def test_as_dict_is_json() -> None:
    d = ApproxBudget(0.1, 1e-6).as_dict()
    assert d["epsilon"] == 0.1 and d["delta"] == 1e-6
    assert d["exact"]["epsilon"] == "1/10"
    json.dumps(d)
    assert PureBudget(2).as_dict()["type"] == "pure"
    assert RhoBudget(0.5).as_dict()["rho"] == 0.5


def test_rho_to_approx() -> None:
    rho, delta = 0.5, 1e-6
    approx = RhoBudget(rho).to_approx(delta)
    assert approx.delta == Fraction(1, 10**6)
    assert float(approx.epsilon) >= rho + 2 * math.sqrt(rho * math.log(1 / delta))
    assert float(approx.epsilon) == pytest.approx(rho + 2 * math.sqrt(rho * math.log(1e6)))
    with pytest.raises(ConfigError, match="delta"):
        RhoBudget(1).to_approx(0)


def test_immutable_and_hashable() -> None:
    b = PureBudget(1)
    with pytest.raises(AttributeError):
        b._epsilon = Fraction(2)  # type: ignore[misc]
    assert len({PureBudget(1), ApproxBudget(1, 0), PureBudget("1.0")}) == 1
