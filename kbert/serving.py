"""Runs kbert's serving exports (ONNX, OpenVINO) on raw text, with the models' own API.

`kbert.export.export_onnx(model, directory)` (optionally `quantize="int8"`) and
`kbert.export.export_openvino(model, directory)` write a self-contained serving directory:
the graph and `kbert_serving.json` (the task, its settings, the tokenizer and packer).
`load(directory)` gives an `ExportedModel` whose `predict` and `encode` take what the Keras
model's take and return what they return:

- `predict(texts)`, `predict((texts, pairs))` or packed arrays: the outputs of a
  `BertClassifier` (logits), `BertTagger` (per-token logits; texts are split into words as
  the tagger's own `predict` splits them), `BertQuestionAnswerer` (`(questions, contexts)`:
  start and end logits of each window) or backbone, in the caller's row order;
- `encode(texts, normalize=..., truncate_dim=..., prompt=..., prompt_name=...,
  precision=...)` for a `BertTextEmbedder`: its sentence embeddings;
- `predict(pairs)` and `rank(query, documents, top_k=..., return_documents=...)` for a
  `BertCrossEncoder` (`ExportedCrossEncoder`): pairs cut by Hugging Face's `longest_first`
  rule and the logits through the head's activation, as `BertCrossEncoder.predict` / `rank`;
- `encode(texts, max_active_dims=..., prompt=..., prompt_name=...)`, `encode_query` and
  `encode_document` for a `BertSparseEncoder` (`ExportedSparseEncoder`): SciPy sparse rows, as
  `BertSparseEncoder.encode` (prompts, lower-casing, length and `max_active_dims` its own).

A `BertMultipleChoice` is not served (its serving exports and `load` raise a ValueError that
says what to use instead), and no export takes a model quantized by `model.quantize(...)`
("Dequantize first": export the float model, with `quantize="int8"` for int8 weights).

The route is the Keras model's: the same tokenizer and packer (`kbert.text`), rows sorted
by length and each batch cut to its longest row, outputs put back in the caller's order.
onnxruntime and OpenVINO run any shape without compiling per shape, so the sorted rows are
cut where padding is least (`kbert.data.batching.plan_tight_batches`): a batch holds at
most `batch_size` rows, fewer where its lengths spread (a run of long question-paragraph
pairs is not padded to the one longest among them). A float export returns the Keras
model's outputs up to float rounding.

`from_model(model, "onnx-int8")` does both steps at once: the switch of a trained Keras
model to a runtime with one argument (`"onnx"`, `"onnx-int8"`, `"openvino"`,
`"openvino-int8"`).

Example:

    kbert.export.export_onnx(embedder, "served", quantize="int8")
    served = kbert.serving.load("served")
    vectors = served.encode(["a good film", "a dull film"], normalize_embeddings=True)
    served = kbert.serving.from_model(embedder, "openvino")  # export + load in one call
"""

import json
from pathlib import Path

import keras
import numpy as np

from kbert.data import batching
from kbert.export import SERVING_CONFIG, SERVING_FILES, UNSERVED_TASKS
from kbert.models.pipeline import is_raw_text, text_parts
from kbert.models.text_embedder import PRECISIONS, quantize_embeddings

_PACKED_INPUTS = ("token_ids", "segment_ids", "padding_mask")
# Rows sent through the tokenizer and packer at a time.
_CHUNK = 4096


