"""tools/benchmarks/benchmark.py and its parts (tools/benchmarks/bench/): FLOP counts, the common
peak, goal lines, worker environments, and one tiny run of the GPU-goals and host-overhead suites
end to end.

The end-to-end run spawns its own worker processes (each sets its own `KERAS_BACKEND`), so it
runs once (the module is `backend_independent`), not once per backend.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.backend_independent

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "tools" / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    """The `bench` package, importable as `python tools/benchmarks/benchmark.py` imports it."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench.cells
    import bench.flops
    import bench.harness
    import bench.keras_timing
    import bench.report

    return bench


def test_forward_flops_count_every_kernel_of_a_real_backbone(bench):
    """Forward FLOPs = 2 x (encoder kernel weights) per token + attention products + pooler,
    counted here from the variables of a real kbert backbone."""
    from kbert.models import BertBackbone

    shape = bench.flops.resolve_preset("L2-H64-A2-V512")
    assert shape["vocabulary_size"] == 512 and shape["intermediate_dim"] == 256
    backbone = BertBackbone(**shape)
    kernels = [v for v in backbone.weights if v.path.endswith("kernel")]
    per_token = sum(math.prod(v.shape) for v in kernels if not v.path.startswith("pooler"))
    pooler = sum(math.prod(v.shape) for v in kernels if v.path.startswith("pooler"))
    s, h, layers = 16, shape["hidden_dim"], shape["num_layers"]
    expected = 2 * s * per_token + 2 * pooler + layers * 2 * 2 * s * s * h
    assert bench.flops.forward_flops(shape, s, "inference") == expected
    assert bench.flops.step_flops(shape, s, "inference") == expected
    assert bench.flops.step_flops(shape, s, "finetune") == 3 * (expected + 2 * h * 2)


def test_encoder_matmul_shapes_are_the_counted_flops(bench):
    """The matmuls timed for the forward's bound are the ones `forward_flops` counts: the
    encoder's FLOPs of a whole batch (everything but the pooler), on BERT-Base and a shape
    with other head and feed-forward widths."""
    for preset, batch, length in (("bert_base_en_uncased", 8, 128), ("L3-H96-A4", 3, 40)):
        shape = bench.flops.resolve_preset(preset)
        matmuls = bench.flops.encoder_matmuls(shape, batch, length)
        timed = sum(count * b * 2 * m * k * n for count, b, m, k, n in matmuls)
        pooler = 2 * shape["hidden_dim"] ** 2
        assert timed == batch * (bench.flops.forward_flops(shape, length, "inference") - pooler)


def test_forward_goal_reports_each_rows_share_of_its_matmul_bound(bench):
    row = {
        "workload": "inference",
        "backend": "torch",
        "step_seconds": 0.5,
        "matmul_bound_seconds": 0.4,
        "sequences_per_second": 16.0,
        "flops_per_sequence": 22.4e9,
        "mfu_own_peak": 0.7,
    }
    records = [dict(row, framework="kbert"), dict(row, framework="hf", step_seconds=0.8)]
    text = bench.report.check_goals(records, {"torch/float32": 400e9})
    assert "kbert/torch 80%, hf/torch 50%" in text
    assert "share of the matmul limit = 90%" in text


def test_bert_base_flops_are_the_issue_figures(bench):
    shape = bench.flops.resolve_preset("bert_base_en_uncased")
    giga = {
        w: bench.flops.step_flops(shape, 128, w) / 1e9
        for w in ("pretrain", "finetune", "inference")
    }
    assert giga == pytest.approx({"pretrain": 69.9, "finetune": 67.1, "inference": 22.4}, abs=0.06)


def test_bad_preset_and_cell_are_rejected(bench):
    with pytest.raises(ValueError, match="L<layers>-H<hidden>-A<heads>"):
        bench.flops.resolve_preset("L2-H64")
    with pytest.raises(SystemExit, match="WORKLOAD:PRESET:BATCH:LENGTH"):
        bench.cells.parse_cell("train:L2-H64-A2:4:16", 20)


