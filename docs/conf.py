"""Sphinx configuration: ``pip install -e '.[docs]' && sphinx-build docs docs/_build``."""

import tinyverse

project = "tinyverse"
release = version = tinyverse.__version__
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode"]
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True}
html_theme = "alabaster"
exclude_patterns = ["_build"]