def load(path, threads=None, sequence_length=None):
    """Loads a serving directory written by `kbert.export.export_onnx` or `export_openvino`.

    Args:
        path: str or path. The directory (holding `kbert_serving.json`).
        threads: int or `None`. Threads of the runtime's CPU kernels; `None` (default)
            leaves the runtime's default (every core).
        sequence_length: int or `None`. Packed length of raw text (tokens per text,
            `[CLS]`/`[SEP]` included), at most the model's `max_sequence_length`; `None`
            (default) keeps the exported preprocessor's.

    Returns:
        `ExportedModel`.
    """
    path = Path(path)
    config_file = path / SERVING_CONFIG
    if not config_file.is_file():
        raise ValueError(
            f"{str(path)!r} is not a kbert serving directory: it has no {SERVING_CONFIG}. "
            "Write one with kbert.export.export_onnx(model, directory) (a path not ending in "
            "`.onnx`) or kbert.export.export_openvino(model, directory)."
        )
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
    ):
        raise ValueError(f"`threads` must be a positive integer or None. Received: {threads!r}")
    config = json.loads(config_file.read_text())
    if sequence_length is not None:
        longest = config.get("max_sequence_length")
        if (
            isinstance(sequence_length, bool)
            or not isinstance(sequence_length, int)
            or not 2 < sequence_length <= (longest or sequence_length)
        ):
            raise ValueError(
                f"`sequence_length` must be an integer in [3, {longest}] (the model's "
                f"max_sequence_length). Received: sequence_length={sequence_length!r}"
            )
        if config.get("preprocessor") is not None:
            preprocessor = dict(config["preprocessor"])
            preprocessor["config"] = dict(preprocessor["config"], sequence_length=sequence_length)
            config["preprocessor"] = preprocessor
        if config.get("sequence_length"):
            config["sequence_length"] = sequence_length
    format = config.get("format")
    if format not in SERVING_FILES:
        raise ValueError(
            f"{str(config_file)!r} names the format {format!r}. Expected one of "
            f"{sorted(SERVING_FILES)}"
        )
    task = config.get("task")
    if task in UNSERVED_TASKS:
        raise ValueError(f"{str(path)!r} holds a {task} export. {UNSERVED_TASKS[task]}")
    graph = path / SERVING_FILES[format]
    if format == "onnx":
        runner = _OnnxRunner(graph, threads)
    else:
        runner = _OpenVinoRunner(graph, threads)
    return _SERVED.get(task, ExportedModel)(config, runner)


# `from_model`'s runtimes: (exporter name in kbert.export, quantize).
RUNTIMES = {
    "onnx": ("export_onnx", None),
    "onnx-int8": ("export_onnx", "int8"),
    "openvino": ("export_openvino", None),
    "openvino-int8": ("export_openvino", "int8"),
}


def from_model(model, runtime="onnx", directory=None, threads=None):
    """Exports a Keras model and loads the export: the one-call switch of a trained model
    to a serving runtime.

    Args:
        model: a built kbert model with a preprocessor (see `kbert.export.export_onnx`).
        runtime: `"onnx"`, `"onnx-int8"`, `"openvino"` or `"openvino-int8"`. Defaults to
            `"onnx"`.
        directory: str, path or `None`. Where to keep the serving directory; `None`
            (default) writes it to a temporary directory, removed once loaded (the runtime
            holds the graph in memory).
        threads: int or `None`. As in `load`.

    Returns:
        `ExportedModel`.

    Example:

        served = kbert.serving.from_model(embedder, "onnx-int8")
        served.encode(["a good film"])
    """
    import shutil
    import tempfile

    from kbert import export

    if runtime not in RUNTIMES:
        raise ValueError(f"Unknown `runtime` {runtime!r}. Expected one of {list(RUNTIMES)}")
    exporter, quantize = RUNTIMES[runtime]
    if directory is not None:
        getattr(export, exporter)(model, directory, quantize=quantize)
        return load(directory, threads=threads)
    scratch = Path(tempfile.mkdtemp(prefix="kbert-serving-"))
    try:
        getattr(export, exporter)(model, scratch / "served", quantize=quantize)
        return load(scratch / "served", threads=threads)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _preprocessor_from(config):
    if config is None:
        return None
    import kbert.text.preprocessor  # noqa: F401  (registers BertPreprocessor, BertTokenizer)

    return keras.saving.deserialize_keras_object(config)


# onnxruntime graph fusions `_OnnxRunner` leaves out (measured slower on the CPU).
_SLOWER_FUSIONS = ("SkipLayerNormFusion",)


class _OnnxRunner:
    """One onnxruntime CPU session: packed int32 arrays in, a dict of outputs out."""

    def __init__(self, graph, threads):
        try:
            import onnxruntime
        except ImportError as error:
            raise ImportError(
                "Running an ONNX export needs onnxruntime: `pip install onnxruntime` "
                "(or kbert[serving])."
            ) from error
        options = onnxruntime.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        self.session = onnxruntime.InferenceSession(
            str(graph),
            options,
            providers=["CPUExecutionProvider"],
            # onnxruntime's fused residual + LayerNorm kernel runs slower than the residual
            # `Add` and `LayerNormalization` it replaces (BENCHMARKS.md, int8 serving).
            disabled_optimizers=list(_SLOWER_FUSIONS),
        )
        self.output_names = [output.name for output in self.session.get_outputs()]

    def __call__(self, packed):
        values = self.session.run(self.output_names, packed)
        return dict(zip(self.output_names, values))


