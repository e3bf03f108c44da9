"""The CLI reference, generated from ``tinyverse.cli.build_parser()`` at every build.

``.. tinyverse-cli::`` in a page expands to one section per mode with its usage,
its description and every option (``.. option::``, so ``:option:`tinyverse play -b```
links to it), straight from the parser: a flag added to the CLI is in the docs at
the next build, and nothing is copied by hand.
"""

import argparse
import re

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

from tinyverse.cli import build_parser

SPECIAL = re.compile(r"([\\*`|])|(_)(?!\w)")  # reStructuredText markup that help texts may contain by chance
CODE = re.compile(r"(?<![\w`])(--?[A-Za-z][\w-]*|\$[A-Z_]+)")  # flags and environment variables in help texts


def escape(text: str) -> str:
    """Plain text as reStructuredText that shows it as it is, flags and $VARIABLES as code.

    As code, ``--db`` keeps its two hyphens (plain text would turn them into a dash).
    """
    text = SPECIAL.sub(lambda m: "\\" + (m.group(1) or m.group(2)), text)
    return CODE.sub(r"``\1``", text)


def modes(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's subcommands, in the order they were added."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def invocation(action: argparse.Action) -> str:
    """``-b N, --batch-size N`` for an option that takes a value, ``--all`` for a flag."""
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    metavar = action.metavar or action.dest.upper()
    if action.nargs == "?":
        metavar = f"[{metavar}]"
    return ", ".join(f"{flag} {metavar}" for flag in action.option_strings)


def describe(action: argparse.Action) -> str:
    text = escape(action.help or "")
    default = action.default
    shown = default is not None and default is not False and default not in ("", [], argparse.SUPPRESS)
    if shown and "default" not in (action.help or ""):
        text += f" (default: ``{default}``)"
    return text


def usage(parser: argparse.ArgumentParser, width: int = 80) -> list[str]:
    """The usage lines of ``--help``, wrapped at ``width`` whatever the terminal of the build."""
    formatter = parser.formatter_class(prog=parser.prog, width=width)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip().splitlines()


def reference(parser: argparse.ArgumentParser | None = None, heading: str = "-") -> list[str]:
    """reStructuredText of ``python -m tinyverse`` and every mode: usage, description, options."""
    parser = parser or build_parser()
    lines = [escape(parser.description or ""), "", ".. code-block:: text", ""]
    lines += ["   " + line for line in usage(parser)] + [""]
    lines += [".. code-block:: text", "", "   " + parser.epilog, ""] if parser.epilog else []  # "example: ..."
    lines += [".. program:: tinyverse", ""] + options(parser)
    for name, mode in modes(parser).items():
        lines += [name, heading * len(name), "", escape(mode.description or ""), "", ".. code-block:: text", ""]
        lines += ["   " + line for line in usage(mode)] + [""]
        lines += [f".. program:: tinyverse {name}", ""] + options(mode)
    return lines


def options(parser: argparse.ArgumentParser) -> list[str]:
    """One ``.. option::`` per flag (``-h`` aside), under the title of its group."""
    lines = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.option_strings and a.help != argparse.SUPPRESS]
        actions = [a for a in actions if not isinstance(a, argparse._HelpAction)]
        if not actions:
            continue
        title = "options" if group.title in ("options", "optional arguments") else f"{group.title} options"
        lines += [f"*{escape(title)}*", ""]
        for action in actions:
            lines += [f".. option:: {invocation(action)}", "", f"   {describe(action)}", ""]
    return lines


class TinyverseCli(SphinxDirective):
    """``.. tinyverse-cli::``: the reference of every mode, from the parser."""

    def run(self):
        source = self.get_source_info()[0] or "cli"
        content = StringList(reference(), source=f"{source} (generated from tinyverse.cli.build_parser)")
        node = nodes.section()  # a container that the generated sections are parsed into
        node.document = self.state.document
        nested_parse_with_titles(self.state, content, node)
        return node.children


def setup(app):
    app.add_directive("tinyverse-cli", TinyverseCli)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
