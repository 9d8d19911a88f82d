"""The documentation's own checks: its links lead somewhere, the results folder holds what its index and the docs
cite and nothing else, and the README stays the front door (at most 150 lines)."""
import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "docs" / "results"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def links(page: Path) -> set[Path]:
    """The local files a markdown page links to."""
    return {(page.parent / target).resolve() for target in LINK.findall(page.read_text())
            if not re.match(r"[a-z]+:", target)}


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), RESULTS / "README.md"]


def test_every_link_of_the_readme_and_docs_leads_to_a_file():
    broken = [f"{page.relative_to(ROOT)} -> {target}" for page in pages() for target in links(page)
              if not target.exists()]
    assert broken == []


def test_the_results_folder_holds_what_is_cited_and_nothing_else():
    index = RESULTS / "README.md"
    logs = {p for p in links(index) if p.parent == RESULTS}
    cited = set().union(*(links(p) for p in pages()), *(links(log) for log in logs if log.suffix == ".md"))
    cited |= {RESULTS / name for page in pages() for name in re.findall(r"results/([\w.-]+)", page.read_text())}
    cited |= {RESULTS / name for log in logs if log.suffix == ".md"                 # a log names its JSON
              for name in re.findall(r"[\w.-]+\.(?:json|png)", log.read_text())}
    unlisted = sorted(p.name for p in RESULTS.glob("*.md") if p != index and p not in logs)
    orphans = sorted(p.name for p in RESULTS.iterdir() if p != index and p.resolve() not in cited | logs)
    assert unlisted == [], f"logs missing from docs/results/README.md: {unlisted}"
    assert orphans == [], f"files in docs/results nothing cites: {orphans}"


def test_the_readme_is_at_most_150_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


def test_the_methods_option_table_is_generated_from_the_dataclasses():
    from specmesh.options import BEGIN, END, table
    text = (ROOT / "docs" / "methods.md").read_text()
    assert text.split(BEGIN, 1)[1].split(END, 1)[0].strip() == table(), \
        "docs/methods.md's option table is stale: python -m specmesh.options --docs docs/methods.md"
