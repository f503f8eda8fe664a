"""Train a WordPiece vocabulary (vocab.txt) for kbert from raw text files.

The text is normalised and split into words exactly as `kbert.text.BertTokenizer`
will do it, then Hugging Face `tokenizers`' WordPiece trainer learns the pieces
(see `kbert.text.train_wordpiece_vocabulary`). The vocabulary starts with
`[PAD] [UNK] [CLS] [SEP] [MASK]` (ids 0-4), then `--reserved` `[unused*]` slots.

Example:

    python tools/train_vocab.py ../shared/data/wikitext-2-raw/wiki.valid.raw \\
        --vocab-size 8000 --output my_bert/vocab.txt

Then `kbert.text.BertTokenizer("my_bert/vocab.txt")` (add `lowercase=False` for
a vocabulary trained with `--cased`).
"""

import argparse
import pathlib
import sys


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="UTF-8 text files to learn from.")
    parser.add_argument(
        "--output", required=True, help="Path of the vocab.txt to write (or a directory)."
    )
    parser.add_argument("--vocab-size", type=int, default=30522, help="Target size.")
    casing = parser.add_mutually_exclusive_group()
    casing.add_argument(
        "--lowercase",
        dest="lowercase",
        action="store_true",
        default=True,
        help="Uncased vocabulary (default): lower-case and strip accents.",
    )
    casing.add_argument("--cased", dest="lowercase", action="store_false", help="Cased vocabulary.")
    parser.add_argument(
        "--strip-accents",
        choices=["auto", "yes", "no"],
        default="auto",
        help="Strip accents; 'auto' strips them iff lower-casing (as the original).",
    )
    parser.add_argument("--min-frequency", type=int, default=2)
    parser.add_argument("--limit-alphabet", type=int, default=1000)
    parser.add_argument(
        "--reserved",
        type=int,
        default=0,
        help="Number of [unusedN] tokens reserved after the special tokens.",
    )
    parser.add_argument("--quiet", action="store_true", help="No progress display.")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    from kbert.text import train_wordpiece_vocabulary

    strip_accents = {"auto": None, "yes": True, "no": False}[args.strip_accents]
    vocabulary = train_wordpiece_vocabulary(
        [pathlib.Path(f) for f in args.files],
        vocabulary_size=args.vocab_size,
        lowercase=args.lowercase,
        strip_accents=strip_accents,
        min_frequency=args.min_frequency,
        limit_alphabet=args.limit_alphabet,
        reserved_tokens=[f"[unused{i}]" for i in range(args.reserved)],
        output_path=args.output,
        verbose=not args.quiet,
    )
    print(f"{len(vocabulary)} tokens ({'uncased' if args.lowercase else 'cased'}).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
