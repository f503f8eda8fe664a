"""tools/benchmarks/gpu_goals.py, the one GPU script of issue #44: the commands of its parts on a
GPU, its time budget (parts skipped, a part past its time stopped with its workers), the goals
and BENCHMARKS rows it writes, and a tiny run of its serving and packing parts end to end on
the CPU (the machine with a GPU has no TensorFlow, so packing trains on batches saved here).

The tool spawns its own processes: the module is `backend_independent`, run once."""

import json
import os
import subprocess
import sys
import time

import pytest

from tests.tools.test_benchmark import BENCHMARKS

pytestmark = pytest.mark.backend_independent


@pytest.fixture
def gpu(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_goals

    return gpu_goals


def _value(command, flag, count=1):
    index = command.index(flag)
    values = command[index + 1 : index + 1 + count]
    return values[0] if count == 1 else values


def test_parts_on_a_gpu_measure_the_issue_workloads(gpu, tmp_path):
    args = gpu.parse_args(["run", "--out", str(tmp_path / "out"), "--bundle", str(tmp_path)])
    args.bundle_data = tmp_path / "data"
    parts = {p["name"]: p for p in gpu.part_commands(args, tmp_path / "work")}
    assert list(parts) == ["core", "serving", "compiled", "variants", "packing"]
    core = parts["core"]["command"]
    assert "--config" not in core and _value(core, "--suite") == "gpu-goals"
    assert _value(core, "--process", 4) == [
        "keras/jax",
        "keras/torch",
        "hf/torch",
        "hf-compile/torch",
    ]
    assert _value(parts["compiled"]["command"], "--process", 2) == [
        "kbert-compile/torch",
        "kbert-cudagraphs/torch",
    ]
    assert _value(parts["variants"]["command"], "--process", 2) == [
        "kbert-flash/jax",
        "kbert-float8/jax",
    ]
    serving = parts["serving"]["command"]
    assert _value(serving, "--workload") == "long" and _value(serving, "--device") == "gpu"
    assert (_value(serving, "--dtype"), _value(serving, "--batch-size")) == ("bfloat16", "128")
    assert _value(serving, "--system", 4) == [
        "kbert-torch",
        "kbert-jax",
        "hf",
        "sentence-transformers",
    ]
    assert "--max-texts" not in serving
    packing = parts["packing"]["command"]
    assert _value(packing, "--preset") == "bert_base_en_uncased"
    assert _value(packing, "--precision") == "mixed_bfloat16"
    assert _value(packing, "--batches-from") == str(tmp_path / "packing_512.npz")
    assert parts["packing"]["env"] == {"KERAS_BACKEND": "jax"}
    assert [p["budgeted"] for p in parts.values()] == [True, False, True, True, False]
    for name, part in parts.items():
        assert _value(part["command"], "--json") == str(tmp_path / "work" / f"{name}.json")


def test_serving_goals_compare_long_texts_with_sentence_transformers(gpu):
    rows = [
        {"system": "kbert-torch", "workload": "long", "texts_per_second": 1500.0},
        {"system": "kbert-jax", "workload": "long", "texts_per_second": 1100.0},
        {"system": "kbert-jax", "workload": "short", "texts_per_second": 9000.0},
        {"system": "sentence-transformers", "workload": "long", "texts_per_second": 1000.0},
    ]
    torch_goal, jax_goal = gpu.serving_goals(rows)
    assert (torch_goal["status"], torch_goal["value"]) == ("met", pytest.approx(1.5))
    assert (jax_goal["status"], jax_goal["value"]) == ("not met", pytest.approx(1.1))
    assert "kbert-jax vs sentence-transformers = 1.10x (goal >= 1.20x): NOT met" in jax_goal["text"]
    assert [g["status"] for g in gpu.serving_goals(rows, tiny=True)] == ["not judged"] * 2
    failed = [dict(rows[0], error="worker died")] + rows[1:]
    assert gpu.serving_goals(failed)[0]["status"] == "not measured"
    # On tiny shapes no ratio is judged: the verdict is replaced, the value kept.
    tiny = gpu.unjudged([torch_goal, jax_goal, gpu.serving_goals([])[0]])
    assert [g["status"] for g in tiny] == ["not judged", "not judged", "not measured"]
    assert tiny[1]["text"].endswith("= 1.10x (goal >= 1.20x): not judged (tiny shapes)")
    assert tiny[1]["value"] == pytest.approx(1.1) and jax_goal["status"] == "not met"


def _model_row(workload, framework, backend, speed, mfu=None, label=None):
    row = {
        "workload": workload,
        "framework": framework,
        "backend": backend,
        "preset": "bert_base_en_uncased",
        "batch_size": 32,
        "sequence_length": 128,
        "precision": "mixed_bfloat16",
        "sequences_per_second": speed,
        "step_seconds": 32 / speed,
        "achieved_flops": speed * 1e9,
        "mfu": mfu,
    }
    return dict(row, label=label) if label else row


def test_markdown_holds_every_part_row_and_goal(gpu):
    rows = [
        _model_row("finetune", "hf", "torch", 700.0, mfu=0.06),
        _model_row("finetune", "kbert", "torch", 1400.0, mfu=0.12),
        _model_row("finetune", "kbert", "torch", 1050.0, mfu=0.09, label="kbert-compile"),
        dict(_model_row("pretrain", "kbert", "jax", 1.0), error="XlaRuntimeError: out of memory"),
    ]
    summary = {
        "device": "NVIDIA H200",
        "date": "2026-12-01T10:00:00+00:00",
        "commit": "abc1234",
        "budget_seconds": 480.0,
        "seconds": 470.0,
        "command": "python tools/benchmarks/gpu_goals.py run --out /o",
        "parts": {
            "core": {"status": "done", "seconds": 250.0},
            "packing": {"status": "skipped (20 s of the budget left)", "seconds": None},
        },
        "model_rows": rows,
        "serving_rows": [{"system": "hf", "workload": "long", "texts_per_second": 1418.0}],
        "packing": {
            "preset": "bert_base_en_uncased",
            "precision": "mixed_bfloat16",
            "batch_size": 32,
            "sequence_length": 512,
            "backend": "jax",
            "device": "NVIDIA H200",
            "ratio_packed_to_pieces": 1.05,
            "ratio_packed_to_standard": 1.2,
            "real_tokens_per_s": {"packed": 120000, "standard": 100000},
            "ms_per_step": {"packed": 130.0, "standard": 140.0},
            "padding_fraction": {"packed": 0.0115, "standard": 0.1185},
        },
        "goals": gpu.serving_goals([]),
    }
    text = gpu.markdown(summary)
    assert text.startswith("### GPU goals (NVIDIA H200, 2026-12-01 10:00 UTC)")
    assert (
        "Commit abc1234" in text and "| packing | skipped (20 s of the budget left) | - |" in text
    )
    assert "| finetune | 32 x 128 | kbert / torch | 1,400 | 23 | 12 % | 2.00x |" in text
    assert "| finetune | 32 x 128 | kbert-compile / torch | 1,050 | 30 | 9 % | 1.50x |" in text
    assert "| pretrain | 32 x 128 | kbert / jax | failed | | | |" in text
    assert "| hf | 1,418 |" in text and "| packed | 120,000 | 130.0 | 1.15 % |" in text
    assert "packed / standard 1.20x" in text
    assert (
        "- serving long texts: kbert-torch vs sentence-transformers >= 1.20x: not measured" in text
    )


def test_a_part_past_its_time_is_stopped_with_its_workers(gpu, tmp_path):
    """A part running past its limit is killed with every process it started; the result file
    it wrote so far is kept."""
    pid_file, result = tmp_path / "worker.pid", tmp_path / "part.json"
    script = (
        "import json, subprocess, sys, time\n"
        "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(worker.pid))\n"
        f"json.dump({{'results': [1]}}, open({str(result)!r}, 'w'))\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n"
    )
    part = {"name": "slow", "command": [sys.executable, "-c", script], "result": result, "env": {}}
    log = tmp_path / "log.txt"
    started = time.monotonic()
    with open(log, "w") as stream:
        outcome = gpu.run_part(part, 4.0, stream, dict(os.environ))
    assert time.monotonic() - started < 30
    assert outcome["status"] == "stopped after 4 s (time budget)"
    assert outcome["result"] == {"results": [1]} and "started" in log.read_text()
    worker = int(pid_file.read_text())
    for _ in range(50):  # the killed worker is reaped by init
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the part's worker {worker} outlived the part")
    failing = dict(part, command=[sys.executable, "-c", "raise SystemExit(3)"])
    result.unlink()
    with open(log, "w") as stream:
        outcome = gpu.run_part(failing, 30.0, stream, dict(os.environ))
    assert outcome["status"] == "failed (exit 3)" and outcome["result"] is None


def test_parts_outside_the_budget_are_skipped_and_reported(gpu, tmp_path):
    out = tmp_path / "out"
    summary = gpu.main(
        ["run", "--out", str(out), "--bundle", str(tmp_path), "--budget", "10", "--config", "tiny"]
    )
    assert set(summary["parts"]) == set(gpu.PARTS)
    assert all(p["status"].startswith("skipped (") for p in summary["parts"].values())
    assert {g["status"] for g in summary["goals"]} == {"not measured"}
    assert sorted(p.name for p in out.iterdir()) == [
        "gpu_goals.json",
        "gpu_goals.log",
        "gpu_goals.md",
    ]
    saved = json.loads((out / "gpu_goals.json").read_text())
    assert saved["budget_seconds"] == 10.0 and saved["config"] == "tiny"
    assert "| core | skipped (" in (out / "gpu_goals.md").read_text()
    # A serving checkpoint that cannot be made fails that part only, and says why.
    missing = tmp_path / "no-checkpoint"
    summary = gpu.main(
        ["run", "--out", str(out), "--bundle", str(tmp_path), "--config", "tiny", "--parts",
         "serving", "--checkpoint", str(missing)]
    )  # fmt: skip
    status = summary["parts"]["serving"]["status"]
    assert (
        status.startswith(f"failed (its checkpoint from {missing}: ")
        and "FileNotFoundError" in status
    )


def _tiny_checkpoint(path):
    """A Hugging Face BERT directory's configuration and tokenizer, without weights (what the
    bundle carries)."""
    import transformers

    from tests.checkpoints._reference import hf_config

    words = "a the good bad film plot was is it not very dull fine great movie story".split()
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ","] + words
    path.mkdir()
    (path / "vocab.txt").write_text("\n".join(vocabulary) + "\n")
    transformers.BertTokenizerFast(str(path / "vocab.txt")).save_pretrained(path)
    config = hf_config(
        vocab_size=len(vocabulary),
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        initializer_range=0.02,
    )
    config.save_pretrained(path)
    return words


