"""tools/benchmarks/benchmark_serving.py (arguments, workloads, worker environments, the ratio
table), the harness's rounds, and the plain-script check of benchmark.py
(benchmark_plain_step.py, its report).

Nothing here depends on the Keras backend (the tools spawn their own processes): the module is
`backend_independent`, run once."""

import json

import pytest

from tests.tools.test_benchmark import BENCHMARKS

pytestmark = pytest.mark.backend_independent


@pytest.fixture
def tools(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench.harness
    import bench.plain_check
    import benchmark_plain_step
    import benchmark_serving

    return benchmark_serving, benchmark_plain_step, bench.plain_check, bench.harness


def test_serving_arguments_are_checked(tools, capsys):
    serving = tools[0]
    args = serving.parse_args([])
    assert (args.batch_size, args.short_length, args.long_length) == (32, 128, 512)
    # Every system but sentence-transformers' ONNX ones, which need --st-onnx-python.
    expected = [s for s in serving.SYSTEMS if s not in serving.st_onnx.SYSTEMS]
    assert args.system == expected and args.device == "cpu"
    gpu = serving.parse_args(["--device", "gpu", "--dtype", "bfloat16", "--batch-size", "128"])
    assert (gpu.device, gpu.dtype, gpu.batch_size) == ("gpu", "bfloat16", 128)
    for bad, message in (
        (["--batch-size", "0"], "--batch-size must be a positive integer. Received: 0"),
        (["--dtype", "bfloat16"], "--dtype bfloat16 is meant for --device gpu"),
        (["--system", "kbert-mxnet"], "invalid choice: 'kbert-mxnet'"),
    ):
        with pytest.raises(SystemExit):
            serving.parse_args(bad)
        assert message in capsys.readouterr().err


def test_serving_workloads_read_sst2_dev_and_the_first_400_squad_paragraphs(tools, tmp_path):
    serving = tools[0]
    (tmp_path / "glue" / "SST-2").mkdir(parents=True)
    rows = ["sentence\tlabel", 'a "quoted" film \t1', "dull\t0"]
    (tmp_path / "glue" / "SST-2" / "dev.tsv").write_text("\n".join(rows) + "\n")
    paragraphs = [{"context": f"paragraph {i}", "qas": []} for i in range(450)]
    articles = [{"title": "a", "paragraphs": paragraphs[:300]}, {"paragraphs": paragraphs[300:]}]
    (tmp_path / "squad").mkdir()
    (tmp_path / "squad" / "dev-v1.1.json").write_text(json.dumps({"data": articles}))
    assert serving.load_texts("short", tmp_path) == ['a "quoted" film ', "dull"]
    long = serving.load_texts("long", tmp_path)
    assert len(long) == 400 and long[0] == "paragraph 0" and long[-1] == "paragraph 399"
    assert serving.load_texts("long", tmp_path, max_texts=3) == [f"paragraph {i}" for i in range(3)]


def test_serving_workers_get_their_backend_and_no_gpu_on_cpu(tools, monkeypatch):
    harness = tools[3]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    env = harness.system_environment({"system": "kbert-tensorflow", "device": "cpu"})
    assert env["KERAS_BACKEND"] == "tensorflow" and env["CUDA_VISIBLE_DEVICES"] == ""
    env = harness.system_environment({"system": "sentence-transformers", "device": "gpu"})
    assert env["KERAS_BACKEND"] == "torch" and env["CUDA_VISIBLE_DEVICES"] == "0"


def test_serving_table_gives_ratios_to_hf_and_sentence_transformers(tools):
    serving = tools[0]
    rows = [
        ("hf", 200.0),
        ("sentence-transformers", 400.0),
        ("kbert-jax", 500.0),
    ]
    common = {"workload": "short", "texts": 872, "sequence_length": 128}
    results = [dict(common, system=s, texts_per_second=r) for s, r in rows]
    results.append({"system": "onnx", "workload": "short", "error": "exited with 1"})
    table = serving.format_table(results)
    lines = {line.split()[0]: line.split() for line in table.splitlines()[2:]}
    assert lines["kbert-jax"][1:] == ["500.0", "2.50x", "1.25x"]
    assert lines["hf"][1:] == ["200.0", "1.00x", "0.50x"]
    assert lines["onnx"][1] == "failed:"
    # A failed system listed first, and a workload where every system failed, still give a table.
    results.insert(0, {"system": "kbert-torch", "workload": "short", "error": "no data"})
    results.append({"system": "hf", "workload": "long", "error": "no data"})
    table = serving.format_table(results)
    assert "short: 872 texts, truncated at 128 tokens" in table
    assert "long: every system failed" in table


def test_serving_rounds_keep_each_systems_fastest_round_and_list_every_round(tools):
    serving, harness = tools[0], tools[3]

    def row(system, rate):
        return {"system": system, "workload": "short", "texts_per_second": rate}

    results = harness.merge_rounds([], [row("hf", 100.0), row("kbert-jax", 90.0)])
    failed = {"system": "hf", "workload": "short", "error": "exited with 1"}
    results = harness.merge_rounds(results, [failed, row("kbert-jax", 120.0)])
    results = harness.merge_rounds(results, [row("hf", 95.0), row("kbert-jax", 110.0)])
    by_system = {r["system"]: r for r in results}
    assert by_system["hf"]["texts_per_second"] == 100.0
    assert by_system["hf"]["rounds_texts_per_second"] == [100.0, None, 95.0]
    assert by_system["kbert-jax"]["texts_per_second"] == 120.0
    assert by_system["kbert-jax"]["rounds_texts_per_second"] == [90.0, 120.0, 110.0]
    only_failed = harness.merge_rounds([], [failed])
    assert only_failed[0]["error"] and only_failed[0]["rounds_texts_per_second"] == [None]
    with pytest.raises(SystemExit):
        serving.parse_args(["--rounds", "0"])


def test_plain_check_report_flags_a_worker_figure_a_plain_script_does_not_reproduce(tools):
    plain_check = tools[2]
    cell = {
        "preset": "L2-H128-A2",
        "sequence_length": 32,
        "batch_size": 8,
        "precision": "float32",
        "workload": "finetune",
        "num_masks": 20,
    }
    other = dict(cell, preset="L6-H384-A12")
    records = [
        dict(cell, framework="hf", step_seconds=0.078),
        dict(other, framework="hf", step_seconds=0.100),
    ]
    # Two rounds of the plain script for the first cell: the best (0.031 s) counts.
    checks = [
        dict(cell, step_seconds=0.040),
        dict(cell, step_seconds=0.031),
        dict(other, step_seconds=0.095),
    ]
    report = plain_check.format_plain_checks(checks, records).splitlines()
    first = next(line for line in report if "L2-H128-A2" in line).split()
    assert first[1:] == ["78.0", "31.0", "2.52x", "DIFFERS"]
    second = next(line for line in report if "L6-H384-A12" in line).split()
    assert second[-2:] == ["1.05x", "consistent"]


@pytest.mark.large
def test_plain_step_times_the_workload_of_the_benchmark_cell(tools):
    pytest.importorskip("transformers")
    plain_step = tools[1]
    cell = plain_step.parse_cell("finetune:L2-H64-A2-V512:4:16", 3)
    times = plain_step.run(cell, warmup=1, steps=2)
    assert len(times) == 2 and all(0 < t < 60 for t in times)
    forward = plain_step.run(plain_step.parse_cell("inference:L2-H64-A2-V512:4:16", 3), 0, 1)
    assert len(forward) == 1


def test_embedding_benchmark_runs_rounds_of_separate_workers_and_compares_embeddings(
    tools, monkeypatch, tmp_path
):
    """tools/benchmarks/benchmark_embeddings.py: each system in its own worker per round (the
    fastest round kept, a failed worker an error row), ratios to sentence-transformers, and each
    kbert system's largest difference from sentence-transformers' embeddings."""
    import numpy as np

    harness = tools[3]
    import benchmark_embeddings as embeddings

    # Per round and system, one rate per workload (questions, paragraphs, sst2).
    rates = iter([300.0, 30.0, 3.0, 400.0, 40.0, 4.0, 280.0, 28.0, 2.8, 360.0, 35.0, 3.5])
    spawned = []

    def fake_spawn(script, spec, env, nice=0, name=None):
        assert env["CUDA_VISIBLE_DEVICES"] == "" and env["KERAS_BACKEND"] in ("torch", "jax")
        spawned.append((spec["system"], script))
        if spec["system"] == "kbert-jax" and len(spawned) > 2:
            raise RuntimeError("the kbert-jax worker exited with 1 and no result")
        return [
            {"system": spec["system"], "workload": w, "texts": 8, "texts_per_second": next(rates)}
            for w in embeddings.WORKLOADS
        ]

    monkeypatch.setattr(harness, "spawn", fake_spawn)
    systems = ["sentence-transformers", "kbert-jax"]
    results = harness.run_rounds("e.py", {"device": "cpu"}, systems, 2, embeddings.WORKLOADS)
    assert [s for s, _ in spawned] == systems * 2 and {s for _, s in spawned} == {"e.py"}
    reference = np.ones((8, 4), "float32")
    for workload in embeddings.WORKLOADS:
        np.save(tmp_path / f"sentence-transformers-{workload}.npy", reference)
        np.save(tmp_path / f"kbert-jax-{workload}.npy", reference + 0.25)
    results = embeddings.add_differences(results, tmp_path)
    by_key = {(r["system"], r["workload"]): r for r in results}
    jax_questions = by_key[("kbert-jax", "questions")]
    assert jax_questions["texts_per_second"] == 400.0  # round 1; round 2 failed
    assert jax_questions["rounds_texts_per_second"] == [400.0, None]
    assert jax_questions["max_abs_diff"] == pytest.approx(0.25)
    assert by_key[("sentence-transformers", "questions")]["texts_per_second"] == 300.0
    assert "max_abs_diff" not in by_key[("sentence-transformers", "paragraphs")]
    table = embeddings.format_table(results)
    questions = table.split("questions:")[1].split("paragraphs:")[0]
    row = next(line.split() for line in questions.splitlines() if "kbert-jax" in line)
    # rate, ratio to sentence-transformers, max |diff|, cosine mean and min (ones vs 1.25s)
    assert row[1:] == ["400.0", "1.33x", "2.5e-01", "1.0000", "1.0000"], row
    with pytest.raises(SystemExit):
        embeddings.parse_args(["--questions", "0"])


def test_sentence_transformers_onnx_systems_of_every_benchmark(tools, monkeypatch, capsys):
    """benchmark_embeddings, benchmark_rerank and benchmark_sparse take sentence-transformers'
    ONNX systems only with `--st-onnx-python` (their workers run there); `load_model` knows
    each model class by its kind."""
    import benchmark_embeddings
    import benchmark_rerank
    import benchmark_sparse
    from bench import st_onnx

    for script in (benchmark_embeddings, benchmark_rerank, benchmark_sparse):
        assert set(st_onnx.SYSTEMS) <= set(script.SYSTEMS)
        assert not set(script.parse_args([]).system) & set(st_onnx.SYSTEMS)
        named = script.parse_args(["--st-onnx-python", "python3"]).system
        assert named == list(script.SYSTEMS)
        args = script.parse_args(["--system", "sentence-transformers-onnx-int8"])
        with pytest.raises(SystemExit, match="give --st-onnx-python"):
            st_onnx.environment(args)
    assert st_onnx.MODEL_CLASSES["sparse-encoder"] == "SparseEncoder"
    with pytest.raises(ValueError, match="`kind` must be one of"):
        st_onnx.load_model("unused", "sentence-transformers-onnx", "unused", kind="splade")
