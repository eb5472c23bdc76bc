"""Multiparty DP: calibration for substitution, party files, and parties as separate runs.

- the calibration audit (Clopper–Pearson, REFERENCE.md) of one party's share under
  substitution of one person passes at scale 2/ε and says no at 1/ε (the add/remove scale);
- `combine_shares` / `privpipe multiparty aggregate` refuse mismatched, duplicate and
  missing party files;
- three parties run `privpipe run` separately on their own rows and the aggregate equals
  the one-process `local_dp` `parties:` simulation under the same --insecure-seed.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from privpipe.dp.multiparty import (
    PARTY_FORMAT,
    SUBSTITUTION_L1,
    TRUST_SEPARATE,
    combine_shares,
    l1_sensitivity,
    party_seed,
    party_share,
)
from privpipe.dp.noise import SecureSampler, SeededTestSampler, laplace_scale, planned_guarantee
from privpipe.errors import ConfigError, InputDataError, PrivacyRefusal
from tests.layout import release_dir
from tests.ledgers import provision_ledger
from tests.test_dp_noise import AUDIT_ALPHA, _epsilon_lb
from tests.test_local_dp_pipeline import DX, LDPProject, assert_refused_before_anything, ldp, run

# ----------------------------------------------------------------------------- calibration


AUDIT_N = 30_000  # pairs of cells per dataset; OpenDP draws 4n values


def _audit_substitution(sensitivity: int, epsilon: float, n: int = AUDIT_N) -> float:
    """ε lower bound for one party's 2-cell share, D = [1, 0] vs D' = [0, 1].

    D and D' differ by substituting one person's value (cell 0 → cell 1). The event
    S = {out₀ ≥ 1 and out₁ ≤ 0} has the largest likelihood ratio, e^{L1/b}: tight.
    """
    d = np.tile(np.array([1, 0], dtype=np.int64), n)
    d_prime = np.tile(np.array([0, 1], dtype=np.int64), n)
    both = party_share(np.concatenate([d, d_prime]), epsilon, SecureSampler(), sensitivity)
    out_d, out_dp = both[: 2 * n].reshape(n, 2), both[2 * n :].reshape(n, 2)
    k_d = int(((out_d[:, 0] >= 1) & (out_d[:, 1] <= 0)).sum())
    k_dp = int(((out_dp[:, 0] >= 1) & (out_dp[:, 1] <= 0)).sum())
    a = AUDIT_ALPHA / 2  # Bonferroni over the two directions
    return max(_epsilon_lb(k_d, k_dp, n, a), _epsilon_lb(k_dp, k_d, n, a))


def test_sensitivity_is_two_for_substitution_one_for_add_remove() -> None:
    assert SUBSTITUTION_L1 == l1_sensitivity("substitution") == 2
    assert l1_sensitivity("add_remove") == 1 and l1_sensitivity("substitution", 3) == 6
    with pytest.raises(ConfigError, match="neighbours"):
        l1_sensitivity("swap")
    # exact: the worst-case ratio of a share under substitution is e^{L1/b} = e^ε at b = 2/ε
    eps = 0.7
    b = laplace_scale(SUBSTITUTION_L1, eps)
    assert math.isclose(2 / b, eps)


def test_calibration_audit_passes_at_scale_two_over_epsilon() -> None:
    eps_lb = _audit_substitution(SUBSTITUTION_L1, 1.0)
    assert eps_lb <= 1.0, eps_lb
    assert eps_lb > 0.85, eps_lb  # the event is tight, so the audit would notice a bug


def test_calibration_audit_says_no_to_half_the_scale() -> None:
    # scale 1/ε: the add/remove calibration, really 2ε-DP under substitution
    eps_lb = _audit_substitution(1, 1.0)
    assert eps_lb > 1.0, eps_lb


# ----------------------------------------------------------------------------- party files


def _party(j: int, m: int = 3, **extra: Any) -> dict[str, Any]:
    counts = party_share(np.array([5, 3, 0]), 1.0, SeededTestSampler(j))
    return {
        "format": PARTY_FORMAT,
        "release_id": "flu",
        "party": j,
        "parties": m,
        "attribute": "dx",
        "domain": ["a", "b", "c"],
        "epsilon": 1.0,
        "neighbours": "substitution",
        "unit": "id",
        "mechanism": "discrete_laplace",
        "sensitivity": 2,
        "scale": 2.0,
        "counts": [int(c) for c in counts],
        "insecure_seed": None,
    } | extra


def test_combine_shares_sums_the_agreeing_parties() -> None:
    docs = [(f"p{j}.json", _party(j)) for j in (2, 0, 1)]  # any order
    est, head = combine_shares(docs)
    assert est.m == 3 and head["release_id"] == "flu"
    want = np.sum([_party(j)["counts"] for j in range(3)], axis=0)
    assert est.counts.tolist() == want.tolist()
    assert est.party_counts[0].tolist() == _party(0)["counts"]


@pytest.mark.parametrize(
    ("docs", "error", "message"),
    [
        ([_party(0), _party(1), _party(2, epsilon=2.0, scale=1.0)], InputDataError, "epsilon"),
        ([_party(0), _party(1), _party(2, domain=["a", "b", "x"])], InputDataError, "domain"),
        ([_party(0), _party(1), _party(2, parties=4)], InputDataError, "parties is 4"),
        ([_party(0), _party(1), _party(2, release_id="x")], InputDataError, "release_id"),
        ([_party(0), _party(1), _party(2, neighbours="add_remove")], InputDataError, "neighbours"),
        ([_party(0), _party(1), _party(1)], PrivacyRefusal, "party 1 was already given"),
        ([_party(0), _party(2)], InputDataError, "party file(s) of party 1 missing"),
        ([_party(0), _party(1), _party(3)], InputDataError, "party index 3 is not in 0..2"),
        ([_party(0), _party(1), _party(2, format="x")], InputDataError, "not a privpipe party"),
        (
            [_party(j, sensitivity=1, scale=1.0) for j in range(3)],
            PrivacyRefusal,
            "sensitivity 1 is below the L1 change 2",
        ),
        ([_party(j, scale=1.0) for j in range(3)], PrivacyRefusal, "noise scale 1.0"),
        ([_party(0), _party(1), _party(2, counts=[1, 2])], InputDataError, "3 integers"),
        ([_party(0), _party(1), _party(2, counts=[1, 2.5, 3])], InputDataError, "3 integers"),
        ([_party(j, scale="x") for j in range(3)], InputDataError, "must be numbers"),
    ],
)
def test_combine_shares_refuses(
    docs: list[dict[str, Any]], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        combine_shares([(f"p{i}.json", d) for i, d in enumerate(docs)])
    assert message in str(info.value), info.value


def test_party_seed_depends_on_seed_release_and_index_only() -> None:
    assert party_seed(None, "flu", 0) is None
    s = {party_seed(7, r, j) for r in ("flu", "cold") for j in range(3)}
    assert len(s) == 6 and party_seed(7, "flu", 1) == party_seed(7, "flu", 1)


# ----------------------------------------------------------------------------- separate runs

SEED = "23"


def _party_release(j: int, m: int = 3, **extra: Any) -> dict[str, Any]:
    return {
        "name": "share",
        "kind": "dp_party_histogram",
        "epsilon": 1.0,
        "attribute": "disease",
        "party": {"release_id": "flu", "index": j, "count": m},
    } | extra


@pytest.mark.slow
def test_three_party_runs_aggregate_to_the_one_process_simulation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the simulation: one process sees every party's rows (parties = regions)
    (tmp_path / "sim").mkdir()
    sim = LDPProject(tmp_path / "sim")
    config = sim.save([ldp("flu", epsilon=1.0, parties={"column": "region"})])
    provision_ledger(config)
    code, _, err = run(["run", str(config), "--insecure-seed", SEED], capsys)
    assert code == 0, err
    folder = release_dir(sim.out, "flu")
    simulated = pd.read_csv(folder / "multiparty.csv")
    g = planned_guarantee(json.loads((folder / "release.json").read_text()))["multiparty"]
    assert g["neighbours"] == "substitution" and g["unit"] == "id"
    assert g["trust"].startswith("simulation")

    # the same rows, one party per region (sorted, as the simulation numbers them), each
    # party its own project, data, ledger and run
    files = []
    for j, region in enumerate(sorted(sim.frame["region"].unique())):
        (tmp_path / f"party{j}").mkdir()
        p = LDPProject(tmp_path / f"party{j}")
        mine = sim.frame[sim.frame["region"] == region]
        mine.to_csv(p.root / "data.csv", index=False)
        p.cfg["name"] = f"visits-party{j}"  # each party is its own data holder with its ledger
        config = p.save([_party_release(j)])
        provision_ledger(config)
        code, out, err = run(["run", str(config), "--insecure-seed", SEED], capsys)
        assert code == 0, err
        assert "charged epsilon 1 to the ledger" in out
        assert p.entries() == [("share", "1", "committed", None)]
        share_dir = release_dir(p.out, "share")
        party = json.loads((share_dir / "party.json").read_text())
        assert party["party"] == j and party["parties"] == 3 and party["domain"] == DX
        assert party["sensitivity"] == 2 and party["scale"] == 2.0
        assert "id" not in json.dumps(party["counts"])  # counts only, no rows
        doc = json.loads((share_dir / "release.json").read_text())
        assert doc["guarantee"] == "none (insecure seed)" and not doc["verified"]
        assert planned_guarantee(doc) == {
            "epsilon": 1.0,
            "delta": 0.0,
            "model": "multiparty (one party's share)",
            "neighbours": "substitution",
            "unit": "id",
            "trust": TRUST_SEPARATE,
        }
        files.append(str(share_dir / "party.json"))

    agg = tmp_path / "agg"
    code, out, err = run(["multiparty", "aggregate", *files[::-1], "--output", str(agg)], capsys)
    assert code == 0, err
    assert "NOT private" in err  # the shares were seeded
    table = pd.read_csv(agg / "data.csv")
    assert table["value"].tolist() == DX
    np.testing.assert_array_equal(table["estimate"], simulated["estimate"])
    np.testing.assert_allclose(table["ci_high"], simulated["ci_high"], rtol=1e-12)
    doc = json.loads((agg / "release.json").read_text())
    assert doc["guarantee"] == "none (insecure seed)" and not doc["verified"]
    assert planned_guarantee(doc) == {
        "epsilon": 1.0,
        "delta": 0.0,
        "model": "multiparty",
        "parties": 3,
        "neighbours": "substitution",
        "unit": "id",
        "trust": TRUST_SEPARATE,
    }
    assert doc["insecure_seed"] == int(SEED)

    # the aggregator refuses a duplicate (exit 4) and a missing party (exit 3), writing nothing
    for args, want in (([*files, files[1]], 4), (files[:2], 3)):
        bad = tmp_path / f"bad{want}"
        code, _, err = run(["multiparty", "aggregate", *args, "--output", str(bad)], capsys)
        assert code == want, err
        assert not bad.exists()

    # a party that ran with another epsilon does not match (exit 3)
    other = copy.deepcopy(json.loads(Path(files[2]).read_text()))
    other.update(epsilon=2.0, scale=1.0)
    (tmp_path / "other.json").write_text(json.dumps(other))
    code, _, err = run(
        ["multiparty", "aggregate", *files[:2], str(tmp_path / "other.json"), "--output",
         str(tmp_path / "bad")],
        capsys,
    )  # fmt: skip
    assert code == 3 and "epsilon is 2.0" in err, err


@pytest.mark.parametrize(
    ("release", "message"),
    [
        (_party_release(3), "releases[0].party.index: 3 is not below party.count 3"),
        (_party_release(0, m=0), "releases[0].party.count: must be an integer >= 1"),
        (_party_release(0, epsilon=0), "releases[0].epsilon: must be a number > 0"),
        (
            _party_release(0) | {"party": {"index": 0, "count": 2}},
            "releases[0].party.release_id",
        ),
        (
            _party_release(0) | {"party": {"release_id": "f", "index": 0, "count": 2, "n": 1}},
            "releases[0].party.n: unknown key",
        ),
        (_party_release(0, attribute="code"), "releases[0].domain: the values of 'code'"),
    ],
)
def test_bad_party_config_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], release: dict[str, Any], message: str
) -> None:
    assert_refused_before_anything(tmp_path, capsys, release, message)
