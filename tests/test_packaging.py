"""One import namespace (issue 17): every module is ``privpipe.<name>``; the top-level
folders stay, but nothing imports them by their old top-level names, and a wheel installs
only the ``privpipe`` package (no generic ``dp``, ``reports`` … in site-packages)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

OLD = {"anonymity", "attacks", "dp", "pipelines", "reports", "transforms"}
SOURCES = [*sorted(OLD), "tests", "benchmarks"]


PATCHERS = {"setattr", "patch", "import_module", "delattr"}


def _old_imports(path: Path) -> list[str]:
    """Imports of the old top-level names, and dotted names given as strings to
    monkeypatch.setattr / mock.patch / import_module (a patch of ``pipelines.run.x``
    would change a second copy of the module, and the test would pass without testing)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if (
                name in PATCHERS
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
                and first.value.split(".")[0] in OLD
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {first.value!r}")
        names = (
            [node.module or ""]
            if isinstance(node, ast.ImportFrom) and node.level == 0
            else [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else []
        )
        found += [
            f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in OLD
        ]
    return found


def test_nothing_imports_the_old_top_level_names() -> None:
    """In a checkout the folders are importable by their old names too (the editable
    install puts the root on sys.path), so a stray old import would work here, load a
    second copy of the module, and fail in an installed wheel."""
    files = [p for d in SOURCES for p in (ROOT / d).rglob("*.py")]
    files += list((ROOT / "privpipe").glob("*.py"))
    assert len(files) > 150
    stray = [hit for p in files for hit in _old_imports(p)]
    assert not stray, "import these as privpipe.<name>:\n" + "\n".join(stray)


@pytest.mark.slow
def test_wheel_holds_only_the_privpipe_namespace(tmp_path: Path) -> None:
    made_here = not (ROOT / "build").exists()  # setuptools builds in the source tree
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(tmp_path)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if made_here:
        shutil.rmtree(ROOT / "build", ignore_errors=True)
    assert build.returncode == 0, build.stderr
    warnings = [ln for ln in build.stderr.splitlines() if "Warning" in ln]
    assert not warnings, build.stderr  # e.g. the licence field, a package left out
    (wheel,) = tmp_path.glob("privpipe-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == {"privpipe"}
    for module in (
        "privpipe/pipelines/cli.py",
        "privpipe/anonymity/search.py",
        "privpipe/dp/noise.py",
    ):
        assert module in names
    assert "privpipe/configs/demo.yaml" in names  # privpipe demo works from a wheel
    assert "privpipe/configs/demo/hierarchies/diagnosis.csv" in names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "privpipe = privpipe.pipelines.cli:entry" in zipfile.ZipFile(wheel).read(entry).decode()