class _OpenVinoRunner:
    """One OpenVINO model compiled for the CPU: packed int32 arrays in, outputs out."""

    def __init__(self, graph, threads):
        try:
            import openvino
        except ImportError as error:
            raise ImportError(
                "Running an OpenVINO export needs OpenVINO: `pip install openvino` "
                "(or kbert[serving])."
            ) from error
        # float32 arithmetic: OpenVINO's CPU default on CPUs with bfloat16 units is bfloat16,
        # whose outputs differ from the model's by about 1e-3.
        settings = {"INFERENCE_PRECISION_HINT": "f32"}
        if threads is not None:
            settings["INFERENCE_NUM_THREADS"] = threads
        self.compiled = openvino.Core().compile_model(str(graph), "CPU", settings)
        self.output_names = [output.get_any_name() for output in self.compiled.outputs]

    def __call__(self, packed):
        results = self.compiled(packed)
        return {name: np.asarray(results[name]) for name in self.output_names}


class ExportedModel:
    """An exported kbert model on onnxruntime or OpenVINO (see the module docstring).

    Attributes:
        task: str. The exported model's class name (`"BertTextEmbedder"`, ...).
        format: `"onnx"` or `"openvino"`.
        quantize: `None` or `"int8"`.
        settings: dict. The task's constructor settings (pooling, prompts, ...).
        preprocessor: `kbert.text.BertPreprocessor` or `None`.
    """

    def __init__(self, config, runner):
        self.config = config
        self.runner = runner
        self.task = config["task"]
        self.format = config["format"]
        self.quantize = config.get("quantize")
        self.settings = dict(config.get("settings") or {})
        self.output_names = list(config["outputs"])
        self.preprocessor = _preprocessor_from(config.get("preprocessor"))

    def __repr__(self):
        quantize = f", quantize={self.quantize!r}" if self.quantize else ""
        return f"<ExportedModel {self.task} format={self.format!r}{quantize}>"

    # ---------------------------------------------------------------- inputs
    def _require_preprocessor(self, what):
        if self.preprocessor is None:
            raise ValueError(
                f"This {self.task} export has no preprocessor, so it cannot take {what}: "
                "export a model that has one (`from_preset(<directory with vocab.txt>)`), or "
                f"give packed int arrays with keys {list(_PACKED_INPUTS)}."
            )
        return self.preprocessor

    @property
    def sequence_length(self):
        """The packed length of raw text: the task's own (`BertTagger`,
        `BertQuestionAnswerer`), else the preprocessor's."""
        own = self.config.get("sequence_length")
        if own:
            return int(own)
        return int(self._require_preprocessor("raw text").sequence_length)

    def _pack_text(self, x):
        """Raw strings or pairs -> packed int32 arrays, as the Keras task packs them."""
        preprocessor = self._require_preprocessor("raw text")
        if self.task == "BertTagger":
            from kbert.data.tagging import encode_tagging

            (texts,) = text_parts(x)
            return encode_tagging(texts, preprocessor.tokenizer, self.sequence_length).inputs
        if self.task == "BertQuestionAnswerer":
            return self._pack_questions(x)
        parts = text_parts(x)
        chunks = []
        for start in range(0, len(parts[0]), _CHUNK):
            ids = tuple(preprocessor.tokenizer.tokenize(p[start : start + _CHUNK]) for p in parts)
            chunks.append(preprocessor.packer(ids))
        return {k: np.concatenate([chunk[k] for chunk in chunks]) for k in _PACKED_INPUTS}

    def _pack_questions(self, x):
        from kbert.data.squad import prepare_squad_features

        parts = text_parts(x)
        if len(parts) != 2:
            raise ValueError(
                "A BertQuestionAnswerer export takes (questions, contexts): two equally long "
                "lists of strings."
            )
        examples = [
            {"id": str(i), "question": q, "context": c, "answers": [], "is_impossible": True}
            for i, (q, c) in enumerate(zip(*parts))
        ]
        features = prepare_squad_features(
            examples,
            self.preprocessor.tokenizer,
            max_sequence_length=self.sequence_length,
            doc_stride=int(self.settings.get("doc_stride", 128)),
            max_query_length=int(self.settings.get("max_query_length", 64)),
        )
        return features.inputs

    @staticmethod
    def _check_packed(x):
        if set(x) != set(_PACKED_INPUTS):
            raise ValueError(
                f"Packed inputs must be a dict with exactly the keys {list(_PACKED_INPUTS)}. "
                f"Received keys {sorted(x)}"
            )
        arrays = {k: np.asarray(v) for k, v in x.items()}
        shapes = {a.shape for a in arrays.values()}
        if len(shapes) != 1 or any(a.dtype.kind not in "iu" for a in arrays.values()):
            raise ValueError(
                "Packed inputs must be integer arrays of one shape (batch, sequence). "
                f"Received {{{', '.join(f'{k}: {a.dtype}{a.shape}' for k, a in arrays.items())}}}"
            )
        return {k: v.astype("int32") for k, v in arrays.items()}

    # ------------------------------------------------------------------- run
    def _run(self, x, batch_size, verbose=False):
        """Packed arrays -> the outputs of every row in the caller's order (per-token
        outputs padded back to the packed length with the task's fill value); a Keras
        progress bar over the batches when `verbose`. Batches hold at most `batch_size`
        rows, cut where the padding is least (`batching.plan_tight_batches`)."""
        batch_size = _check_batch_size(batch_size)
        plan = batching.plan_tight_batches(
            batching.row_lengths(x["padding_mask"]),
            batch_size,
            batching.bucket_lengths(x["token_ids"].shape[-1], granularity=1),
        )
        collected = batching.OrderedOutputs(
            x["token_ids"].shape[0],
            x["token_ids"].shape[-1],
            {name: bool(self.config["sequence_outputs"][name]) for name in self.output_names},
            fill_value=float(self.config.get("prediction_fill_value", 0.0)),
        )
        progress = keras.utils.Progbar(len(plan)) if verbose else None
        for step, (rows, length) in enumerate(plan, 1):
            batch = batching.crop_batch(x, rows, length, axis=-1)
            outputs = self.runner({k: np.ascontiguousarray(v) for k, v in batch.items()})
            collected.add(rows, length, {name: outputs[name] for name in self.output_names})
            if progress is not None:
                progress.update(step)
        return collected.result()

    def predict(self, x, batch_size=32, verbose=0):
        """The exported model's outputs for raw text or packed arrays, as its `predict`.

        Args:
            x: strings, `(texts, pairs)`, a list of `(text, pair)` tuples (for a
                `BertQuestionAnswerer`: `(questions, contexts)`), or a dict of packed int
                arrays `token_ids`, `segment_ids`, `padding_mask` `(batch, sequence)`.
            batch_size: int. Most rows per run (see `_run`). Defaults to `32`.
            verbose: a Keras progress bar over the batches when true (`1`, `"auto"`);
                `0` (default) runs silently.

        Returns:
            NumPy array for a model with one output (`logits`, `embeddings`), else a dict.
        """
        if isinstance(x, dict):
            packed = self._check_packed(x)
        elif is_raw_text(x):
            packed = self._pack_text(x)
        else:
            raise ValueError(
                "`predict` takes strings, (texts, pairs) or a dict of packed arrays. Received "
                f"{type(x).__name__}: {x!r:.80}"
            )
        outputs = self._run(packed, batch_size, verbose)
        return outputs[self.output_names[0]] if len(self.output_names) == 1 else outputs

    # ------------------------------------------------------------- embeddings
    def _token_rows(self, texts, prompt, prompt_name):
        """`(preprocessor, sequence_length, rows)`: the token ids of `texts` with the prompt
        prepended and the model's casing, each cut to leave room for [CLS] and [SEP] (the
        embedder's and the sparse encoder's `encode`)."""
        preprocessor = self._require_preprocessor("raw strings")
        prompt = self._resolve_prompt(prompt, prompt_name)
        if prompt:
            texts = [prompt + text for text in texts]
        if self.settings.get("lowercase_input"):
            texts = [text.lower() for text in texts]
        length = int(preprocessor.sequence_length)
        return (
            preprocessor,
            length,
            [ids[: length - 2] for ids in preprocessor.tokenizer.tokenize(texts)],
        )

    def _resolve_prompt(self, prompt, prompt_name):
        prompts = self.settings.get("prompts") or {}
        if prompt is not None:
            if not isinstance(prompt, str):
                raise ValueError(f"`prompt` must be a string. Received: {prompt!r}")
            return prompt
        if prompt_name is not None:
            if prompt_name not in prompts:
                raise ValueError(
                    f"Unknown prompt name {prompt_name!r}. This model's prompts are "
                    f"{sorted(prompts)}"
                )
            return prompts[prompt_name]
        default = self.settings.get("default_prompt_name")
        return prompts[default] if default is not None else ""

    def encode(
        self,
        texts,
        batch_size=32,
        normalize_embeddings=None,
        truncate_dim=None,
        prompt=None,
        prompt_name=None,
        precision="float32",
        normalize=None,
        verbose=False,
    ):
        """Sentence embeddings of raw strings, as `BertTextEmbedder.encode` (an embedder's
        export only).

        Args:
            texts: str or list of str. One string returns one vector.
            batch_size: int. Most rows per run (see `_run`). Defaults to `32`.
            normalize_embeddings: `None`, `True` or `False`. `True` L2-normalises the
                returned (truncated) vectors; `None`/`False` return the model's own output.
                Defaults to `None`. `normalize` is the same argument under the Keras
                embedder's name.
            truncate_dim: int or `None`. Keep the first `truncate_dim` dimensions. Defaults
                to the model's `truncate_dim`.
            prompt: str or `None`. Text prepended to every input.
            prompt_name: str or `None`. A key of the model's `prompts`.
            precision: `"float32"`, `"int8"`, `"uint8"`, `"binary"` or `"ubinary"` (see
                `kbert.models.text_embedder.quantize_embeddings`). Defaults to `"float32"`.
            verbose: bool. Show a progress bar. Defaults to `False`.

        Returns:
            NumPy array `(len(texts), dim)`, or `(dim,)` for one string.
        """
        if self.task != "BertTextEmbedder":
            raise ValueError(
                f"`encode` runs a BertTextEmbedder export. This export is a {self.task}: "
                "use `predict`."
            )
        if normalize is not None and normalize_embeddings is not None:
            raise ValueError("Give `normalize_embeddings` or `normalize`, not both.")
        normalize = normalize_embeddings if normalize is None else normalize
        if normalize not in (None, True, False):
            raise ValueError(f"`normalize` must be None, True or False. Received: {normalize!r}")
        if precision not in PRECISIONS:
            raise ValueError(
                f"Unknown `precision` {precision!r}. Expected one of {list(PRECISIONS)}"
            )
        single = isinstance(texts, (str, bytes))
        if not single and not isinstance(texts, (list, tuple, np.ndarray)):
            raise ValueError(
                "`encode` takes a string or a list of strings. Received "
                f"{type(texts).__name__}: {texts!r:.80}"
            )
        parts = text_parts(texts)
        if len(parts) != 1:
            raise ValueError("`encode` takes a batch of strings, not sentence pairs.")
        texts = parts[0]
        preprocessor, length, rows = self._token_rows(texts, prompt, prompt_name)
        truncate_dim = self.settings.get("truncate_dim") if truncate_dim is None else truncate_dim
        packed = preprocessor.packer(rows, sequence_length=length)
        embeddings = self._run(packed, batch_size, verbose)[self.output_names[0]]
        if truncate_dim is not None:
            if (
                isinstance(truncate_dim, bool)
                or not isinstance(truncate_dim, (int, np.integer))
                or not 1 <= truncate_dim <= embeddings.shape[-1]
            ):
                raise ValueError(
                    f"`truncate_dim` must be an integer in [1, {embeddings.shape[-1]}] (the "
                    f"embedding size). Received: truncate_dim={truncate_dim!r}"
                )
            embeddings = embeddings[:, :truncate_dim]
        if normalize:
            norms = np.linalg.norm(embeddings.astype("float64"), axis=-1, keepdims=True)
            embeddings = (embeddings / np.maximum(norms, 1e-12)).astype("float32")
        if precision != "float32":
            embeddings = quantize_embeddings(embeddings, precision)
        return embeddings[0] if single else embeddings


