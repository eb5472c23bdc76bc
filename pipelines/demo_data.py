"""Seeded synthetic health-register microdata for the demo: one row per visit.

Why: `make run` must work with nothing outside the repo, and the demo must exercise what
privpipe is about: quasi-identifiers that generalise meaningfully (zip codes clustered in
three-digit regions, an age pyramid, education/marital status/occupation consistent with age),
a skewed sensitive attribute that depends on age and sex (so small equivalence classes are often
homogeneous and the attacks find something), and several visits for some persons (so the DP
privacy unit "person" differs from "row").

How: persons are generated in fixed blocks of `_BLOCK_PERSONS`, each block from its own RNG
stream derived from the seed (`SeedSequence(seed, spawn_key=(block,))`). The table for n rows is
therefore a prefix of the table for any larger n, and `write_csv` writes, chunk by chunk, exactly
what `generate` returns. Everything is vectorised numpy/pandas (no per-row Python, no Beam); the
CSV is encoded straight from the integer codes as fixed-width byte records with the padding
removed, which is much faster than `DataFrame.to_csv`.

This is synthetic data, not a release: `numpy.random` is fine here (released noise never uses it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike, NDArray

DEFAULT_SEED = 20261122

DEMO_COLUMNS: tuple[str, ...] = (
    "person_id",
    "zip",
    "age",
    "sex",
    "race",
    "education",
    "marital-status",
    "occupation",
    "diagnosis",
    "salary",
    "visit_date",
)
DEMO_QUASI_IDENTIFIERS: tuple[str, ...] = (
    "zip",
    "age",
    "sex",
    "race",
    "education",
    "marital-status",
    "occupation",
)
DEMO_SENSITIVE = "diagnosis"
DEMO_PRIVACY_UNIT = "person_id"

# Column dtypes of `generate`, and what `pd.read_csv(path, dtype=DEMO_DTYPES)` gives back for a
# file from `write_csv` (zip must be read as a string to keep its leading zeros).
DEMO_DTYPES: Mapping[str, str] = MappingProxyType(
    {c: "int64" if c in ("age", "salary") else "str" for c in DEMO_COLUMNS}
)

SEXES = ("Male", "Female")
RACES = ("White", "Black", "Asian", "Native-American", "Other")
EDUCATIONS = (
    "Preschool",
    "Elementary",
    "Middle-school",
    "Some-HS",
    "HS-grad",
    "Some-college",
    "Assoc-voc",
    "Bachelors",
    "Masters",
    "Prof-school",
    "Doctorate",
)
MARITAL_STATUSES = (
    "Never-married",
    "Married",
    "Married-spouse-absent",
    "Separated",
    "Divorced",
    "Widowed",
)
# The first four are the non-working statuses, the rest the working occupations (_WORK_*).
OCCUPATIONS = (
    "Student",
    "Retired",
    "Homemaker",
    "Unemployed",
    "Managerial",
    "Professional",
    "Technical",
    "Clerical",
    "Sales",
    "Service",
    "Craft-repair",
    "Transport-operative",
    "Farming-fishing",
)
# Grouped as in configs/demo/hierarchies/diagnosis.csv (the similarity attack's categories).
DIAGNOSES = (
    "Flu",
    "Bronchitis",
    "Pneumonia",  # respiratory infection
    "Gastritis",
    "Gastric ulcer",
    "Stomach cancer",  # stomach disease
    "Hypertension",
    "Heart disease",
    "Stroke",  # cardiovascular
    "Breast cancer",
    "Prostate cancer",
    "Lung cancer",  # cancer
    "Diabetes",
    "Hypothyroidism",  # endocrine
    "Arthritis",
    "Fracture",  # musculoskeletal
    "Depression",
    "Anxiety",  # mental health
)


class _Region(NamedTuple):
    """A three-digit zip region: its zips (most populous first) and local characteristics."""

    weight: float  # share of the register's persons
    zips: tuple[str, ...]
    race: tuple[float, float, float, float, float]  # weights in RACES order
    higher_ed: float  # factor on Bachelors and above
    farming: float  # factor on Farming-fishing
    pay: float  # factor on salaries


def _zips(region: str, suffixes: str) -> tuple[str, ...]:
    """The five-digit zips of a three-digit region, from their last two digits."""
    return tuple(region + s for s in suffixes.split())


# Zips of a region are listed most populous first. The values are plausible, not survey figures.
_REGIONS = (
    _Region(  # 476xx, around Evansville IN: small towns, farming
        0.12,
        _zips("476", "30 20 01 35 60 70 10 12 77 78 02 05 07 73"),
        (0.90, 0.04, 0.01, 0.01, 0.04),
        0.8,
        2.5,
        0.88,
    ),
    _Region(  # 477xx, Evansville city
        0.14,
        _zips("477", "14 11 12 15 10 13 20 08"),
        (0.80, 0.13, 0.02, 0.01, 0.04),
        0.95,
        0.3,
        0.92,
    ),
    _Region(  # 478xx, Terre Haute
        0.09,
        _zips("478", "03 02 04 05 07 34 42"),
        (0.88, 0.07, 0.02, 0.01, 0.02),
        0.85,
        2.0,
        0.88,
    ),
    _Region(  # 479xx, Lafayette (university town)
        0.11,
        _zips("479", "06 05 09 04 01 20 33"),
        (0.80, 0.05, 0.10, 0.01, 0.04),
        1.3,
        1.5,
        0.95,
    ),
    _Region(  # 130xx, around Syracuse NY
        0.13,
        _zips("130", "90 27 68 57 31 66 53 21"),
        (0.85, 0.08, 0.03, 0.02, 0.02),
        1.0,
        1.0,
        1.0,
    ),
    _Region(  # 148xx, Ithaca and Elmira NY
        0.07,
        _zips("148", "50 45 53 67 86 82"),
        (0.82, 0.05, 0.09, 0.01, 0.03),
        1.4,
        1.5,
        0.98,
    ),
    _Region(  # 021xx, Boston MA (leading zero)
        0.18,
        _zips("021", "34 30 39 18 16 38 15 08"),
        (0.55, 0.22, 0.12, 0.005, 0.105),
        1.5,
        0.05,
        1.3,
    ),
    _Region(  # 024xx, Boston western suburbs
        0.16,
        _zips("024", "46 53 51 45 59 78 20 21"),
        (0.75, 0.06, 0.14, 0.005, 0.055),
        1.6,
        0.1,
        1.35,
    ),
)

DEMO_ZIP_CODES: tuple[str, ...] = tuple(z for r in _REGIONS for z in r.zips)

# Every value the generator can produce, per column that has a hierarchy file.
DEMO_DOMAINS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "sex": SEXES,
        "race": RACES,
        "education": EDUCATIONS,
        "marital-status": MARITAL_STATUSES,
        "occupation": OCCUPATIONS,
        "diagnosis": DIAGNOSES,
    }
)

_BLOCK_PERSONS = 1 << 16
_MAX_AGE = 95
_AGES = np.arange(_MAX_AGE + 1)
_N_REGIONS = len(_REGIONS)
_PERSON_ID_DIGITS = 7  # "P0001234"; ids past 9,999,999 simply get more digits
# Visit dates: 2024 is a leap year, and 1 January 2024 was a Monday (see _WEEKDAY).
_DATES = tuple(str(d) for d in np.datetime64("2024-01-01") + np.arange(366))


def hierarchy_dir() -> Path:
    """The folder of the demo's ARX hierarchy files (configs/demo/hierarchies)."""
    return Path(__file__).resolve().parent.parent / "configs" / "demo" / "hierarchies"


