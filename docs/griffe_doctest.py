"""Shows the docstrings' `>>>` examples as code on the API pages.

kbert's docstrings write their examples in the Keras form: `Example:` followed by doctest
lines at the same indentation (tests/test_docstrings.py runs them). Markdown would read
`>>>` as nested quotes and `x["a"][0]` as a link, so this griffe extension (loaded by
mkdocstrings, see mkdocs.yml) puts each run of doctest lines, up to the next blank line as
doctest itself reads them, inside a ```pycon fence before the docstring is parsed. The
docstrings themselves are not changed.
"""

import griffe


def fence_doctests(text):
    """`text` with every doctest block (`>>>` up to a blank line) inside a ```pycon fence."""
    lines, out, index = text.split("\n"), [], 0
    while index < len(lines):
        line = lines[index]
        if not line.lstrip().startswith(">>>"):
            out.append(line)
            index += 1
            continue
        indent = line[: len(line) - len(line.lstrip())]
        out.append(f"{indent}```pycon")
        while index < len(lines) and lines[index].strip():
            out.append(lines[index])
            index += 1
        out.append(f"{indent}```")
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    """Fences the doctest examples of every docstring griffe loads."""

    def on_instance(self, *, obj, **kwargs):
        if obj.docstring is not None:
            obj.docstring.value = fence_doctests(obj.docstring.value)
