"""The benchmark scripts' shared code. A script in tools/benchmarks/ imports it as `bench` (the
script's folder is first on `sys.path` when it runs); no script imports another script.

- `harness`: worker processes and their environment, rounds (best kept), timing, the result
  marker, result files; every benchmark script runs on it.
- `charts`: PNG chart helpers.
- `tables`: the text table of rates and ratios to a reference system.
- `compare`: the run of a CPU comparison of kbert's backends with one reference system
  (rounds, table, chart, result file).
- `data`: data and checkpoint locations, the SQuAD and SST-2 readers, random MiniLM-sized
  checkpoints.
- `st_onnx`: sentence-transformers' ONNX backends as systems of the serving and embedding
  benchmarks (their own environment, `--st-onnx-python`).
- `recipes`: the fine-tuning recipes of the quality and LoRA benchmarks.
- The model benchmark (benchmark.py): `common` (names, random batch), `flops` (shapes, FLOP
  counts), `devices`, `peak` (matmul peak), `keras_timing` and `hf_timing` (one cell each),
  `memory`, `workers` (its worker), `cells` (suites and goals), `report` (tables, goal lines,
  chart), `plain_check` (its HF figures against benchmark_plain_step.py).
"""