# --------------------------------------------------------------------------- model tables


def _cdf(weights: ArrayLike) -> NDArray[np.float64]:
    """Row-wise cumulative distribution ending at exactly 1.0, so a uniform u < 1 never
    selects a category of weight 0 (see `_draw` and `_draw_rows`)."""
    w = np.asarray(weights, dtype=np.float64)
    c = np.cumsum(w, axis=-1)
    return c / c[..., -1:]


def _bracket(edges: tuple[int, ...]) -> NDArray[np.intp]:
    """Bracket index of every age 0..95 for the given lower edges (bracket 0 below edges[0])."""
    return np.searchsorted(np.asarray(edges), _AGES, side="right")


# Zips: regions weighted, zips within a region Zipf-like in the listed order.
_ZIP_REGION = np.repeat(np.arange(_N_REGIONS), [len(r.zips) for r in _REGIONS])
_ZIP_CDF = _cdf(
    np.concatenate(
        [r.weight * (w := 1.0 / np.arange(1, len(r.zips) + 1) ** 0.7) / w.sum() for r in _REGIONS]
    )
)

# Age pyramid in 5-year bands (0-4 … 85-89, 90-95), uniform within a band; adult-heavy.
_AGE_BANDS = (5.6, 5.8, 6.0, 6.1, 6.3, 6.8, 7.0, 6.8, 6.4, 6.1, 6.3, 6.5, 6.4, 5.8, 5.0, 3.8, 2.5)
_AGE_CDF = _cdf(
    np.concatenate([np.repeat(np.array(_AGE_BANDS) / 5, 5), np.repeat([1.5 / 5, 0.8 / 6], [5, 6])])
)
# Women live longer: the female share rises after 60.
_FEMALE_SHARE = 0.49 + 0.16 * np.clip((_AGES - 60) / 35, 0.0, 1.0)