def test_every_row_mfu_uses_the_largest_peak_of_its_precision(bench):
    peaks = {"jax/mixed_bfloat16": 487e12, "torch/mixed_bfloat16": 765e12, "jax/float32": 10e9}
    records = [
        {"precision": "mixed_bfloat16", "achieved_flops": 206e12, "mfu": 206 / 487},
        {"precision": "mixed_bfloat16", "achieved_flops": 100e12, "mfu": 100 / 765},
        {"precision": "float32", "achieved_flops": 5e9, "mfu": 0.5},
        {"precision": "float32", "error": "failed"},
    ]
    out = bench.report.apply_common_peaks(records, peaks)
    assert out[0]["mfu"] == pytest.approx(206 / 765)  # Not 42 % against JAX's own figure.
    assert out[0]["mfu_own_peak"] == pytest.approx(206 / 487)
    assert out[1]["mfu"] == pytest.approx(100 / 765)
    assert out[2]["mfu"] == pytest.approx(0.5)
    assert "mfu" not in out[3]


def _record(
    workload, framework, backend, speed, label=None, preset="bert_base_en_uncased", mfu=None
):
    record = {
        "workload": workload,
        "framework": framework,
        "backend": backend,
        "sequences_per_second": speed,
        "preset": preset,
        "mfu": mfu,
        "matmul_peak_flops": 765e12,
    }
    if label:
        record["label"] = label
    return record


def test_gpu_goal_lines_judge_each_goal(bench):
    records = [
        _record("pretrain", "kbert", "jax", 5700, mfu=0.52),
        _record("pretrain", "kbert", "torch", 3000),
        _record("pretrain", "hf", "torch", 2400),
        _record("pretrain", "hf", "torch", 3500, label="hf-compile"),
        _record("finetune", "kbert", "jax", 900),
        _record("finetune", "hf", "torch", 600),
        _record("inference", "kbert", "torch", 9700),
        _record("inference", "hf", "torch", 9600),
    ]
    lines = bench.report.check_suite_goals(
        "GPU", bench.cells.GPU_GOALS, records, full_preset="bert_base_en_uncased"
    ).splitlines()
    text = "\n".join(lines)
    assert "pretrain: kbert/jax = 5,700 seq/s (goal >= 5,600): met" in text
    assert "pretrain: kbert/jax MFU = 52.0%" in text and "(goal >= 45%): met" in text
    # The variants of JAX pretraining have MFU lines of their own.
    assert "pretrain: kbert-flash/jax MFU >= 45%: not measured" in text
    # Against the compiled HF row, not the eager one: 3000 / 3500.
    assert "pretrain: kbert/torch vs hf-compile = 0.86x (goal >= 1.00x): NOT met" in text
    assert "finetune: kbert/jax vs hf = 1.50x (goal >= 1.50x): met" in text
    assert "finetune: kbert/torch vs hf >= 1.50x: not measured" in text
    assert "inference: kbert/jax >= 12,000 seq/s: not measured" in text
    assert "inference: kbert/torch vs hf = 1.01x (goal >= 1.00x): met" in text
    # kbert's compiled torch steps have goal lines of their own.
    assert "finetune: kbert-compile/torch vs hf >= 1.50x: not measured" in text
    records.append(_record("finetune", "kbert", "torch", 950, label="kbert-compile"))
    records.append(_record("pretrain", "kbert", "jax", 4000, mfu=0.41, label="kbert-float8"))
    text = bench.report.check_suite_goals("GPU", bench.cells.GPU_GOALS, records)
    assert "finetune: kbert-compile/torch vs hf = 1.58x (goal >= 1.50x): met" in text
    assert "pretrain: kbert-float8/jax MFU = 41.0%" in text and "(goal >= 45%): NOT met" in text
    judged = {
        (g["workload"], g["row"], g["measure"]): g
        for g in bench.report.judge_goals(bench.cells.GPU_GOALS, records)
    }
    assert judged[("finetune", "kbert-compile/torch", "vs hf")]["status"] == "met"
    assert judged[("finetune", "kbert-compile/torch", "vs hf")]["value"] == pytest.approx(950 / 600)
    assert judged[("pretrain", "kbert-float8/jax", "mfu")]["status"] == "not met"
    assert judged[("pretrain", "kbert-flash/jax", "mfu")]["value"] is None
    assert judged[("pretrain", "kbert-flash/jax", "mfu")]["status"] == "not measured"


