"""kbert's backend-specific code, in one package: speed paths and the optional TensorFlow.

kbert's layers, optimizer and tasks are written in `keras.ops`. Where one backend has a faster
way to compute the same thing, they call a hook of this package, which answers with that
backend's result or `None` (use the portable form). Each hook computes the same function as
the portable form (same law for random masks) and is tested against it.

Modules:
    paths       the hooks, one per speed path, each deciding by `keras.config.backend()`;
                re-exported here, so callers write `backend.fused_dense(layer, x)`.
    torch       the torch calls behind the hooks (imported only on the torch backend).
    torch_encoder
                the backbone's forward pass in torch calls (the lean eager path on torch).
    torch_heads the task heads in torch calls, around the backbone's lean path.
    torch_steps the train / test / predict steps `compile(jit_compile=True)` runs on torch.
    tensorflow  TensorFlow as an optional dependency: the one place kbert imports it from.

The speed paths:
    fused_dense             torch: matmul and bias in one BLAS call (`kbert.layers.Dense`).
    int8_dense              torch: an int8 `Dense` through torch's dynamic int8 linear kernel.
    int8_dense_group        torch: the attention's int8 query, key and value in one product.
    lean_backbone_outputs   eager torch: `BertBackbone`'s forward pass as plain torch calls
                            (`torch_encoder`), one call per kernel; `prepare_lean_backbone`
                            gathers its weights when a backbone is made.
    lean_task_outputs       eager torch: a task's forward pass with its head as plain torch
                            calls (`torch_heads`) and its backbone's lean path, without a
                            Keras `__call__` per layer.
    lean_loss_spec, lean_task_loss
                            torch: a task's default cross-entropy as the torch calls Keras'
                            `compute_loss` ends in, without its twenty-odd wrapped calls.
    call_sublayer           eager torch: a built sublayer's `call` without Keras' `__call__`
                            bookkeeping, where `__call__` would change nothing.
    native_dropout, hash_dropout_backend, batch_slice
                            dropout masks from torch's generator on torch (replayed by
                            `torch.utils.checkpoint`), a counter-based hash on JAX and TF;
                            over several replicas each takes its slice of the global mask.
    attention_path, torch_attention, attention_with_dropout, flash_unavailable_reason,
    fused_attention_unsupported, key_mask_as_bias, one_row_attention_by_products
                            which attention kernel `BertSelfAttention` uses, how it
                            masks padded keys, and how it attends from one row.
    needs_dense_embedding_gradient
                            TensorFlow: dense embedding gradients instead of `IndexedSlices`.
    has_multi_tensor_adamw, adamw_update, clip_by_global_norm
                            torch: `BertAdamW`'s update of every variable by one fused kernel,
                            and its global-norm clipping by one multi-tensor norm.
    xla_predict_function    TensorFlow: `predict` compiled with XLA.
    int8_products_saturate  whether this CPU's uint8 x int8 products need 7-bit operands.
    build_optimizer_before_tracing
                            TensorFlow: the optimizer built before the train step is traced
                            (one trace instead of two).
    eager_train_step        eager torch: Keras' train step with the trainable weights walked once
                            and only their gradients cleared.
    torch_step_function     torch with `jit_compile=True`: kbert's compiled steps (static
                            shapes per bucket, no graph break, fused optimizer update).
    replicas_gradient_sum   TensorFlow: gradients summed over a strategy's replicas before
                            `BertAdamW` clips them (Keras clips each replica's own).
    strategy_build_inputs   TensorFlow: integer ids for Keras' symbolic build in a strategy's
                            scope (it averages the first batch over the replicas).
"""

from kbert.backend.cpu import int8_products_saturate
from kbert.backend.paths import (
    ATTENTION_IMPLEMENTATIONS,
    adamw_update,
    attention_path,
    attention_with_dropout,
    batch_slice,
    build_optimizer_before_tracing,
    call_sublayer,
    clip_by_global_norm,
    eager_train_step,
    flash_unavailable_reason,
    fused_attention_unsupported,
    fused_dense,
    has_multi_tensor_adamw,
    hash_dropout_backend,
    int8_dense,
    int8_dense_group,
    key_mask_as_bias,
    lean_backbone_outputs,
    lean_loss_spec,
    lean_task_loss,
    lean_task_outputs,
    native_dropout,
    needs_dense_embedding_gradient,
    one_row_attention_by_products,
    prepare_lean_backbone,
    replicas_gradient_sum,
    strategy_build_inputs,
    torch_attention,
    torch_step_function,
    xla_predict_function,
)

__all__ = [
    "ATTENTION_IMPLEMENTATIONS",
    "adamw_update",
    "attention_path",
    "attention_with_dropout",
    "batch_slice",
    "build_optimizer_before_tracing",
    "call_sublayer",
    "clip_by_global_norm",
    "eager_train_step",
    "flash_unavailable_reason",
    "fused_attention_unsupported",
    "fused_dense",
    "int8_dense",
    "int8_dense_group",
    "int8_products_saturate",
    "has_multi_tensor_adamw",
    "hash_dropout_backend",
    "key_mask_as_bias",
    "lean_backbone_outputs",
    "lean_loss_spec",
    "lean_task_loss",
    "lean_task_outputs",
    "native_dropout",
    "needs_dense_embedding_gradient",
    "one_row_attention_by_products",
    "prepare_lean_backbone",
    "replicas_gradient_sum",
    "strategy_build_inputs",
    "torch_attention",
    "torch_step_function",
    "xla_predict_function",
]