class ExportedCrossEncoder(ExportedModel):
    """A `BertCrossEncoder` export: `predict(pairs)` and `rank(query, documents)` as the
    Keras model's (`kbert.models.BertCrossEncoder`), on onnxruntime or OpenVINO.

    Pairs are cut to the exported preprocessor's `sequence_length` by Hugging Face's
    `"longest_first"` rule (`kbert.models.cross_encoder.tokenize_pairs`, as the Keras model
    and sentence-transformers' `CrossEncoder` cut them) and the logits go through the
    model's activation (its `activation` setting: sigmoid for one label by default).
    """

    def _pack_pairs(self, x):
        from kbert.models.cross_encoder import read_pairs, tokenize_pairs

        firsts, seconds, single = read_pairs(x)
        preprocessor = self._require_preprocessor("raw (query, document) pairs")
        length = int(preprocessor.sequence_length)
        chunks = []
        for start in range(0, len(firsts), _CHUNK):
            ids = tokenize_pairs(
                preprocessor.tokenizer,
                length,
                firsts[start : start + _CHUNK],
                seconds[start : start + _CHUNK],
            )
            chunks.append(preprocessor.packer(ids, sequence_length=length))
        packed = {k: np.concatenate([chunk[k] for chunk in chunks]) for k in _PACKED_INPUTS}
        return packed, single

    def predict(self, x, batch_size=32, activation=None, apply_softmax=False, verbose=0):
        """Scores of (query, document) pairs, as `BertCrossEncoder.predict`.

        Args:
            x: one pair `(query, document)`, a list of pairs, a tuple of two columns of
                strings, or a dict of packed int arrays `token_ids`, `segment_ids`,
                `padding_mask` `(batch, sequence)`.
            batch_size: int. Most pairs per run (see `_run`). Defaults to `32`.
            activation: `None` (the model's `activation`), `"sigmoid"`, `"identity"`,
                `"tanh"` or a callable on NumPy arrays. Defaults to `None`.
            apply_softmax: bool. Softmax over the labels of a several-label model.
                Defaults to `False`.
            verbose: a Keras progress bar over the batches when true. Defaults to `0`.

        Returns:
            float32 NumPy array `(n,)` for one label, `(n, num_labels)` otherwise; for one
            pair a scalar (one label) or one row.
        """
        from kbert.models.cross_encoder import check_activation, scores_from_logits

        if activation is not None and not callable(activation):
            check_activation(activation)
        if isinstance(x, dict):
            packed, single = self._check_packed(x), False
        else:
            packed, single = self._pack_pairs(x)
        logits = self._run(packed, batch_size, verbose)[self.output_names[0]]
        scores = scores_from_logits(
            logits,
            self.settings["activation"] if activation is None else activation,
            int(self.settings.get("num_labels", 1)),
            apply_softmax,
        )
        return scores[0] if single else scores

    def rank(self, query, documents, top_k=None, return_documents=False, batch_size=32):
        """Documents ranked by their score for `query`, as `BertCrossEncoder.rank` (one-label
        models only).

        Args:
            query: str.
            documents: non-empty list of str.
            top_k: int >= 1 or `None` (all). Defaults to `None`.
            return_documents: bool. Add each document's `"text"`. Defaults to `False`.
            batch_size: int. Most pairs per run (see `_run`). Defaults to `32`.

        Returns:
            A list of dicts `{"corpus_id": int, "score": float(, "text": str)}`, highest
            score first (ties keep the documents' order).
        """
        from kbert.models.cross_encoder import check_rank_arguments, ranked

        query, documents = check_rank_arguments(
            query, documents, top_k, int(self.settings.get("num_labels", 1))
        )
        scores = self.predict([(query, d) for d in documents], batch_size=batch_size)
        return ranked(scores, documents, top_k, return_documents)


