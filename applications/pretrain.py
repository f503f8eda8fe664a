"""Pretrain BERT (masked LM + next-sentence prediction) on raw text and write a kbert preset.

    python applications/pretrain.py                  # bert_tiny on the shipped demo corpus
    python applications/pretrain.py --preset bert_mini_en_uncased --train-files 'text/*.txt' \
        --epochs 3 --steps-per-epoch 2000 --backup-every 500 --backend jax

Input: the raw text files `*.txt` and `*.raw` directly in `--data-dir` (default: the demo corpus
`applications/demo_data/corpus.txt` this project ships), or `--train-files` (paths or glob
patterns). One sentence per line with blank lines between documents (the input format of
google-research/bert), or WikiText raw files; see `kbert.data.read_documents`.

Model: `--preset` a preset name builds that architecture with fresh weights; its vocabulary is
`--vocab` (a vocab.txt), else the vocabulary of an installed preset of that name, else a
WordPiece vocabulary trained on the input text (`kbert.text.train_wordpiece_vocabulary`,
`--vocab-size` tokens at most). `--preset` a checkpoint directory (kbert preset, Hugging Face,
Google BERT or keras-hub) continues pretraining from its weights (and its MLM/NSP heads when it
has them) with its own vocabulary. A line of output says which of these was chosen.

Training: `kbert.data.pretraining_dataset` streams the text (memory does not grow with the
corpus; pre-tokenized shards from `tools/prepare_pretraining_data.py` work too), and every pass
over it builds new sentence pairs and new dynamic masks; `kbert.models.BertPretrainer` trains
with AdamW, weight decay 0.01, linear warm-up (`--warmup-ratio` or `--warmup-steps`) and linear
decay to 0 over `epochs x steps-per-epoch` steps. An epoch is `--steps-per-epoch` batches, by
default the number of full batches in one pass over the text (the first pass is generated at
start-up to count them; training then starts with the second). Training reads the passes back
to back as one stream of batches, and batch `k` of the stream depends only on the seed, the
text and the settings.

Two phases (BERT's recipe): `--phase2-sequence-length 512` trains the last `--phase2-epochs`
epochs (default a tenth of `--epochs`, at least 1) on sequences of 512 tokens with up to
`--phase2-max-predictions` (default 80) masked positions, after the first epochs at
`--sequence-length` (128 in the paper: 90 % of the steps, then 10 % at 512, which needs a preset
with `max_sequence_length` >= 512). Each phase streams its own pairs from the same text; the
optimizer and the learning-rate schedule run on across the boundary, and a resume works inside
either phase. Example: `--epochs 10 --sequence-length 128 --phase2-sequence-length 512`.

Packing: `--pack` trains the masked LM alone (no next-sentence prediction: `BertPretrainer(...,
next_sentence=False)`) on rows that each hold several whole documents
(`kbert.data.packed_pretraining_dataset`: `[CLS] document [SEP]` pieces packed first-fit; a
document longer than a row is cut into row-sized pieces), in both phases of a two-phase run. The
backbone is built with `packed=True`: tokens attend only inside their own document and positions
restart at each, so no step is spent on padding and no document sees another. `--max-predictions`
(and `--phase2-max-predictions`) then count per row. The preset written at the end is an ordinary
one (`packed=False`, MLM head, no NSP head). Example: `--pack --epochs 10 --sequence-length 128
--phase2-sequence-length 512`.

Resume (`kbert.callbacks.TrainingBackup` and `resumable_fit`; this script only wires them up):
the training state (weights, optimizer moments and step, dropout random state, the running
metrics of the epoch, the loss history and a trained vocabulary) is backed up to
`<output-dir>/backup/` at the end of every epoch and, with `--backup-every N`, every N steps, by
writing a new file and renaming it over the old one, so a kill never leaves a half-written
backup. Running the same command again after an interruption (Ctrl-C, kill, crash) restores that
state, fast-forwards the data stream to the next batch and continues from that step, mid-epoch
included: the result equals an uninterrupted run's (the same updates on the same batches with
the same dropout masks), bit for bit wherever the backend's kernels are deterministic (checked
on CPU with JAX, TensorFlow, and torch with one thread, killing real processes with SIGKILL).
The backup records the settings that shape the run; a re-run with different ones stops naming
the differences (`--restart` discards the backup and starts over). A disk that fills during a
backup stops the run and leaves the last good backup in place.

Output, in `--output-dir` (default `runs/pretrain`): `preset/` (a kbert preset: config, backbone
and MLM/NSP weights, vocab.txt and tokenizer_config.json; loads with `BertBackbone.from_preset`,
`BertClassifier.from_preset(dir, num_classes=...)`, or `BertPretrainer.from_preset` to continue
pretraining), written to a temporary sibling folder first and renamed into place (an existing
preset is only replaced with `--overwrite`); `metrics.json` (`metrics`: the last epoch's mean
`mlm_accuracy`, `mlm_loss`, `nsp_accuracy`, `nsp_loss` and total `loss`, over the whole epoch
even when the run was resumed inside it; `train_steps`,
`train_seconds`, the per-step loss and per-epoch logs of the whole run, resumed parts included)
and `training_curve.png`. The backup folder is removed once the preset is written.

Several processes: the same command under torchrun, `TF_CONFIG` or Keras'
`KERAS_DISTRIBUTION_*` variables (README, "Several hosts") trains one model over them; each
process reads its share of the text and takes its slice of every global `--batch-size`, and
process 0 alone prints and writes the outputs and backups.

What a run should reach: with no arguments (bert_tiny_en_uncased: 2 layers, hidden 128, 535k
parameters with the 438-token vocabulary it trains on the demo corpus; 8 epochs of one pass =
23 steps, so 184 steps of 32 sequences of 128 tokens) the JAX backend measured here a masked-LM
accuracy of 0.22 and an NSP accuracy of 0.63 (last-epoch means). The loss falls from 6.8 to
about 4.5 in 50 steps and then flattens: so few steps learn little beyond token frequencies.
Real pretraining needs far more text and steps (BERT-Base: 1M steps of 256 sequences).
"""

