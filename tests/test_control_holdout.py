"""Held-out control records (attacks.control): the selection rule, the split in the
pipeline (no held-out person in any release; the attacks get members as ``raw`` and the
others as ``control``), a control file, config errors, and ``privpipe report``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import yaml

from privpipe.attacks.control import holdout_mask, key_from_hex, new_holdout_key
from privpipe.attacks.matching import WEIGHT, expand_rows, frequency_table
from privpipe.errors import ConfigError
from privpipe.pipelines.cli import main
from tests.layout import internal_file, release_dir
from tests.ledgers import provision_ledger

# ------------------------------------------------------------------ the rule (pure)


def test_share_is_close_to_the_request_on_100k_units() -> None:
    units = pd.DataFrame({"pid": np.arange(100_000)})
    for share in (0.05, 0.1, 0.5):
        got = holdout_mask(units, share, new_holdout_key(), "pid").mean()
        # binomial sd at 100k is <= 0.0016; 5 sd
        assert abs(got - share) < 0.008, (share, got)


def test_every_row_of_a_unit_goes_the_same_way() -> None:
    rng = np.random.default_rng(1)
    pid = rng.integers(0, 5_000, 40_000)
    batch = pd.DataFrame({"pid": pid, "x": rng.integers(0, 100, pid.size)})
    mask = holdout_mask(batch, 0.3, new_holdout_key(), "pid")
    sides = pd.Series(mask).groupby(pid).nunique()
    assert (sides == 1).all()
    assert 0 < mask.mean() < 1
    # batches split independently: the same rows cut into pieces split the same way
    key = new_holdout_key()
    whole = holdout_mask(batch, 0.3, key, "pid")
    pieces = np.concatenate(
        [holdout_mask(batch.iloc[i : i + 7_000], 0.3, key, "pid") for i in range(0, 40_000, 7_000)]
    )
    assert np.array_equal(whole, pieces)


def test_two_keys_choose_different_units_and_one_key_is_deterministic() -> None:
    units = pd.DataFrame({"pid": np.arange(20_000)})
    k1, k2 = new_holdout_key(), new_holdout_key()
    assert k1 != k2
    a, b = holdout_mask(units, 0.2, k1, "pid"), holdout_mask(units, 0.2, k2, "pid")
    assert np.array_equal(a, holdout_mask(units, 0.2, k1, "pid"))
    overlap = (a & b).sum() / a.sum()
    assert overlap < 0.3  # independent keys: about 0.2 of one side is on the other's
    assert not np.array_equal(a, b)


def test_without_a_unit_the_whole_row_is_hashed() -> None:
    rows = pd.DataFrame({"a": np.arange(10_000) % 50, "b": np.arange(10_000) // 50})
    key = new_holdout_key()
    mask = holdout_mask(rows, 0.25, key)
    assert abs(mask.mean() - 0.25) < 0.03
    same_a = holdout_mask(rows, 0.25, key, "a")  # unit a: only 50 distinct values
    assert not np.array_equal(mask, same_a)


def test_the_keyed_hash_is_aes_of_each_values_fingerprint() -> None:
    """Known answer, computed here with ``cryptography`` one value at a time: AES-128 under
    SHA-256(context + key)[:16] of the block (fingerprint, 0), its first 8 bytes."""
    import hashlib

    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    from privpipe.attacks.control import _AES_KEY_CONTEXT, keyed_hashes
    from privpipe.hashing import string_hashes

    key = new_holdout_key()
    ids = pd.Series(["P0000001", "P0000002", "zoë", ""], dtype="str")
    aes = hashlib.sha256(_AES_KEY_CONTEXT + key.encode()).digest()[:16]
    expected = []
    for fingerprint in string_hashes(ids).tolist():
        block = int(fingerprint).to_bytes(8, "little") + bytes(8)
        sealed = Cipher(algorithms.AES(aes), modes.ECB()).encryptor().update(block)
        expected.append(int.from_bytes(sealed[:8], "little"))
    assert keyed_hashes(ids, key).tolist() == expected


def test_a_person_hashes_the_same_whatever_the_columns_storage() -> None:
    key = new_holdout_key()
    ids = ["P1", "P2", None, "P1", "Q9"]
    want = keyed_hashes_of(pd.Series(ids, dtype="str"), key)
    for other in (
        pd.Series(ids, dtype=object),
        pd.Series(ids, dtype="string[pyarrow]"),
        pd.Series(pd.arrays.ArrowExtensionArray(pa.array(ids, type=pa.large_string()))),
    ):
        assert keyed_hashes_of(other, key).tolist() == want.tolist()
    assert want[0] == want[3] and len(set(want.tolist())) == 4
    # a missing value is one value whatever its column's type (a float NaN, an object None)
    nan = keyed_hashes_of(pd.Series([np.nan, 1.0]), key)[0]
    assert nan == keyed_hashes_of(pd.Series([None, "x"], dtype=object), key)[0] == want[2]
    # rows: the same values in two frames of different storage, the same row hashes
    a = pd.DataFrame({"x": pd.Series(ids, dtype="str"), "n": [1, 2, 3, 1, 5]})
    b = pd.DataFrame({"x": pd.Series(ids, dtype=object), "n": [1, 2, 3, 1, 5]})
    assert keyed_hashes_of(a, key).tolist() == keyed_hashes_of(b, key).tolist()
    assert keyed_hashes_of(a, key)[0] == keyed_hashes_of(a, key)[3]


def keyed_hashes_of(values: pd.Series | pd.DataFrame, key: str) -> np.ndarray:
    from privpipe.attacks.control import keyed_hashes

    return keyed_hashes(values, key)


def test_bad_share_or_key_is_refused() -> None:
    units = pd.DataFrame({"pid": [1, 2]})
    with pytest.raises(ValueError):
        holdout_mask(units, 0.6, new_holdout_key(), "pid")
    with pytest.raises(ValueError):
        holdout_mask(units, 0.1, "short", "pid")


# ------------------------------------------------------------------ the pipeline

PERSONS = 600


def visits(persons: range, seed: int) -> pd.DataFrame:
    """Persons with 1-2 visits each; the diagnosis names the person (traceable in a table)."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in persons:
        for v in range(1 + (p % 3 == 0)):
            rows.append(
                {
                    "person_id": f"p{p:05d}",
                    "zip": f"4767{rng.integers(0, 4)}",
                    "age": int(rng.integers(20, 80)),
                    "sex": "F" if rng.random() < 0.5 else "M",
                    "diagnosis": f"d{p:05d}v{v}",
                }
            )
    return pd.DataFrame(rows)


