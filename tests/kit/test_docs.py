"""The documentation's links inside the repository lead somewhere: every relative link in README.md and docs/
names a file that exists and, with a #fragment, a heading of that file. The node CLI's option reference
(docs/cli.md) is what the commands' parsers make."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "BENCHMARKS.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#+ (.+)$", re.M)


def anchor(heading: str) -> str:
    """GitHub's id for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [target for target in LINK.findall(text) if not re.match(r"\w+:", target)]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_relative_link_names_a_file_and_heading_that_exist(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(REPO) if REPO in dest.parents else dest}")
        elif fragment and fragment not in {anchor(h) for h in HEADING.findall(dest.read_text())}:
            broken.append(f"{target}: no heading with id {fragment} in {dest.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_the_cli_reference_is_what_the_parsers_make(tmp_path: Path) -> None:
    """`dglkit clidoc` (make docs) finds docs/cli.md current, and names it once an option's help changes."""
    command = [sys.executable, "-m", "dglkit", "clidoc", "--root"]  # from app/: this checkout's dglkit
    current = subprocess.run([*command, str(REPO)], cwd=REPO / "app", capture_output=True, text=True, timeout=300)
    assert current.returncode == 0, f"docs/cli.md is stale: run make docs ({current.stderr.strip()})"
    (tmp_path / "docs").mkdir()
    reference = (REPO / "docs" / "cli.md").read_text()
    edited = reference.replace("| the workers, one rank and one part each |", "| the workers |")
    assert edited != reference
    (tmp_path / "docs" / "cli.md").write_text(edited)
    stale = subprocess.run([*command, str(tmp_path)], cwd=REPO / "app", capture_output=True, text=True, timeout=300)
    assert stale.returncode == 1 and "docs/cli.md differs" in stale.stderr and "make docs" in stale.stderr


def test_every_program_of_the_app_is_on_the_cli_reference_or_says_why_not() -> None:
    """A module run as `python -m dglkit.<module>` (mpirun's programs, the roles' and the commands' children) has its
    options on docs/cli.md like the commands, or is named with the reason it is not."""
    from dglkit import clidoc

    app = REPO / "app" / "dglkit"
    programs = {f"dglkit.{path.stem}" for path in app.glob("*.py")
                if path.stem != "__main__" and re.search(r"^if __name__ == .__main__.:", path.read_text(), re.M)}
    assert programs == set(clidoc.PROGRAMS) | set(clidoc.UNLISTED), "list each in clidoc.PROGRAMS or UNLISTED"
    run = re.compile(r"""-m['"]?,? ['"]?(dglkit\.\w+)""")
    sources = [*app.rglob("*.py"), *(REPO / "roles").rglob("*.yml"), *(REPO / "playbooks").rglob("*.yml")]
    started = {module for path in sources for module in run.findall(path.read_text())}
    assert started and started <= programs, started - programs
    reference = (REPO / "docs" / "cli.md").read_text()
    for module in clidoc.PROGRAMS:
        assert f"python -m {module}" in reference, module
