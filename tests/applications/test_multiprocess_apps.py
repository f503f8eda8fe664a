"""applications/glue.py and pretrain.py, unchanged, over two local processes (README, "Several
hosts"): torch under `python -m torch.distributed.run` (torchrun), JAX with Keras'
`KERAS_DISTRIBUTION_*` variables, TensorFlow with `TF_CONFIG`, on the test session's backend.

Both processes exit 0; a `sitecustomize` audit hook (test-only, on `PYTHONPATH`) records every
file or folder each process creates, writes, renames or removes under the output folder: process
1 touched none, process 0 wrote the run's files. The records show one run over the global
batch (the GLUE run's loss at every step equals the same run's in one process), and the hook saves
each process' weights at the start and end of `fit`: the two replicas end equal (1e-6) after
moving 100 times more, which they would not without the gradients' sync (each process trains on
its own slice of every global batch). That two processes equal one process on the same global
batches is tested in tests/test_multiprocess.py. Every wait is bounded;
the processes are killed on failure; ports are free ports of 127.0.0.1.
"""

import json
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import keras
import pytest

from tests.applications import ONE_BACKEND
from tests.applications.test_finetuning_apps import VOCABULARY, _write_glue
from tests.applications.test_pretrain import WORDS as PRETRAIN_WORDS
from tests.applications.test_pretrain import write_text
from tests.per_backend import per_backend
from tests.test_case import REPO_ROOT, tiny_backbone_kwargs

# Two processes each, with launch limits: `make test` runs these alone (tools/test_leg.sh).
pytestmark = pytest.mark.processes

BACKEND = keras.backend.backend()
# Seconds one two-process launch may take before the test kills it (a hang).
LAUNCH_LIMIT = 300

AUDIT = textwrap.dedent(
    '''
    """Test-only: records the files this process writes under $KBERT_AUDIT_ROOT."""
    import atexit, json, os, sys

    _root = os.path.realpath(os.environ["KBERT_AUDIT_ROOT"])
    _written = set()

    def _hook(event, arguments):
        if event == "open" and arguments[0] is not None and not isinstance(arguments[0], int):
            mode, flags = arguments[1], arguments[2]
            writing = (mode and any(c in mode for c in "wax+")) or flags & (os.O_WRONLY | os.O_RDWR)
            paths = [arguments[0]] if writing else []
        elif event in ("os.mkdir", "os.rename", "os.replace", "os.remove", "os.rmdir"):
            paths = [a for a in arguments[:2] if isinstance(a, (str, bytes, os.PathLike))]
        else:
            return
        for path in paths:
            path = os.path.realpath(os.fsdecode(path))
            if path == _root or path.startswith(_root + os.sep):
                _written.add(path)

    def _rank():
        env = os.environ
        if "RANK" in env:
            return env["RANK"]
        if env.get("TF_CONFIG"):
            return str(json.loads(env["TF_CONFIG"])["task"]["index"])
        return env.get("KERAS_DISTRIBUTION_PROCESS_ID")  # None: torchrun's agent

    def _report():
        if _rank() is None:
            return
        name = os.path.join(os.environ["KBERT_AUDIT_RECORDS"], "writes_" + _rank() + ".json")
        with open(name, "w") as f:
            json.dump(sorted(_written), f)

    sys.addaudithook(_hook)
    atexit.register(_report)

    # Each process' weights at the start of its first `fit` and at the end of its last, saved
    # beside the records (outside the output folder): the replicas must end equal.
    import importlib.abc, importlib.util

    def _save_weights(model, stage, first_only=False):
        if _rank() is None:
            return
        import keras, numpy as np

        name = os.path.join(os.environ["KBERT_AUDIT_RECORDS"], f"{stage}_{_rank()}.npz")
        if first_only and os.path.exists(name):
            return
        np.savez(name, *[keras.ops.convert_to_numpy(w) for w in model.trainable_weights])

    def _patch(keras):
        fit = keras.Model.fit

        def recording_fit(self, *args, **kwargs):
            _save_weights(self, "start", first_only=True)
            result = fit(self, *args, **kwargs)
            _save_weights(self, "end")
            return result

        keras.Model.fit = recording_fit

    class _AfterKeras(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "keras":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            execute = spec.loader.exec_module

            def execute_and_patch(module):
                execute(module)
                _patch(module)

            spec.loader.exec_module = execute_and_patch
            return spec

    sys.meta_path.insert(0, _AfterKeras())
    '''
)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun_commands(script_args):
    """torch: one `python -m torch.distributed.run` (torchrun) that starts both processes."""
    port = _free_port()
    return [([
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1", "--master_port", str(port), *script_args,
    ], {})]  # fmt: skip