def write_config(tmp: Path, control: Any, data: pd.DataFrame | None = None) -> Path:
    data = visits(range(PERSONS), 0) if data is None else data
    data.to_csv(tmp / "visits.csv", index=False)
    cfg = {
        "name": "visits",
        "input": {"path": "visits.csv"},
        "schema": {
            "quasi_identifiers": ["zip", "age", "sex"],
            "sensitive": "diagnosis",
            "privacy_unit": "person_id",
            "types": {"age": "integer"},
        },
        "hierarchies": {
            "zip": {"mask": {"digits": 5}},
            "age": {"intervals": {"widths": [10, 20], "lower": 0, "upper": 120}},
            "sex": {"groups": [{"F": "*", "M": "*"}]},
        },
        "releases": [
            {"name": "k2", "kind": "k_anonymity", "k": 2, "suppression_limit": 0.5},
            {
                "name": "dp_total",
                "kind": "dp_count",
                "epsilon": 8.0,
                "max_contributions_per_partition": 2,
            },
            {
                "name": "ldp_sex",
                "kind": "local_dp",
                "epsilon": 1.0,
                "attribute": "sex",
                "protocol": "grr",
                "write_reports": True,
            },
        ],
        "publish": ["k2"],
        "attacks": {"run": ["homogeneity"], **({"control": control} if control else {})},
        "budget": {
            "ledger": str(tmp / "ledger.sqlite"),
            "lifetime_epsilon": 100,
            "heads_file": str(tmp / "heads.json"),
        },
        "output": {"dir": "out"},
    }
    path = tmp / "visits.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    provision_ledger(path)
    return path


