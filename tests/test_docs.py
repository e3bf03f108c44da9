"""The README and the docs: the two commands stay first, links lead somewhere, the CLI reference is complete."""

import argparse
import importlib.util
import re
from pathlib import Path

from tinyverse.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
TRAIN = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[examples]' && "
    "python -m tinyverse examples/cartpole_dqn.py run --target-return 475"
)
TEST = "pip install -e '.[test]' && ruff check . && ruff format --check . && python -m pytest -q"


def code_blocks(markdown: str) -> list[str]:
    return [b.strip() for b in re.findall(r"^```[a-z]*\n(.*?)^```", markdown, re.M | re.S)]


def test_the_readme_starts_with_the_two_commands_and_keeps_the_five():
    blocks = code_blocks(README)
    assert blocks[:2] == [TRAIN, TEST]
    five = ("play", "train", "eval", "info", "clear")
    modes = [next(word for word in line.split() if word in five) for line in blocks[2].splitlines()]
    assert modes == list(five), blocks[2]
    assert all(line.startswith("python -m tinyverse ") for line in blocks[2].splitlines())


def test_the_quickstart_gives_the_same_two_commands():
    quickstart = (ROOT / "docs" / "quickstart.rst").read_text()
    assert f"$ {TRAIN}\n" in quickstart and f"$ {TEST}\n" in quickstart


def test_the_readme_links_lead_to_files_that_exist():
    links = re.findall(r"\]\(([^)#]+)\)", README)
    local = [link for link in links if "://" not in link]
    assert len(local) >= 10, local
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, f"README links to missing files: {missing}"


def load_cliref():
    spec = importlib.util.spec_from_file_location("cliref", ROOT / "docs" / "_ext" / "cliref.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_has_every_mode_and_every_flag_of_the_parser():
    cliref, parser = load_cliref(), build_parser()
    text = "\n".join(cliref.reference(parser))
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == ["play", "train", "run", "eval", "clear", "info", "plot", "export", "import", "tune"]
    sections = re.split(r"^(\w+)\n-+\n", text, flags=re.M)  # [preamble, name, body, name, body, ...]
    bodies = dict(zip(sections[1::2], sections[2::2], strict=True))
    assert list(bodies) == list(sub.choices)
    for name, mode in sub.choices.items():
        options = re.findall(r"^\.\. option:: (.+)$", bodies[name], re.M)
        documented = {flag.split()[0] for line in options for flag in line.split(", ")}
        flags = {f for a in mode._actions for f in a.option_strings} - {"-h", "--help"}
        assert documented == flags, name
        assert f".. program:: tinyverse {name}" in bodies[name]
        assert (mode.description or "").split("(")[0].strip() in bodies[name]


def test_help_texts_are_shown_as_they_are():
    cliref = load_cliref()
    assert cliref.escape("a *glob*, `x`, a|b, name_ and snake_case") == (
        r"a \*glob\*, \`x\`, a\|b, name\_ and snake_case"
    )
    assert cliref.escape("shorthand for --db (-vv: debug), comma-separated, $TINYVERSE_DB") == (
        "shorthand for ``--db`` (``-vv``: debug), comma-separated, ``$TINYVERSE_DB``"
    )
