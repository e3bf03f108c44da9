"""Sphinx configuration: ``pip install -e '.[docs]' && sphinx-build -W -n docs docs/_build``."""

import sys
from pathlib import Path

from sphinx.util.nodes import make_refnode

import tinyverse

sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))  # cliref: the CLI reference, from the parser

project = "tinyverse"
author = "the tinyverse developers"
copyright = "the tinyverse developers, MIT license"
release = version = tinyverse.__version__
extensions = ["sphinx.ext.autodoc", "sphinx.ext.viewcode", "cliref"]
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True}
exclude_patterns = ["_build"]

# every internal reference must resolve (sphinx-build -n); third-party classes in signatures have no
# pages here (intersphinx would need the network, which CI does not have)
nitpicky = True
nitpick_ignore_regex = [("py:class", r"(numpy|np|gymnasium|redis|random|collections\.abc)\..+")]

# links out are not checked (no network in CI); links between pages and to files are
linkcheck_ignore = [r"https?://.*"]

html_theme = "furo"
html_title = f"tinyverse {release}"
html_static_path: list[str] = []
pygments_style = "friendly"
pygments_dark_style = "monokai"


def link_short_names(app, env, node, contnode):
    """``:class:`Pace``` in a docstring of another module: link to the one documented object of that name.

    Runs only for references Sphinx could not resolve; a name documented twice, or not at all, stays
    unresolved, and ``-n`` reports it.
    """
    if node.get("refdomain") != "py" or "." in node["reftarget"]:
        return None
    objects = env.get_domain("py").objects
    found = [name for name, obj in objects.items() if name.rsplit(".", 1)[-1] == node["reftarget"] and not obj.aliased]
    if len(found) != 1:
        return None
    obj = objects[found[0]]
    return make_refnode(app.builder, node["refdoc"], obj.docname, obj.node_id, contnode, found[0])


def setup(app):
    app.connect("missing-reference", link_short_names)