@pytest.fixture(scope="module")
def holdout_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, dict[str, Any], Path]:
    """One run with holdout 0.3, ``run_attacks`` spied on (what the attacks received)."""
    import privpipe.pipelines.run as run_module

    tmp = tmp_path_factory.mktemp("holdout")
    config = write_config(tmp, {"holdout": 0.3})
    seen: dict[str, Any] = {}
    real = run_module.run_attacks

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen["raw"], seen["control"] = args[2].copy(), kwargs.get("control")
        seen["args"], seen["kwargs"] = args, kwargs
        return real(*args, **kwargs)

    mp = pytest.MonkeyPatch()
    mp.setattr(run_module, "run_attacks", spy)
    try:
        assert main(["run", str(config), "--insecure-seed", "7"]) == 0
    finally:
        mp.undo()
    return tmp / "out", seen, config


def held_out_persons(out: Path, data: pd.DataFrame) -> set[str]:
    """The held-out persons, recomputed from the run's key (the test's oracle)."""
    key = key_from_hex(internal_file(out, "holdout.key").read_text())
    typed = data.assign(person_id=data["person_id"].astype("string[pyarrow]"))
    mask = holdout_mask(typed, 0.3, key, "person_id")
    return set(data.loc[mask, "person_id"])


@pytest.mark.slow
def test_no_held_out_person_is_in_any_release(holdout_run: tuple[Path, Any, Path]) -> None:
    out, _, _ = holdout_run
    data = visits(range(PERSONS), 0)
    held = held_out_persons(out, data)
    assert 0.2 * PERSONS < len(held) < 0.4 * PERSONS
    members = data[~data["person_id"].isin(held)]
    controls = data[data["person_id"].isin(held)]
    # the anonymised table: every published diagnosis is a member's, none a control's
    table = pd.read_csv(release_dir(out, "k2") / "data.csv", dtype=str)
    published = set(table["diagnosis"])
    assert published <= set(members["diagnosis"])
    assert not published & set(controls["diagnosis"])
    assert len(table) == len(members)  # suppressed rows are published as '*' rows
    # the DP total (epsilon 8, one cell): the members' rows, not the input's
    total = pd.read_csv(release_dir(out, "dp_total") / "data.csv")["count"].sum()
    assert abs(total - len(members)) <= 5 < abs(total - len(data)) - 5
    # the local DP reports: one per member person
    reports = pd.read_csv(internal_file(out, "local_reports") / "ldp_sex" / "reports.csv")
    assert len(reports) == members["person_id"].nunique()


@pytest.mark.slow
def test_attacks_get_members_as_raw_and_the_others_as_control(
    holdout_run: tuple[Path, Any, Path],
) -> None:
    out, seen, _ = holdout_run
    data = visits(range(PERSONS), 0)
    held = held_out_persons(out, data)
    members = data[~data["person_id"].isin(held)]
    controls = data[data["person_id"].isin(held)]
    raw, control = seen["raw"], seen["control"]
    assert control is not None
    # the members as a frequency table (never every row staged), the controls' records
    assert list(control.columns) == ["zip", "age", "sex", "diagnosis"]
    assert list(raw.columns) == ["zip", "age", "sex", "diagnosis", WEIGHT]
    assert sorted(expand_rows(raw)["diagnosis"].astype(str)) == sorted(members["diagnosis"])
    assert sorted(control["diagnosis"].astype(str)) == sorted(controls["diagnosis"])
    audit = json.loads(internal_file(out, "audit.json").read_text())
    assert audit["attacker"]["control"] == {
        "source": "holdout", "share": 0.3, "records": len(controls)
    }  # fmt: skip
    assert audit["attacker"]["records"] == len(members)
    manifest = json.loads(internal_file(out, "manifest.json").read_text())
    assert manifest["rows_held_out"] == len(controls)
    assert manifest["rows_accepted"] == len(data)
    assert manifest["profile"]["rows"] == len(members)