_RACE_CDF = _cdf([list(r.race) for r in _REGIONS])

# Education by age bracket (in progress for children), then region (higher education).
_EDU_BRACKET = _bracket((6, 12, 15, 18, 22, 25, 30, 45, 65))
_EDU_WEIGHTS = np.array(
    [
        [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # 0-5
        [0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # 6-11
        [0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0],  # 12-14
        [0, 0, 0, 95, 5, 0, 0, 0, 0, 0, 0],  # 15-17
        [0, 0, 0, 10, 50, 38, 2, 0, 0, 0, 0],  # 18-21
        [0, 0.5, 1, 6, 32, 28, 8, 22, 2.5, 0, 0],  # 22-24
        [0, 0.5, 1.5, 6, 27, 18, 9, 27, 9, 1.5, 0.5],  # 25-29
        [0, 1, 2, 6, 26, 16, 10, 25, 10, 2.5, 1.5],  # 30-44
        [0, 2, 3, 8, 31, 17, 10, 19, 7, 1.8, 1.2],  # 45-64
        [0, 5, 5, 10, 34, 15, 7, 14, 6, 2, 1.2],  # 65+
    ]
)
_HIGHER = np.arange(len(EDUCATIONS)) >= EDUCATIONS.index("Bachelors")
_EDU_CDF = _cdf(
    (
        _EDU_WEIGHTS[:, None, :]
        * np.where(_HIGHER, np.array([r.higher_ed for r in _REGIONS])[:, None], 1.0)[None]
    ).reshape(-1, len(EDUCATIONS))
)  # row = bracket * _N_REGIONS + region
# Coarse education groups for occupation and status: low, high school, college, bachelor, graduate.
_EDU_GROUP = np.array([0, 0, 0, 0, 1, 2, 2, 3, 4, 4, 4])

# Marital status by age bracket, then sex (widows outnumber widowers).
_MAR_BRACKET = _bracket((16, 18, 25, 35, 45, 55, 65, 75))
_MAR_WEIGHTS = np.array(
    [
        [1, 0, 0, 0, 0, 0],  # <16
        [99.5, 0.5, 0, 0, 0, 0],  # 16-17
        [88, 10, 0.5, 0.8, 0.7, 0],  # 18-24
        [48, 44, 1.2, 2, 4.7, 0.1],  # 25-34
        [25, 57, 1.5, 3, 13, 0.5],  # 35-44
        [15, 58, 1.5, 3, 20.5, 2],  # 45-54
        [10, 60, 1.3, 2, 20.7, 6],  # 55-64
        [6, 58, 1, 1, 16, 18],  # 65-74
        [5, 42, 1, 0.5, 9.5, 42],  # 75+
    ]
)
_MAR_SEX = np.array([[1, 1.05, 1, 1, 1, 0.55], [1, 0.95, 1, 1, 1, 1.45]])  # Male, Female
_MAR_CDF = _cdf((_MAR_WEIGHTS[:, None, :] * _MAR_SEX[None]).reshape(-1, len(MARITAL_STATUSES)))


def _status_weights(age: int, female: bool, group: int) -> list[float]:
    """Weights of (Student, Retired, Homemaker, Unemployed, working) for one cell."""
    if age < 18:
        return [1, 0, 0, 0, 0]
    unemployed = (1.8, 1.2, 1.0, 0.7, 0.5)[group]
    home = 0.10 if female else 0.01
    if age < 25:
        student = (0.05, 0.15, 0.6, 0.25, 0.3)[group]
        s = [student, 0, home * 0.4, 0.10 * unemployed]
    elif age < 55:
        s = [0.02, 0.005, home, 0.05 * unemployed]
    elif age < 65:
        s = [0.002, 0.05 + 0.45 * (age - 55) / 9, home * 0.8, 0.04 * unemployed]
    elif age < 75:
        s = [0, 0.80 + 0.015 * (age - 65), home * 0.4, 0.005]
    else:
        s = [0, 0.97, home * 0.2, 0]
    return [*s, max(0.0, 1 - sum(s))]


_STATUS_CDF = _cdf(
    [_status_weights(a, f, g) for a in range(_MAX_AGE + 1) for f in (False, True) for g in range(5)]
)  # row = (age * 2 + female) * 5 + education group; tiny table built once at import

# Working occupation (OCCUPATIONS[_FIRST_WORK:]) by education group, sex and region.
_WORK_EDU = np.array(
    [
        [2, 1, 1, 5, 8, 30, 20, 23, 10],  # low
        [7, 3, 4, 14, 12, 20, 18, 16, 6],  # high school
        [12, 10, 14, 18, 13, 13, 11, 7, 2],  # college
        [25, 35, 10, 9, 12, 4, 3, 1.5, 0.5],  # bachelor
        [25, 62, 5, 3, 3, 1, 0.5, 0.3, 0.2],  # graduate
    ]
)
_WORK_SEX = np.array(
    [
        [1.15, 0.9, 1.2, 0.4, 1, 0.8, 1.8, 1.7, 1.5],  # Male
        [0.85, 1.1, 0.8, 1.6, 1, 1.2, 0.2, 0.3, 0.5],  # Female
    ]
)
_FIRST_WORK = OCCUPATIONS.index("Managerial")
_FARMING = np.asarray(OCCUPATIONS[_FIRST_WORK:]) == "Farming-fishing"
_WORK_REGION = np.where(_FARMING, np.array([r.farming for r in _REGIONS])[:, None], 1.0)
_WORK_CDF = _cdf(
    (_WORK_EDU[:, None, None, :] * _WORK_SEX[None, :, None, :] * _WORK_REGION[None, None]).reshape(
        -1, len(OCCUPATIONS) - _FIRST_WORK
    )
)  # row = (group * 2 + female) * _N_REGIONS + region

# Salary: log-normal around an occupation median, scaled by education, experience, sex, region.
_SALARY_MEDIAN = np.array(
    [0, 0, 0, 0, 82_000, 76_000, 58_000, 41_000, 43_000, 30_000, 50_000, 42_000, 34_000], float
)
_SALARY_EDU = np.array([0.75, 0.75, 0.8, 0.8, 0.92, 1.0, 1.05, 1.25, 1.4, 1.9, 1.55])
_SALARY_AGE = (0.55 + 0.55 * (1 - np.exp(-np.clip(_AGES - 18, 0, None) / 12))) * np.where(
    _AGES > 60, 1 - 0.01 * (_AGES - 60), 1.0
)
_SALARY_SIGMA = 0.45
_SALARY_FEMALE = 0.84
_SALARY_REGION = np.array([r.pay for r in _REGIONS])
_STUDENT_JOB_SHARE = 0.35  # adult students with part-time earnings
_STUDENT_JOB_MEDIAN = 8_500.0

# Diagnosis (per person "main" condition) by age bracket and sex: strongly skewed.
_DIAG_BRACKET = _bracket((16, 40, 65))
_DIAG_WEIGHTS = np.array(
    [
        # columns in DIAGNOSES order: Flu, Bronchitis, … Depression, Anxiety
        [40, 22, 4, 6, 0.3, 0.01, 0.3, 0.3, 0.02, 0, 0, 0.01, 1.5, 0.2, 0.3, 14, 2, 2.5],  # 0-15
        [28, 14, 2, 10, 3, 0.05, 4, 1, 0.2, 0.4, 0.01, 0.1, 3, 1.5, 2, 9, 12, 9],  # 16-39
        [16, 10, 2.5, 8, 5, 0.4, 18, 8, 1.5, 2.5, 1.5, 1, 9, 3, 8, 4, 8, 5],  # 40-64
        [12, 9, 6, 5, 5, 1, 20, 16, 5, 2.5, 4, 2.5, 11, 4, 12, 5, 4, 2],  # 65+
    ]
)
_DIAG_SEX = np.array(
    [
        [1, 1, 1.1, 1, 1.2, 1.5, 1.05, 1.4, 1.05, 0.01, 2, 1.2, 1.1, 0.3, 0.7, 1.2, 0.6, 0.6],
        [1, 1, 0.9, 1, 0.8, 0.5, 0.95, 0.6, 0.95, 1.99, 0, 0.8, 0.9, 1.7, 1.3, 0.8, 1.4, 1.4],
    ]
)  # Male, Female: no prostate cancer in women, breast cancer rare in men
_DIAG_CDF = _cdf((_DIAG_WEIGHTS[:, None, :] * _DIAG_SEX[None]).reshape(-1, len(DIAGNOSES)))
_ACUTE = np.isin(DIAGNOSES, ("Flu", "Bronchitis", "Pneumonia", "Gastritis", "Fracture"))
# Per visit: probability that the visit is for the person's main condition again.
_SAME_DIAGNOSIS = np.where(_ACUTE, 0.7, 0.92)
# Visits: probability of being a repeat visitor (by diagnosis age bracket; chronic adds more),
# and the geometric tail of further visits, capped at 10 visits in all.
_REPEAT_VISITOR = np.array([0.16, 0.18, 0.25, 0.34])
_REPEAT_CHRONIC = 0.12
_MORE_VISITS_P = np.where(_ACUTE, 0.55, 0.4)
_MAX_VISITS = 10

# Visit day of 2024: fewer visits at weekends; respiratory infections peak in winter.
_WEEKDAY = np.array([1, 1, 1, 1, 0.95, 0.35, 0.2])[np.arange(366) % 7]
_WINTER = np.cos(2 * np.pi * (np.arange(366) - 15) / 366)
_DAY_CDF = _cdf([_WEEKDAY * np.exp(s * _WINTER) for s in (1.6, 0.8, 0.0)])
_DIAG_SEASON = np.select(
    [np.asarray(DIAGNOSES) == "Flu", np.isin(DIAGNOSES, ("Bronchitis", "Pneumonia"))], [0, 1], 2
)


# --------------------------------------------------------------------------- sampling


def _draw(rng: np.random.Generator, cdf: NDArray[np.float64], n: int) -> NDArray[np.intp]:
    """n categorical draws from one distribution given as a cdf ending at 1.0."""
    return np.searchsorted(cdf, rng.random(n), side="right").astype(np.intp)


def _draw_rows(rng: np.random.Generator, cdfs: NDArray[np.float64]) -> NDArray[np.intp]:
    """One categorical draw per row of a (n, k) matrix of cdfs ending at 1.0."""
    u = rng.random(len(cdfs))
    out: NDArray[np.intp] = np.count_nonzero(cdfs <= u[:, None], axis=1).astype(np.intp)
    return out


_Chunk = dict[str, NDArray[np.integer]]  # codes or integers per column (see _block)


def _block(seed: int, index: int) -> _Chunk:
    """Rows (visits) of persons index*_BLOCK_PERSONS+1 … (index+1)*_BLOCK_PERSONS, person-sorted.

    All arrays are integer codes into the value tuples (zip into DEMO_ZIP_CODES, day into 2024).
    """
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(index,)))
    n = _BLOCK_PERSONS
    zip_ = _draw(rng, _ZIP_CDF, n)
    region = _ZIP_REGION[zip_]
    age = _draw(rng, _AGE_CDF, n)
    female = (rng.random(n) < _FEMALE_SHARE[age]).astype(np.intp)
    race = _draw_rows(rng, _RACE_CDF[region])
    edu = _draw_rows(rng, _EDU_CDF[_EDU_BRACKET[age] * _N_REGIONS + region])
    marital = _draw_rows(rng, _MAR_CDF[_MAR_BRACKET[age] * 2 + female])
    group = _EDU_GROUP[edu]
    status = _draw_rows(rng, _STATUS_CDF[(age * 2 + female) * 5 + group])
    work = _draw_rows(rng, _WORK_CDF[(group * 2 + female) * _N_REGIONS + region])
    working = status == _FIRST_WORK
    occ = np.where(working, _FIRST_WORK + work, status)

    scale = (
        _SALARY_MEDIAN[occ]
        * _SALARY_EDU[edu]
        * _SALARY_AGE[age]
        * np.where(female == 1, _SALARY_FEMALE, 1.0)
        * _SALARY_REGION[region]
    )
    student_job = (occ == 0) & (age >= 18) & (rng.random(n) < _STUDENT_JOB_SHARE)
    scale = np.where(student_job, _STUDENT_JOB_MEDIAN, scale)
    salary = np.rint(scale * rng.lognormal(0.0, _SALARY_SIGMA, n) / 100).astype(np.int64) * 100

    diag_cond = _DIAG_BRACKET[age] * 2 + female
    main = _draw_rows(rng, _DIAG_CDF[diag_cond])
    repeat = rng.random(n) < _REPEAT_VISITOR[_DIAG_BRACKET[age]] + _REPEAT_CHRONIC * ~_ACUTE[main]
    more = np.minimum(rng.geometric(_MORE_VISITS_P[main]), _MAX_VISITS - 1)
    visits = np.where(repeat, 1 + more, 1)

    owner = np.repeat(np.arange(n), visits)
    fresh = _draw_rows(rng, _DIAG_CDF[diag_cond[owner]])
    same = rng.random(len(owner)) < _SAME_DIAGNOSIS[main[owner]]
    diag = np.where(same, main[owner], fresh)
    u = rng.random(len(owner))
    season = _DIAG_SEASON[diag]
    day = np.empty(len(owner), dtype=np.intp)
    for s in range(len(_DAY_CDF)):  # three seasonal profiles, not rows
        sel = season == s
        day[sel] = np.searchsorted(_DAY_CDF[s], u[sel], side="right")
    order = np.lexsort((day, owner))  # each person's visits in date order
    diag, day = diag[order], day[order]

    def code(a: NDArray[np.intp]) -> NDArray[np.uint8]:
        return a.astype(np.uint8)[owner]  # compact codes: every domain has < 256 values

    return {
        "person": owner.astype(np.int64) + index * _BLOCK_PERSONS + 1,
        "zip": code(zip_),
        "age": code(age),
        "sex": code(female),
        "race": code(race),
        "education": code(edu),
        "marital-status": code(marital),
        "occupation": code(occ),
        "diagnosis": diag.astype(np.uint8),
        "salary": salary[owner],
        "visit_date": day.astype(np.uint16),
    }


