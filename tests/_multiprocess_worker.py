"""One process of tests/test_multiprocess.py: trains a tiny kbert task with `fit`.

Started by the test with `KERAS_BACKEND` and the launcher's environment (torchrun's
`RANK`/`WORLD_SIZE`/`MASTER_ADDR`/`MASTER_PORT`, `TF_CONFIG`, or `--coordinator` for JAX),
once per process, or alone (`--processes 1`) for the one-process reference. It writes what the
test compares into `<results>/process_<index>.json` / `.npz`, and the library's own files
(preset, training backup, run report) into `--output`.

Usage:
    python -m tests._multiprocess_worker --task classifier --output DIR --results DIR \\
        --processes 2 --process-id 0 --coordinator 127.0.0.1:PORT
"""

import argparse
import json
import os
import signal
import sys


def launcher_arguments():
    """The arguments every worker of the multi-process tests takes (see `join`)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", required=True)
    parser.add_argument("--results", required=True)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--process-id", type=int, default=None)
    parser.add_argument("--coordinator", default=None)
    parser.add_argument("--timeout", type=int, default=30)
    return parser


def join(args):
    """Joins the launcher's processes (`kbert.distribution.initialize`); returns the index."""
    import kbert

    kbert.distribution.initialize(
        coordinator_address=args.coordinator,
        num_processes=args.processes if args.coordinator else None,
        process_id=args.process_id,
        timeout=args.timeout,
    )
    return kbert.processes.process_index()


def _parse(argv):
    parser = launcher_arguments()
    parser.add_argument("--task", choices=("classifier", "pretrainer", "both"), default="both")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--die-in", default=None, help="TASK:STEP - kill -9 this process there.")
    parser.add_argument(
        "--layout",
        choices=("data", "model"),
        default="data",
        help="data: data_parallel(); model: model_parallel(processes), JAX, the classifier "
        "only, without backup, preset or report (nothing written into --output).",
    )
    return parser.parse_args(argv)