@pytest.mark.slow
def test_the_frequency_table_gives_the_rows_figures(holdout_run: tuple[Path, Any, Path]) -> None:
    """The staged frequency table (never every row) and the rows it stands for give the
    same attacks, common attacker and publication attacks on the same targets."""
    from privpipe.pipelines.audit import run_attacks, run_common
    from privpipe.pipelines.pubattacks import publication_attacks

    _, seen, _ = holdout_run
    plan, loaded, table, hierarchies = seen["args"][:4]
    control, targets = seen["kwargs"]["control"], seen["kwargs"]["targets"]
    assert WEIGHT in table.columns and targets is not None
    # every row twice: the table's weights are 2, its size that of the distinct rows
    rows = pd.concat([expand_rows(table)] * 2, ignore_index=True)
    table = frequency_table(rows, [c for c in table.columns if c != WEIGHT])
    assert len(table) < len(rows) and set(table[WEIGHT]) == {2}

    def plain(found: Any) -> Any:
        return {n: {a: r.as_dict() for a, r in f.items()} for n, f in found.items()}

    summed = run_attacks(plan, loaded, table, hierarchies, control=control, targets=targets)
    whole = run_attacks(plan, loaded, rows, hierarchies, control=control, targets=targets)
    assert plain(summed) == plain(whole)
    assert run_common(plan, loaded, table, hierarchies, control, targets) == run_common(
        plan, loaded, rows, hierarchies, control, targets
    )
    assert publication_attacks(plan, loaded, table, hierarchies, None, targets) == (
        publication_attacks(plan, loaded, rows, hierarchies, None, targets)
    )


def _ints(doc: Any) -> set[int]:
    if isinstance(doc, dict):
        return set().union(*(_ints(v) for v in doc.values())) if doc else set()
    if isinstance(doc, list):
        return set().union(*(_ints(v) for v in doc)) if doc else set()
    return {doc} if isinstance(doc, int) and not isinstance(doc, bool) else set()


@pytest.mark.slow
def test_public_holds_no_key_and_no_control_count(holdout_run: tuple[Path, Any, Path]) -> None:
    out, _, _ = holdout_run
    data = visits(range(PERSONS), 0)
    key_file = internal_file(out, "holdout.key")
    assert oct(os.stat(key_file).st_mode & 0o777) == "0o600"
    key_hex = key_file.read_text().strip()
    files = [f for f in (out / "public").rglob("*") if f.is_file()]
    assert files
    for f in files:
        text = f.read_text(errors="replace")
        assert key_hex not in text
        for word in ("holdout", "control", "held"):
            assert word not in text, (f, word)
        if f.name == "release.json":
            # members are published (the table's length); the input's size, which would
            # give the number held out, is not
            assert len(data) not in _ints(json.loads(text)), f
    manifest = json.loads(internal_file(out, "manifest.json").read_text())
    assert manifest["rows_held_out"] == len(data) - manifest["profile"]["rows"] > 0


