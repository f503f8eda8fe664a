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
import time


def _parse(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", choices=("classifier", "pretrainer"), default="classifier")
    parser.add_argument("--output", required=True)
    parser.add_argument("--results", required=True)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--process-id", type=int, default=None)
    parser.add_argument("--coordinator", default=None)
    parser.add_argument("--timeout", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--backup-every", type=int, default=None)
    parser.add_argument("--hang-after-step", type=int, default=None)
    parser.add_argument("--die-after-step", type=int, default=None)
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


def main(argv=None):
    args = _parse(argv)
    import keras
    import numpy as np

    import kbert
    from kbert import processes, tracking
    from kbert.callbacks import TrainingBackup
    from kbert.models import BertBackbone, BertClassifier, BertPretrainer
    from tests.test_case import tiny_backbone_kwargs

    if args.processes > 1:
        kbert.distribution.initialize(
            coordinator_address=args.coordinator,
            num_processes=args.processes if args.coordinator else None,
            process_id=args.process_id,
            timeout=args.timeout,
        )
    index = processes.process_index()
    keras.utils.set_random_seed(0)
    distribution = kbert.distribution.data_parallel() if args.processes > 1 else None
    scope = distribution.scope() if distribution is not None else _nothing()
    x, y, weights = _data(args.task, args.rows)
    with scope:
        backbone = BertBackbone(**tiny_backbone_kwargs())
        if args.task == "classifier":
            model = BertClassifier(backbone, num_classes=3, dropout=0.0)
        else:
            model = BertPretrainer(backbone)
        if _compiles_settings(model):
            model.compile(learning_rate=1e-2)
        backup = TrainingBackup(
            os.path.join(args.output, "backup"),
            save_every=args.backup_every,
            settings={"task": args.task, "batch_size": args.batch_size},
        )
        start = backup.restore(model)
        history = tracking.StepLossHistory()
        callbacks = [backup, history, _Faults(args, index)]
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
            callbacks=callbacks,
        )
    model.save_to_preset(os.path.join(args.output, "preset"))
    tracking.write_run_report(
        os.path.join(args.output, "report"),
        f"multiprocess/{args.task}",
        {"loss": float(backup.step_loss[-1])},
        step_loss=backup.step_loss,
        plot=False,
    )
    os.makedirs(args.results, exist_ok=True)
    np.savez(
        os.path.join(args.results, f"process_{index}.npz"),
        *[keras.ops.convert_to_numpy(w) for w in model.weights],
    )
    with open(os.path.join(args.results, f"process_{index}.json"), "w") as f:
        json.dump(
            {
                "process_index": index,
                "process_count": processes.process_count(),
                "step_loss": backup.step_loss,
                "epoch_loss": [e["loss"] for e in backup.epochs],
                "resumed_from": start,
            },
            f,
        )
    kbert.distribution.shutdown()


def _compiles_settings(model):
    import inspect

    return "learning_rate" in inspect.signature(type(model).compile).parameters


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *args):
        return False


class _Faults:
    """Test hooks: this process dies (`--die-after-step`) or hangs (`--hang-after-step`)."""

    def __new__(cls, args, index):
        import keras

        class Faults(keras.callbacks.Callback):
            step = 0

            def on_train_batch_end(self, batch, logs=None):
                self.step += 1
                if args.die_after_step is not None and self.step == args.die_after_step:
                    sys.stdout.flush()
                    os.kill(os.getpid(), signal.SIGKILL)
                if args.hang_after_step is not None and self.step == args.hang_after_step:
                    time.sleep(3600)

        return Faults()


if __name__ == "__main__":
    main()