import argparse
import glob
import json
import shutil
from pathlib import Path

if __package__:  # Imported as applications.pretrain (the tests).
    from applications import common
else:  # Run as `python applications/pretrain.py`: Python put this folder first on sys.path.
    import common

DEMO_DATA_DIR = Path(__file__).resolve().parent / "demo_data"
DEFAULT_PRESET = "bert_tiny_en_uncased"
TEXT_PATTERNS = ("*.txt", "*.raw")
PRESET_DIR = "preset"
BACKUP_DIR = "backup"
_NO_BATCH = (
    "It holds fewer sequences than --batch-size: add text, or lower --batch-size or "
    "--sequence-length."
)
_GLOB_CHARACTERS = "*?["


def build_parser():
    shared = common.base_parser(
        __doc__.split("\n\n")[0], epochs=8, batch_size=32, learning_rate=1e-3, max_length=128
    )
    # A few shared flags mean something else here: they are redefined below, and the
    # "resolve" handler drops the shared definitions.
    parser = argparse.ArgumentParser(
        description=shared.description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[shared],
        conflict_handler="resolve",
    )
    _add_input_arguments(parser)
    _add_training_arguments(parser)
    parser.add_argument(
        "--restart",
        action="store_true",
        help="Discard a backup left in the output directory and start from step 0.",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="Replace an existing <output-dir>/preset at the end of the run.",
    )
    return parser


def _add_input_arguments(parser):
    """The flags of the model, the text, the vocabulary and the output folder."""
    parser.add_argument(
        "--preset",
        default=DEFAULT_PRESET,
        help="A preset name (its architecture with fresh weights) or a checkpoint directory "
        "(continue pretraining from its weights; its vocabulary is used). Default: %(default)s.",
    )
    parser.add_argument(
        "--data-dir",
        default=str(DEMO_DATA_DIR),
        help="Folder of raw text files: every *.txt and *.raw file directly in it. "
        "Default: the shipped demo corpus (%(default)s).",
    )
    parser.add_argument(
        "--sequence-length",
        "--max-length",
        dest="max_length",
        type=int,
        default=128,
        metavar="N",
        help="Tokens per packed example (at most the preset's max_sequence_length). "
        "Default: %(default)s.",
    )
    parser.add_argument("--max-train-examples", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--output-dir",
        default=None,
        help="Where preset/, backup/ (while training), metrics.json and training_curve.png go. "
        "Default: ./runs/pretrain.",
    )
    parser.add_argument(
        "--train-files",
        nargs="+",
        default=None,
        metavar="FILE",
        help="Text files or glob patterns to train on (instead of --data-dir).",
    )
    parser.add_argument(
        "--vocab",
        default=None,
        help="vocab.txt (or a folder holding one) for a preset name. Default: the installed "
        "preset's vocabulary if any, else one trained on the input text.",
    )
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="Size of a vocabulary trained on the input text (a small text gives fewer "
        "tokens). Default: the preset's vocabulary_size.",
    )