@pytest.mark.slow
def test_report_rebuilds_with_members_only(
    holdout_run: tuple[Path, Any, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from privpipe import reports

    out, _, _ = holdout_run
    data = visits(range(PERSONS), 0)
    held = held_out_persons(out, data)
    members = data[~data["person_id"].isin(held)]
    seen: dict[str, pd.DataFrame] = {}
    real = reports.audit_run

    def spy(run: Any, raw: pd.DataFrame, **kwargs: Any) -> Any:
        seen["raw"] = raw
        return real(run, raw, **kwargs)

    monkeypatch.setattr(reports, "audit_run", spy)
    assert main(["report", str(out)]) == 0
    # the rebuilt utility truth is the members' rows, split again with the run's key
    assert sorted(seen["raw"]["diagnosis"].astype(str)) == sorted(members["diagnosis"])
    after = json.loads(internal_file(out, "audit.json").read_text())
    assert after["attacker"]["control"]["records"] == len(data) - len(members)
    # the run's key as an older privpipe wrote it (bare hex: another holdout rule): the
    # rebuild is refused with exit 3 naming the file, and the run is left as it was
    key_file = internal_file(out, "holdout.key")
    text, audit = key_file.read_text(), internal_file(out, "audit.json").read_bytes()
    try:
        key_file.write_text(text.split()[-1] + "\n")
        capsys.readouterr()
        assert main(["report", str(out)]) == 3
        err = capsys.readouterr().err
        assert "holdout.key" in err and "older privpipe" in err, err
    finally:
        key_file.write_text(text)
    assert internal_file(out, "audit.json").read_bytes() == audit


def test_report_on_a_holdout_run_without_its_key_is_refused(tmp_path: Path) -> None:
    from privpipe.errors import InputDataError
    from privpipe.pipelines.control import read_key

    (tmp_path / "internal").mkdir()
    with pytest.raises(InputDataError, match="holdout key"):
        read_key(tmp_path)


def test_a_key_file_of_an_older_rule_is_refused_naming_it(tmp_path: Path) -> None:
    from privpipe.attacks.control import KEY_SCHEME, key_to_hex
    from privpipe.errors import InputDataError
    from privpipe.pipelines.control import read_key, write_key

    (tmp_path / "internal").mkdir()
    key = new_holdout_key()
    write_key(tmp_path / "internal", key)
    text = internal_file(tmp_path, "holdout.key").read_text()
    assert text.split() == [KEY_SCHEME, key.encode("ascii").hex()] == key_to_hex(key).split()
    assert read_key(tmp_path) == key
    # a key file from before the rule was named (pandas' SipHash): the same key would hold
    # out other persons, so the rebuild is refused rather than run on the wrong members
    internal_file(tmp_path, "holdout.key").write_text(key.encode("ascii").hex() + "\n")
    with pytest.raises(InputDataError, match=r"older privpipe.*version that made the run"):
        read_key(tmp_path)
    internal_file(tmp_path, "holdout.key").write_text("sip24 " + key.encode("ascii").hex())
    with pytest.raises(InputDataError, match="rule 'sip24'"):
        read_key(tmp_path)
    internal_file(tmp_path, "holdout.key").write_text(f"{KEY_SCHEME} zz")
    with pytest.raises(InputDataError, match="missing or damaged"):
        read_key(tmp_path)


# ------------------------------------------------------------------ a control file, errors


@pytest.mark.slow
def test_a_control_file_is_read_and_handed_to_the_attacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import privpipe.pipelines.run as run_module

    config = write_config(tmp_path, {"file": "later.csv"}, visits(range(200), 0))
    visits(range(1000, 1050), 5).to_csv(tmp_path / "later.csv", index=False)
    seen: dict[str, Any] = {}
    real = run_module.run_attacks

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen["raw"], seen["control"] = args[2], kwargs.get("control")
        return real(*args, **kwargs)

    monkeypatch.setattr(run_module, "run_attacks", spy)
    assert main(["run", str(config), "--insecure-seed", "3"]) == 0
    later = visits(range(1000, 1050), 5)
    assert sorted(seen["control"]["diagnosis"].astype(str)) == sorted(later["diagnosis"])
    assert len(seen["raw"]) == len(visits(range(200), 0))  # nothing held out of the input
    audit = json.loads(internal_file(tmp_path / "out", "audit.json").read_text())
    assert audit["attacker"]["control"] == {"source": "file", "share": None, "records": len(later)}
    assert not internal_file(tmp_path / "out", "holdout.key").exists()


@pytest.mark.slow
def test_a_bad_row_in_the_control_file_names_the_file(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"file": "later.csv"}, visits(range(200), 0))
    later = visits(range(1000, 1020), 5).astype(str)
    later.loc[3, "age"] = "forty"
    later.to_csv(tmp_path / "later.csv", index=False)
    assert main(["run", str(config), "--insecure-seed", "3"]) == 3
    assert not (tmp_path / "out" / "public").exists()


def test_a_missing_control_file_is_exit_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, {"file": "nowhere.csv"}, visits(range(20), 0))
    assert main(["run", str(config)]) == 2
    err = capsys.readouterr().err
    assert "attacks.control.file" in err and "nowhere.csv" in err


@pytest.mark.parametrize(
    "control",
    [{"holdout": 0.6}, {"holdout": 0}, {"holdout": 0.1, "file": "x.csv"}, {}, {"share": 0.1}],
)
def test_bad_control_config_is_exit_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], control: dict[str, Any]
) -> None:
    config = write_config(tmp_path, None, visits(range(20), 0))
    cfg = yaml.safe_load(config.read_text())
    cfg["attacks"]["control"] = control
    config.write_text(yaml.safe_dump(cfg))
    assert main(["validate", str(config)]) == 2
    assert "attacks.control" in capsys.readouterr().err


def test_control_needs_qis_and_a_sensitive_attribute() -> None:
    from privpipe.pipelines.config import validate_config

    cfg = {
        "name": "x",
        "input": {"path": "x.csv"},
        "schema": {"quasi_identifiers": ["zip"]},
        "attacks": {"control": {"holdout": 0.1}},
        "output": {"dir": "out"},
    }
    with pytest.raises(ConfigError, match=r"attacks\.control"):
        validate_config(cfg, "x.yaml")
