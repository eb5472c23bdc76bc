"""The README's "Python API (notebooks)" examples run as written (from the repository root)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT


def _examples() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Python API (notebooks)", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


@pytest.mark.slow
def test_readme_python_api_examples_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = _examples()
    assert len(blocks) == 3, "the section's examples moved: update this test"
    monkeypatch.chdir(ROOT)
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)  # the README's own code
    out = capsys.readouterr().out
    assert "True" in out  # the anonymised table is verified
    assert "nothing was drawn" in out  # the session refused the second release
    session = namespace["session"]
    assert str(session.remaining) == "ApproxBudget(epsilon=1/2, delta=0)"  # type: ignore[attr-defined]
    table = namespace["table"]
    assert set(table["sex"]) == {"Male", "Female"}  # type: ignore[index]


def test_budget_session_refuses_before_drawing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused release draws no noise: the sampler is never asked."""
    import pandas as pd

    import privpipe.pipelines.notebook as notebook
    from privpipe.errors import ConfigError, PrivacyRefusal

    df = pd.DataFrame({"u": [1, 2, 3], "g": ["a", "b", "a"]})
    session = notebook.BudgetSession(epsilon=1)

    def no_sampler(seed: int | None) -> object:
        raise AssertionError("noise drawn for a refused release")

    monkeypatch.setattr(notebook, "sampler", no_sampler)
    with pytest.raises(PrivacyRefusal, match="nothing was drawn"):
        session.release(df, name="c", kind="dp_count", epsilon=2, unit="u")
    assert session.spent.epsilon == 0
    with pytest.raises(ConfigError, match="config's key is max_contributions_per_partition"):
        session.release(df, name="c", kind="dp_count", epsilon=1, max_contributions=2)
    with pytest.raises(ConfigError, match="central DP release"):
        session.release(df, name="c", kind="k_anonymity", k=2)


def test_budget_session_on_a_ledger(tmp_path: object) -> None:
    """from_ledger charges the dataset's authenticated ledger (shared with privpipe run)."""
    from pathlib import Path

    import pandas as pd

    from privpipe.dp.budget import ApproxBudget
    from privpipe.dp.ledger import Ledger
    from privpipe.dp.ledger_auth import load_key
    from privpipe.pipelines.notebook import BudgetSession

    path = Path(str(tmp_path)) / "ledger.sqlite"
    Ledger.create(path, "visits", ApproxBudget(2, 0), load_key("visits", None, None, None))
    df = pd.DataFrame({"u": range(30), "g": ["a", "b", "c"] * 10})
    with BudgetSession.from_ledger(path, "visits") as session:
        session.release(df, name="c", kind="dp_count", epsilon=1.5, unit="u", insecure_seed=1)
    with Ledger.open(path, "visits", load_key("visits", None, None, None)) as ledger:
        assert [e.release for e in ledger.history()] == ["c"]
        assert ledger.remaining().epsilon == pytest.approx(0.5)
    with (
        BudgetSession.from_ledger(path, "visits") as session,
        pytest.raises(Exception, match="epsilon"),
    ):
        session.release(df, name="d", kind="dp_count", epsilon=1, unit="u", insecure_seed=1)