def _concat(parts: list[_Chunk]) -> _Chunk:
    """Concatenate chunks column by column."""
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _chunks(n_rows: int, seed: int, chunk_rows: int) -> Iterator[_Chunk]:
    """The first n_rows rows of the stream for seed, in chunks of chunk_rows (last may be short)."""
    if n_rows < 0:
        raise ValueError(f"n_rows must be >= 0, got {n_rows}")
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    pending: list[_Chunk] = []
    pending_rows = 0
    remaining = n_rows
    index = 0
    while remaining > 0:
        block = _block(seed, index)
        index += 1
        take = min(len(block["person"]), remaining)
        remaining -= take
        start = 0
        while start < take:
            stop = min(take, start + chunk_rows - pending_rows)
            pending.append({k: v[start:stop] for k, v in block.items()})
            pending_rows += stop - start
            start = stop
            if pending_rows == chunk_rows:
                yield _concat(pending)
                pending, pending_rows = [], 0
    if pending:
        yield _concat(pending)


# --------------------------------------------------------------------------- output

_CODED: dict[str, tuple[str, ...]] = {
    "zip": DEMO_ZIP_CODES,
    "sex": SEXES,
    "race": RACES,
    "education": EDUCATIONS,
    "marital-status": MARITAL_STATUSES,
    "occupation": OCCUPATIONS,
    "diagnosis": DIAGNOSES,
    "visit_date": _DATES,
}