def _data(task, rows, vocabulary_size=97, length=12, predictions=3):
    import numpy as np

    rng = np.random.default_rng(1)
    x = {
        "token_ids": rng.integers(1, vocabulary_size, (rows, length)).astype("int32"),
        "segment_ids": np.zeros((rows, length), "int32"),
        "padding_mask": np.ones((rows, length), "int32"),
    }
    x["segment_ids"][:, length // 2 :] = 1
    x["padding_mask"][1::3, length - 3 :] = 0
    if task == "classifier":
        # The held-out kind of input: padding at the end and inside rows (holes), token
        # id 0 at every padded position, rows of one segment; rows of several lengths, so
        # that batches are planned by length (sorted within each batch).
        x["padding_mask"][::4, length // 2 :] = 0
        x["padding_mask"][2::5, 3:5] = 0
        x["segment_ids"][::2] = 0
        x["token_ids"][x["padding_mask"] == 0] = 0
        return x, rng.integers(0, 3, (rows,)).astype("int32"), None
    x["mask_positions"] = np.sort(
        np.stack([rng.choice(length - 3, predictions, replace=False) for _ in range(rows)]), axis=1
    ).astype("int32")
    y = {
        "mlm": rng.integers(1, vocabulary_size, (rows, predictions)).astype("int32"),
        "nsp": rng.integers(0, 2, (rows,)).astype("int32"),
    }
    # Every slot real: each process' slice has as many predictions as the others, so the
    # mean over a slice's predictions averages to the global batch's mean.
    weights = {"mlm": np.ones((rows, predictions), "float32"), "nsp": np.ones((rows,), "float32")}
    return x, y, weights


def _audit_writes(root, written):
    """Records every file or folder this process creates, writes or renames under `root`."""
    root = os.path.realpath(root)

    def hook(event, arguments):
        if event == "open" and arguments[0] is not None and not isinstance(arguments[0], int):
            mode, flags = arguments[1], arguments[2]
            writes = flags & (os.O_WRONLY | os.O_RDWR)
            writing = (mode and any(c in mode for c in "wax+")) or writes
            paths = [arguments[0]] if writing else []
        elif event in ("os.mkdir", "os.rename", "os.replace", "os.remove", "os.rmdir"):
            paths = [a for a in arguments[:2] if isinstance(a, (str, bytes, os.PathLike))]
        else:
            return
        for path in paths:
            path = os.path.realpath(os.fsdecode(path))
            if path.startswith(root + os.sep):
                written.append(path)

    sys.addaudithook(hook)


def main(argv=None):
    args = _parse(argv)
    import keras
    import numpy as np

    import kbert
    from kbert import processes

    if os.environ.get("MP_DEBUG"):
        keras.config.disable_traceback_filtering()
    written = []
    os.makedirs(args.results, exist_ok=True)
    if args.processes > 1:
        _audit_writes(args.output, written)
        join(args)
    index = processes.process_index()
    tasks = ("classifier", "pretrainer") if args.task == "both" else (args.task,)
    report = {"process_index": index, "process_count": processes.process_count()}
    train = _train_model_parallel if args.layout == "model" else _train
    for task in tasks:
        report[task] = train(args, task, np, keras, kbert)
        np.savez(
            os.path.join(args.results, f"{task}_{index}.npz"),
            *report[task].pop("weights"),
        )
    report["written"] = sorted(set(written))
    with open(os.path.join(args.results, f"process_{index}.json"), "w") as f:
        json.dump(report, f)
    kbert.distribution.shutdown()
    return report


def _train(args, task, np, keras, kbert):
    from kbert import tracking
    from kbert.callbacks import TrainingBackup
    from kbert.models import BertBackbone, BertClassifier, BertPretrainer
    from tests.test_case import tiny_backbone_kwargs

    keras.utils.set_random_seed(0)
    x, y, weights = _data(task, args.rows)
    output = os.path.join(args.output, task)
    # The same script in one process (the reference) and in several.
    with kbert.distribution.data_parallel().scope():
        backbone = BertBackbone(**tiny_backbone_kwargs())
        if task == "classifier":
            # Dropout on (0.1 everywhere, the defaults): each process' masks must be its
            # rows of the masks one process draws for the global batch.
            backbone = BertBackbone(**tiny_backbone_kwargs(dropout=0.1, attention_dropout=0.1))
            model = BertClassifier(backbone, num_classes=3)
        else:
            model = BertPretrainer(backbone)
            # The pretrainer's batches as given (the classifier's are planned by length:
            # both ways must equal one process).
            model.length_batching = False
        # A constant learning rate: a resumed `fit` (from `initial_epoch`) takes the same
        # steps as an uninterrupted one.
        model.compile(optimizer=keras.optimizers.Adam(learning_rate=1e-3))
        # The same start on every backend and process (TensorFlow's strategy draws its own
        # initial values): small normal weights, LayerNorm scales around 1.
        rng = np.random.default_rng(0)
        initial = [
            (w.path.endswith("gamma") + rng.normal(0, 0.1, w.shape)).astype(w.dtype)
            for w in model.weights
        ]
        model.set_weights(initial)
        backup = TrainingBackup(
            os.path.join(output, "backup"),
            settings={"task": task, "batch_size": args.batch_size},
        )
        start = backup.restore(model)
        steps_per_epoch = -(-args.rows // args.batch_size)
        epoch, offset = divmod(start, steps_per_epoch)
        if offset:
            raise SystemExit("The test backs up at epoch ends only.")
        model.fit(
            x,
            y,
            sample_weight=weights,
            batch_size=args.batch_size,
            epochs=args.epochs,
            initial_epoch=epoch,
            shuffle=False,
            verbose=0,
            callbacks=[backup, _Faults(args, task)],
        )
    model.save_to_preset(os.path.join(output, "preset"))
    tracking.write_run_report(
        os.path.join(output, "report"),
        f"multiprocess/{task}",
        {"loss": float(backup.step_loss[-1])},
        step_loss=backup.step_loss,
        plot=False,
    )
    final = [keras.ops.convert_to_numpy(w) for w in model.weights]
    return {
        "step_loss": [float(v) for v in backup.step_loss],
        "resumed_from": start,
        "moved": max(float(np.abs(a - b).max()) for a, b in zip(final, initial)),
        "weights": final,
    }


def _train_model_parallel(args, task, np, keras, kbert):
    """`--layout model`: the classifier under `model_parallel(processes)`; nothing saved."""
    from jax.experimental import multihost_utils

    from kbert.models import BertBackbone, BertClassifier
    from tests.test_case import tiny_backbone_kwargs

    if task != "classifier":
        raise SystemExit("--layout model trains the classifier only.")
    keras.utils.set_random_seed(0)
    distribution = None
    if args.processes > 1:
        distribution = kbert.distribution.model_parallel(args.processes)
    scope = distribution.scope() if distribution is not None else _nothing()
    x, y, _ = _data(task, args.rows)
    with scope:
        model = BertClassifier(BertBackbone(**tiny_backbone_kwargs()), num_classes=3, dropout=0.0)
        model.length_batching = False
        model.compile(optimizer=keras.optimizers.Adam(learning_rate=1e-3))
        rng = np.random.default_rng(0)
        initial = [
            (w.path.endswith("gamma") + rng.normal(0, 0.1, w.shape)).astype(w.dtype)
            for w in model.weights
        ]
        model.set_weights(initial)
        history = model.fit(
            x, y, batch_size=args.batch_size, epochs=args.epochs, shuffle=False, verbose=0
        )
    # Sharded over the processes: every process gathers the whole value (a collective).
    final = [
        np.asarray(multihost_utils.process_allgather(w.value, tiled=True)) for w in model.weights
    ]
    sharded = [w.path for w in model.weights if not w.value.is_fully_replicated]
    return {
        "epoch_loss": [float(v) for v in history.history["loss"]],
        "sharded": sharded,
        "moved": max(float(np.abs(a - b).max()) for a, b in zip(final, initial)),
        "weights": final,
    }


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *args):
        return False


class _Faults:
    """Test hook: `--die-in TASK:STEP` kills this process (SIGKILL) after that step."""

    def __new__(cls, args, task):
        import keras

        die_task, _, die_step = (args.die_in or ":").partition(":")

        class Faults(keras.callbacks.Callback):
            step = 0

            def on_train_batch_end(self, batch, logs=None):
                self.step += 1
                if task == die_task and self.step == int(die_step):
                    sys.stdout.flush()
                    os.kill(os.getpid(), signal.SIGKILL)

        return Faults()


if __name__ == "__main__":
    main()
