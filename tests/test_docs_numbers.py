"""The documentation cannot disagree with the results (issue 26): every number the README or
docs/ quote from a report is the report's (``<!-- num SOURCE:PATH FORMAT -->``), the generated
pages and blocks are what ``python -m dse.docs`` writes now, local links resolve, and the README
stays short."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from helpers import ROOT

from dse import docs
from dse.errors import InputError
from dse.spec import bundled

LINK = re.compile(r"(?:\]\(|<img src=\")(?!https?:|mailto:|#)([^)\"\s#]+)(#[^)\"\s]*)?")


def test_every_quoted_number_is_its_reports():
    assert docs.mismatches() == [], "run `python -m dse.docs`"


def test_generated_pages_and_blocks_are_current():
    stale = [str(f.relative_to(ROOT)) for f in docs.stale()]
    assert stale == [], f"{stale}: run `python -m dse.docs`"


def test_the_docs_quote_numbers_from_every_kind_of_report():
    text = "\n".join(f.read_text() for f in docs.markdown_files())
    specs = {m[1].split(":")[0] for m in docs.NUM.finditer(text)}
    assert {"e2e", "kernels", "bench"} <= specs
    assert any(s.startswith("answer/") for s in specs)
    # the headline figures of the README all come from reports
    readme = (ROOT / "README.md").read_text()
    assert len(docs.NUM.findall(readme)) >= 10


def _fake_root(tmp_path, quoted: str):
    (tmp_path / "reports" / "q").mkdir(parents=True)
    (tmp_path / "reports" / "q" / "answer.json").write_text(json.dumps(
        {"lead": [{"nominal": 1.1305776637551692, "label": "price cut"}]}))
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("x\n")
    (tmp_path / "README.md").write_text(
        f"The cut is <!-- num answer/q:lead/0/nominal .2f -->{quoted}<!-- /num -->x "
        "(<!-- num answer/q:lead/0/label s --><!-- /num -->).\n")
    return tmp_path


def test_a_number_that_drifts_from_its_report_fails(tmp_path):
    root = _fake_root(tmp_path, "1.14")        # the README said 1.14x; the report says 1.13x
    bad = docs.mismatches(root)
    assert len(bad) == 2 and "answer/q:lead/0/nominal says '1.14', its source '1.13'" in bad[0]
    fixed = docs.fill((root / "README.md").read_text(), root)
    assert "-->1.13<!--" in fixed and "-->price cut<!--" in fixed
    (root / "README.md").write_text(fixed)
    assert docs.mismatches(root) == []


def test_a_missing_source_or_path_is_named(tmp_path):
    root = _fake_root(tmp_path, "1.13")
    (root / "docs" / "index.md").write_text("<!-- num answer/q:lead/3/nominal .2f -->1<!-- /num -->"
                                            "<!-- num answer/gone:x .2f -->1<!-- /num -->\n")
    bad = docs.mismatches(root)
    assert any("has no '3'" in b for b in bad) and any("gone/answer.json is missing" in b
                                                       for b in bad)


def test_the_end_to_end_and_kernel_reports_parse():
    e2e = docs.value("e2e:aic-silicon/tpot_s")
    assert e2e["cases"] > 100 and 1 < e2e["error_factor"] < 3
    k = docs.value("kernels:gemm")
    assert k["groups"] > 10 and 1 < k["median"] <= k["worst"]


def test_local_links_resolve():
    """Every relative link and image of the README and docs/ names a file in the repository, so
    the pages work on the repository host as plain Markdown (mkdocs --strict checks the site)."""
    missing = []
    for f in docs.markdown_files():
        text = re.sub(r"```.*?```", "", f.read_text(), flags=re.DOTALL)
        for m in LINK.finditer(text):
            if not (f.parent / m[1]).exists():
                missing.append(f"{f.relative_to(ROOT)}: {m[1]}")
    assert missing == []


def test_every_docs_page_is_in_the_site_nav():
    nav = set(re.findall(r":\s+(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.MULTILINE))
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert pages == nav


def test_the_readme_is_short_and_points_into_the_docs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 12 * 1024
    for page in ("docs/accuracy.md", "docs/speed.md", "docs/spaces.md", "docs/reference/cli.md"):
        assert f"({page})" in readme, page
    # CI runs the README's quick start and test command (.ci/run)
    ci = (ROOT / ".ci" / "run").read_text()
    assert ".venv/bin/dse run spaces/quickstart.toml" in readme
    assert ".venv/bin/dse run spaces/quickstart.toml" in ci
    assert ".venv/bin/python -m pytest" in readme and ".venv/bin/python -m pytest" in ci


def test_shipped_spaces_run_by_name(tmp_path):
    assert bundled.space_path("quickstart") == str(bundled.spaces_dir() / "quickstart.toml")
    assert bundled.space_path("quickstart.toml").endswith("quickstart.toml")
    assert bundled.space_path("fast-mode").endswith("questions/fast-mode.toml")
    assert {"quickstart", "annotated", "fast-mode"} <= set(bundled.names())
    assert bundled.space_path("spaces/other.toml") == "spaces/other.toml"   # a path: as given
    with pytest.raises(InputError, match="did you mean 'quickstart'"):
        bundled.space_path("quickstrat")
    with pytest.raises(InputError, match="shipped spaces: "):
        bundled.space_path("no-such-space.toml")
    r = subprocess.run([sys.executable, "-m", "dse", "validate", "annotated"], cwd=tmp_path,
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert "size: 132 designs" in r.stdout


@pytest.mark.parametrize("argv", [["--version"]])
def test_version_from_the_package(argv):
    from dse import __version__
    r = subprocess.run([sys.executable, "-m", "dse", *argv], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 0 and r.stdout.strip() == f"dse {__version__}"


def test_no_quoted_number_starts_a_line():
    """A line that starts with an HTML comment starts an HTML block (CommonMark, GitHub and
    Python-Markdown alike), which would cut its paragraph in two."""
    bad = [f"{f.relative_to(ROOT)}:{i}" for f in docs.markdown_files()
           for i, ln in enumerate(f.read_text().splitlines(), 1)
           if ln.lstrip().startswith("<!-- num")]
    assert bad == []
