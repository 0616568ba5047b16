"""Worker-side half of the vLLM engine's weight sync; imported inside vLLM's worker process only.

``VLLMEngine`` starts vLLM with ``worker_extension_cls="objbench.rollout.vllm_worker.WeightSyncExtension"``: vLLM mixes
this class into its worker class, so ``LLM.collective_rpc("objbench_reload_weights", ...)`` calls the method
below by name. Only a folder path crosses the process boundary: no pickled function and no tensor payload
(``collective_rpc`` with a Python function needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``, and tensors given as
arguments arrive as lists).

Why not ``model.load_weights(...)``: vLLM's CPU backend repacks linear weights after loading (oneDNN / sgl
kernels) and leaves empty parameters behind, so a plain ``load_weights`` into the running model fails
("Attempted to load weight (64, 256) into parameter (0,)"). ``reload_weights`` (vLLM's layerwise in-place
reload) restores each layer's checkpoint-format parameters, loads, re-runs the layer's post-load processing
(the repacking) and copies the result into the tensors the kernels hold.
"""

from __future__ import annotations

import logging

_LAYERWISE_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class _DropBufferOnlyLayerWarning(logging.Filter):
    # Rotary embeddings have buffers but nothing in a checkpoint: every reload warns "RotaryEmbedding: Failed
    # to load weights" and keeps its tensors, which is right. Any other layer's warning stays visible.
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.getMessage().startswith("RotaryEmbedding:") and "Failed to load" in record.getMessage())


class WeightSyncExtension:
    """Methods added to vLLM's worker (``self`` is the worker: ``self.model_runner``, ``self.vllm_config``)."""

    def objbench_reload_weights(self, weights_path: str) -> bool:
        """Reload every weight in place from the safetensors files in ``weights_path``."""
        log = logging.getLogger(_LAYERWISE_LOGGER)
        if not any(isinstance(f, _DropBufferOnlyLayerWarning) for f in log.filters):
            log.addFilter(_DropBufferOnlyLayerWarning())
        self.reload_weights(weights_path=weights_path)  # Worker.reload_weights -> model_runner.reload_weights
        _refresh_tied_lm_head(self.model_runner.get_model(), self.vllm_config)
        return True


def _refresh_tied_lm_head(model, vllm_config) -> None:
    """Redo the LM head's post-load processing when it shares its weight with the input embedding.

    vLLM skips ``lm_head.weight`` of a tied checkpoint for some architectures; the layerwise reload then keeps
    the LM head's old processed state (on the CPU backend: a packed copy of the *old* embedding made at start-up),
    so sampling would use stale output weights while the embedding is new. Re-running the head's
    ``process_weights_after_loading`` repacks it from the (shared, reloaded) weight; on a GPU it is a no-op.
    """
    lm_head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    w_head, w_embed = getattr(lm_head, "weight", None), getattr(embed, "weight", None)
    if w_head is None or w_embed is None or w_head.numel() == 0 or w_head.data_ptr() != w_embed.data_ptr():
        return
    method = getattr(lm_head, "quant_method", None)
    if method is None or not hasattr(method, "process_weights_after_loading"):
        return
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(vllm_config):
        method.process_weights_after_loading(lm_head)
