"""Foreign checkpoint formats (Hugging Face, Google TF, keras-hub): detection and loading."""


def detect(path):
    """The format name of a foreign checkpoint directory, or None."""
    return None


def load(cls, path, fmt, load_weights=True, **kwargs):
    raise NotImplementedError(f"Loading {fmt} checkpoints is not implemented yet")
