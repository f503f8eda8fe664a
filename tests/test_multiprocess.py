"""Training over two local processes equals one process (JAX, TensorFlow and torch).

Each backend's own engine starts from a launcher's environment, as in the README: JAX
processes with `--coordinator 127.0.0.1:PORT` (jax.distributed, gloo collectives), TensorFlow
workers with `TF_CONFIG` (MultiWorkerMirroredStrategy), torch ranks with torchrun's
`RANK`/`WORLD_SIZE`/`MASTER_ADDR`/`MASTER_PORT` (torch.distributed, gloo). Every process runs
`tests/_multiprocess_worker.py` with the same full arrays and the global batch size.

* Two processes `fit` a `BertClassifier` and a `BertPretrainer`; one of them is killed
  (`kill -9`) in the second epoch of the pretrainer: the other fails within the collective
  timeout instead of hanging. The same command run again resumes both from the backups of
  process 0 and ends at the weights of one process trained on the same global batches
  (max |delta| <= 1e-5) with the same per-step losses; only process 0 created, wrote or
  renamed files in the output folder.
* JAX: two processes `fit` a `BertClassifier` under `kbert.distribution.model_parallel(2)`
  (a (batch=1, model=2) mesh: heads and feed-forward columns sharded over the processes,
  each feeding the whole global batch) and end at the weights of one process.
* Bad input: a global batch the processes cannot share, settings that contradict the
  launcher's, an unreachable coordinator - clear errors within a bounded time.

Ports are free ports of 127.0.0.1; every wait is bounded and every process is killed on
failure.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import keras
import numpy as np
import pytest

from kbert import distribution as kd
from kbert.models import process_inference
from kbert.models.multiprocess import ProcessBatches, check_global_batch_size
from tests import _multiprocess_inference_worker as inference_worker
from tests import _multiprocess_worker as worker
from tests.per_backend import per_backend
from tests.test_case import REPO_ROOT

# Several processes each, with timeouts: `make test` runs these alone (tools/test_leg.sh).
pytestmark = pytest.mark.processes

BACKEND = keras.backend.backend()
# Seconds a process waits for the others (joining, and each collective afterwards).
TIMEOUT = 20
# The same, in the launches that kill a process: the survivor fails this long after its peer
# died, so the test waits it out; both processes start together and run the same steps, and
# only process 0 writes files between collectives (a tiny model's backups), so the live
# processes never wait for each other for nearly as long.
KILLED_LAUNCH_TIMEOUT = 12
# Seconds one two-process launch may take before the test kills it.
LAUNCH_LIMIT = 240
# Seconds a survivor may take past its timeout to exit once its peer died: the step it was in,
# the error's report and the interpreter's exit (a loaded 2-core machine), far below
# LAUNCH_LIMIT so that a survivor that waits for the launcher's kill fails the test.
SURVIVOR_MARGIN = 30


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tf_config(ports, index):
    """TensorFlow's cluster setting for worker `index` of the workers at `ports`."""
    workers = [f"127.0.0.1:{port}" for port in ports]
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})


def _jax_launch(index, ports):
    """JAX: `--coordinator` and `--process-id` arguments (jax.distributed)."""
    return ["--coordinator", f"127.0.0.1:{ports[0]}", "--process-id", str(index)], {}


def _torch_launch(index, ports):
    """torch: torchrun's environment (torch.distributed)."""
    return [], dict(
        RANK=str(index),
        LOCAL_RANK=str(index),
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(ports[0]),
    )


def _tensorflow_launch(index, ports):
    """TensorFlow: `TF_CONFIG` (MultiWorkerMirroredStrategy)."""
    return [], {"TF_CONFIG": _tf_config(ports, index)}


