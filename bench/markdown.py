"""Markdown pieces of the bench report: tables kept as data (so results.json holds every number shown)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

Cell = str | int | float | None

README_START = "<!-- bench:openb:start -->"
README_END = "<!-- bench:openb:end -->"


@dataclass
class Table:
    """A report table: column names and rows of cells; rendered as-is, saved as-is."""

    columns: list[str]
    rows: list[list[Cell]] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        """Append one row. Cells are often values read back from results (typed `object`), so each is
        checked to be a string, a number or None here."""
        if len(cells) != len(self.columns):
            raise ValueError(f"row of {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append([_checked(cell) for cell in cells])

    def markdown(self) -> str:
        """The table in GitHub markdown; numbers right-aligned, None as an em dash."""
        numeric = [
            all(isinstance(row[i], int | float) or row[i] is None for row in self.rows)
            for i in range(len(self.columns))
        ]
        lines = [
            "| " + " | ".join(self.columns) + " |",
            "|" + "|".join("---:" if n else "---" for n in numeric) + "|",
        ]
        lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in self.rows]
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        return {"columns": self.columns, "rows": self.rows}


def _checked(value: object) -> Cell:
    if value is None or isinstance(value, str | int | float):
        return value
    raise TypeError(f"table cell {value!r}: not a string, a number or None")


def _cell(value: Cell) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def update_readme(readme: Path, block: str) -> bool:
    """Replace the text between the bench markers of `readme` with `block`; False when markers are missing."""
    text = readme.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(README_START) + r".*?" + re.escape(README_END), re.DOTALL)
    if not pattern.search(text):
        return False
    replacement = f"{README_START}\n{block.strip()}\n{README_END}"
    readme.write_text(pattern.sub(lambda _: replacement, text, count=1), encoding="utf-8")
    return True


def bullet_list(items: Sequence[str]) -> str:
    """Markdown bullets, or a single line saying there is nothing to list."""
    return "\n".join(f"- {item}" for item in items) if items else "- (none)"


def provenance(command: str, module: str, protocol: str, info: Mapping[str, object]) -> str:
    """The opening of a bench report: the command, its module and protocol, the machine, date, commit and
    wall seconds (`bench_report.machine` plus `seconds`)."""
    return (
        f"`{command}` (`bench.{module}`, protocol `sim.{protocol}`). Machine: {info['cpu']}, {info['cores']} "
        f"cores, {info['ram_gib']} GiB RAM, Python {info['python']}; {info['date']}, commit `{info['commit']}`; "
        f"{info['seconds']} s."
    )
