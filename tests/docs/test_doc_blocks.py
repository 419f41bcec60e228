"""Every shell and Python block of the docs site and README.md runs in a test or is marked as an
excerpt (tests/docs/doc_blocks.py; the convention for writers: docs/development/docs.md).

The unmarked blocks of each page run here, in the page's order, in a scratch folder laid out as a
clone: a page is one session at the top of the clone, later blocks using what earlier ones wrote."""
import pytest

import doc_blocks as D

# pages whose blocks take more than about 30 s on this 2-core machine: the `slow` tier
SLOW = {"docs/tutorials/pytorch.md", "docs/tutorials/sparse.md", "docs/tutorials/int8.md", "docs/tutorials/board.md"}


def test_every_code_block_is_run_or_marked():
    problems = []
    counts = {"run here": 0, "run-by": 0, "excerpt": 0}
    for page in D.pages():
        for b in D.blocks(page, problems):
            if b.kind:
                key = "run here" if b.marker is None else b.marker.split()[0]
                counts[key] = counts.get(key, 0) + 1
    assert not problems, "\n".join(problems + ["(the convention: docs/development/docs.md)"])
    assert counts["run here"] >= 10, counts


def test_the_convention_refuses_what_it_should():
    page = "\n".join([
        "```", "no language", "```",
        "<!-- doc-test: exerpt -->", "```sh", "echo typo in the marker", "```",
        "<!-- doc-test: run-by tests/docs/test_nowhere.py -->", "```python", "print(1)", "```",
        "<!-- doc-test: run-by tests/cli/test_cli.py -->", "```python", "print(2)", "```",
        "<!-- doc-test: excerpt -->", "", "some prose between the marker and the block",
        "```sh", "echo unmarked, so it runs", "```",
        "<!-- doc-test: excerpt -->", "```text", "not code", "```",
        "<!-- doc-test: excerpt -->", "```sh", "echo an excerpt", "```",
    ])
    problems = []
    bs = D.blocks("docs/example.md", problems, text=page)
    assert [(b.lang, b.marker) for b in bs] == [
        ("", None), ("sh", "exerpt"), ("python", "run-by tests/docs/test_nowhere.py"),
        ("python", "run-by tests/cli/test_cli.py"), ("sh", None), ("text", "excerpt"), ("sh", "excerpt")]
    assert [b.text for b in bs][-1] == "echo an excerpt\n"
    expected = [
        "docs/example.md:1: a code block with no language",
        "docs/example.md:5: unknown doc-test marker 'exerpt'",
        "docs/example.md:9: run-by names tests/docs/test_nowhere.py, which does not exist",
        "docs/example.md:13: run-by names tests/cli/test_cli.py, which never reads example.md",
        "docs/example.md:16: a doc-test marker with no code block after it",
        "docs/example.md:23: a doc-test marker on a ```text block",
    ]
    assert len(problems) == len(expected), problems
    for p, e in zip(problems, expected):
        assert p.startswith(e), (p, e)


PAGES = [p for p in D.pages() if D.runnable(p)]


@pytest.mark.parametrize("page", [pytest.param(p, marks=pytest.mark.slow) if p in SLOW else p for p in PAGES])
def test_the_page_runs(page, tmp_path):
    cwd = D.scratch_clone(tmp_path)
    for b in D.runnable(page):
        r = D.run_block(b, cwd)
        assert r.returncode == 0, "%s (```%s) exit status %d\n--- block\n%s--- stdout\n%s\n--- stderr\n%s" % (
            b.where, b.lang, r.returncode, b.text, r.stdout[-4000:], r.stderr[-4000:])


def test_every_page_with_blocks_is_tested():
    """A page (or SLOW entry) that no longer exists, or slow pages that are not there, are noticed."""
    assert SLOW <= set(PAGES), SLOW - set(PAGES)
    assert "docs/getting-started.md" in PAGES
