"""Convert a BERT checkpoint into a kbert preset or a Hugging Face directory, with a parity report.

Sources: a kbert preset, a Hugging Face BERT directory, an original Google BERT directory or
a keras-hub BERT preset (see `kbert.checkpoints.formats`), or an `hf://<owner>/<name>` handle
or preset name, downloaded first (see `kbert.hub`). The report gives max |diff| of
kbert's outputs against the source run by its own framework (transformers for HF, keras-hub
for keras-hub, an independent NumPy forward pass for Google checkpoints) on real positions
of a padded batch, and against the converted output loaded back.

Usage:
    python tools/convert_checkpoint.py --source path/to/uncased_L-2_H-128_A-2 \\
        --output out/bert_tiny --format kbert --model pretrainer

Exits with status 1 when a difference exceeds `--tolerance` (default 1e-4).
"""

import argparse
import os
import sys


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--source",
        required=True,
        help="checkpoint directory: a kbert preset, a Hugging Face BERT directory, an original "
        "Google BERT directory or a keras-hub BERT preset; or an hf://<owner>/<name>[@revision] "
        "handle or a preset name (downloaded into huggingface_hub's cache)",
    )
    parser.add_argument(
        "--output",
        required=True,
        help="output directory, replaced atomically. To install a named preset, use "
        "$KBERT_PRESETS_DIR/<name> (default ~/.cache/kbert/presets/<name>)",
    )
    parser.add_argument(
        "--format",
        choices=("kbert", "huggingface"),
        default="kbert",
        help="what to write: a kbert preset or a Hugging Face directory (default: %(default)s)",
    )
    parser.add_argument(
        "--model",
        choices=("backbone", "pretrainer"),
        default="backbone",
        help="convert the backbone alone, or with the masked-LM and next-sentence heads "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--fresh-heads",
        action="store_true",
        help="start the pretraining heads fresh instead of loading them",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=1e-4,
        help="largest max |diff| accepted in the parity report; exit status 1 above it "
        "(default: %(default)g)",
    )
    parser.add_argument(
        "--backend",
        choices=("tensorflow", "jax", "torch"),
        default=None,
        help="Keras backend to run on (default: $KERAS_BACKEND, else tensorflow)",
    )
    args = parser.parse_args(argv)
    if not args.tolerance >= 0:
        parser.error(f"--tolerance must be a number >= 0. Received: {args.tolerance}")
    return args


def main(argv=None):
    """Runs the conversion; returns a dict with the report (also printed)."""
    args = parse_args(argv)
    if args.backend:
        os.environ["KERAS_BACKEND"] = args.backend
    import kbert
    from kbert.checkpoints import detect_format, export_to_huggingface, parity

    cls = kbert.models.BertPretrainer if args.model == "pretrainer" else kbert.models.BertBackbone
    try:
        # A preset name or an hf:// handle becomes the directory it stands for (installed or
        # downloaded), so the parity report runs against that checkpoint's own framework.
        source = str(kbert.hub.resolve_preset_source(args.source))
        fmt = detect_format(source)
        print(f"[1/4] Loading {args.source} ({fmt}) as {cls.__name__}", flush=True)
        model = cls.from_preset(source, fresh_heads=True if args.fresh_heads else None)
    except (ValueError, OSError, ImportError) as error:  # OSError: also hf:// download errors
        raise SystemExit(f"--source {args.source}: {error}") from None
    backbone = getattr(model, "backbone", model)
    inputs = parity.sample_inputs(backbone)
    outputs = parity.model_outputs(model, inputs)

    print("[2/4] Computing the reference outputs", flush=True)
    heads = args.model == "pretrainer" and not args.fresh_heads
    try:
        reference = parity.reference_outputs(source, fmt, inputs, heads=heads)
        against_source = parity.max_differences(outputs, reference, inputs["padding_mask"])
        reference_note = None
    except parity.ReferenceUnavailable as error:
        against_source, reference_note = {}, str(error)

    print(f"[3/4] Writing {args.format} to {args.output}", flush=True)
    if args.format == "kbert":
        model.save_to_preset(args.output)
    else:
        export_to_huggingface(model, args.output)

    print("[4/4] Loading the output back", flush=True)
    reloaded = cls.from_preset(args.output)
    round_trip = parity.max_differences(
        parity.model_outputs(reloaded, inputs), outputs, inputs["padding_mask"]
    )

    report = {
        "source_format": fmt,
        "against_source": against_source,
        "reference_note": reference_note,
        "round_trip": round_trip,
        "tolerance": args.tolerance,
    }
    _print_report(report)
    worst = max([*against_source.values(), *round_trip.values()], default=0.0)
    report["ok"] = worst <= args.tolerance
    return report


def _print_report(report):
    print(f"\nParity report (max |diff| on real positions, tolerance {report['tolerance']:g};")
    print("  mlm logits relative to max(1, max |reference logit|))")
    if report["reference_note"]:
        print(f"  against source: not computed ({report['reference_note']})")
    for title, values in (
        ("against source", report["against_source"]),
        ("round trip", report["round_trip"]),
    ):
        for name, value in values.items():
            flag = "ok" if value <= report["tolerance"] else "FAIL"
            print(f"  {title:15s} {name:16s} {value:.3e}  {flag}")


if __name__ == "__main__":
    sys.exit(0 if main()["ok"] else 1)
