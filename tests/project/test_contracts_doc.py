"""docs/contracts.md is the contracts document the code cites: no Python file cites the original design
document (outside the repository) any more, every label and annotation key of kube/keys.py is in it,
and the section anchors the code and the document link to exist."""

from __future__ import annotations

import re
from pathlib import Path

from gpupack.kube import keys

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = ROOT / "docs" / "contracts.md"
TEXT = CONTRACTS.read_text()
SKIPPED_DIRS = {".venv", "build", ".git", "__pycache__", "node_modules"}
# A citation of the original design: its file name, a section of it (`§3`), or "its order".
CITATION = re.compile("DESIGN" + r"(?:\.md|\s*§|'s\b)")
# Files this change may not touch (tests/e2e has its own owner); drop each once it cites docs/contracts.md.
NOT_YET_CONVERTED: set[str] = set()


def python_files() -> list[Path]:
    return sorted(
        path
        for path in ROOT.rglob("*.py")
        if not any(part in SKIPPED_DIRS or part.endswith(".egg-info") for part in path.relative_to(ROOT).parts)
    )


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    return {slug(line.lstrip("#")) for line in markdown.splitlines() if re.match(r"#{1,6} ", line)}


def test_no_python_file_cites_the_original_design() -> None:
    citing = {
        str(path.relative_to(ROOT)) for path in python_files() if CITATION.search(path.read_text(encoding="utf-8"))
    }
    assert citing - NOT_YET_CONVERTED == set(), "cite docs/contracts.md (with a section anchor) instead"
    assert citing >= NOT_YET_CONVERTED, f"converted: drop {sorted(NOT_YET_CONVERTED - citing)} from NOT_YET_CONVERTED"


def test_the_readme_points_to_the_contracts() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "docs/contracts.md" in readme
    assert not CITATION.search(readme)


def test_every_label_and_annotation_key_is_documented() -> None:
    names = {
        value
        for name, value in vars(keys).items()
        if name.startswith(("LABEL_", "ANNOTATION_", "RESOURCE_")) and isinstance(value, str) and "/" in value
    }
    names |= set(keys.SPOT_LABELS)
    assert {"gpupack.io/assignment", "gpupack.io/devices-in-use", "nvidia.com/gpu.product"} <= names
    missing = sorted(name for name in names if f"`{name}" not in TEXT)
    assert missing == [], f"kube/keys.py names these, docs/contracts.md does not: {missing}"


def test_the_anchors_the_code_cites_exist() -> None:
    known = anchors(TEXT)
    cited = {
        (str(path.relative_to(ROOT)), anchor)
        for path in python_files()
        for anchor in re.findall(r"docs/contracts\.md#([\w-]+)", path.read_text(encoding="utf-8"))
    }
    assert cited, "the code cites sections of docs/contracts.md"
    assert sorted((path, anchor) for path, anchor in cited if anchor not in known) == []


def test_the_links_of_the_contracts_resolve() -> None:
    for target, anchor in re.findall(r"\]\(([\w./-]*?)(?:#([\w-]+))?\)", TEXT):
        path = CONTRACTS.parent / target if target else CONTRACTS
        assert path.is_file(), f"docs/contracts.md links to missing {target}"
        if anchor:
            assert anchor in anchors(path.read_text()), f"docs/contracts.md links to missing {target}#{anchor}"