def _launch(
    output, results, extra=(), die_in=None, worker_module="tests._multiprocess_worker", die_index=1
):
    """Starts the two processes as the README's launch lines do; returns their Popen objects.

    With `die_in`, process `die_index` kills itself there and both wait for each other at most
    `KILLED_LAUNCH_TIMEOUT` seconds, else `TIMEOUT`."""
    ports = [_free_port(), _free_port()]
    timeout = TIMEOUT if die_in is None else KILLED_LAUNCH_TIMEOUT
    # The arguments and environment that start process `index` on this backend.
    launch = per_backend(jax=_jax_launch, torch=_torch_launch, tensorflow=_tensorflow_launch)
    commands = []
    for index in range(2):
        env = dict(os.environ, KERAS_BACKEND=BACKEND, TF_CPP_MIN_LOG_LEVEL="3")
        for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG"):
            env.pop(name, None)
        args = [
            sys.executable,
            "-m",
            worker_module,
            "--output",
            str(output),
            "--results",
            str(results),
            "--processes",
            "2",
            "--timeout",
            str(timeout),
            *extra,
        ]
        launch_args, launch_env = launch(index, ports)
        args += launch_args
        env.update(launch_env)
        if die_in is not None and index == die_index:
            args += ["--die-in", die_in]
        commands.append((args, env))
    return [
        subprocess.Popen(
            args,
            env=env,
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for args, env in commands
    ]


def _wait(processes, limit=LAUNCH_LIMIT, exit_times=None):
    """(return codes, outputs); kills every process still running after `limit` seconds.

    With a list `exit_times`, the `time.monotonic()` at which each process was seen to exit
    (polled every 0.1 s while the outputs are read in threads) is appended to it.
    """
    deadline = time.monotonic() + limit
    outputs = [None] * len(processes)

    def read(index):
        outputs[index] = processes[index].stdout.read()

    readers = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(len(processes))]
    for reader in readers:
        reader.start()
    exited = [None] * len(processes)
    try:
        while None in exited:
            if time.monotonic() > deadline:
                raise AssertionError(f"The processes ran past {limit} s (a hang); killed them.")
            for index, process in enumerate(processes):
                if exited[index] is None and process.poll() is not None:
                    exited[index] = time.monotonic()
            time.sleep(0.1)
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        for reader in readers:
            reader.join(timeout=10)
    if exit_times is not None:
        exit_times.extend(exited)
    return [p.returncode for p in processes], [o or "" for o in outputs]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process trained on the same global batches: per-step losses and final weights."""
    root = tmp_path_factory.mktemp("reference")
    results = root / "results"
    results.mkdir()
    report = worker.main(["--output", str(root / "output"), "--results", str(results)])
    weights = {
        task: [w for _, w in sorted(np.load(results / f"{task}_0.npz").items(), key=_order)]
        for task in ("classifier", "pretrainer")
    }
    return report, weights


def _order(item):
    return int(item[0].split("_")[1])


def _weights(results, task, index):
    with np.load(results / f"{task}_{index}.npz") as data:
        return [w for _, w in sorted(data.items(), key=_order)]


def test_two_processes_train_resume_after_kill_and_equal_one_process(tmp_path, reference):
    reference_report, reference_weights = reference
    output, results = tmp_path / "output", tmp_path / "results"
    results.mkdir()

    # Process 1 is killed after step 6 of 8 of the pretrainer (its backup is at step 4).
    exit_times = []
    codes, outputs = _wait(_launch(output, results, die_in="pretrainer:6"), exit_times=exit_times)
    assert codes[1] == -signal.SIGKILL, outputs[1][-3000:]
    assert codes[0] not in (0, None), outputs[0][-3000:]  # failed, did not hang
    # The survivor fails within the collective timeout of its peer's death.
    failed_after = exit_times[0] - exit_times[1]
    assert failed_after <= KILLED_LAUNCH_TIMEOUT + SURVIVOR_MARGIN, (
        failed_after,
        outputs[0][-3000:],
    )
    assert not (results / "process_0.json").exists()

    # The same command again resumes from process 0's backups.
    codes, outputs = _wait(_launch(output, results))
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
    reports = [json.loads((results / f"process_{i}.json").read_text()) for i in range(2)]
    assert [r["process_index"] for r in reports] == [0, 1]
    assert all(r["process_count"] == 2 for r in reports)
    for task in ("classifier", "pretrainer"):
        expected = reference_report[task]["step_loss"]
        for index, report in enumerate(reports):
            # Resumed: the classifier had finished, the pretrainer resumes after epoch 1.
            assert report[task]["resumed_from"] == (8 if task == "classifier" else 4)
            np.testing.assert_allclose(report[task]["step_loss"], expected, atol=1e-5)
            got = _weights(results, task, index)
            assert len(got) == len(reference_weights[task])
            delta = max(float(np.abs(a - b).max()) for a, b in zip(got, reference_weights[task]))
            assert delta <= 1e-5, (task, index, delta)
        # The run really trained: the weights moved 100 times farther than the tolerance.
        assert reference_report[task]["moved"] > 1e-3
    # Only process 0 wrote into the output folder (in both launches, for the second here).
    assert reports[1]["written"] == []
    assert any(path.endswith("training_state.npz") for path in reports[0]["written"])
    assert any("preset" in path for path in reports[0]["written"])
    assert any(path.endswith("metrics.json") for path in reports[0]["written"])
    for task in ("classifier", "pretrainer"):
        assert (output / task / "preset" / "config.json").is_file()
        assert (output / task / "report" / "metrics.json").is_file()
    leftovers = [p.name for p in output.rglob("*") if "kbert-" in p.name or p.suffix == ".tmp"]
    assert leftovers == []


# === Inference over processes ===
INFERENCE_WORKER = "tests._multiprocess_inference_worker"


@pytest.fixture(scope="module")
def inference_reference(tmp_path_factory):
    """One process, no distribution: predict, evaluate, encode and its shards."""
    return inference_worker.reference(str(tmp_path_factory.mktemp("inference_reference")))


# Rows of each call of the inference worker's `run`.
INFERENCE_ROWS = {
    "predict": 37,
    "predict_text": 9,
    "encode": 23,
    "encode_binary": 23,
    "cross_encoder": 13,
    "rank": 11,
    "sparse_encoder": 23,
    "multiple_choice": 11,
    "evaluate": 37,
}
# Shared by the length of their packed rows (the others by the characters of their texts).
SHARED_BY_PACKED_LENGTH = ("predict", "cross_encoder", "rank", "sparse_encoder", "multiple_choice")


def test_predict_evaluate_encode_over_two_processes_equal_one_process(
    tmp_path, inference_reference
):
    expected, expected_report = inference_reference
    output, results = tmp_path / "output", tmp_path / "results"
    codes, outputs = _wait(_launch(output, results, worker_module=INFERENCE_WORKER))
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
    reports = [json.loads((results / f"inference_{i}.json").read_text()) for i in range(2)]
    # One process ran every row of every call through its model (the counter sees them all;
    # its evaluate runs Keras' own loop, not counted).
    one = expected_report["rows_run"]
    for label, rows in INFERENCE_ROWS.items():
        assert len(one[label]) == (0 if label == "evaluate" else rows), label
    one["evaluate"] = one["predict"]  # the same packed rows
    # Two processes: each ran its share only, the shares dealt longest first in turn.
    for label, rows in INFERENCE_ROWS.items():
        ran = [report["rows_run"][label] for report in reports]
        assert [len(r) for r in ran] == [(rows + 1) // 2, rows // 2], (label, ran)
        assert sorted(ran[0] + ran[1]) == sorted(one[label]), label
        if label in SHARED_BY_PACKED_LENGTH + ("evaluate",):
            tops = sorted(one[label], reverse=True)
            assert [sorted(r, reverse=True) for r in ran] == [tops[0::2], tops[1::2]], label
    # Shards k, k + 2, ... per process: 0, 2, 4 (5 + 5 + 3 rows) and 1, 3 (5 + 5).
    assert [len(report["rows_run"]["shards"]) for report in reports] == [13, 10]
    for index in range(2):
        report = reports[index]
        assert report["process_count"] == 2
        got = np.load(results / f"inference_{index}.npz")
        # Each process computed its share: every process has every row, in order.
        for key, value in expected.items():
            assert got[key].shape == value.shape, key
            np.testing.assert_allclose(got[key], value, atol=1e-5, err_msg=key)
        for key, value in expected_report["evaluate"].items():
            assert report["evaluate"][key] == pytest.approx(value, abs=1e-5), key
        assert report["shards"] == expected_report["shards"]
    shards = process_inference.load_shards(output / "shards")
    np.testing.assert_allclose(shards, expected["encode"], atol=1e-5)
    assert [p.name for p in output.rglob("*") if p.suffix != ".npy"] == [
        "shards",
        "embeddings.json",
    ]


def test_encode_shards_after_the_coordinator_dies_fails_cleanly_and_resumes(
    tmp_path, inference_reference
):
    expected, _ = inference_reference
    output, results = tmp_path / "output", tmp_path / "results"
    exit_times = []
    # Process 0 (the coordinator) is killed after writing its first shard.
    processes = _launch(
        output,
        results,
        ["--encode-only"],
        worker_module=INFERENCE_WORKER,
        die_in="encode:1",
        die_index=0,
    )
    codes, outputs = _wait(processes, exit_times=exit_times)
    assert codes[0] == -signal.SIGKILL, outputs[0][-3000:]
    assert codes[1] not in (0, None), outputs[1][-3000:]
    assert exit_times[1] - exit_times[0] <= KILLED_LAUNCH_TIMEOUT + SURVIVOR_MARGIN, outputs[1][
        -3000:
    ]
    # The survivor says why it stops; on JAX the runtime ends it itself (its heartbeat),
    # with or without kbert's message.
    reported = "could not exchange results with the others" in outputs[1]
    assert per_backend(tensorflow=reported, torch=reported, jax=True), outputs[1][-3000:]
    shards = output / "shards"
    written = sorted(p.name for p in shards.iterdir())
    # Whole shards only, no temporary file, no manifest: 0 (process 0), 1 and 3 (process 1;
    # on JAX the runtime may end it before shard 3).
    assert all(name.endswith(".npy") and "-of-00005-" in name for name in written), written
    numbers = [name[11:16] for name in written]
    every_shard = numbers == ["00000", "00001", "00003"]
    first_shard = numbers[:1] == ["00000"]
    assert per_backend(tensorflow=every_shard, torch=every_shard, jax=first_shard), numbers
    before = {name: (shards / name).stat().st_mtime_ns for name in written}
    # The same call again, in one process, writes only the missing shards.
    _, embedder = inference_worker.build()
    paths = embedder.encode(inference_worker.texts(), batch_size=4, output_dir=shards, shard_rows=5)
    assert all((shards / name).stat().st_mtime_ns == t for name, t in before.items())
    assert len(paths) == 5
    np.testing.assert_allclose(process_inference.load_shards(shards), expected["encode"], atol=1e-5)


# === Bad input (no second process needed) ===


def test_global_batch_must_divide_over_the_processes():
    with pytest.raises(ValueError, match="divisible by the 2 processes.*batch_size=7"):
        check_global_batch_size(7, 2)
    x = {"a": np.arange(10)}
    with pytest.raises(ValueError, match="divisible by the 2 processes"):
        ProcessBatches(x, batch_size=5, num_processes=2, process_index=0)


@pytest.mark.parametrize("rows", [8, 11])
def test_each_process_gets_its_slice_of_every_global_batch(rows):
    x, y = np.arange(rows), np.arange(rows) * 10
    slices = [
        ProcessBatches(x, y, batch_size=4, num_processes=2, process_index=i) for i in range(2)
    ]
    assert len(slices[0]) == len(slices[1]) == 2 + (rows == 11)
    for b in range(len(slices[0])):
        joined = np.concatenate([s[b][0] for s in slices])
        np.testing.assert_array_equal(joined, np.arange(b * 4, b * 4 + len(joined)))
        np.testing.assert_array_equal(np.concatenate([s[b][1] for s in slices]), joined * 10)
    # 11 rows: the last global batch has 3 rows; each process takes 1, row 10 is left out.
    assert slices[0].dropped_rows == (rows % 4) % 2
    shuffled = [
        ProcessBatches(x, batch_size=4, shuffle=True, seed=3, num_processes=2, process_index=i)
        for i in range(2)
    ]
    rows_seen = np.concatenate([s[b] for b in range(len(shuffled[0])) for s in shuffled])
    assert len(set(rows_seen.tolist())) == len(rows_seen)  # the same order on both


def test_settings_that_contradict_the_launcher_are_refused(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(ValueError, match=r"`num_processes`=3 does not match the launcher's 2"):
        kd.initialize(num_processes=3)
    with pytest.raises(ValueError, match=r"`process_id`=1 does not match the launcher's 0"):
        kd.initialize(process_id=1)
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ValueError, match=r"`process_id` must lie in \[0, num_processes\)"):
        kd.initialize()


def test_missing_settings_are_refused(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "TF_CONFIG", "KERAS_DISTRIBUTION_JOB_ADDRESSES"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="needs `coordinator_address`"):
        kd.initialize(num_processes=2)
    with pytest.raises(ValueError, match="'host:port'"):
        kd.initialize("nohost", num_processes=2, process_id=1)


def _coordinator_in_tf_config(monkeypatch, port):
    monkeypatch.setenv("TF_CONFIG", _tf_config([port, _free_port()], 1))
    return {}


def _coordinator_as_arguments(monkeypatch, port):
    return dict(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=1)


def test_unreachable_coordinator_fails_within_the_timeout(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "TF_CONFIG", "KERAS_DISTRIBUTION_JOB_ADDRESSES"):
        monkeypatch.delenv(name, raising=False)
    port = _free_port()  # nothing listens there
    # Process 1 of 2 with the coordinator at `port`: in `TF_CONFIG` on TensorFlow (as its
    # launcher sets it), as arguments on JAX and torch.
    arguments = per_backend(
        tensorflow=_coordinator_in_tf_config,
        jax=_coordinator_as_arguments,
        torch=_coordinator_as_arguments,
    )(monkeypatch, port)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=f"could not reach the coordinator at 127.0.0.1:{port}"):
        kd.initialize(timeout=2, **arguments)
    assert time.monotonic() - started < 10
    assert kd.processes.process_group() is None


@pytest.mark.backends(
    "jax",
    reason="model_parallel spans processes on JAX only (keras.distribution.ModelParallel); "
    "TensorFlow and torch train over processes data-parallel.",
)
def test_model_parallel_over_two_processes_equals_one_process(tmp_path):
    # A (batch=1, model=2) mesh: heads and feed-forward columns sharded over the processes,
    # each of which feeds the whole global batch.
    extra = ["--task", "classifier", "--layout", "model", "--epochs", "1", "--rows", "16"]
    one = tmp_path / "one"
    reference = worker.main(["--output", str(one / "output"), "--results", str(one), *extra])
    expected = _weights(one, "classifier", 0)
    output, results = tmp_path / "output", tmp_path / "results"
    results.mkdir()
    codes, outputs = _wait(_launch(output, results, extra=extra))
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
    reports = [json.loads((results / f"process_{i}.json").read_text()) for i in range(2)]
    assert [r["process_index"] for r in reports] == [0, 1]
    for index, report in enumerate(reports):
        # Really sharded over the processes: the attention and feed-forward kernels.
        assert any("attention" in path for path in report["classifier"]["sharded"])
        assert any("intermediate" in path for path in report["classifier"]["sharded"])
        np.testing.assert_allclose(
            report["classifier"]["epoch_loss"], reference["classifier"]["epoch_loss"], atol=1e-5
        )
        got = _weights(results, "classifier", index)
        assert len(got) == len(expected)
        delta = max(float(np.abs(a - b).max()) for a, b in zip(got, expected))
        assert delta <= 1e-5, (index, delta)
        assert report["written"] == []  # nothing written into the output folder
    assert reference["classifier"]["moved"] > 1e-3
    assert not output.exists() or list(output.rglob("*")) == []
