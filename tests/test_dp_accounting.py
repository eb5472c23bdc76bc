"""The accountant: composition methods, parallel groups, group privacy, the chosen bound."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest

from privpipe.dp.accounting import (
    Accountant,
    DiscreteGaussian,
    DiscreteLaplace,
    Parallel,
    advanced_composition,
    group_privacy,
)
from privpipe.errors import ConfigError


def test_mechanism_parameters() -> None:
    lap = DiscreteLaplace.of(scale=20, sensitivity=2)
    assert lap.epsilon == Fraction(1, 10)
    assert lap.rho == pytest.approx(0.005)
    gauss = DiscreteGaussian.of(sigma=2, sensitivity=3)
    assert gauss.rho == pytest.approx(9 / 8)
    with pytest.raises(ConfigError, match="scale"):
        DiscreteLaplace.of(0, 1)
    with pytest.raises(ConfigError, match="sigma"):
        DiscreteGaussian.of(float("nan"), 1)
    with pytest.raises(ConfigError, match="sensitivity"):
        DiscreteGaussian.of(1, -1)


def test_pure_sum_is_exact_and_chosen_at_delta_zero() -> None:
    acc = Accountant([DiscreteLaplace.of(10, 1), DiscreteLaplace.of(5, 1)], delta=0)
    report = acc.report()
    assert report["chosen"]["method"] == "pure"
    assert report["chosen"]["epsilon"] == pytest.approx(0.3)
    assert report["chosen"]["delta"] == 0.0
    assert report["methods"]["advanced"]["epsilon"] is None
    json.dumps(report)


def test_advanced_composition_hand_numbers() -> None:
    # sqrt(2*10*ln(1e5))*0.1 + 10*0.1*(e^0.1 - 1) = 1.517427 + 0.105171
    eps, delta = advanced_composition(0.1, 0.0, 10, 1e-5)
    assert eps == pytest.approx(1.6225980, abs=1e-6)
    assert delta == pytest.approx(1e-5)
    eps, delta = advanced_composition(0.1, 1e-8, 100, 1e-6)
    assert eps == pytest.approx(6.3082310, abs=1e-6)
    assert delta == pytest.approx(100 * 1e-8 + 1e-6)
    # In the accountant: 100 pure mechanisms of 0.1, delta' = target.
    acc = Accountant([DiscreteLaplace.of(10, 1)] * 100, delta=1e-6)
    adv = acc.advanced()
    assert adv.epsilon == pytest.approx(6.3082310, abs=1e-6)
    assert adv.epsilon is not None and adv.epsilon < 10.0  # beats basic (sum = 10)


def test_many_pure_mechanisms_choose_a_tighter_method() -> None:
    acc = Accountant([DiscreteLaplace.of(10, 1)] * 100, delta=1e-6)
    report = acc.report()
    assert report["methods"]["pure"]["epsilon"] == pytest.approx(10.0)
    assert report["chosen"]["method"] == "pld"
    assert report["chosen"]["epsilon"] < report["methods"]["advanced"]["epsilon"] < 10.0
    assert report["chosen"]["delta"] <= 1e-6


def test_pld_and_rdp_beat_basic_for_many_gaussians() -> None:
    mechs = [DiscreteGaussian.of(sigma=10, sensitivity=1, dimensions=1)] * 50
    acc = Accountant(mechs, delta=1e-6)
    m = acc.report()["methods"]
    assert m["pure"]["epsilon"] is None
    basic = m["basic"]["epsilon"]
    assert m["pld"]["epsilon"] < basic / 5
    assert m["rdp"]["epsilon"] < basic / 5
    # zCDP composition bound: rho = 50/200 = 0.25; RDP is at least as tight as it.
    rho = 0.25
    assert m["rdp"]["epsilon"] <= rho + 2 * math.sqrt(rho * math.log(1e6)) + 1e-9
    # PLD is close to (and valid w.r.t.) the continuous Gaussian's exact curve.
    assert acc.report()["chosen"]["method"] in {"pld", "rdp"}
    assert acc.report()["chosen"]["epsilon"] == min(m["pld"]["epsilon"], m["rdp"]["epsilon"])


def test_vector_gaussian_has_no_pld_but_rdp() -> None:
    acc = Accountant([DiscreteGaussian.of(5, math.sqrt(3))], delta=1e-5)
    m = acc.report()["methods"]
    assert m["pld"]["epsilon"] is None and "scalar" in m["pld"]["note"]
    assert m["rdp"]["epsilon"] is not None


def test_gaussian_at_delta_zero_is_refused() -> None:
    acc = Accountant([DiscreteGaussian.of(5, 1)], delta=0)
    with pytest.raises(ConfigError, match="delta"):
        acc.report()


def test_parallel_is_max_not_sum() -> None:
    group = Parallel((DiscreteLaplace.of(1, 1), DiscreteLaplace.of(2, 1), DiscreteLaplace.of(4, 1)))
    acc = Accountant([group, DiscreteLaplace.of(2, 1)], delta=0)
    assert acc.report()["chosen"]["epsilon"] == pytest.approx(1.0 + 0.5)
    gauss = Parallel((DiscreteGaussian.of(2, 1), DiscreteGaussian.of(1, 1)))
    g_acc = Accountant([gauss], delta=1e-6)
    single = Accountant([DiscreteGaussian.of(1, 1)], delta=1e-6)
    assert g_acc.rdp().epsilon == pytest.approx(single.rdp().epsilon)
    assert g_acc.basic().epsilon == pytest.approx(single.basic().epsilon)


def test_group_privacy() -> None:
    eps, delta = group_privacy(0.5, 1e-6, 3)
    assert eps == pytest.approx(1.5)
    assert delta == pytest.approx(1e-6 * (math.exp(1.5) - 1) / (math.exp(0.5) - 1))
    assert delta == pytest.approx(1e-6 * (1 + math.exp(0.5) + math.exp(1.0)))
    assert group_privacy(0.5, 1e-6, 1) == (0.5, 1e-6)
    acc = Accountant([DiscreteLaplace.of(10, 1)] * 4, delta=0, group_size=5)
    assert acc.report()["chosen"]["epsilon"] == pytest.approx(2.0)
    with pytest.raises(ConfigError):
        group_privacy(1, 0, 0)


def test_input_validation() -> None:
    with pytest.raises(ConfigError):
        Accountant([], delta=0)
    with pytest.raises(ConfigError, match="delta"):
        Accountant([DiscreteLaplace.of(1, 1)], delta=1)
    with pytest.raises(ConfigError):
        Parallel(())
