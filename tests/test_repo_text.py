"""Checks of the repository's tracked text: what the project says of itself.

The project speaks of its code, not of how, when or by whom it was written
(the words in ``BANNED`` belong to that story), and docs/benchmarks.md is a
reference (one section per benchmark, the latest table), not a diary, so it
stays short and every citation of it names a section it has.
"""
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCHMARKS = "docs/benchmarks.md"
MAX_BENCHMARK_LINES = 1000
THIS = "tests/test_repo_text.py"  # its patterns would read as citations

# Spelled in pieces so that this file does not say them itself. A plain
# substring, case-insensitive: identifiers count too, and where a word has a
# technical sense the text says "function", "subroutine" or "builder".
BANNED = re.compile("|".join(("ses" + "sion", "hel" + "per")), re.IGNORECASE)

FOREIGN_NAMES = re.compile(r"\b_new_process_group_" + "hel" + r"per\b")
"""Names of other projects' APIs that the code must call by name (torch's
builder of a process group on a subset of ranks): not the project's words."""


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git checkout ({e})")
    return [p for p in out.decode().split("\0") if p]


def _text(path: str) -> str | None:
    try:
        return (ROOT / path).read_text(encoding="utf-8")
    except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
        return None  # binary, a submodule, or deleted in the work tree


def test_no_tracked_file_tells_the_story_of_its_writing():
    hits = []
    for path in _tracked():
        for word in BANNED.findall(path):
            hits.append(f"{path}: its name says {word!r}")
        text = _text(path)
        if text is None:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if BANNED.search(FOREIGN_NAMES.sub("", line)):
                hits.append(f"{path}:{n}: {line.strip()[:100]}")
    assert not hits, "tracked text that says a word of BANNED:\n" + "\n".join(hits)


def test_benchmarks_document_is_a_short_reference():
    lines = (ROOT / BENCHMARKS).read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_BENCHMARK_LINES, (
        f"{BENCHMARKS} has {len(lines)} lines, more than {MAX_BENCHMARK_LINES}: keep the latest "
        "table of each benchmark and let git keep the history")


def _sections() -> set[str]:
    text = (ROOT / BENCHMARKS).read_text(encoding="utf-8")
    heads = re.findall(r"^#+\s+(.+?)\s*$", text, flags=re.MULTILINE)
    return {re.sub(r"\s*\(to be measured\)$", "", h) for h in heads}


# A citation: docs/benchmarks.md, then optionally a comma, "section" or "(",
# then the section's name in double or single quotes.
_CITATION = re.compile(r"benchmarks\.md`?\)?,?\s*(?:section\s+|\()?[\"']([^\"']+)[\"']")


def _flattened(text: str) -> str:
    """The text with comment markers at line starts, line breaks and the
    seams of implicitly concatenated Python strings removed, so that a name
    wrapped over lines reads as one."""
    text = re.sub(r"\n[ \t]*(#|//)?[ \t]*", " ", text)
    return re.sub(r"\"\s+\"", "", text)


def test_citations_of_the_benchmarks_document_name_its_sections():
    sections = _sections()
    cited, unknown = 0, []
    for path in _tracked():
        if path in (BENCHMARKS, THIS):
            continue
        text = _text(path)
        if text is None or "benchmarks.md" not in text:
            continue
        for name in _CITATION.findall(_flattened(text)):
            cited += 1
            if name not in sections:
                unknown.append(f"{path}: {name!r}")
    assert cited > 0, "the citation pattern found nothing: it no longer matches how the code cites"
    assert not unknown, ("citations of sections docs/benchmarks.md does not have:\n"
                         + "\n".join(unknown) + f"\nsections: {sorted(sections)}")