def _person_ids(person: NDArray[np.integer]) -> pd.Series:
    """'P' + the person number, zero-padded to 7 digits."""
    return "P" + pd.Series(person, dtype="int64").astype("str").str.zfill(_PERSON_ID_DIGITS)


def _to_frame(chunk: _Chunk) -> pd.DataFrame:
    """The DataFrame (dtypes as DEMO_DTYPES) of a chunk of codes."""
    cols: dict[str, object] = {"person_id": _person_ids(chunk["person"])}
    for c in DEMO_COLUMNS[1:]:
        if c in _CODED:
            cols[c] = pd.Series(pd.array(_CODED[c], dtype="str").take(chunk[c]))
        else:
            cols[c] = pd.Series(chunk[c], dtype="int64")
    return pd.DataFrame(cols, columns=list(DEMO_COLUMNS))


def generate(n_rows: int, seed: int = DEFAULT_SEED) -> pd.DataFrame:
    """Exactly n_rows visits (the first n_rows of the seed's stream), deterministic for a seed.

    Rows are sorted by person, then visit date; a person's quasi-identifiers and salary are
    identical on all their rows. Columns and dtypes: DEMO_COLUMNS, DEMO_DTYPES.
    """
    for chunk in _chunks(n_rows, seed, max(n_rows, 1)):
        return _to_frame(chunk)  # a single chunk of n_rows rows
    return _to_frame({k: np.zeros(0, np.int64) for k in ("person", *DEMO_COLUMNS[1:])})


