"""train_wordpiece_vocabulary is deterministic and learns the most frequent pairs first."""

import os
import subprocess
import sys

import pytest

from kbert.text import train_wordpiece_vocabulary
from kbert.text.vocabulary import _learn_wordpiece
from tests.text.conftest import REPO_ROOT

pytestmark = pytest.mark.backend_independent

CORPUS = REPO_ROOT / "applications" / "demo_data" / "corpus.txt"
SCRIPT = (
    "import sys; from kbert.text import train_wordpiece_vocabulary as t; "
    "sys.stdout.write('\\n'.join(t([sys.argv[1]], vocabulary_size=800, verbose=False)))"
)


def test_merges_by_count_with_ties_broken_by_text():
    # "aab" x3, "ab" x2: pairs (a,##a)=3, (##a,##b)=3, (a,##b)=2. The tie at 3 goes to the
    # smaller text ("##a" < "a"), then "a"+"##ab" (3), then "a"+"##b" (2).
    vocabulary = _learn_wordpiece({"aab": 3, "ab": 2}, 100, 2, None, ["[PAD]"], False)
    assert vocabulary == ["[PAD]", "a", "##a", "##b", "##ab", "aab", "ab"]
    # min_frequency stops the merges; vocabulary_size caps the size.
    assert _learn_wordpiece({"aab": 3, "ab": 2}, 100, 4, None, [], False) == ["a", "##a", "##b"]
    assert len(_learn_wordpiece({"aab": 3, "ab": 2}, 5, 2, None, [], False)) == 5


def test_two_trainings_give_the_same_vocabulary_in_any_process():
    first = train_wordpiece_vocabulary([CORPUS], vocabulary_size=800, verbose=False)
    second = train_wordpiece_vocabulary([CORPUS], vocabulary_size=800, verbose=False)
    assert first == second and len(first) > 300
    env = dict(os.environ, PYTHONHASHSEED="12345", TF_CPP_MIN_LOG_LEVEL="3")
    other = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(CORPUS)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=600,
    ).stdout.split("\n")
    assert other == first
