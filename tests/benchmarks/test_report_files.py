"""The result files every benchmark command writes (:mod:`benchmarks.common.report_files`): tables as markdown, CSV and
JSON with the command, date and machine, and the generated section of a hand-written markdown file, replaced
without a byte outside its markers changing."""
from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest

from benchmarks.common.report_files import command_line, markdown_table, replace_generated_section, write_csv, write_results

MACHINE = {"cpu": "Test CPU", "cores": 2, "usable_cores": 2, "load_average": [0.5, 0.5, 0.5], "memory_bytes": 2**33, "gpus": [],
           "python": "3.x", "torch": None, "commit": "abc1234"}
PROVENANCE = ("Generated 2026-01-02T03:04:05+00:00 by `python -m benchmarks.suite --quick`; machine: Test CPU, 2 of 2 cores "
              "usable, 8 GiB, no GPU; load average 0.50 0.50 0.50; Python 3.x, torch -, commit abc1234.")
HISTORY = "# Results\n\nHand-written history, kept as it is.\r\nA CRLF line and trailing spaces   \n\n## Old entry\n\n- 1.0 s\n"


def replace(path: Path, name: str, markdown: str) -> Path:
    return replace_generated_section(path, name, markdown, command="python -m benchmarks.suite --quick", machine=MACHINE,
                                     date="2026-01-02T03:04:05+00:00")


def test_a_markdown_table_formats_numbers_and_escapes_cells() -> None:
    rows = [{"name": "a|b", "median": 1234.5, "ratio": 0.01234, "runs": 3}, {"name": "</answer>", "median": 12.34, "extra": [1.0, 2]}]
    assert markdown_table(rows).splitlines() == [
        "| name | median | ratio | runs | extra |", "|---|---|---|---|---|",
        "| a\\|b | 1,234 | 0.0123 | 3 | - |", "| \\</answer> | 12.3 | - | - | 1 2 |"]
    assert markdown_table(rows, ["runs", "name"]).splitlines()[2] == "| 3 | a\\|b |"


def test_csv_has_every_key_as_a_column_lists_joined_and_none_empty(tmp_path: Path) -> None:
    write_csv(tmp_path / "t.csv", [{"a": 1, "b": [1.5, 2]}, {"a": None, "c": "x"}])
    with open(tmp_path / "t.csv", encoding="utf-8", newline="") as handle:
        assert list(csv.reader(handle)) == [["a", "b", "c"], ["1", "1.5 2", ""], ["", "", "x"]]


