"""Tokenizes a pretraining corpus once into TFRecord shards for `kbert.data.pretraining_dataset`.

    python tools/prepare_pretraining_data.py --vocab my_bert/vocab.txt \
        --output-dir shards/ --num-shards 64 'corpus/*.txt'

Each shard records the digest of the vocabulary it was written with; `pretraining_dataset`
refuses shards written with another vocabulary. Reading shards skips tokenization, so a long
run (or a resumed one) never tokenizes the text twice, and several processes split the shards
between them (use at least as many shards as processes).
"""

import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", help="Text files or glob patterns.")
    parser.add_argument(
        "--vocab", required=True, help="vocab.txt, or a preset directory/name with a vocabulary."
    )
    parser.add_argument("--output-dir", required=True, help="Folder of the shards.")
    parser.add_argument("--num-shards", type=int, default=8, help="Number of shards (default 8).")
    parser.add_argument("--text-format", default="auto", choices=("auto", "lines", "wikitext"))
    casing = parser.add_mutually_exclusive_group()
    casing.add_argument("--lowercase", dest="lowercase", action="store_true", default=None)
    casing.add_argument("--cased", dest="lowercase", action="store_false")
    args = parser.parse_args(argv)

    from kbert.data.shards import write_pretraining_shards
    from kbert.text import BertTokenizer

    kwargs = {} if args.lowercase is None else {"lowercase": args.lowercase}
    try:
        tokenizer = BertTokenizer.from_preset(args.vocab, **kwargs)
        return write_pretraining_shards(
            args.files,
            tokenizer,
            args.output_dir,
            num_shards=args.num_shards,
            text_format=args.text_format,
        )
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"prepare_pretraining_data: {error}")


if __name__ == "__main__":
    main()
