"""mkdocs hooks of the docs site (mkdocs.yml `hooks:`), run by `make docs` and tests/docs/.

- The command-line reference (docs/reference/cli.md) is generated from the argparse parser of
  host/microtrain/cli.py at every build: the page's `<!-- cli-reference -->` line becomes one
  section per command (`microtrain compile`, ..., `microtrain fleet simulate`), with its
  description, usage and a table of its arguments, so the reference cannot drift from the CLI.
- The board-side package (modules/microtrain/python/microtrain) is also called `microtrain`, as
  the host package is; mkdocstrings finds packages by name, so the board's is offered to it as
  `microtrain_board`, a link in build/docs-api/ made here (docs/reference/python-board.md).
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = "<!-- cli-reference -->"
BOARD_API = os.path.join(ROOT, "build", "docs-api")


def _board_api_link():
    """build/docs-api/microtrain_board -> the board's package. Made when mkdocs loads this file
    (reading mkdocs.yml), before mkdocstrings looks at its `paths`, which skips missing folders."""
    os.makedirs(BOARD_API, exist_ok=True)
    link = os.path.join(BOARD_API, "microtrain_board")
    target = os.path.join(ROOT, "modules", "microtrain", "python", "microtrain")
    if os.path.realpath(link) != os.path.realpath(target):
        tmp = "%s.%d" % (link, os.getpid())      # made aside, then renamed: two builds at once agree
        os.symlink(target, tmp)
        os.replace(tmp, link)


_board_api_link()


def on_config(config):
    host = os.path.join(ROOT, "host")
    if host not in sys.path:
        sys.path.insert(0, host)
    return config


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri != "reference/cli.md":
        return markdown
    if MARKER not in markdown:
        raise ValueError("docs/reference/cli.md lost its %s line: the CLI reference goes there" % MARKER)
    return markdown.replace(MARKER, cli_reference())


def _cell(text):
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(action):
    if action.required or action.default in (None, argparse.SUPPRESS) or action.nargs == 0:
        return ""
    return "`%s`" % (action.default,)


def _argument(action):
    """The argument as its usage line shows it, in one code span (a bare `{a,b}` would be read
    as Markdown attributes): `-o, --output PLAN.mtp`, `--saved {float32,int8,bits}`, `model`."""
    if action.option_strings:
        names = ", ".join(action.option_strings)
        if action.nargs != 0:
            metavar = action.metavar or (action.dest.upper() if not action.choices else None)
            names += " %s" % (metavar if metavar else "{%s}" % ",".join(map(str, action.choices)))
        return "`%s`" % names
    return "`%s`" % (action.metavar or action.dest)


def commands(parser):
    """[(("compile",), subparser), ..., (("fleet", "simulate"), subparser)] in the CLI's order."""
    out = []

    def walk(prefix, p):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    out.append((prefix + (name,), sub))
                    walk(prefix + (name,), sub)
    walk((), parser)
    return out


def cli_reference():
    os.environ["COLUMNS"] = "88"     # argparse wraps usage lines to the terminal's width
    from microtrain.cli import parser
    p = parser()
    lines = ["The commands of `microtrain` (and `python -m microtrain`), generated from the "
             "parser of host/microtrain/cli.py when this site was built; `microtrain COMMAND --help` "
             "prints the same. Every command takes `-h`/`--help`.", ""]
    for cmd, sub in [((), p)] + commands(p):
        lines += ["## %s" % " ".join(("microtrain",) + cmd), ""]
        if sub.description:
            lines += [" ".join(sub.description.split()), ""]
        lines += ["```text", sub.format_usage().strip(), "```", ""]
        rows = [a for a in sub._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
        subs = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
        if rows:
            lines += ["| argument | default | what it does |", "| --- | --- | --- |"]
            for a in rows:
                help_text = a.help or ""
                if a.choices and a.option_strings and a.metavar:
                    help_text += " (one of: %s)" % ", ".join(map(str, a.choices))
                lines.append("| %s | %s | %s |" % (_cell(_argument(a)), _cell(_default(a)), _cell(help_text)))
            lines.append("")
        for a in subs:
            lines += ["| command | what it does |", "| --- | --- |"]
            for choice in a._choices_actions:
                name = ("microtrain",) + cmd + (choice.dest,)
                lines.append("| [`%s`](#%s) | %s |" % (" ".join(name), "-".join(name), _cell(choice.help)))
            lines.append("")
    return "\n".join(lines)
