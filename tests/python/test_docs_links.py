"""Every relative link in the README and docs/ leads somewhere: the file exists and, for
a markdown file, the anchor is one of its headings (GitHub's slugs: lower case,
punctuation dropped, spaces to hyphens, -1, -2... for repeats). And the documentation
site (mkdocs.yml) builds with --strict, which checks the links between docs/ pages by
mkdocs' own slugs and every page's place in the nav (`make docs`)."""

import functools
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.*)$", re.M)


@functools.cache  # many links point into the same few pages
def anchors(path):
    out, seen = set(), {}
    for title in HEADING.findall(FENCE.sub("", path.read_text())):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title).strip().lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(doc):
    broken = []
    for link in LINK.findall(FENCE.sub("", doc.read_text())):
        if re.match(r"^[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = (doc.parent / path).resolve() if path else doc
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(f"{link}: no heading with that anchor in {target.name}")
    return broken


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_heading(doc):
    assert broken_links(doc) == []


def test_a_link_to_a_missing_heading_or_file_is_reported(tmp_path):
    doc = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("# gloo's shared-memory path\n## Twice\n## Twice\n")
    doc.write_text("[ok](b.md#gloos-shared-memory-path) [ok](b.md#twice-1) [ok](#here)\n"
                   "# Here\n[bad](b.md#glooss-shared-memory-path) [bad](c.md)\n"
                   "```\n[in a fence](nowhere.md)\n```\n")
    assert broken_links(doc) == ["b.md#glooss-shared-memory-path: no heading with that anchor in b.md",
                                 "c.md: no such file"]


def test_the_site_builds_strict(tmp_path):
    # make's set-up installs mkdocs (make docs, make py-test); a bare venv skips.
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: run make docs")
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
