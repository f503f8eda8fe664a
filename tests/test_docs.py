"""The documentation: every public name has an API entry, every link of the README and of the
pages points at a file that exists, every guide links to the API pages, the README stays short
and links every guide.

The site itself is built (strict) by `make docs`, a leg of `make test`; the pages' code blocks
run in tests/test_readme.py. These checks read files only.
"""

import importlib
import importlib.util
import inspect
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
# The modules whose public names the API reference documents, one page each.
MODULES = (
    "models",
    "layers",
    "text",
    "data",
    "losses",
    "metrics",
    "retrieval",
    "serving",
    "export",
    "checkpoints",
    "distribution",
    "hub",
)
ENTRY = re.compile(r"^:::\s+(\S+)\s*$", re.MULTILINE)
LINK = re.compile(r"\]\(([^)\s]+)\)")

pytestmark = pytest.mark.backend_independent


def public_names(module):
    """The module's `__all__`, else the classes and functions it defines (griffe's public)."""
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and value.__module__ == module.__name__
    ]


@pytest.mark.parametrize("name", MODULES)
def test_every_public_name_has_an_api_entry(name):
    page = DOCS / "api" / f"{name}.md"
    entries = set(ENTRY.findall(page.read_text(encoding="utf-8")))
    module = importlib.import_module(f"kbert.{name}")
    prefix = f"kbert.{name}."
    missing = [
        public
        for public in public_names(module)
        # `kbert.data`'s tf.data names are imported on first use: their entries carry the
        # path of the module that defines them (kbert.data.pretraining.pretraining_dataset).
        if not any(entry.startswith(prefix) and entry.endswith(f".{public}") for entry in entries)
    ]
    assert not missing, f"docs/api/{name}.md has no `::: kbert.{name}.NAME` entry for {missing}"


def test_public_names_sees_all_and_defined_names():
    from kbert import losses, models

    assert public_names(models) == list(models.__all__)
    assert "MultipleNegativesRankingLoss" in public_names(losses)  # losses has no __all__
    assert not [name for name in public_names(losses) if name.startswith("_")]


def pages():
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def relative_links(page):
    text = page.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)  # links in code are code
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        yield target


@pytest.mark.parametrize("page", pages(), ids=lambda page: page.relative_to(REPO).as_posix())
def test_relative_links_point_at_files_and_api_entries(page):
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve()
        assert resolved.exists(), f"{page.name}: link to missing {target}"
        if anchor.startswith("kbert.") and resolved.parent.name == "api":
            entries = ENTRY.findall(resolved.read_text(encoding="utf-8"))
            assert anchor in entries, f"{page.name}: {target} names no API entry"


def test_every_guide_links_to_the_api_pages():
    guides = sorted((DOCS / "guides").glob("*.md"))
    assert guides
    for guide in guides:
        # The second click: each guide links to the API page of what it describes.
        assert any("api/" in link for link in relative_links(guide)), guide.name


def test_readme_is_short_and_links_every_guide():
    # A newcomer goes README -> guide -> API entry: two clicks.
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    links = set(relative_links(REPO / "README.md"))
    for guide in sorted((DOCS / "guides").glob("*.md")):
        assert f"docs/guides/{guide.name}" in links, f"the README does not link {guide.name}"


def test_every_page_is_in_the_navigation():
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    for page in sorted(DOCS.rglob("*.md")):
        assert page.relative_to(DOCS).as_posix() in nav, page.name


def test_doctest_examples_become_code_fences():
    pytest.importorskip("griffe")
    spec = importlib.util.spec_from_file_location("griffe_doctest", DOCS / "griffe_doctest.py")
    extension = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(extension)
    text = 'Summary.\n\nExample:\n>>> x = {"a": [1]}\n>>> x["a"][0]\n1\n\nAfter.'
    assert extension.fence_doctests(text) == (
        'Summary.\n\nExample:\n```pycon\n>>> x = {"a": [1]}\n>>> x["a"][0]\n1\n```\n\nAfter.'
    )
    indented = "Args:\n    x: int.\n\n    >>> f(1)\n    2"
    assert extension.fence_doctests(indented).endswith("    ```pycon\n    >>> f(1)\n    2\n    ```")
    assert extension.fence_doctests("no examples here") == "no examples here"
