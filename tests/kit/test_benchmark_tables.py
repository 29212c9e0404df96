"""Every table in BENCHMARKS.md between `<!-- table NAME: ARGS -->` and `<!-- end table -->` is what
`bench/NAME.py --table ARGS` prints from the stored results: a figure edited by hand, or a result line lost
or added inside a table's dates, fails here."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TABLE = re.compile(r"<!-- table (\w+)(?:: ([^>]*?))? -->\n(.*?)<!-- end table -->", re.S)
TABLES = [(m.group(1), (m.group(2) or "").split(), m.group(3).strip())
          for m in TABLE.finditer((REPO / "BENCHMARKS.md").read_text())]


def test_the_page_has_tables() -> None:
    assert len(TABLES) >= 10, "the table markers in BENCHMARKS.md are no longer found"


@pytest.mark.parametrize(("name", "args", "table"), TABLES, ids=[f"{n} {' '.join(a)}" for n, a, _ in TABLES])
def test_table_is_made_from_the_stored_results(name: str, args: list[str], table: str) -> None:
    proc = subprocess.run([sys.executable, f"bench/{name}.py", "--table", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == table, f"regenerate it: .venv/bin/python bench/{name}.py --table {' '.join(args)}"