def test_gpu_goals_time_kbert_compiled_steps_in_their_own_process(bench):
    """gpu-goals runs kbert on torch twice: eagerly (the default) and with `jit_compile=True` in
    a process of its own, whose rows are labelled "kbert-compile"; `--kbert-compile off` drops
    it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("benchmark_main", BENCHMARKS / "benchmark.py")
    main = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(main)
    args = main.parse_args(["--suite", "gpu-goals", "--config", "tiny"])
    specs = main._processes(args, bench.cells.build_cells(args))
    compiled = [s for _, s in specs if s.get("kbert_compile") and not s.get("cuda_graphs")]
    assert len(compiled) == 1 and compiled[0]["jit_compile"] is True
    assert compiled[0]["backend"] == "torch" and compiled[0]["frameworks"] == ["kbert"]
    assert {c["workload"] for c in compiled[0]["cells"]} == {"pretrain", "finetune", "inference"}
    # ... and, for fine-tuning and inference, with CUDA graphs (issue #44, item 2).
    (graphed,) = [s for _, s in specs if s.get("cuda_graphs")]
    assert graphed["jit_compile"] is True and graphed["backend"] == "torch"
    assert [c["workload"] for c in graphed["cells"]] == ["finetune", "inference"]
    eager = [
        s
        for b, s in specs
        if b == "torch" and s["family"] == "keras" and not s.get("kbert_compile")
    ]
    assert eager and all(s["jit_compile"] == "auto" for s in eager)
    args = main.parse_args(["--suite", "gpu-goals", "--config", "tiny", "--kbert-compile", "off"])
    assert not [
        s for _, s in main._processes(args, bench.cells.build_cells(args)) if s.get("kbert_compile")
    ]
    # JAX pretraining also with each variant of the recipe, each in a process of its own.
    names = [main.process_name(s) for _, s in specs]
    assert names == [
        "keras/jax",
        "keras/torch",
        "kbert-compile/torch",
        "kbert-cudagraphs/torch",
        "hf/torch",
        "hf-compile/torch",
        "kbert-flash/jax",
        "kbert-float8/jax",
    ]
    flash = [s for _, s in specs if s.get("kbert_variant") == "flash"][0]
    assert [c["workload"] for c in flash["cells"]] == ["pretrain"] and flash["backend"] == "jax"
    args = main.parse_args(["--suite", "gpu-goals", "--config", "tiny", "--kbert-variants", "off"])
    assert not [
        s for _, s in main._processes(args, bench.cells.build_cells(args)) if s.get("kbert_variant")
    ]
    # --process runs the named ones only, and refuses a name the run does not have.
    args = main.parse_args(
        ["--suite", "gpu-goals", "--config", "tiny", "--process", "hf/torch", "kbert-float8/jax"]
    )
    picked = main._processes(args, bench.cells.build_cells(args))
    assert [main.process_name(s) for _, s in picked] == ["hf/torch", "kbert-float8/jax"]
    args = main.parse_args(["--suite", "gpu-goals", "--config", "tiny", "--process", "hf/jax"])
    with pytest.raises(SystemExit, match="hf/jax: not a process of this run"):
        main._processes(args, bench.cells.build_cells(args))
    # --plain: every worker also times Keras' own AdamW, as a user's script writes it.
    assert all(s["optimizers"] == ["kbert"] for _, s in specs)
    args = main.parse_args(["--suite", "gpu-goals", "--config", "tiny", "--plain"])
    plain = main._processes(args, bench.cells.build_cells(args))
    assert plain and all(s["optimizers"] == ["kbert", "keras"] for _, s in plain)
    adamw = bench.keras_timing._keras_optimizer(optimizer="keras")
    assert type(adamw).__name__ == "AdamW" and float(adamw.learning_rate) == pytest.approx(2e-5)


def test_kbert_variants_build_what_they_name(bench):
    """`flash`: no attention dropout and flash attention asked for; `float8`: every Dense
    layer of the model in Keras' float8 mode; anything else is refused."""
    import keras

    shape = bench.flops.resolve_preset("L2-H64-A2-V512")
    timing = bench.keras_timing
    plain = timing._keras_models("kbert", shape, "mixed_bfloat16", "pretrain")
    flash = timing._keras_models("kbert", shape, "mixed_bfloat16", "pretrain", variant="flash")
    assert plain.backbone.attention_dropout == 0.1 and plain.backbone.flash_attention is None
    assert flash.backbone.attention_dropout == 0.0 and flash.backbone.flash_attention is True
    float8 = timing._keras_models("kbert", shape, "mixed_bfloat16", "pretrain", variant="float8")
    dense = [layer for layer in float8._flatten_layers() if isinstance(layer, keras.layers.Dense)]
    assert len(dense) > 8 and {layer.quantization_mode for layer in dense} == {"float8"}
    assert all(
        layer.quantization_mode is None
        for layer in plain._flatten_layers()
        if isinstance(layer, keras.layers.Dense)
    )
    with pytest.raises(ValueError, match="Unknown kbert variant 'fp4'"):
        timing._keras_models("kbert", shape, "float32", "pretrain", variant="fp4")