@pytest.mark.large
@pytest.mark.processes
def test_serving_and_packing_parts_run_end_to_end_on_a_tiny_config(gpu, tmp_path):
    import random

    words = _tiny_checkpoint(tmp_path / "checkpoint")
    rng = random.Random(0)

    def sentence():
        return " ".join(rng.choice(words) for _ in range(rng.randint(3, 9))) + " ."

    paragraphs = [{"context": " ".join(sentence() for _ in range(4)), "qas": []} for _ in range(9)]
    (tmp_path / "data" / "squad").mkdir(parents=True)
    squad = {"data": [{"title": "t", "paragraphs": paragraphs}]}
    (tmp_path / "data" / "squad" / "dev-v1.1.json").write_text(json.dumps(squad))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "\n\n".join("\n".join(sentence() for _ in range(4)) for _ in range(30)) + "\n"
    )
    bundle = tmp_path / "bundle"
    # What `prepare` does for packing, here, where the tf.data pipeline runs.
    env = dict(os.environ, KERAS_BACKEND="jax")
    subprocess.run(
        [sys.executable, str(BENCHMARKS / "benchmark_packing.py"), "training", str(corpus)]
        + ["--vocab", str(tmp_path / "checkpoint"), "--sequence-length", "64"]
        + ["--max-predictions", "8", "--batch-size", "4", "--batches", "2"]
        + ["--save-batches", str(bundle / "packing_512.npz")],
        check=True,
        env=env,
        timeout=600,
        capture_output=True,
    )
    out = tmp_path / "out"
    command = [sys.executable, str(BENCHMARKS / "gpu_goals.py"), "run", "--config", "tiny"]
    command += ["--out", str(out), "--bundle", str(bundle), "--parts", "serving", "packing"]
    command += ["--checkpoint", str(tmp_path / "checkpoint")]
    command += ["--data-dir", str(tmp_path / "data")]
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((out / "gpu_goals.json").read_text())
    assert {k: p["status"] for k, p in summary["parts"].items()} == {
        "serving": "done",
        "packing": "done",
    }
    speeds = {r["system"]: r for r in summary["serving_rows"]}
    assert set(speeds) == {"kbert-torch", "kbert-jax", "hf", "sentence-transformers"}
    # The tiny config serves the first 8 paragraphs (--max-texts 8).
    assert all(r["texts"] == 8 and r["texts_per_second"] > 0 for r in speeds.values())
    goals = [g for g in summary["goals"] if g["workload"] == "serving long texts"]
    assert [g["status"] for g in goals] == ["not judged", "not judged"]
    assert all(g["value"] > 0 for g in goals)
    # Nothing measured on tiny shapes is judged; goals of parts not run are not measured.
    assert {g["status"] for g in summary["goals"]} == {"not judged", "not measured"}
    packing = summary["packing"]
    assert packing["sequence_length"] == 64 and packing["backend"] == "jax"
    assert packing["padding_fraction"]["packed"] < packing["padding_fraction"]["standard"]
    assert all(rate > 0 for rate in packing["real_tokens_per_s"].values())
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "gpu_goals.json",
        "gpu_goals.log",
        "gpu_goals.md",
        "gpu_goals.png",
        "serving.png",
    ]
    assert "| kbert-jax |" in (out / "gpu_goals.md").read_text()
    assert "== serving: done" in (out / "gpu_goals.log").read_text()