def _add_training_arguments(parser):
    """The flags of the schedule, the masking, the two phases, packing and backups."""
    parser.add_argument(
        "--steps-per-epoch",
        type=int,
        default=None,
        help="Batches per epoch. Default: the full batches of one pass over the text.",
    )
    parser.add_argument(
        "--max-predictions",
        type=int,
        default=20,
        help="Masked positions per sequence (15 %% of the tokens, up to this). "
        "Default: %(default)s.",
    )
    parser.add_argument(
        "--whole-word-masking", action="store_true", help="Mask whole words, not single pieces."
    )
    warmup = parser.add_mutually_exclusive_group()
    warmup.add_argument(
        "--warmup-ratio",
        type=float,
        default=0.1,
        help="Warm-up as a fraction of all training steps. Default: %(default)s.",
    )
    warmup.add_argument("--warmup-steps", type=int, default=None, help="Warm-up steps.")
    parser.add_argument(
        "--phase2-sequence-length",
        type=int,
        default=None,
        metavar="LENGTH",
        help="BERT's two-phase recipe: train the last --phase2-epochs epochs on sequences of "
        "LENGTH tokens (the paper: 128 for 90 %% of the steps, then 512). Default: one phase.",
    )
    parser.add_argument(
        "--phase2-epochs",
        type=int,
        default=None,
        help="Epochs of phase 2 (same steps per epoch). Default: a tenth of --epochs, at least 1.",
    )
    parser.add_argument(
        "--phase2-max-predictions",
        type=int,
        default=80,
        help="Masked positions per phase-2 sequence (BERT: 80 at 512). Default: %(default)s.",
    )
    parser.add_argument(
        "--pack",
        action="store_true",
        help="Masked-LM-only training on rows packed with several whole documents (no NSP; "
        "attention stays inside each document, positions restart at each).",
    )
    parser.add_argument(
        "--backup-every",
        type=int,
        default=None,
        metavar="STEPS",
        help="Also back up the training state every STEPS steps. Default: at epoch ends only.",
    )


