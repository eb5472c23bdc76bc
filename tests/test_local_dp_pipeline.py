"""Local DP releases (`kind: local_dp`) through `privpipe run`, and `privpipe ldp aggregate`."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from privpipe import dp
from privpipe.dp.local import parameters
from privpipe.dp.local_release import PARTICIPATION, verify_local_release
from privpipe.dp.multiparty import TRUST_SIMULATION
from privpipe.pipelines.cli import main
from tests.layout import internal_file, release_dir
from tests.ledgers import provision_ledger
from tests.test_cli import assert_nothing_published

DX = ["Flu", "Cancer", "Asthma", "Gastritis"]
CODES = [f"c{i:02d}" for i in range(20)]
PERSONS = 400


class LDPProject:
    """Persons with 2 visits each; person-level attributes, so the truth is known."""

    def __init__(self, root: Path, unit: bool = True) -> None:
        self.root, self.config, self.out = root, root / "config.yaml", root / "out"
        self.ledger = root / "ledger.sqlite"
        rng = np.random.default_rng(5)
        pid = np.repeat(np.arange(PERSONS), 2)
        per_person = {
            "disease": rng.choice(DX, PERSONS, p=[0.4, 0.1, 0.2, 0.3]),
            "smoker": rng.choice(["yes", "no"], PERSONS, p=[0.3, 0.7]),
            "code": rng.choice(CODES, PERSONS),
            "region": rng.choice(["North", "South", "East"], PERSONS),
        }
        self.persons = pd.DataFrame(per_person)
        self.frame = pd.DataFrame({"id": [f"P{i:04d}" for i in pid]})
        for col, values in per_person.items():
            self.frame[col] = values[pid]
        self.frame.to_csv(root / "data.csv", index=False)
        (root / "h").mkdir()
        (root / "h" / "disease.csv").write_text("".join(f"{d};*\n" for d in DX))
        self.cfg: dict[str, Any] = {
            "name": "visits",
            "input": {"path": "data.csv", "batch_rows": 300},
            "schema": {"privacy_unit": "id" if unit else None},
            "hierarchies": {"disease": {"file": "h/disease.csv"}},
            "releases": [],
            "budget": {"ledger": "ledger.sqlite", "lifetime_epsilon": 100},
            "output": {"dir": "out"},
        }

    def save(self, releases: list[dict[str, Any]]) -> Path:
        self.cfg["releases"] = releases
        self.config.write_text(yaml.safe_dump(self.cfg, sort_keys=False))
        return self.config

    def entries(self) -> list[tuple[Any, ...]]:
        if not self.ledger.exists():
            return []
        with sqlite3.connect(self.ledger) as conn:
            return conn.execute(
                "SELECT release, epsilon, status, reason FROM entries ORDER BY id"
            ).fetchall()

    def release(self, name: str) -> tuple[pd.DataFrame, dict[str, Any]]:
        folder = release_dir(self.out, name)
        return pd.read_csv(folder / "data.csv"), json.loads((folder / "release.json").read_text())


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    if args[0] == "run":  # the operator created the ledger (`privpipe budget init`)
        provision_ledger(Path(args[1]))
    code = main(args)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def ldp(name: str, attribute: str = "disease", **extra: Any) -> dict[str, Any]:
    return {"name": name, "kind": "local_dp", "epsilon": 2.0, "attribute": attribute} | extra


ALL_PROTOCOLS = [
    ldp("auto4", write_reports=True),  # d = 4 at eps 2: grr
    ldp("auto20", "code", domain=CODES, write_reports=True, epsilon=1.0),  # d = 20, eps 1: oue
    ldp("auto2", "smoker", domain=["yes", "no"], write_reports=True),  # d = 2: rr
    ldp("rr", "smoker", domain=["yes", "no"], protocol="rr", write_reports=True),
    *[ldp(p, "code", domain=CODES, protocol=p, write_reports=True) for p in dp.local.PROTOCOLS[1:]],
    ldp("other", domain=["Flu", "Asthma"], other="__other__", write_reports=True),
    ldp("mp_even", parties={"count": 4}),
    ldp("mp_region", parties={"column": "region"}),
]


def test_every_protocol_runs_reports_round_trip_and_parties_compare_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = LDPProject(tmp_path)
    # a comparison run: every release a candidate (full release.json), charged to the
    # audit ledger (its own dataset id, visits.audit)
    p.cfg["budget"]["audit_ledger"] = "audit.sqlite"
    p.save(ALL_PROTOCOLS)
    code, out, err = run(["run", str(p.config), "--insecure-seed", "11"], capsys)
    assert code == 0, err
    assert "charged epsilon 27 to the ledger" in out  # 9 x 2 + 1 + 2 with parties x 4
    chosen = {}
    for r in ALL_PROTOCOLS:
        name = r["name"]
        table, doc = p.release(name)
        chosen[name] = doc["parameters"]["protocol"]
        # a seeded run: the check passed, but nothing is claimed (issue 12)
        assert doc["verified"] is False and doc["verification"]["ok"] is True
        assert doc["guarantee"] == "none (insecure seed)"
        eps = r["epsilon"]
        assert doc["planned_guarantee"] == {
            "epsilon": eps,
            "delta": 0.0,
            "model": "local",
            "unit": "id",
            "neighbours": "substitution",
            "participation": PARTICIPATION,
            **(
                {
                    "multiparty": {
                        "epsilon": 2.0,
                        "delta": 0.0,
                        "model": "multiparty",
                        "parties": 4 if name == "mp_even" else 3,
                        "neighbours": "substitution",
                        "unit": "id",
                        "trust": TRUST_SIMULATION,
                    },
                    "ledger_epsilon": 4.0,
                }
                if "parties" in r
                else {}
            ),
        }
        assert table.columns.tolist() == ["value", "estimate", "ci_low", "ci_high"]
        values = r.get("domain", DX) + ([r["other"]] if "other" in r else [])
        assert table["value"].tolist() == values
        assert doc["metrics"]["reports"] == PERSONS  # each person reports once
        # estimates near the per-person truth (seeded, so no flakiness): within 4.5 sd
        truth = p.persons[r["attribute"]].where(
            p.persons[r["attribute"]].isin(r.get("domain", DX)), r.get("other")
        )
        counts = truth.value_counts().reindex(values, fill_value=0).to_numpy()
        sd = (table["ci_high"] - table["estimate"]).to_numpy() / 1.959963984540054
        assert np.all(np.abs(table["estimate"].to_numpy() - counts) <= 4.5 * sd + 1e-9), name
        par = doc["parameters"]["oracle"]
        assert par["implied_epsilon"] == pytest.approx(eps)
        models = [e["model"] for e in doc["metrics"]["error_by_model"]]
        assert models[0] == "central" and models[-1] == f"local ({chosen[name]})"
        if r.get("write_reports"):
            collected = internal_file(p.out, "local_reports") / name / "reports.csv"
            reports = pd.read_csv(collected, dtype={"bits": str})
            assert set(reports.columns) <= {"key", "report", "bits"}  # never id or true value
            assert len(reports) == PERSONS
            est = tmp_path / f"{name}-est.csv"
            domain_arg = ",".join(values)
            code, _, err = run(
                ["ldp", "aggregate", str(collected),
                 "--protocol", chosen[name], "--epsilon", str(eps),
                 "--domain-size", str(len(values)),
                 "--domain", domain_arg, "--output", str(est)],
                capsys,
            )  # fmt: skip
            assert code == 0, err
            again = pd.read_csv(est)
            assert again["value"].tolist() == values
            np.testing.assert_allclose(again["estimate"], table["estimate"], rtol=1e-12)
            np.testing.assert_allclose(again["ci_high"], table["ci_high"], rtol=1e-12)
    assert chosen["auto4"] == "grr" and chosen["auto20"] == "oue" and chosen["auto2"] == "rr"
    assert {chosen[x] for x in ("grr", "sue", "oue", "blh", "olh", "rr")} == set(dp.local.PROTOCOLS)
    # multiparty: the same histogram, central < multiparty < local error
    for name, m in (("mp_even", 4), ("mp_region", 3)):
        _, doc = p.release(name)
        errors = {e["model"].split(" ")[0]: e for e in doc["metrics"]["error_by_model"]}
        assert errors["multiparty"]["parties"] == m
        assert (
            errors["central"]["std_error"]
            < errors["multiparty"]["std_error"]
            < errors["local"]["std_error"]
        )
        mp = pd.read_csv(release_dir(p.out, name) / "multiparty.csv")
        truth = p.persons["disease"].value_counts().reindex(DX).to_numpy()
        assert mp["value"].tolist() == DX
        assert np.all(
            np.abs(mp["estimate"].to_numpy() - truth) <= 4 * (mp["ci_high"] - mp["estimate"])
        )
    assert p.entries() == []  # nothing published: the dataset's ledger is not charged
    with sqlite3.connect(p.root / "audit.sqlite") as conn:
        entries = conn.execute(
            "SELECT release, epsilon, status, reason FROM entries ORDER BY id"
        ).fetchall()
    assert len(entries) == len(ALL_PROTOCOLS)
    assert ("mp_even", "4", "committed", None) in entries and (
        "rr",
        "2",
        "committed",
        None,
    ) in entries


@pytest.mark.parametrize("unit", [True, False])
def test_seeded_run_is_reproducible(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], unit: bool
) -> None:
    p = LDPProject(tmp_path, unit=unit)
    p.cfg["hierarchies"] = {}
    p.save([ldp("o", "code", domain=CODES, protocol="olh", write_reports=True)])
    outs = []
    for i in range(2):
        out = tmp_path / f"out{i}"
        code, _, err = run(
            ["run", str(p.config), "--output", str(out), "--insecure-seed", "4"], capsys
        )
        assert code == 0, err
        reports = pd.read_csv(internal_file(out, "local_reports") / "o" / "reports.csv")
        outs.append(
            (
                (release_dir(out, "o") / "data.csv").read_text(),
                reports.sort_values(["key", "report"]).reset_index(drop=True),
            )
        )
        doc = json.loads((release_dir(out, "o") / "release.json").read_text())
        assert doc["insecure_seed"] == 4
        assert "metrics" not in doc  # published: the exact number of reports is internal
        details = json.loads(internal_file(out, "manifest.json").read_text())["release_details"]
        assert details["o"]["metrics"]["reports"] == (PERSONS if unit else 2 * PERSONS)
    assert outs[0][0] == outs[1][0]
    pd.testing.assert_frame_equal(outs[0][1], outs[1][1])
    # another seed gives other reports
    code, _, _ = run(
        ["run", str(p.config), "--output", str(tmp_path / "x"), "--insecure-seed", "5"], capsys
    )
    assert code == 0
    assert (release_dir(tmp_path / "x", "o") / "data.csv").read_text() != outs[0][0]


@pytest.mark.parametrize(
    ("release", "message"),
    [
        (ldp("a", epsilon=0), "releases[0].epsilon: must be a number > 0.0, got 0"),
        (ldp("a", epsilon=-1.0), "releases[0].epsilon: must be a number > 0"),
        (ldp("a", epsilon=31.0), "releases[0].epsilon: local DP epsilon must be <= 30"),
        (ldp("a", protocol="rappor"), "releases[0].protocol: must be one of"),
        (ldp("a", domain=DX, protocol="rr"), "releases[0].protocol: rr (randomised response)"),
        (ldp("a", protocol="rr"), "releases[0].protocol: randomised response (rr) is for yes/no"),
        (ldp("a", "code"), "releases[0].domain: the values of 'code' must be public"),
        (ldp("a", domain=["x", "x"]), "releases[0].domain: 'x' is listed twice"),
        (ldp("a", domain=["x"]), "releases[0].domain: local DP needs at least 2 values"),
        (ldp("a", other="Flu", domain=DX), "releases[0].other: 'Flu' is already"),
        (ldp("a", parties={"count": 0}), "releases[0].parties.count: must be an integer >= 1"),
        (ldp("a", parties={}), "releases[0].parties: give exactly one of column or count"),
        (ldp("a", atribute="x"), "releases[0].atribute: unknown key; did you mean 'attribute'?"),
        (ldp("a", attribute="id"), "releases[0].attribute: 'id' is the privacy unit"),
    ],
)
def test_bad_local_config_is_exit_2_before_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], release: dict[str, Any], message: str
) -> None:
    assert_refused_before_anything(tmp_path, capsys, release, message)


def assert_refused_before_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], release: dict[str, Any], message: str
) -> None:
    """``release`` alone is exit 2 with ``message``, nothing charged, nothing published."""
    p = LDPProject(tmp_path)
    p.save([release])
    code, _, err = run(["run", str(p.config)], capsys)
    assert code == 2, err
    assert message in err, err
    assert p.entries() == []
    assert_nothing_published(p.out)


def test_missing_attribute_column_is_exit_3_and_spends_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = LDPProject(tmp_path)
    p.cfg["hierarchies"] = {}
    p.save([ldp("a", "blood_type", domain=["A", "B", "0", "AB"])])
    code, _, err = run(["run", str(p.config)], capsys)
    assert code == 3, err
    assert "blood_type" in err
    assert p.entries() == []  # the header is checked before the charge
    assert_nothing_published(p.out)


def test_value_outside_the_domain_is_exit_3_and_the_charge_is_marked_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = LDPProject(tmp_path)
    p.save([ldp("a", domain=["Flu", "Cancer", "Asthma"], write_reports=True)])
    code, _, err = run(["run", str(p.config), "--insecure-seed", "1"], capsys)
    assert code == 3, err
    assert "outside the public domain" in err and "other:" in err
    # local noise is drawn while reading, so the charge was recorded before: kept, failed
    [(name, eps, status, reason)] = p.entries()
    assert (name, eps, status) == ("a", "2", "failed") and "outside the public domain" in reason
    assert_nothing_published(p.out)


def test_verification_says_no_and_nothing_is_published(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = dp.local.OracleParameters.as_dict

    def raised_p(self: dp.local.OracleParameters) -> dict[str, Any]:
        doc = real(self)
        doc["p"] = min(0.99, doc["p"] * 1.5)  # a broken randomiser: p raised
        return doc

    monkeypatch.setattr(dp.local.OracleParameters, "as_dict", raised_p)
    p = LDPProject(tmp_path)
    p.save([ldp("a")])
    code, _, err = run(["run", str(p.config), "--insecure-seed", "1"], capsys)
    assert code == 4, err
    assert "failed its verification" in err and "above the configured 2" in err
    assert p.entries()[0][2] == "failed"
    assert_nothing_published(p.out)


def test_verifier_checks_epsilon_estimates_and_domain() -> None:
    par = parameters("grr", 1.0, 4).as_dict()
    support = np.array([40, 30, 20, 10])
    ok_table = pd.DataFrame({"value": list("abcd")})
    est = (support - 100 * par["q_star"]) / (par["p_star"] - par["q_star"])
    ok_table = ok_table.assign(estimate=est, ci_low=est - 1, ci_high=est + 1)
    assert verify_local_release(par, 1.0, list("abcd"), 100, support, ok_table)["ok"]
    # every broken piece is caught
    assert not verify_local_release({**par, "p": 0.9}, 1.0, list("abcd"), 100, support, ok_table)[
        "ok"
    ]
    assert not verify_local_release(par, 0.5, list("abcd"), 100, support, ok_table)["ok"]
    assert not verify_local_release(par, 1.0, list("abcde"), 100, support, ok_table)["ok"]
    shifted = ok_table.assign(estimate=ok_table["estimate"] + 3)
    assert not verify_local_release(par, 1.0, list("abcd"), 100, support, shifted)["ok"]
    assert not verify_local_release(par, 1.0, list("abcd"), 99, support, ok_table)["ok"]
    mp = {"epsilon": 1.0, "scale": 0.5, "sensitivity": 1, "parties": 3}
    assert not verify_local_release(par, 1.0, list("abcd"), 100, support, ok_table, mp)["ok"]
    # substitution of one person moves a histogram by L1 = 2: scale 2/ε passes, the
    # add/remove calibration 1/ε does not
    mp = {"epsilon": 1.0, "scale": 2.0, "sensitivity": 2, "parties": 3}
    assert verify_local_release(par, 1.0, list("abcd"), 100, support, ok_table, mp)["ok"]
    mp = {"epsilon": 1.0, "scale": 1.0, "sensitivity": 1, "parties": 3}
    check = verify_local_release(par, 1.0, list("abcd"), 100, support, ok_table, mp)
    assert not check["ok"] and "below the L1 change 2" in check["problems"][0]


def test_verifier_refuses_an_interval_that_states_the_number_of_persons() -> None:
    """The interval from the number of reports (n) lets anyone solve for n; the published
    one must be computed from the estimates alone, and the verifier says no otherwise."""
    par = parameters("oue", 1.0, 4).as_dict()
    support = np.array([60, 45, 40, 30])
    est = dp.local.estimate("oue", 1.0, 4, 100, support, beta=0.05)
    table = pd.DataFrame({"value": list("abcd"), "estimate": est.counts})
    by_n = table.assign(ci_low=est.counts - est.halfwidth, ci_high=est.counts + est.halfwidth)
    check = verify_local_release(par, 1.0, list("abcd"), 100, support, by_n, confidence=0.95)
    assert not check["ok"] and "number of persons" in check["problems"][0]
    half = dp.local.public_halfwidth(est.parameters, est.counts, 0.05)
    public = table.assign(ci_low=est.counts - half, ci_high=est.counts + half)
    assert verify_local_release(par, 1.0, list("abcd"), 100, support, public, confidence=0.95)["ok"]
    assert not np.allclose(half, est.halfwidth)  # n̂ = Σ ĉ is not n here


def test_ldp_aggregate_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reports = tmp_path / "reports.csv"
    pd.DataFrame({"report": [0, 1, 3, 2]}).to_csv(reports, index=False)
    base = ["ldp", "aggregate", str(reports), "--epsilon", "1", "--domain-size", "4"]
    code, out, err = run([*base, "--protocol", "grr"], capsys)
    assert code == 0, err
    assert out.splitlines()[0] == "value,estimate,ci_low,ci_high" and len(out.splitlines()) == 5
    cases = [
        ([*base, "--protocol", "rappor"], 2, "--protocol: unknown local DP protocol"),
        ([*base, "--protocol", "grr", "--domain", "a,b"], 2, "--domain: 2 value(s) given"),
        ([*base, "--protocol", "rr"], 2, "yes/no"),
        ([*base, "--protocol", "oue"], 3, "need column(s) ['bits']"),
        (["ldp", "aggregate", str(tmp_path / "nope.csv"), "--protocol", "grr", "--epsilon", "1",
          "--domain-size", "4"], 3, "no such reports file"),
        (["ldp", "aggregate", str(reports), "--protocol", "grr", "--epsilon", "0",
          "--domain-size", "4"], 2, "--epsilon: must be a finite number > 0"),
        (["ldp", "aggregate", str(reports), "--protocol", "grr", "--epsilon", "1",
          "--domain-size", "3"], 3, "outside [0, 3)"),
        (["ldp", "aggregate", str(reports), "--epsilon", "1", "--domain-size", "3"], 2,
         "required: --protocol"),
    ]  # fmt: skip
    for args, want, message in cases:
        code, _, err = run(args, capsys)
        assert code == want, (args, err)
        assert message in err, (args, err)


@pytest.mark.parametrize("unit", [None, "pid"])
def test_reports_are_written_in_a_random_order(tmp_path: Path, unit: str | None) -> None:
    """The collected reports (no id, no true value) are written shuffled: with a near
    deterministic oracle (epsilon 20) on input sorted by value, the reports follow neither
    the input's order nor the shards' (unseeded: a shard keeps its rows' order), yet are the
    same multiset of values."""
    import apache_beam as beam

    from privpipe.dp.local import FrequencyOracle
    from privpipe.transforms.local_dp import LocalDPSpec, PerturbLocalDP

    n, domain = 3000, tuple(f"v{i}" for i in range(10))
    values = [domain[i * len(domain) // n] for i in range(n)]  # sorted by value
    frame = pd.DataFrame({"a": values, "pid": [f"p{i:05d}" for i in range(n)]})
    batches = [frame.iloc[i : i + 500].reset_index(drop=True) for i in range(0, n, 500)]
    spec = LocalDPSpec(
        "r", FrequencyOracle.create("grr", 20.0, len(domain)), "a", domain, None, unit,
        write_reports=True,
    )  # fmt: skip
    with beam.Pipeline() as p:
        _ = (
            p
            | beam.Create(batches, reshuffle=False)
            | PerturbLocalDP(spec, str(tmp_path / "r.pickle"), str(tmp_path / "reports"))
        )
    written = pd.read_csv(tmp_path / "reports" / "reports.csv")["report"].to_numpy()
    assert len(written) == n
    # nearly every report is its true value's code: the multiset is the input's
    assert abs(np.bincount(written, minlength=10) - n // 10).max() <= 5
    # sorted input would give ~n-10 non-decreasing steps; a random order about half
    steps = int((np.diff(written) >= 0).sum())
    assert steps < 0.65 * n, steps
