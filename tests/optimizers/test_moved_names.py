"""The optimizers' old home, `kbert.models`, still hands them out for one release, with a
`DeprecationWarning` that names the new place."""

import pytest

import kbert.models
import kbert.optimizers

MOVED = ("BertAdamW", "Lamb", "WarmupLinearDecay", "bert_optimizer", "lamb_large_batch_settings")


@pytest.mark.parametrize("name", MOVED)
def test_old_name_warns_and_is_the_same_object(name):
    with pytest.warns(DeprecationWarning, match=rf"kbert\.optimizers\.{name}") as record:
        old = getattr(kbert.models, name)
    assert old is getattr(kbert.optimizers, name)
    assert record[0].filename == __file__  # The warning points at the caller's line.


def test_from_import_warns_too():
    with pytest.warns(DeprecationWarning, match=r"kbert\.optimizers\.bert_optimizer"):
        from kbert.models import bert_optimizer
    assert bert_optimizer is kbert.optimizers.bert_optimizer


def test_new_names_are_exported_and_old_ones_are_not():
    assert set(MOVED) == set(kbert.optimizers.__all__)
    assert not set(MOVED) & set(kbert.models.__all__)
    with pytest.raises(AttributeError, match="has no attribute 'NotAModel'"):
        kbert.models.NotAModel  # noqa: B018  (the attribute access is the test)