def check_arguments(parser, args):
    """Exits with a usage error for flag values that cannot work."""
    if args.max_train_examples is not None:
        parser.error("--max-train-examples does not apply to pretraining; use --steps-per-epoch")
    if args.max_length < 8:
        parser.error(f"--sequence-length must be >= 8. Received: {args.max_length}")
    if not 1 <= args.max_predictions <= args.max_length - 3:
        parser.error(
            "--max-predictions must lie in [1, sequence length - 3] = "
            f"[1, {args.max_length - 3}] ([CLS] and two [SEP] are never masked). "
            f"Received: {args.max_predictions}"
        )
    for name in ("steps_per_epoch", "backup_every"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1. Received: {value}")
    if args.warmup_steps is not None and args.warmup_steps < 0:
        parser.error(f"--warmup-steps must be >= 0. Received: {args.warmup_steps}")
    if not 0.0 <= args.warmup_ratio <= 1.0:
        parser.error(f"--warmup-ratio must lie in [0, 1]. Received: {args.warmup_ratio}")
    if not args.learning_rate > 0:
        parser.error(f"--learning-rate must be positive. Received: {args.learning_rate}")
    if args.phase2_sequence_length is not None:
        if args.phase2_sequence_length < 8:
            parser.error(
                f"--phase2-sequence-length must be >= 8. Received: {args.phase2_sequence_length}"
            )
        if not 1 <= args.phase2_max_predictions <= args.phase2_sequence_length - 3:
            parser.error(
                "--phase2-max-predictions must lie in [1, phase-2 sequence length - 3] = "
                f"[1, {args.phase2_sequence_length - 3}]. Received: {args.phase2_max_predictions}"
            )
        if args.phase2_epochs is None:
            args.phase2_epochs = max(1, round(args.epochs / 10))
        if not 1 <= args.phase2_epochs < args.epochs:
            parser.error(
                f"--phase2-epochs must lie in [1, --epochs - 1] = [1, {args.epochs - 1}] "
                f"(phase 1 needs at least one epoch). Received: {args.phase2_epochs}"
            )
    elif args.phase2_epochs is not None:
        parser.error("--phase2-epochs needs --phase2-sequence-length.")
    if args.vocab_size is not None and args.vocab_size <= 5:
        parser.error(f"--vocab-size must exceed the 5 special tokens. Received: {args.vocab_size}")


# --------------------------------------------------------------------------------- inputs
def text_files(args):
    """The text files to train on, as sorted `Path`s; exits with a clear message otherwise."""
    if args.train_files:
        paths = []
        for pattern in args.train_files:
            if any(c in pattern for c in _GLOB_CHARACTERS):
                matches = sorted(Path(p) for p in glob.glob(pattern) if Path(p).is_file())
                if not matches:
                    raise SystemExit(f"--train-files: no file matches the pattern {pattern!r}.")
                paths.extend(matches)
                continue
            path = Path(pattern)
            if not path.exists():
                raise SystemExit(f"--train-files: {pattern} does not exist. Expected a text file.")
            if not path.is_file():
                raise SystemExit(
                    f"--train-files: {pattern} is a directory. Expected text files "
                    "(or pass the folder as --data-dir)."
                )
            paths.append(path)
    else:
        folder = Path(args.data_dir)
        paths = sorted(p for pattern in TEXT_PATTERNS for p in folder.glob(pattern) if p.is_file())
        if not paths:
            found = sorted(p.name for p in folder.iterdir())[:20]
            raise SystemExit(
                f"--data-dir {folder} holds no text files ({', '.join(TEXT_PATTERNS)}). "
                f"Found: {found}. Pass --train-files to name the files."
            )
    if not any(_has_text(p) for p in paths):
        raise SystemExit(
            f"The text files hold no text (empty or only whitespace): {[str(p) for p in paths]}"
        )
    return paths


def _has_text(path, chunk_size=1 << 16):
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            if chunk.strip():
                return True
    return False


def resolve_preset(preset):
    """`("name", None)` for a preset name or `("directory", Path)`; exits otherwise."""
    from kbert.models import BACKBONE_PRESETS

    path = Path(preset)
    if path.is_dir():
        return "directory", path
    if preset in BACKBONE_PRESETS:
        return "name", None
    what = "is a file" if path.exists() else "is neither a known preset name nor a directory"
    raise SystemExit(
        f"--preset {preset!r} {what}. Expected one of the preset names {sorted(BACKBONE_PRESETS)} "
        "or a checkpoint directory (kbert preset, Hugging Face, Google BERT or keras-hub BERT)."
    )


def _vocabulary_digest(tokens):
    from kbert.data.shards import vocabulary_digest

    return vocabulary_digest(tokens)


def choose_tokenizer(args, kind, backup_dir, files):
    """The tokenizer of the run, where its vocabulary comes from, and whether it was trained."""
    from kbert.checkpoints.loading import installed_presets_dir
    from kbert.models import BACKBONE_PRESETS
    from kbert.text import BertTokenizer, train_wordpiece_vocabulary

    lowercase = {}
    if kind == "name":
        lowercase = {"lowercase": BACKBONE_PRESETS[args.preset]["lowercase"]}
    if args.vocab is not None:
        if not Path(args.vocab).exists():
            raise SystemExit(f"--vocab {args.vocab} does not exist. Expected a vocab.txt file.")
        try:
            tokenizer = BertTokenizer.from_preset(args.vocab, **lowercase)
        except ValueError as error:
            raise SystemExit(f"--vocab {args.vocab}: {error}") from None
        return tokenizer, f"{args.vocab} (--vocab)", False
    if kind == "directory":
        try:
            tokenizer = BertTokenizer.from_preset(args.preset)
        except ValueError:
            raise SystemExit(
                f"--preset {args.preset} has no vocabulary (vocab.txt); pass --vocab."
            ) from None
        return tokenizer, f"the preset's own ({args.preset})", False
    installed = installed_presets_dir() / args.preset
    if installed.is_dir():
        try:
            tokenizer = BertTokenizer.from_preset(installed)
            return tokenizer, f"the installed preset's ({installed})", False
        except ValueError:
            pass  # An installed preset without a vocabulary: train one below.
    target = args.vocab_size or BACKBONE_PRESETS[args.preset]["config"]["vocabulary_size"]
    record = backup_dir / "vocabulary.json"  # How the vocabulary kept in the backup was made.
    request = {"target_size": target, "text_files": [str(p.resolve()) for p in files], **lowercase}
    if (backup_dir / "vocab.txt").is_file() and record.is_file():
        if json.loads(record.read_text()) == request:
            tokenizer = BertTokenizer.from_preset(backup_dir)
            return (
                tokenizer,
                f"trained on the input text by the interrupted run ({backup_dir})",
                True,
            )
    print(f"Training a WordPiece vocabulary (up to {target:,} tokens) on the input text:")
    tokens = train_wordpiece_vocabulary(files, vocabulary_size=target, **lowercase)
    tokenizer = BertTokenizer(tokens, **lowercase)
    if common.is_writer():  # Several processes: each trains the same vocabulary; one keeps it.
        tokenizer.save_to_preset(backup_dir)  # Kept with the backup: a resumed run reuses it.
        record.write_text(json.dumps(request))
    return (
        tokenizer,
        f"trained on the input text ({len(tokens):,} of at most {target:,} tokens)",
        True,
    )


def repack(model, packed):
    """An MLM-only `BertPretrainer` with the weights of `model` and a `packed` backbone
    (compiled with the defaults; the run compiles it with its own schedule)."""
    from kbert.models import BertBackbone, BertPretrainer

    config = model.backbone.get_config()
    config["packed"] = packed
    backbone = BertBackbone.from_config(config)
    backbone.set_weights(model.backbone.get_weights())
    result = BertPretrainer(backbone, next_sentence=False)
    head = model.masked_lm_head
    for target, source in zip(result.masked_lm_head.weights, head.weights):
        target.assign(source)
    return result


# --------------------------------------------------------------------------------- output
def write_preset(model, tokenizer, target, overwrite):
    """Writes the preset (config, weights, vocabulary) to `target` as one atomic replacement
    (`kbert.checkpoints.atomic.atomic_directory`): a kill leaves the old complete folder or the
    new one, and no file of an old preset is carried over into the new one."""
    from kbert.checkpoints.atomic import atomic_directory

    target = Path(target)
    if target.exists() and not overwrite:
        raise SystemExit(f"{target} already exists. Pass --overwrite to replace it.")
    replaced = [item.name for item in target.iterdir()] if target.is_dir() else []
    with atomic_directory(target, owned_files=replaced) as staging:
        model.save_to_preset(staging, tokenizer=tokenizer)


def _describe(backbone):
    return (
        f"{backbone.num_layers} layers, hidden {backbone.hidden_dim}, {backbone.num_heads} heads, "
        f"{backbone.count_params():,} parameters"
    )


# ----------------------------------------------------------------------------------- main
def main(argv=None, callbacks=()):
    """Runs the application; `callbacks` are extra Keras callbacks for `fit` (used by tests)."""
    parser = build_parser()
    args = common.parse_args(parser, argv)
    check_arguments(parser, args)
    # Several processes when a launcher started them (README, "Several hosts"): each reads its
    # share of the text and trains on its slice of every global batch of --batch-size.
    num_processes, process_index = common.start_processes()
    if args.batch_size % num_processes:
        parser.error(
            f"--batch-size {args.batch_size} (the global batch) must be divisible by the "
            f"{num_processes} processes."
        )
    with common.training_scope():
        return run(args, callbacks, num_processes, process_index)


def _fewest(count):
    """The smallest of every process' `count` (each process reads its own share of the text)."""
    import numpy as np

    from kbert import processes

    counts = np.zeros(processes.process_count(), "int64")
    counts[processes.process_index()] = count
    return int(processes.all_sum([counts])[0].min())


def run(args, callbacks, num_processes, process_index):
    """The run of `main`, inside the scope the model trains in: the steps below, in order."""
    common.seed_everything(args.seed)
    directory = common.output_dir(args, "pretrain")
    preset_path, backup_dir = _prepare_output(args, directory, num_processes, process_index)
    files, kind, tokenizer, vocabulary_source = _read_inputs(args, backup_dir)
    model, model_source = _build_model(args, kind, len(tokenizer.vocabulary))
    print(f"Vocabulary: {len(tokenizer.vocabulary):,} tokens, {vocabulary_source}")
    data = _build_data(args, files, tokenizer, num_processes, process_index)
    schedule = _compile(args, model, data["steps_per_epoch"])
    backup, start_step = _open_backup(args, files, kind, tokenizer, backup_dir, schedule)
    _train(args, model, data, backup, start_step, callbacks)
    # A fresh optimizer, so the preset holds no optimizer moments (three times the weights' size,
    # and a mismatch warning when the preset is loaded again); the weights are unchanged.
    model.compile()
    if args.pack:  # An ordinary preset: the packing input is an option of the run, not the model.
        model = repack(model, packed=False)
    if process_index == 0:
        write_preset(model, tokenizer, preset_path, args.overwrite)
    print(
        f"Wrote the preset {preset_path} (BertBackbone/BertClassifier/BertPretrainer.from_preset)"
    )
    details = {
        "model": model_source,
        "parameters": int(model.backbone.count_params()),
        "vocabulary": vocabulary_source,
        "vocabulary_size": len(tokenizer.vocabulary),
        "text_files": [str(p) for p in files],
    }
    metrics = _report(args, directory, backup, start_step, schedule, preset_path, details)
    if process_index == 0:
        shutil.rmtree(backup_dir, ignore_errors=True)  # Only now: the preset is safely written.
    return metrics


def _prepare_output(args, directory, num_processes, process_index):
    """The preset and backup folders of the run; refuses to replace a finished run's preset
    without --overwrite, and discards the backup on --restart."""
    preset_path = directory / PRESET_DIR
    backup_dir = directory / BACKUP_DIR
    if preset_path.exists() and not args.overwrite:
        raise SystemExit(
            f"{preset_path} already exists (a finished run?). Pass --overwrite to replace it, "
            "or choose another --output-dir."
        )
    if args.restart and backup_dir.exists():
        print(f"--restart: discarding the backup in {backup_dir}")
        if process_index == 0:
            shutil.rmtree(backup_dir)
    if args.restart and num_processes > 1:
        _fewest(0)  # Every process waits until process 0 has discarded the backup.
    return preset_path, backup_dir


def _read_inputs(args, backup_dir):
    """The text files, the kind of --preset and the tokenizer (with where its vocabulary
    comes from); exits when the preset cannot hold the sequence length."""
    from kbert.models import BACKBONE_PRESETS

    files = text_files(args)
    kind, _ = resolve_preset(args.preset)
    if kind == "name":
        max_positions = BACKBONE_PRESETS[args.preset]["config"]["max_sequence_length"]
        if args.max_length > max_positions:
            raise SystemExit(
                f"--sequence-length {args.max_length} exceeds the max_sequence_length "
                f"{max_positions} of preset {args.preset}. Expected at most {max_positions}."
            )
    names = [str(p) for p in files]
    size = sum(p.stat().st_size for p in files)
    print(
        f"Text: {len(files)} file(s), {size / 1e6:.2f} MB: {', '.join(names[:5])}"
        + (" ..." if len(files) > 5 else "")
    )
    tokenizer, vocabulary_source, trained = choose_tokenizer(args, kind, backup_dir, files)
    if args.vocab_size is not None and not trained:
        print("Note: --vocab-size is not used, the vocabulary is not trained here.")
    return files, kind, tokenizer, vocabulary_source


def _build_model(args, kind, vocabulary_size):
    """The `BertPretrainer` to train and a line saying where its weights come from; exits
    when its vocabulary or positions do not fit the run."""
    from kbert.models import BertPretrainer

    if kind == "name":
        model = BertPretrainer.from_preset(
            args.preset, load_weights=False, vocabulary_size=vocabulary_size
        )
        model_source = f"the {args.preset} architecture with fresh weights"
    else:
        try:
            model = BertPretrainer.from_preset(args.preset)
        except (ValueError, FileNotFoundError) as error:
            raise SystemExit(f"--preset {args.preset}: {error}") from None
        model_source = f"the weights of {args.preset} (continued pretraining)"
    if args.pack:
        model = repack(model, packed=True)
        model_source += "; masked LM only, on packed rows (--pack)"
    backbone = model.backbone
    if backbone.vocabulary_size != vocabulary_size:
        raise SystemExit(
            f"The vocabulary has {vocabulary_size:,} tokens but the model's vocabulary_size is "
            f"{backbone.vocabulary_size:,}; they must be equal."
        )
    flag, longest = "--sequence-length", args.max_length
    if (args.phase2_sequence_length or 0) > args.max_length:
        flag, longest = "--phase2-sequence-length", args.phase2_sequence_length
    if longest > backbone.max_sequence_length:
        raise SystemExit(
            f"{flag} {longest} exceeds the max_sequence_length "
            f"{backbone.max_sequence_length} of {args.preset}. Expected at most "
            f"{backbone.max_sequence_length}."
        )
    print(f"Model: {model_source} ({_describe(backbone)})")
    return model, model_source


def _build_data(args, files, tokenizer, num_processes, process_index):
    """The phase-1 batch stream, the epoch length, and a builder of the phase-2 stream."""
    from kbert.callbacks import BatchStream
    from kbert.data import packed_pretraining_dataset, pretraining_dataset

    names = [str(p) for p in files]
    batch_size = args.batch_size // num_processes  # This process' slice of each global batch.

    def dataset(length, max_predictions, **kwargs):
        build = pretraining_dataset
        if args.pack:  # The packed builder has no other options (`verbose`).
            build, kwargs = packed_pretraining_dataset, {}
        return build(
            names,
            tokenizer,
            sequence_length=length,
            max_predictions=max_predictions,
            whole_word_masking=args.whole_word_masking,
            batch_size=batch_size,
            seed=args.seed,
            drop_remainder=True,
            num_processes=num_processes,
            process_index=process_index,
            **kwargs,
        )

    try:
        stream = BatchStream(dataset(args.max_length, args.max_predictions, verbose=True))
        steps_per_epoch = args.steps_per_epoch
        if steps_per_epoch is None:
            print("Counting the batches of one pass over the text (the epoch length) ...")
            steps_per_epoch = stream.count_pass()
            if num_processes > 1:  # Every process runs as many steps as the shortest share.
                steps_per_epoch = _fewest(steps_per_epoch)
    except ValueError as error:
        hint = _NO_BATCH if "gives no batch" in str(error) else ""
        raise SystemExit(f"Cannot build pretraining data from {names}: {error} {hint}") from None

    def phase2_stream():
        try:
            return BatchStream(dataset(args.phase2_sequence_length, args.phase2_max_predictions))
        except ValueError as error:
            raise SystemExit(f"Cannot build phase-2 data from {names}: {error}") from None

    return {
        "names": names,
        "stream": stream,
        "steps_per_epoch": steps_per_epoch,
        "phase2_stream": phase2_stream,
    }


def _compile(args, model, steps_per_epoch):
    """Compiles BERT's AdamW with the schedule of the run; returns the schedule's numbers."""
    total_steps = args.epochs * steps_per_epoch
    warmup_steps = args.warmup_steps
    if warmup_steps is None:
        warmup_steps = int(round(total_steps * args.warmup_ratio))
    warmup_steps = min(warmup_steps, total_steps)
    model.compile(
        learning_rate=args.learning_rate, total_steps=total_steps, warmup_steps=warmup_steps
    )
    print(
        f"Training: {args.epochs} epochs x {steps_per_epoch} steps = {total_steps} steps of "
        f"{args.batch_size} sequences of {args.max_length} tokens; learning rate "
        f"{args.learning_rate:g}, {warmup_steps} warm-up steps, seed {args.seed}"
    )
    phase1_epochs = args.epochs - (args.phase2_epochs or 0)
    if args.phase2_sequence_length:
        print(
            f"Two phases: epochs 1-{phase1_epochs} at {args.max_length} tokens, epochs "
            f"{phase1_epochs + 1}-{args.epochs} at {args.phase2_sequence_length} tokens "
            f"(up to {args.phase2_max_predictions} predictions)."
        )
    return {
        "steps_per_epoch": steps_per_epoch,
        "total_steps": total_steps,
        "warmup_steps": warmup_steps,
        "phase1_epochs": phase1_epochs,
    }


def _open_backup(args, files, kind, tokenizer, backup_dir, schedule):
    """The run's `TrainingBackup` (keyed by the settings that shape the run) and the step to
    start at: that of the backup left by an interrupted run, else 0."""
    from kbert.callbacks import TrainingBackup

    steps_per_epoch, total_steps = schedule["steps_per_epoch"], schedule["total_steps"]
    settings = {
        "text_files": [[str(p.resolve()), p.stat().st_size] for p in files],
        "preset": args.preset if kind == "name" else str(Path(args.preset).resolve()),
        "vocabulary_sha256": _vocabulary_digest(tokenizer.vocabulary),
        "lowercase": tokenizer.lowercase,
        "sequence_length": args.max_length,
        "max_predictions": args.max_predictions,
        "whole_word_masking": args.whole_word_masking,
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "steps_per_epoch": steps_per_epoch,
        "counted_epoch_length": args.steps_per_epoch is None,
        "learning_rate": args.learning_rate,
        "warmup_steps": schedule["warmup_steps"],
        "seed": args.seed,
        "phase2_sequence_length": args.phase2_sequence_length,
        "phase2_epochs": args.phase2_epochs,
        "phase2_max_predictions": args.phase2_max_predictions if args.phase2_epochs else None,
        "pack": args.pack,
    }
    backup = TrainingBackup(backup_dir, save_every=args.backup_every, settings=settings)
    if not backup.exists():
        every = f"every {args.backup_every} steps and " if args.backup_every else ""
        print(
            f"Starting from step 0; the training state is backed up {every}at every epoch end "
            f"to {backup_dir} (re-run the same command to resume)."
        )
        return backup, 0
    try:
        start_step = backup.read_metadata()["global_step"]
    except (OSError, ValueError, KeyError) as error:
        raise SystemExit(
            f"The backup in {backup_dir} cannot be read ({error}); pass --restart to discard it."
        ) from None
    epoch, offset = divmod(start_step, steps_per_epoch)
    where = f"epoch {epoch + 1}" if offset == 0 else f"epoch {epoch + 1}, step {offset + 1}"
    print(
        f"Resuming from the backup in {backup_dir}: {start_step} of {total_steps} steps "
        f"done; continuing at {where}."
    )
    if 0 < start_step < total_steps:
        print(f"Fast-forwarding the data stream past the {start_step} batches already used.")
    return backup, start_step


def _train(args, model, data, backup, start_step, callbacks):
    """Both phases of training from `start_step`, backed up as it goes (`resumable_fit`)."""
    from kbert.callbacks import resumable_fit

    stream, steps_per_epoch = data["stream"], data["steps_per_epoch"]
    phase1_epochs = args.epochs - (args.phase2_epochs or 0)
    if start_step == 0:
        try:
            stream.get(0)  # Fails early (no full batch in a pass) rather than in fit.
        except ValueError as error:
            raise SystemExit(
                f"Cannot build pretraining data from {data['names']}: {error} {_NO_BATCH}"
            ) from None
    try:
        if start_step < phase1_epochs * steps_per_epoch:
            resumable_fit(
                model, stream, phase1_epochs, steps_per_epoch, backup, callbacks=list(callbacks)
            )
        if args.phase2_epochs:
            resumable_fit(
                model,
                data["phase2_stream"](),
                args.epochs,
                steps_per_epoch,
                backup,
                callbacks=list(callbacks),
                first_epoch=phase1_epochs,
            )
    except KeyboardInterrupt:
        raise SystemExit(
            f"\nInterrupted at step {backup.step}. The last backup (step {backup.saved_step}) is "
            f"in {backup.backup_dir}; run the same command again to resume from it."
        ) from None
    except ValueError as error:
        raise SystemExit(f"Cannot resume: {error} (--restart discards the backup.)") from None


def _scores(args, logs):
    """The run's metrics from Keras' logs of one epoch (running means over its batches)."""
    found = {
        name: float(logs[name])
        for name in ("mlm_accuracy", "mlm_loss", "nsp_accuracy", "nsp_loss", "loss")
        if name in logs
    }
    if args.pack and "accuracy" in logs:  # A one-output model logs its metric unprefixed.
        found["mlm_accuracy"] = float(logs["accuracy"])
        found["mlm_loss"] = found["loss"]  # The masked LM is the whole loss.
    return found


def _report(args, directory, backup, start_step, schedule, preset_path, details):
    """Prints the run's metrics and writes metrics.json and the training curve; returns the
    metrics (the last epoch's means)."""
    from kbert import tracking

    steps_per_epoch = schedule["steps_per_epoch"]
    train_seconds = backup.seconds()
    history = backup  # step_loss and epochs of the whole run, resumed parts included.
    # No dev set here: the figure's right panel shows the accuracies on the training batches of
    # every epoch (the losses are in its left panel).
    per_epoch = [
        {"step": (k + 1) * steps_per_epoch, **_scores(args, logs)}
        for k, logs in enumerate(history.epochs)
    ]
    metrics = _scores(args, history.epochs[-1]) if history.epochs else {}
    tracking.print_metrics("pretrain", metrics)
    print(
        f"{backup.step} steps in {train_seconds:.1f} s of training"
        + (f" (resumed at step {start_step})" if start_step else "")
    )
    paths = tracking.write_run_report(
        directory,
        "pretrain",
        metrics,
        step_loss=history.step_loss,
        epoch_logs=history.epochs,
        evaluations=per_epoch,
        evaluation_label="training batches",
        plot_metrics=[name for name in ("mlm_accuracy", "nsp_accuracy") if name in metrics],
        arguments=vars(args),
        extra={
            "train_seconds": train_seconds,
            "total_steps": schedule["total_steps"],
            "steps_per_epoch": steps_per_epoch,
            "resumed_from_step": start_step,
            "warmup_steps": schedule["warmup_steps"],
            "preset_dir": str(preset_path),
            **details,
        },
    )
    print("Wrote", *(path for path in paths if path))
    return metrics


if __name__ == "__main__":
    main()
