"""The code blocks of the docs site and README.md, and how each is tested
(docs/development/docs.md has the convention for writers).

Every fenced block has a language. A shell block (sh, bash, shell, console) or a Python block
(python, py, pycon) is one of:

- unmarked: run by tests/docs/test_doc_blocks.py, page by page, in the page's order, in a
  scratch folder laid out as a clone (the repository's top-level folders linked into it, build/
  its own), `microtrain` and `python` those of the suite's interpreter; a Python block with a
  title (```python title="my_model.py") is written to that file first, so later blocks can
  import it;
- marked, on the last non-blank line before its fence, `<!-- doc-test: run-by tests/AREA/test_X.py -->`:
  run by that test, which reads the page (its file names the page), e.g. the getting-started
  install in a clean venv, the emulated board;
- marked `<!-- doc-test: excerpt -->`: not run (placeholders such as model.onnx, a real board,
  MIT's networks that are not in the repository, a run of many minutes).

Any other marker, a marker with no block after it, or a block with no language fails
tests/docs/test_doc_blocks.py.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CODE = {"sh": "sh", "bash": "sh", "shell": "sh", "console": "sh", "python": "python", "py": "python",
        "pycon": "python"}
MARKER = re.compile(r"^\s*<!--\s*doc-test:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")


def pages():
    """README.md and every .md under docs/, as paths relative to the repository."""
    out = ["README.md"]
    for base, dirs, files in os.walk(os.path.join(ROOT, "docs")):
        dirs.sort()
        out += sorted(os.path.relpath(os.path.join(base, f), ROOT) for f in files if f.endswith(".md"))
    return out


class Block:
    def __init__(self, page, line, lang, text, marker, title=None):
        self.page, self.line, self.lang, self.text, self.marker = page, line, lang, text, marker
        self.title = title      # ```python title="my_model.py": the block is that file

    @property
    def kind(self):
        """'sh', 'python' or None (not code: text, json, ...)."""
        return CODE.get(self.lang)

    @property
    def where(self):
        return "%s:%d" % (self.page, self.line)

    def __repr__(self):
        return "<%s ```%s %s>" % (self.where, self.lang, self.marker or "run")


def blocks(page, problems=None, text=None):
    """The fenced blocks of a page (README.md, docs/...; or text, if given, as that page), in
    order; problems (a list) gets each place that breaks the convention, as PAGE:LINE: what."""
    problems = [] if problems is None else problems
    if text is None:
        with open(os.path.join(ROOT, page)) as f:
            text = f.read()
    lines = text.split("\n")
    out, i, pending = [], 0, None
    while i < len(lines):
        m = MARKER.match(lines[i])
        if m:
            if pending is not None:
                problems.append("%s:%d: a doc-test marker with no code block after it" % (page, pending[0]))
            pending = (i + 1, m.group(1))
            i += 1
            continue
        f = FENCE.match(lines[i])
        if not f:
            if lines[i].strip() and pending is not None:
                problems.append("%s:%d: a doc-test marker with no code block after it" % (page, pending[0]))
                pending = None
            i += 1
            continue
        indent, fence, info = f.groups()
        start = i + 1
        j = i + 1
        while j < len(lines):
            c = FENCE.match(lines[j])
            if c and c.group(2)[0] == fence[0] and len(c.group(2)) >= len(fence) and not c.group(3).strip():
                break
            j += 1
        body = "\n".join(l[len(indent):] if l.startswith(indent) else l.lstrip() for l in lines[i + 1:j]) + "\n"
        lang = info.strip().split()[0].lstrip("{.").rstrip("}") if info.strip() else ""
        marker = pending[1] if pending else None
        pending = None
        t = re.search(r'title="([^"]+)"', info)
        b = Block(page, start, lang, body, marker, t.group(1) if t else None)
        if not lang:
            problems.append("%s: a code block with no language (```text for output or a diagram)" % b.where)
        if marker is not None:
            if b.kind is None:
                problems.append("%s: a doc-test marker on a ```%s block, which is not run anyway" % (b.where, lang))
            elif marker != "excerpt":
                m2 = re.match(r"run-by (tests/\S+\.py)$", marker)
                if not m2:
                    problems.append("%s: unknown doc-test marker %r (excerpt, or run-by tests/AREA/test_X.py)"
                                    % (b.where, marker))
                else:
                    path = os.path.join(ROOT, m2.group(1))
                    if not os.path.exists(path):
                        problems.append("%s: run-by names %s, which does not exist" % (b.where, m2.group(1)))
                    else:
                        with open(path) as t:
                            if os.path.basename(page) not in t.read():
                                problems.append("%s: run-by names %s, which never reads %s"
                                                % (b.where, m2.group(1), os.path.basename(page)))
        out.append(b)
        i = j + 1
    if pending is not None:
        problems.append("%s:%d: a doc-test marker with no code block after it" % (page, pending[0]))
    return out


def runnable(page):
    """The page's blocks that tests/docs/test_doc_blocks.py runs (code, unmarked)."""
    return [b for b in blocks(page) if b.kind and b.marker is None]


def scratch_clone(tmp_path):
    """A folder laid out as a clone: the repository's top-level entries linked in, except the
    build folder, the venv and git's, so that what the docs' commands write lands here."""
    for name in os.listdir(ROOT):
        if name in ("build", ".venv", ".git") or name.startswith(".pytest"):
            continue
        os.symlink(os.path.join(ROOT, name), str(tmp_path / name))
    return tmp_path


def run_block(b, cwd, env=None, timeout=600, python=None):
    """Run one block in cwd as the page shows it (bash -e for shell, python for Python); returns
    the completed process. PATH starts with the interpreter's folder, as an activated venv's does."""
    env = dict(os.environ if env is None else env)
    python = python or sys.executable
    env["PATH"] = os.path.dirname(python) + os.pathsep + env["PATH"]
    if b.kind == "sh":
        args = ["bash", "-e", "-o", "pipefail", "-c", b.text]
    elif b.title:
        # a block titled as a file (```python title="my_model.py") is that file: written, then run
        with open(os.path.join(str(cwd), b.title), "w") as f:
            f.write(b.text)
        args = [python, b.title]
    else:
        args = [python, "-c", b.text]
    return subprocess.run(args, cwd=str(cwd), env=env, capture_output=True, text=True, timeout=timeout)