class ExportedSparseEncoder(ExportedModel):
    """A `BertSparseEncoder` export: `encode`, `encode_query` and `encode_document` return
    the Keras model's SciPy sparse rows (`kbert.models.BertSparseEncoder`), on onnxruntime
    or OpenVINO.

    The exported graph holds the backbone, the masked-LM head and the SPLADE pooling and
    activation; texts are prepared as the Keras model prepares them (the prompt prepended,
    lower-cased when the model lower-cases, cut to the preprocessor's `sequence_length`),
    and `max_active_dims` keeps each row's largest weights.
    """

    def encode(
        self,
        texts,
        batch_size=32,
        convert_to_sparse=True,
        max_active_dims=None,
        prompt=None,
        prompt_name=None,
        verbose=False,
    ):
        """Sparse vectors of raw strings, in the order given, as `BertSparseEncoder.encode`.

        Args:
            texts: str or list / NumPy array of str.
            batch_size: int. Most rows per run (see `_run`). Defaults to `32`.
            convert_to_sparse: bool. Return a float32 `scipy.sparse.csr_matrix`
                `(len(texts), vocabulary_size)` (one string: one row); `False` returns a
                dense NumPy array (one string: a vector). Defaults to `True`.
            max_active_dims: int or `None`. Non-zero weights kept per vector. Defaults to
                the model's `max_active_dims` (`None`: all).
            prompt: str or `None`. Text prepended to every input (overrides `prompt_name`).
            prompt_name: str or `None`. A key of the model's `prompts`.
            verbose: bool. Show a progress bar. Defaults to `False`.

        Returns:
            float32 `scipy.sparse.csr_matrix` or NumPy array.
        """
        from kbert.models.sparse_encoder import (
            ENCODE_BLOCK_ROWS,
            check_max_active_dims,
            encode_texts,
            keep_top_dims,
            require_scipy,
            rows_in_caller_order,
        )

        single, texts = encode_texts(texts, convert_to_sparse)
        batch_size = _check_batch_size(batch_size)
        default = self.settings.get("max_active_dims")
        max_active_dims = check_max_active_dims(
            default if max_active_dims is None else max_active_dims
        )
        sparse = require_scipy() if convert_to_sparse else None
        preprocessor, length, rows = self._token_rows(texts, prompt, prompt_name)
        # Blocks of rows of similar length (longest first), each block's dense
        # `(rows, vocabulary_size)` output made sparse before the next runs.
        order = np.argsort(-np.array([len(row) for row in rows]), kind="stable")
        blocks = []
        for start in range(0, len(order), ENCODE_BLOCK_ROWS):
            block_rows = [rows[i] for i in order[start : start + ENCODE_BLOCK_ROWS]]
            packed = preprocessor.packer(block_rows, sequence_length=length)
            block = self._run(packed, batch_size, verbose)[self.output_names[0]]
            block = np.asarray(block, np.float32)
            if max_active_dims is not None:
                block = keep_top_dims(block, max_active_dims)
            blocks.append(sparse.csr_matrix(block) if sparse is not None else block)
        return rows_in_caller_order(blocks, order, sparse, single)

    def encode_query(self, texts, prompt=None, prompt_name=None, **kwargs):
        """`encode` with the model's `"query"` prompt (`""` when it has none), as
        `BertSparseEncoder.encode_query`. Other arguments as `encode`."""
        if prompt is None and prompt_name is None:
            prompt = (self.settings.get("prompts") or {}).get("query", "")
        return self.encode(texts, prompt=prompt, prompt_name=prompt_name, **kwargs)

    def encode_document(self, texts, prompt=None, prompt_name=None, **kwargs):
        """`encode` with the first of the model's `"document"`, `"passage"` and `"corpus"`
        prompts (a `"document"` prompt always exists, `""` unless set), as
        `BertSparseEncoder.encode_document`. Other arguments as `encode`."""
        if prompt is None and prompt_name is None:
            prompts = {"document": "", **(self.settings.get("prompts") or {})}
            name = next(n for n in ("document", "passage", "corpus") if n in prompts)
            prompt = prompts[name]
        return self.encode(texts, prompt=prompt, prompt_name=prompt_name, **kwargs)


# Tasks `load` serves with their own methods; the others' `predict` / `encode` are
# `ExportedModel`'s.
_SERVED = {
    "BertCrossEncoder": ExportedCrossEncoder,
    "BertSparseEncoder": ExportedSparseEncoder,
}


def _check_batch_size(batch_size):
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
        raise ValueError(f"`batch_size` must be a positive integer. Received: {batch_size!r}")
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be a positive integer. Received: {batch_size!r}")
    return int(batch_size)
