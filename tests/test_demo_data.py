"""Tests of the seeded demo microdata generator and its hierarchy files."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from privpipe.pipelines import demo_data as dd

N = 20_000
HIERARCHY_FILES = ("sex", "race", "education", "marital-status", "occupation", "diagnosis")


@pytest.fixture(scope="module")
def df() -> pd.DataFrame:
    return dd.generate(N)


@pytest.fixture(scope="module")
def persons(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop_duplicates("person_id")


def read_hierarchy(name: str) -> list[list[str]]:
    """Rows of an ARX hierarchy file, parsed with plain Python (no dependency on anonymity/)."""
    raw = (dd.hierarchy_dir() / f"{name}.csv").read_bytes()
    assert b"\r" not in raw, "LF line endings only"
    assert raw.endswith(b"\n")
    return [line.split(";") for line in raw.decode("utf-8").splitlines()]


# --------------------------------------------------------------------------- generate


def test_deterministic_for_a_seed_and_different_across_seeds() -> None:
    a = dd.generate(3_000, seed=7)
    pd.testing.assert_frame_equal(a, dd.generate(3_000, seed=7))
    b = dd.generate(3_000, seed=8)
    assert not a.equals(b)
    assert (a["age"].to_numpy() != b["age"].to_numpy()).mean() > 0.5


def test_default_seed_is_the_documented_one() -> None:
    pd.testing.assert_frame_equal(dd.generate(500), dd.generate(500, seed=20261122))


@pytest.mark.parametrize("n", [0, 1, 7, 120_000])  # 120k rows span two internal blocks
def test_exact_row_count(n: int) -> None:
    out = dd.generate(n)
    assert len(out) == n
    assert tuple(out.columns) == dd.DEMO_COLUMNS
    assert {c: str(t) for c, t in out.dtypes.items()} == dict(dd.DEMO_DTYPES)
    number = out["person_id"].str[1:].astype(int)
    assert number.diff().dropna().isin([0, 1]).all()  # ids continue across blocks


def test_negative_rows_refused() -> None:
    with pytest.raises(ValueError, match="n_rows"):
        dd.generate(-1)


def test_smaller_table_is_a_prefix_of_a_larger_one(df: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(dd.generate(1_234), df.head(1_234))


def test_columns_and_dtypes(df: pd.DataFrame) -> None:
    assert tuple(df.columns) == dd.DEMO_COLUMNS
    assert set(dd.DEMO_QUASI_IDENTIFIERS) | {dd.DEMO_SENSITIVE, "person_id"} <= set(df.columns)
    assert dd.DEMO_SENSITIVE == "diagnosis"
    assert {c: str(t) for c, t in df.dtypes.items()} == dict(dd.DEMO_DTYPES)
    assert not df.isna().any().any()
    assert df["person_id"].str.fullmatch(r"P\d{7}").all()
    assert df["age"].between(0, 95).all()
    assert df["salary"].ge(0).all()
    dates = pd.to_datetime(df["visit_date"], format="%Y-%m-%d")
    assert dates.dt.year.eq(2024).all()


def test_zip_codes_are_clustered_strings_with_leading_zeros(df: pd.DataFrame) -> None:
    assert df["zip"].str.fullmatch(r"\d{5}").all()
    assert set(df["zip"]) <= set(dd.DEMO_ZIP_CODES)
    assert 50 <= len(dd.DEMO_ZIP_CODES) <= 70
    assert len(set(dd.DEMO_ZIP_CODES)) == len(dd.DEMO_ZIP_CODES)
    regions = {z[:3] for z in dd.DEMO_ZIP_CODES}
    assert 6 <= len(regions) <= 10
    assert df["zip"].str.startswith("0").mean() > 0.1  # leading zeros survive
    assert df["zip"].str[:3].nunique() == len(regions)


def test_person_quasi_identifiers_and_salary_are_constant(df: pd.DataFrame) -> None:
    per_person = df.groupby("person_id")[[*dd.DEMO_QUASI_IDENTIFIERS, "salary"]].nunique()
    assert per_person.eq(1).all().all()
    # Rows are grouped by person (ids consecutive from P0000001), visits in date order.
    number = df["person_id"].str[1:].astype(int)
    assert number.iloc[0] == 1
    assert number.diff().dropna().isin([0, 1]).all()
    same = number.diff().eq(0)
    assert (df["visit_date"] >= df["visit_date"].shift())[same].all()


def test_some_persons_have_several_visits(df: pd.DataFrame) -> None:
    visits = df.groupby("person_id").size()
    assert 0.6 <= visits.eq(1).mean() <= 0.8  # about 70% of persons have one visit
    assert visits.max() <= 10
    assert visits.ge(5).sum() > 100
    # Diagnosis mostly repeats for a person, but not always.
    multi = df[df["person_id"].map(visits).ge(2)]
    distinct = multi.groupby("person_id")["diagnosis"].nunique()
    assert 0.4 <= distinct.eq(1).mean() <= 0.9


def test_age_pyramid_is_adult_heavy(persons: pd.DataFrame) -> None:
    age = persons["age"]
    assert 0.15 <= (age < 18).mean() <= 0.3
    assert 0.1 <= (age >= 65).mean() <= 0.3
    assert age.min() == 0 and age.max() >= 90


def test_diagnosis_is_skewed(df: pd.DataFrame) -> None:
    shares = df["diagnosis"].value_counts(normalize=True)
    assert shares.iloc[0] >= 0.15
    assert shares.min() < 0.01
    assert 14 <= len(shares) <= 20


def test_diagnosis_depends_on_sex_and_age(df: pd.DataFrame) -> None:
    female = df["sex"].eq("Female")
    assert not df.loc[female, "diagnosis"].eq("Prostate cancer").any()
    breast = df.loc[df["diagnosis"].eq("Breast cancer"), "sex"]
    assert breast.eq("Female").mean() > 0.9
    child = df["age"] < 16
    flu_child = df.loc[child, "diagnosis"].eq("Flu").mean()
    flu_senior = df.loc[df["age"] >= 65, "diagnosis"].eq("Flu").mean()
    assert flu_child > 1.5 * flu_senior
    assert df.loc[child, "diagnosis"].isin(["Heart disease", "Hypertension"]).mean() < 0.02


def test_children_have_no_salary_no_degree_and_are_students(persons: pd.DataFrame) -> None:
    kids = persons[persons["age"] < 18]
    assert len(kids) > 500
    assert kids["salary"].eq(0).all()
    assert kids["occupation"].eq("Student").all()
    assert kids["marital-status"].isin(["Never-married", "Married"]).all()
    assert kids.loc[kids["age"] < 16, "marital-status"].eq("Never-married").all()
    degrees = ["Assoc-voc", "Bachelors", "Masters", "Prof-school", "Doctorate"]
    assert not kids["education"].isin(degrees).any()
    assert not persons.loc[persons["age"] < 25, "education"].eq("Doctorate").any()


def test_occupation_and_salary_follow_age_and_education(persons: pd.DataFrame) -> None:
    adults = persons[persons["age"].between(30, 60)]
    working = ~adults["occupation"].isin(["Student", "Retired", "Homemaker", "Unemployed"])
    assert working.mean() > 0.7
    assert adults.loc[working, "salary"].gt(0).all()
    assert adults.loc[~working & adults["occupation"].ne("Student"), "salary"].eq(0).all()
    old = persons[persons["age"] >= 75]
    assert old["occupation"].eq("Retired").mean() > 0.9
    pay = adults[working].groupby(adults["education"].isin(["Masters", "Doctorate"]))["salary"]
    assert pay.median()[True] > 1.3 * pay.median()[False]


# --------------------------------------------------------------------------- hierarchy files


def test_hierarchy_dir_holds_one_file_per_categorical_attribute() -> None:
    folder = dd.hierarchy_dir()
    assert folder == Path(dd.__file__).resolve().parent.parent / "configs" / "demo" / "hierarchies"
    assert sorted(p.stem for p in folder.glob("*.csv")) == sorted(HIERARCHY_FILES)
    assert set(dd.DEMO_DOMAINS) == set(HIERARCHY_FILES)


@pytest.mark.parametrize("name", HIERARCHY_FILES)
def test_hierarchy_file_is_well_formed(name: str) -> None:
    rows = read_hierarchy(name)
    width = len(rows[0])
    assert width >= 2
    assert all(len(r) == width for r in rows), "same number of levels on every row"
    assert all(r[-1] == "*" for r in rows), "last level is full suppression"
    assert all(v.strip() == v and v for r in rows for v in r)
    raw = [r[0] for r in rows]
    assert len(set(raw)) == len(raw), "one row per raw value"
    for level in range(1, width):
        parent: dict[str, str] = {}
        for r in rows:
            assert parent.setdefault(r[level - 1], r[level]) == r[level], (
                f"{name}: level {level} is not a function of level {level - 1} at {r}"
            )
    # Exactly the values the generator can produce (the domain that loss metrics count).
    assert raw == list(dd.DEMO_DOMAINS[name])


@pytest.mark.parametrize("name", HIERARCHY_FILES)
def test_every_generated_value_is_in_its_hierarchy(df: pd.DataFrame, name: str) -> None:
    raw = {r[0] for r in read_hierarchy(name)}
    assert set(df[name].unique()) <= raw


def test_diagnosis_categories_are_meaningful() -> None:
    category = {r[0]: r[1] for r in read_hierarchy("diagnosis")}
    assert category["Gastric ulcer"] == category["Gastritis"] == category["Stomach cancer"]
    assert category["Flu"] == category["Bronchitis"]
    assert category["Prostate cancer"] == category["Breast cancer"]
    assert category["Heart disease"] != category["Flu"]
    sizes = pd.Series(category).value_counts()
    assert len(sizes) >= 5 and sizes.ge(2).all()


def test_values_need_no_csv_quoting() -> None:
    values = [v for d in dd.DEMO_DOMAINS.values() for v in d]
    assert not [v for v in values if re.search(r'[,;"\n\r]', v) or not v.isascii()]


# --------------------------------------------------------------------------- attacks find something


def test_small_classes_are_often_homogeneous(df: pd.DataFrame) -> None:
    qis = list(dd.DEMO_QUASI_IDENTIFIERS)
    category = {r[0]: r[1] for r in read_hierarchy("diagnosis")}
    g = df.assign(
        zip=df["zip"].str[:3], age=df["age"] // 10, category=df["diagnosis"].map(category)
    )
    classes = g.groupby(qis).agg(
        size=("diagnosis", "size"), distinct=("diagnosis", "nunique"), cats=("category", "nunique")
    )
    small = classes[classes["size"].between(5, 9)]  # k=5 holds, but barely
    assert len(small) > 200
    homogeneous = small["distinct"].eq(1).mean()
    assert 0.05 <= homogeneous <= 0.6
    assert small["cats"].eq(1).mean() > homogeneous  # similarity finds more than homogeneity


# --------------------------------------------------------------------------- write_csv


def read_back(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, dtype=dict(dd.DEMO_DTYPES), keep_default_na=False)


def test_write_csv_matches_generate(tmp_path: Path) -> None:
    path = dd.write_csv(tmp_path / "sub" / "demo.csv", 5_000, seed=3)
    assert path == tmp_path / "sub" / "demo.csv"
    raw = path.read_bytes()
    assert raw.startswith((",".join(dd.DEMO_COLUMNS) + "\n").encode())
    assert b"\r" not in raw and b'"' not in raw
    assert raw.count(b"\n") == 5_001
    pd.testing.assert_frame_equal(read_back(path), dd.generate(5_000, seed=3))
    assert [p.name for p in path.parent.iterdir()] == ["demo.csv"]  # no temporary left behind


def test_write_csv_chunks_continue_person_ids(tmp_path: Path) -> None:
    whole = dd.write_csv(tmp_path / "whole.csv", 7_000, seed=5)
    chunked = dd.write_csv(tmp_path / "chunked.csv", 7_000, seed=5, chunk_rows=999)
    assert whole.read_bytes() == chunked.read_bytes()
    ids = read_back(chunked)["person_id"].str[1:].astype(int)
    assert ids.iloc[0] == 1 and ids.diff().dropna().isin([0, 1]).all()


def test_write_csv_empty_and_bad_chunk(tmp_path: Path) -> None:
    path = dd.write_csv(tmp_path / "empty.csv", 0)
    assert path.read_text() == ",".join(dd.DEMO_COLUMNS) + "\n"
    with pytest.raises(ValueError, match="chunk_rows"):
        dd.write_csv(tmp_path / "bad.csv", 10, chunk_rows=0)
    assert not (tmp_path / "bad.csv").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.csv"]