def _keras_distribution_commands(script_args):
    """JAX: each process with Keras' `KERAS_DISTRIBUTION_*` variables."""
    script = [sys.executable, *script_args]
    address = f"127.0.0.1:{_free_port()}"
    return [
        (script, {
            "KERAS_DISTRIBUTION_JOB_ADDRESSES": address,
            "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
            "KERAS_DISTRIBUTION_PROCESS_ID": str(index),
        })
        for index in range(2)
    ]  # fmt: skip


def _tf_config_commands(script_args):
    """TensorFlow: each worker with its `TF_CONFIG`."""
    script = [sys.executable, *script_args]
    workers = [f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"]
    return [
        (script, {"TF_CONFIG": json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        )})
        for index in range(2)
    ]  # fmt: skip


def _launch_commands(script_args):
    """The README's launch lines for two processes on one machine: [(argv, extra env)]."""
    return per_backend(
        torch=_torchrun_commands,
        jax=_keras_distribution_commands,
        tensorflow=_tf_config_commands,
    )(script_args)


def _run_two_processes(tmp_path, script_args, output):
    """Runs the application in two processes; returns the paths each one wrote under `output`."""
    hooks, records = tmp_path / "audit", tmp_path / "records"
    hooks.mkdir()
    records.mkdir()
    (hooks / "sitecustomize.py").write_text(AUDIT)
    base = dict(os.environ, KERAS_BACKEND=BACKEND, TF_CPP_MIN_LOG_LEVEL="3")
    for name in (
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TF_CONFIG",
        "KERAS_DISTRIBUTION_JOB_ADDRESSES",
        "KERAS_DISTRIBUTION_NUM_PROCESSES",
        "KERAS_DISTRIBUTION_PROCESS_ID",
    ):
        base.pop(name, None)
    base["PYTHONPATH"] = os.pathsep.join(
        [str(hooks), str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    base.update(KBERT_AUDIT_ROOT=str(output), KBERT_AUDIT_RECORDS=str(records))
    running = [
        subprocess.Popen(
            argv, env=dict(base, **env), cwd=tmp_path, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )
        for argv, env in _launch_commands(script_args)
    ]  # fmt: skip
    deadline = time.monotonic() + LAUNCH_LIMIT
    outputs = []
    try:
        for process in running:
            out, _ = process.communicate(timeout=max(deadline - time.monotonic(), 1))
            outputs.append(out)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"The processes ran past {LAUNCH_LIMIT} s (a hang); killed them."
        ) from None
    finally:
        for process in running:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    codes = [p.returncode for p in running]
    assert codes == [0] * len(running), "\n".join(out[-4000:] for out in outputs)
    writes = [json.loads((records / f"writes_{i}.json").read_text()) for i in range(2)]
    _check_replicas_trained_together(records)
    return writes, "\n".join(outputs)


def _run_one_process(tmp_path, script_args):
    """Runs the application alone (no launcher); returns its metrics.json record."""
    env = dict(os.environ, KERAS_BACKEND=BACKEND, TF_CPP_MIN_LOG_LEVEL="3")
    for name in ("RANK", "WORLD_SIZE", "TF_CONFIG", "KERAS_DISTRIBUTION_NUM_PROCESSES"):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    done = subprocess.run(
        [sys.executable, *script_args], env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=LAUNCH_LIMIT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    output = script_args[script_args.index("--output-dir") + 1]
    return json.loads((Path(output) / "metrics.json").read_text())


def _check_replicas_trained_together(records):
    """Both processes end `fit` with the same weights, far from where they started: each
    trained on its own slice of every global batch, so without the gradients' sync over the
    processes the replicas would drift apart."""
    import numpy as np

    def load(stage, index):
        with np.load(records / f"{stage}_{index}.npz") as data:
            return [data[f"arr_{i}"] for i in range(len(data.files))]

    start, ends = load("start", 0), [load("end", i) for i in range(2)]
    assert len(ends[0]) == len(ends[1]) == len(start) > 0
    moved = max(float(np.abs(a - b).max()) for a, b in zip(ends[0], start))
    apart = max(float(np.abs(a - b).max()) for a, b in zip(ends[0], ends[1]))
    assert moved > 1e-4, moved
    # Replicas that each followed their own slice would differ by about as much as they moved.
    assert apart <= min(1e-6, moved / 100), (apart, moved)


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    """A tiny kbert preset directory: weights and a vocabulary of both applications' words."""
    from kbert.models import BertBackbone
    from kbert.text import BertTokenizer

    folder = tmp_path_factory.mktemp("preset")
    vocabulary = VOCABULARY + sorted(set(PRETRAIN_WORDS) - set(VOCABULARY))
    backbone = BertBackbone(**tiny_backbone_kwargs(
        vocabulary_size=len(vocabulary), num_layers=1, max_sequence_length=64
    ))  # fmt: skip
    backbone.save_to_preset(folder)
    BertTokenizer(vocabulary).save_to_preset(folder)
    return folder


@pytest.mark.backends("jax", reason=ONE_BACKEND)
def test_glue_over_two_processes(preset, tmp_path):
    _write_glue(tmp_path / "data")
    output = tmp_path / "out"
    arguments = [
        str(REPO_ROOT / "applications" / "glue.py"), "--task", "sst2", "--preset", str(preset),
        "--data-dir", str(tmp_path / "data"), "--epochs", "2", "--batch-size", "8",
        "--max-length", "16", "--learning-rate", "3e-2", "--classifier-dropout", "0",
    ]  # fmt: skip
    writes, log = _run_two_processes(tmp_path, [*arguments, "--output-dir", str(output)], output)
    assert writes[1] == [], writes[1]
    assert str(output / "metrics.json") in writes[0]
    record = json.loads((output / "metrics.json").read_text())
    # 24 rows in global batches of 8: 3 steps per epoch, as in one process.
    assert record["train_steps"] == len(record["step_loss"]) == 6
    assert len(record["evaluations"]) == 2
    # The same run in one process: the same global batches, so the same loss at every step
    # (each process' loss alone, or unsynchronised gradients, would differ from step 0 or 1).
    alone = _run_one_process(tmp_path, [*arguments, "--output-dir", str(tmp_path / "alone")])
    losses, expected = record["step_loss"], alone["step_loss"]
    assert max(expected) - min(expected) > 0.02, expected  # the steps move the loss
    assert len(losses) == len(expected)
    for step, (loss, reference) in enumerate(zip(losses, expected)):
        assert abs(loss - reference) <= 1e-4 * max(1.0, abs(reference)), (step, losses, expected)
    assert record["metrics"] == pytest.approx(alone["metrics"], abs=1e-6)
    assert (output / "training_curve.png").read_bytes().startswith(b"\x89PNG")
    assert log.count("GLUE sst2: 24 training examples") == 1  # process 1 prints nothing


@pytest.mark.backends("tensorflow", reason=ONE_BACKEND)
def test_pretrain_over_two_processes(preset, tmp_path):
    from kbert.models import BertPretrainer
    from kbert.text import BertTokenizer

    text = write_text(tmp_path / "corpus.txt", num_documents=12)
    output = tmp_path / "out"
    writes, log = _run_two_processes(tmp_path, [
        str(REPO_ROOT / "applications" / "pretrain.py"), "--preset", str(preset),
        "--train-files", str(text), "--sequence-length", "32", "--max-predictions", "5",
        "--batch-size", "4", "--epochs", "2", "--warmup-steps", "1", "--backup-every", "2",
        "--output-dir", str(output),
    ], output)  # fmt: skip
    assert writes[1] == [], writes[1]
    assert str(output / "metrics.json") in writes[0]
    assert any(path.endswith("training_state.npz") for path in writes[0])  # backups
    assert (output / "preset" / "config.json").is_file()
    assert not (output / "backup").exists()
    record = json.loads((output / "metrics.json").read_text())
    # The epoch is counted from the text: the shorter of the two processes' shares.
    assert record["steps_per_epoch"] >= 1
    assert record["total_steps"] == len(record["step_loss"]) == 2 * record["steps_per_epoch"]
    assert log.count("Counting the batches of one pass") == 1  # process 1 prints nothing
    # Every step's loss finite (neither NaN nor inf) and, at the start, that of fresh heads
    # guessing: ln(vocabulary) for the masked tokens plus ln(2) for the next sentence.
    losses, metrics = record["step_loss"], record["metrics"]
    assert all(math.isfinite(value) for value in losses), losses
    vocabulary = len(BertTokenizer.from_preset(preset).vocabulary)
    assert 0.5 < losses[0] / (math.log(vocabulary) + math.log(2)) < 1.5, losses
    # The final metrics: finite, the last epoch's means of the steps (the loss the sum of the
    # two tasks'), accuracies among [0, 1].
    assert set(metrics) == {"mlm_accuracy", "mlm_loss", "nsp_accuracy", "nsp_loss", "loss"}
    assert all(math.isfinite(value) for value in metrics.values()), metrics
    last_epoch = losses[-record["steps_per_epoch"] :]
    assert metrics["loss"] == pytest.approx(sum(last_epoch) / len(last_epoch), rel=1e-4)
    assert metrics["loss"] == pytest.approx(metrics["mlm_loss"] + metrics["nsp_loss"], rel=1e-4)
    assert 0 <= metrics["mlm_accuracy"] <= 1 and 0 <= metrics["nsp_accuracy"] <= 1
    model = BertPretrainer.from_preset(output / "preset")
    assert model.backbone.vocabulary_size == len(BertTokenizer.from_preset(preset).vocabulary)