def _byte_matrix(values: tuple[str, ...]) -> NDArray[np.uint8]:
    """ASCII values as a (len, width) uint8 matrix, NUL-padded on the right."""
    a = np.array([v.encode("ascii") for v in values])
    return a.view(np.uint8).reshape(len(values), a.dtype.itemsize)


_CODED_BYTES = {c: _byte_matrix(v) for c, v in _CODED.items()}


def _int_bytes(x: NDArray[np.integer], min_digits: int = 1) -> NDArray[np.uint8]:
    """Decimal digits of non-negative ints as a (n, width) uint8 matrix, zero-padded to
    min_digits and NUL-padded on the left beyond that."""
    x = x.astype(np.int64)
    width = max(min_digits, len(str(int(x.max()))) if len(x) else 1)
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    digits = (x[:, None] // powers % 10 + ord("0")).astype(np.uint8)
    digits[:, : width - min_digits][x[:, None] < powers[: width - min_digits]] = 0
    return digits


def _take_rows(matrix: NDArray[np.uint8], codes: NDArray[np.integer]) -> NDArray[np.uint8]:
    """matrix[codes], faster: each row taken as one opaque item rather than byte by byte."""
    items = np.ascontiguousarray(matrix).view(f"V{matrix.shape[1]}").ravel()
    out: NDArray[np.uint8] = items[codes].view(np.uint8).reshape(len(codes), matrix.shape[1])
    return out


def _csv_bytes(chunk: _Chunk) -> NDArray[np.uint8]:
    """The CSV lines of a chunk, as bytes: one fixed-width NUL-padded record per row, then the
    NULs removed. No value contains a delimiter or quote, so nothing needs quoting."""
    n = len(chunk["person"])
    sep = np.full((n, 1), ord(","), dtype=np.uint8)
    fields = [np.full((n, 1), ord("P"), np.uint8), _int_bytes(chunk["person"], _PERSON_ID_DIGITS)]
    for c in DEMO_COLUMNS[1:]:
        fields.append(sep)
        fields.append(
            _take_rows(_CODED_BYTES[c], chunk[c]) if c in _CODED else _int_bytes(chunk[c])
        )
    fields.append(np.full((n, 1), ord("\n"), dtype=np.uint8))
    flat: NDArray[np.uint8] = np.hstack(fields).ravel()
    out: NDArray[np.uint8] = flat[flat != 0]
    return out


def write_csv(
    path: str | Path, n_rows: int, seed: int = DEFAULT_SEED, chunk_rows: int = 1_000_000
) -> Path:
    """Write generate(n_rows, seed) as CSV (',' delimiter, header, LF), chunk by chunk.

    Memory is bounded by chunk_rows, not n_rows; the content does not depend on chunk_rows.
    The file is written beside its destination and renamed into place, so a reader never sees a
    partial file. Read it back with `pd.read_csv(path, dtype=DEMO_DTYPES)`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write((",".join(DEMO_COLUMNS) + "\n").encode("ascii"))
            for chunk in _chunks(n_rows, seed, chunk_rows):
                f.write(_csv_bytes(chunk).data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
