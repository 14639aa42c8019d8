"""Transformer model shapes: what the cost model needs of an LLM.

Shapes from each model's published ``config.json`` on the Hugging Face hub (layers, hidden
size, attention and KV heads, MLP width, vocabulary, context length). Parameter counts are
computed from the shape (:attr:`ModelSpec.params`; ``tests/core/cluster`` checks them against
the published totals). Mixture-of-experts models count every expert's weights in memory and the
``experts_per_token`` active ones in FLOPs and weight traffic (all experts are streamed once a
batch is large enough to touch them: :meth:`ModelSpec.mlp_weight_params_touched`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

BYTES_FP16 = 2


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One decoder-only transformer (fp16/bf16 weights)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int  # MLP intermediate size
    vocab: int
    max_seq_len: int
    gated_mlp: bool = True  # SwiGLU (3 matrices) or a plain MLP (2)
    tied_embeddings: bool = False
    experts: int = 1
    experts_per_token: int = 1

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def attn_params_per_layer(self) -> int:
        return self.hidden * (self.hidden + 2 * self.kv_dim) + self.hidden * self.hidden

    @property
    def mlp_params_per_expert(self) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden * self.ffn

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def params(self) -> int:
        """All weights (every expert)."""
        per = self.attn_params_per_layer + self.experts * self.mlp_params_per_expert
        return self.layers * per + self.embedding_params

    @property
    def active_params_per_layer(self) -> int:
        """Weights one token multiplies by in one layer (the chosen experts only)."""
        return self.attn_params_per_layer + self.experts_per_token * self.mlp_params_per_expert

    @property
    def active_params(self) -> int:
        return self.layers * self.active_params_per_layer + self.embedding_params

    def mlp_weight_params_touched(self, tokens: float) -> float:
        """Expected MLP weights read per layer by a batch of ``tokens`` tokens: every expert
        chosen by at least one token (uniform routing)."""
        if self.experts == 1:
            return float(self.mlp_params_per_expert)
        miss = float((1.0 - self.experts_per_token / self.experts) ** max(tokens, 1.0))
        return self.experts * (1.0 - miss) * self.mlp_params_per_expert

    def kv_bytes_per_token(self, tp: int = 1, layers: int | None = None) -> int:
        """KV cache bytes of one token on one GPU of a ``tp``-way stage of ``layers`` layers
        (K and V, fp16; vLLM replicates KV heads when ``tp`` exceeds them)."""
        kv_heads_gpu = max(1, self.kv_heads // tp) if self.kv_heads >= tp else 1
        n = self.layers if layers is None else layers
        return 2 * n * kv_heads_gpu * self.head_dim * BYTES_FP16

    def valid_tp(self, tp: int) -> bool:
        return tp >= 1 and self.heads % tp == 0


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int,
           seq: int) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, kv, ffn, vocab, seq)


_L2_13B = _llama("llama-2-13b", 40, 5120, 40, 40, 13824, 32000, 4096)
_PYTHIA_12B = ModelSpec("pythia-12b", 36, 5120, 40, 40, 20480, 50688, 2048, gated_mlp=False)

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _llama("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
        _L2_13B,
        _llama("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
        _llama("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
        _llama("llama-3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
        _llama("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 32768),
        ModelSpec("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 32768, experts=8,
                  experts_per_token=2),
        _llama("codellama-34b", 48, 8192, 64, 8, 22016, 32000, 16384),
        # fine-tunes of LLaMA-2-13B (SamuLLM's ensembling, routing and chain summary)
        replace(_L2_13B, name="vicuna-13b"),
        replace(_L2_13B, name="wizardlm-13b"),
        # fine-tunes of LLaMA-1-13B (2,048-token context)
        replace(_L2_13B, name="alpaca-13b", max_seq_len=2048),
        replace(_L2_13B, name="baize-v2-13b", max_seq_len=2048),
        replace(_L2_13B, name="koala-13b", max_seq_len=2048),
        # Pythia-12B fine-tunes (GPT-NeoX: plain MLP)
        replace(_PYTHIA_12B, name="oasst-pythia-12b"),
        replace(_PYTHIA_12B, name="dolly-v2-12b", vocab=50280),
        ModelSpec("mpt-7b-chat", 32, 4096, 32, 32, 16384, 50432, 2048, gated_mlp=False,
                  tied_embeddings=True),
        ModelSpec("chatglm3-6b", 28, 4096, 32, 2, 13696, 65024, 8192),
        ModelSpec("stablelm-alpha-7b", 16, 6144, 48, 48, 24576, 50432, 4096, gated_mlp=False),
    )
}

_ALIASES = {"llama2-7b": "llama-2-7b", "llama2-13b": "llama-2-13b", "llama2-70b": "llama-2-70b",
            "llama3-8b": "llama-3-8b", "llama3-70b": "llama-3-70b"}


def get_model(name: str) -> ModelSpec:
    """The model called ``name`` (case-insensitive)."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    try:
        return MODELS[key]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None