def test_absolute_goals_are_not_judged_on_another_shape(bench):
    records = [_record("pretrain", "kbert", "jax", 9e9, preset="L2-H64-A2-V512", mfu=0.9)]
    text = bench.report.check_suite_goals(
        "GPU", bench.cells.GPU_GOALS[:2], records, full_preset="bert_base_en_uncased"
    )
    assert text.count("not judged (L2-H64-A2-V512 is not bert_base_en_uncased)") == 2
    assert "met" not in text.replace("not judged", "")


def test_worker_environment_switches_allocator_settings(bench, monkeypatch):
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1:glibc.pthread.rseq=0")
    env = bench.harness.worker_environment("jax", hugepages=False, allocator_tuning=False)
    assert env["GLIBC_TUNABLES"] == "glibc.pthread.rseq=0"  # "off" removes the inherited one.
    assert env["KBERT_MALLOC_TUNING"] == "0" and env["KERAS_BACKEND"] == "jax"
    env = bench.harness.worker_environment("torch", hugepages=True)
    assert env["GLIBC_TUNABLES"].split(":") == ["glibc.pthread.rseq=0", "glibc.malloc.hugetlb=1"]
    assert "KBERT_MALLOC_TUNING" not in env or env["KBERT_MALLOC_TUNING"] != "0"


@pytest.mark.large
def test_gpu_goals_and_host_overhead_suites_run_end_to_end_on_a_tiny_config(tmp_path, bench):
    out = tmp_path / "run.json"
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    command = [
        sys.executable,
        str(BENCHMARKS / "benchmark.py"),
        "--suite",
        "gpu-goals",
        "host-overhead",
        "--config",
        "tiny",
        "--malloc-hugepages",
        "off",
        "--steps",
        "1",
        "--warmup",
        "1",
        "--json",
        str(out),
        "--check-plain",
        # kbert's compiled torch steps: Inductor compiles each for minutes on a small CPU; their
        # processes are checked by test_gpu_goals_time_kbert_compiled_steps_in_their_own_process.
        "--kbert-compile",
        "off",
        # The JAX pretraining variants time the same step on another model: the models are
        # checked by test_kbert_variants_build_what_they_name, their processes above.
        "--kbert-variants",
        "off",
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1500)
    assert result.returncode == 0, result.stderr[-3000:]
    payload = json.loads(out.read_text())
    rows = {
        (r["workload"], r.get("label", r["framework"]), r["backend"]): r for r in payload["results"]
    }
    failed = {k: r["error"] for k, r in rows.items() if "error" in r}
    assert not failed, failed
    for workload in ("pretrain", "finetune", "inference"):
        for row in (("kbert", "jax"), ("kbert", "torch"), ("hf", "torch")):
            assert (workload,) + row in rows, (workload, row, sorted(rows))
    assert ("pretrain", "hf-compile", "torch") in rows  # HF torch.compile, same run.
    # Keras' own optimizer (`--plain`) only where asked: a compiled cell more per workload.
    assert not [k for k in rows if k[1] == "kbert+AdamW"]
    # kbert's inference is timed with outputs left on the device, as HF's.
    assert rows[("inference", "kbert", "jax")]["outputs"] == "on device"
    # One common peak per precision for every row.
    peak = payload["common_matmul_peaks"]["mixed_bfloat16"]
    assert {
        r["matmul_peak_flops"] for r in payload["results"] if r["precision"] == "mixed_bfloat16"
    } == {peak}
    assert payload["malloc_hugepages"] == "off"
    assert payload["processes"]["keras/jax"]["allocator"]["reason"]
    text = result.stdout
    assert "goals (GPU, this run):" in text and "goals (host overhead, CPU, this run):" in text
    assert "finetune: kbert/torch vs hf = " in text
    # Minor page faults per timed step, from every worker (`--plain` prints them as a table).
    assert all(isinstance(r["page_faults_per_step"], int) for r in payload["results"])
    table = bench.report.format_page_faults(payload["results"]).splitlines()
    assert "minor page faults per step" in table[1] and len(table) == 2 + len(payload["results"])
    # --check-plain: the HF cells also timed as a plain script, in the same run, side by side.
    assert "plain-script check" in text and "finetune:L2-H64-A2-V512:4:16" in text
    assert [c["workload"] for c in payload["plain_checks"]] == ["finetune"]  # float32 only.
    assert "pretrain  L2-H64-A2-V512  batch=4  seq=16  mixed_bfloat16" in text
