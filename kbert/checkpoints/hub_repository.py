"""The directory a model's `push_to_hub` uploads: one repository for kbert, transformers and
sentence-transformers.

Its top holds the files another library loads, where a format exists for the model: a
Hugging Face BERT directory for the backbone, the pretrainer and the task heads
(`export_to_huggingface`: `transformers`' `AutoModel...` classes), a sentence-transformers
directory for a text embedder, a cross-encoder directory for a reranker and a SparseEncoder
directory for a SPLADE encoder (each also a Hugging Face directory); a quantized model
(`quantize`) is uploaded as kbert's preset alone. kbert's own preset
(`save_to_preset`: the configuration, weights, tokenizer and preprocessor settings,
quantization) is the `kbert/` folder (`kbert.hub.KBERT_FOLDER`), which `from_preset` reads
on such a repository. The model card `README.md` at the top says how to load the model in
each library.
"""

from pathlib import Path

from kbert import hub
from kbert.checkpoints.atomic import atomic_write_text
from kbert.checkpoints.kbert_preset import save_preset
from kbert.checkpoints.model_card import CARD_FILE, model_card

# kbert class -> the model card's name of the format written at the repository's top.
_FORMATS = {
    "BertTextEmbedder": "sentence-transformers",
    "BertCrossEncoder": "cross-encoder",
    "BertSparseEncoder": "sparse-encoder",
    "BertBackbone": "transformers",
    "BertPretrainer": "transformers",
    "BertClassifier": "transformers",
    "BertTagger": "transformers",
    "BertQuestionAnswerer": "transformers",
    "BertMultipleChoice": "transformers",
}


def repository_format(model):
    """The format written beside kbert's preset for `model` (see `_FORMATS`), or None."""
    for cls in type(model).__mro__:  # The nearest kbert class (a subclass of a task too).
        if cls.__name__ in _FORMATS:
            return _FORMATS[cls.__name__]
    return None


def write_repository(model, path, location, tokenizer=None):
    """Writes the directory `push_to_hub` uploads for `model` at `path` (a new directory).

    Args:
        model: a kbert model.
        path: str or path. The directory to write; it must not exist.
        location: str. The model's `hf://` handle, named in the model card.
        tokenizer: optional `kbert.text.BertTokenizer` stored with the model when it has
            none of its own (see `save_to_preset`).

    Returns:
        The directory as a `Path`.
    """
    from kbert.checkpoints.cross_encoder import export_cross_encoder
    from kbert.checkpoints.huggingface import export_to_huggingface
    from kbert.checkpoints.sentence_transformers import export_to_sentence_transformers
    from kbert.checkpoints.sparse_encoder import export_to_sparse_encoder

    path = Path(path)
    if path.exists():
        raise ValueError(f"`path` must be a new directory. Received an existing path: {path}")
    # A quantized model's int8 weights have no Hugging Face names: kbert's preset alone.
    kind = None if getattr(model, "quantization_record", None) else repository_format(model)
    if kind == "sentence-transformers":
        export_to_sentence_transformers(model, path)
    elif kind == "cross-encoder":
        export_cross_encoder(model, path)
    elif kind == "sparse-encoder":
        export_to_sparse_encoder(model, path)
    elif kind == "transformers":
        export_to_huggingface(model, path, tokenizer=tokenizer)
    save_preset(model, path / hub.KBERT_FOLDER, tokenizer=tokenizer)
    card = model_card(model, location, formats=(kind,) if kind else (), in_subfolder=True)
    atomic_write_text(path / CARD_FILE, card)
    return path
