"""tests/hygiene.py, the check that no test writes into the checkout, on a folder of its own."""

from __future__ import annotations

import os
from pathlib import Path

from .hygiene import changes, snapshot


def test_a_new_a_removed_and_a_rewritten_file_are_named(tmp_path: Path) -> None:
    (tmp_path / "rules").mkdir()
    kept = tmp_path / "rules" / "x.yaml"
    kept.write_text("groups: []\n")
    gone = tmp_path / "README.md"
    gone.write_text("# x\n")
    before = snapshot(tmp_path)
    assert changes(before, snapshot(tmp_path)) == []
    (tmp_path / "new.txt").write_text("")
    gone.unlink()
    # The same bytes written again still count: the file was written during the run.
    st = kept.stat()
    kept.write_text("groups: []\n")
    os.utime(kept, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert changes(before, snapshot(tmp_path)) == [
        "added new.txt",
        "removed README.md",
        "rewritten rules/x.yaml",
    ]


def test_the_tools_folders_are_left_out(tmp_path: Path) -> None:
    before = snapshot(tmp_path)
    for folder in (
        ".venv-py3.10/lib",
        ".cache/prometheus-3",
        "enricher/__pycache__",
        ".hypothesis/examples",
        "dcgm_enricher.egg-info",
        "mutants/enricher",
    ):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "f").write_text("x")
    assert changes(before, snapshot(tmp_path)) == []
    (tmp_path / "enricher" / "stray.py").write_text("")
    assert changes(before, snapshot(tmp_path)) == ["added enricher/stray.py"]