def test_the_results_carry_the_command_date_and_machine_in_every_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{"figure": "step", "median": 2.0}, {"figure": "turn", "median": 0.5}]
    out = tmp_path / "new" / "folder"
    drawn = []
    paths = write_results(out, "bench", title="A benchmark", command="python -m benchmarks.bench --x 1", body=markdown_table(rows),
                          data={"settings": {"x": 1, "path": tmp_path}, "rows": rows, "date": "not this"}, rows=rows,
                          plot=lambda figure: drawn.append(figure.subplots().plot([0, 1], [0, 1])))
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None
    assert [p.name for p in paths] == ["bench.md", "bench.json", "bench.csv"] + ["bench.png"] * has_matplotlib
    lines = (out / "bench.md").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "# A benchmark" and lines[2].startswith("Generated ") and "by `python -m benchmarks.bench --x 1`; machine: " in lines[2]
    assert lines[4:] == ["| figure | median |", "|---|---|", "| step | 2 |", "| turn | 0.5 |"]
    saved = json.loads((out / "bench.json").read_text(encoding="utf-8"))
    assert saved["command"] == "python -m benchmarks.bench --x 1" and saved["machine"]["cores"] >= 1
    assert saved["date"] != "not this" and saved["date"] in lines[2]  # the provenance wins over a key of the same name
    assert saved["settings"] == {"x": 1, "path": str(tmp_path)} and saved["rows"] == rows
    assert (out / "bench.csv").read_text(encoding="utf-8").splitlines() == ["figure,median", "step,2.0", "turn,0.5"]
    if has_matplotlib:
        assert drawn and (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out.startswith(f"results: {out / 'bench.md'}")


def test_the_command_line_is_the_program_and_its_arguments_quoted() -> None:
    assert command_line("python -m benchmarks.x", ["--a", "two words", "--b"]) == "python -m benchmarks.x --a 'two words' --b"
    assert command_line("python -m benchmarks.x", []) == "python -m benchmarks.x"


# --- the generated section ---------------------------------------------------------------------------


def test_a_missing_section_is_appended_after_every_byte_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    path.write_bytes(HISTORY.encode())
    replace(path, "suite", "## Performance report\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    text = path.read_bytes().decode()
    assert text.startswith(HISTORY)
    assert text[len(HISTORY):] == (
        "\n<!-- generated section suite: begin (rewritten by the command named below; edit outside these markers) -->\n"
        f"## Performance report\n\n{PROVENANCE}\n\n| a | b |\n|---|---|\n| 1 | 2 |\n<!-- generated section suite: end -->\n")


def test_a_file_without_a_final_newline_keeps_its_last_line(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    path.write_bytes(b"last line")
    replace(path, "suite", "plain text, no heading")
    text = path.read_bytes().decode()
    assert text.startswith("last line\n\n<!-- generated section suite: begin")
    assert f"-->\n{PROVENANCE}\n\nplain text, no heading\n<!-- generated section suite: end -->\n" in text


def test_a_present_section_is_replaced_and_nothing_outside_its_markers_changes(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    path.write_bytes(HISTORY.encode())
    replace(path, "suite", "## Report\n\nold figures 1.0\n")
    after = "\n## Later hand-written entry\r\n\n- kept\n"  # written by hand below the section
    path.write_bytes(path.read_bytes() + after.encode())
    before = path.read_bytes().decode()
    begin, end = before.index("<!-- generated section suite: begin"), before.index("<!-- generated section suite: end -->")
    replace(path, "suite", "## Report\n\nnew figures 2.0\n")
    text = path.read_bytes().decode()
    assert "old figures" not in text and "new figures 2.0" in text and text.count("generated section suite: begin") == 1
    new_end = text.index("<!-- generated section suite: end -->")
    assert text[:begin] == before[:begin] == HISTORY + "\n"
    assert text[new_end:] == before[end:] == "<!-- generated section suite: end -->\n" + after
    replace(path, "suite", "## Report\n\nnew figures 2.0\n")
    assert path.read_bytes().decode() == text  # same content, same file


def test_each_name_has_its_own_section(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    replace(path, "suite", "## Suite\n\nfast")  # the file is made
    replace(path, "evaluation", "## Evaluation\n\nEM 0.5")
    first = path.read_bytes().decode()
    replace(path, "evaluation", "## Evaluation\n\nEM 0.75")
    text = path.read_bytes().decode()
    suite_end = text.index("<!-- generated section suite: end -->")
    assert text[:suite_end] == first[:suite_end] and text.startswith("<!-- generated section suite: begin")
    assert "EM 0.75" in text and "EM 0.5\n" not in text and text.index("## Suite") < text.index("## Evaluation")


@pytest.mark.parametrize(("content", "message"), [
    ("<!-- generated section suite: begin -->\nno end\n", "half-marked"),
    ("<!-- generated section suite: end -->\n<!-- generated section suite: begin -->\n", "half-marked"),
    ("<!-- generated section suite: begin -->\n<!-- generated section suite: end -->\n" * 2, "more than once"),
])
def test_a_damaged_section_is_refused_and_the_file_left_alone(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "RESULTS.md"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        replace(path, "suite", "## New")
    assert path.read_text(encoding="utf-8") == content
    with pytest.raises(ValueError, match="a generated section's name"):
        replace(path, "two words", "## New")
