"""The docs site (mkdocs.yml) builds with `mkdocs build --strict`: no warning, no broken link or
anchor; its command-line reference, generated from the CLI's parser, has every command and
option; its API pages come from the docstrings."""
import importlib.util
import os
import re
import subprocess
import sys

import pytest

from repo import ROOT, skip

import doc_blocks


def _commands():
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        import docs_hooks
    finally:
        sys.path.pop(0)
    from microtrain.cli import parser
    return docs_hooks, docs_hooks.commands(parser())


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        skip("mkdocs or mkdocstrings is not installed in this venv: pip install -r requirements-docs.txt "
             "(make venv installs it)")     # under CI (CI=true) a failure, not a skip
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=ROOT,
                       capture_output=True, text=True, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert not re.search(r"^(WARNING|ERROR) ", r.stderr, re.M), r.stderr
    return out


def test_the_site_builds_strict_with_every_page(site):
    for page in doc_blocks.pages():
        if page.startswith("docs/"):
            assert (site / (page[len("docs/"):-len(".md")] + ".html")).exists(), page
    assert (site / "arena.svg").exists()


def test_the_cli_reference_has_every_command_and_option(site):
    html = (site / "reference" / "cli.html").read_text()
    _, cmds = _commands()
    assert len(cmds) >= 15
    for cmd, sub in cmds:
        anchor = 'id="microtrain-%s"' % "-".join(cmd)
        assert anchor in html, cmd
        section = html[html.index(anchor):]
        section = section[:section.find("<h2", 1) if "<h2" in section[1:] else None]
        for action in sub._actions:
            if action.dest == "help":
                continue            # -h/--help: said once for all at the top of the page
            for o in action.option_strings:
                # in a row of the command's table, not only in its usage line
                assert re.search(r"<td><code>[^<]*(?<![\w-])%s(?![\w-])[^<]*</code></td>" % re.escape(o),
                                 section), (cmd, o)
            if action.choices and action.option_strings and not action.metavar:
                assert "{%s}" % ",".join(map(str, action.choices)) in section, (cmd, action.dest)
    assert "<code>--version</code>" in html and 'id="microtrain"' in html
    assert "<!-- cli-reference -->" not in html


def test_the_api_pages_come_from_the_docstrings(site):
    host = (site / "reference" / "python-host.html").read_text()
    for name in ("microtrain.compile", "microtrain.Simulator", "microtrain.Plan", "microtrain.load_plan"):
        assert 'id="%s"' % name in host, name
    assert "Compile an ONNX model (path, bytes or onnx.ModelProto) into a Plan." in host
    board = (site / "reference" / "python-board.html").read_text()
    assert "Serve the host over the REPL" in board          # microtrain.serve's docstring
    assert re.search(r'id="microtrain_board\.checkpoint\.Checkpoint"', board)


def test_the_hook_refuses_a_cli_page_without_its_marker():
    hooks, _ = _commands()

    class Page:
        class file:
            src_uri = "reference/cli.md"
    with pytest.raises(ValueError, match="cli-reference"):
        hooks.on_page_markdown("# Command line\n", Page, None, None)
    assert "## microtrain compile" in hooks.on_page_markdown("<!-- cli-reference -->", Page, None, None)


def test_the_readme_links_to_pages_that_exist():
    """README.md is read on the repository's web page, outside the site: its relative links are
    checked here, as mkdocs checks the site's."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [l for l in links if "://" not in l]
    assert len(local) >= 15, local
    missing = [l for l in local if not os.path.exists(os.path.join(ROOT, l))]
    assert not missing, missing
