"""The documents: README a front page, and every relative link in README.md, docs/
and bench/ leading to a file and, with an anchor, to a heading of it."""

import pathlib
import re

import runs

REPO = pathlib.Path(runs.REPO)
DOCUMENTS = [
  REPO / "README.md",
  *sorted((REPO / "docs").glob("*.md")),
  *sorted((REPO / "bench").rglob("README.md")),
]
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose(path: pathlib.Path):
  """(line number, line) outside fenced code blocks."""
  fenced = False
  for number, line in enumerate(path.read_text().splitlines(), 1):
    if line.lstrip().startswith("```"):
      fenced = not fenced
    elif not fenced:
      yield number, line


def _slug(heading: str) -> str:
  """A heading's anchor as GitHub makes it: link text kept, punctuation dropped,
  lower case, spaces to hyphens."""
  text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
  return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: pathlib.Path) -> set[str]:
  """The anchors of the headings of `path`; a repeated heading's get -1, -2, ..."""
  anchors, seen = set(), {}
  for _, line in _prose(path):
    match = HEADING.match(line)
    if match:
      slug = _slug(match.group(2))
      anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
      seen[slug] = seen.get(slug, 0) + 1
  return anchors


def test_readme_is_a_front_page_of_at_most_200_lines():
  assert len((REPO / "README.md").read_text().splitlines()) <= 200


def test_every_relative_link_leads_to_a_file_and_a_heading():
  broken = []
  for document in DOCUMENTS:
    for number, line in _prose(document):
      for target in LINK.findall(line):
        if re.match(r"^[a-z]+:", target):
          continue  # http:, https:, mailto:
        file_part, _, anchor = target.partition("#")
        destination = (document.parent / file_part).resolve() if file_part else document
        where = f"{document.relative_to(REPO)}:{number}: {target}"
        if not destination.exists():
          broken.append(f"{where} (no such file)")
        elif anchor and anchor not in _anchors(destination):
          broken.append(f"{where} (no such heading)")
  assert not broken, "\n".join(broken)
