"""A GPT-2-like decoder: learned positions, pre-LayerNorm blocks, GELU MLP of any width, Hugging
Face's dropouts (masks from the global RNG, which the trainer seeds). Module names follow TorchTitan's
llama3, so the parallelisation plan reads the same.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Partial
from torchtitan.protocols.model import ModelProtocol

from ...utils.dtensor import copy_full_into, local_tensor
from .args import GPT2ModelArgs

INIT_STD = 0.02


class Attention(nn.Module):
    """Causal multi-head self-attention with biases, its heads counted from the projected width (so
    it runs on TP shards). q, k, v are one GEMM over ``wq``, ``wk``, ``wv`` concatenated (a 3·dim²
    copy against two GEMM launches)."""

    def __init__(self, args: GPT2ModelArgs):
        super().__init__()
        self.head_dim = args.head_dim
        self.wq = nn.Linear(args.dim, args.dim)
        self.wk = nn.Linear(args.dim, args.dim)
        self.wv = nn.Linear(args.dim, args.dim)
        self.wo = nn.Linear(args.dim, args.dim)
        self.attn_dropout = args.attn_dropout
        self.resid_dropout = nn.Dropout(args.resid_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seqlen, _ = x.shape
        projections = (self.wq, self.wk, self.wv)
        weight = torch.cat([local_tensor(w.weight) for w in projections])
        bias = torch.cat([local_tensor(w.bias) for w in projections])
        if isinstance(x, DTensor):  # tensor parallel: the replicated input; each rank's heads give a partial gradient
            x = x.to_local(grad_placements=[Partial()])
        qkv = F.linear(x, weight, bias).view(bsz, seqlen, 3, -1, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [bsz, heads, seqlen, head_dim]
        dropout_p = self.attn_dropout if self.training else 0.0  # on the attention probabilities
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
        return self.resid_dropout(self.wo(out.transpose(1, 2).reshape(bsz, seqlen, -1)))


class FeedForward(nn.Module):
    def __init__(self, args: GPT2ModelArgs):
        super().__init__()
        self.w1 = nn.Linear(args.dim, args.hidden_dim)
        self.w2 = nn.Linear(args.hidden_dim, args.dim)
        self.resid_dropout = nn.Dropout(args.resid_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.resid_dropout(self.w2(F.gelu(self.w1(x), approximate="tanh")))  # GPT-2's "gelu_new"


class TransformerBlock(nn.Module):
    def __init__(self, args: GPT2ModelArgs):
        super().__init__()
        self.attention_norm = nn.LayerNorm(args.dim, eps=args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = nn.LayerNorm(args.dim, eps=args.norm_eps)
        self.feed_forward = FeedForward(args)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class GPT2(ModelProtocol):
    def __init__(self, args: GPT2ModelArgs):
        super().__init__(args)
        self.model_args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.pos_embeddings = nn.Embedding(args.max_seq_len, args.dim)
        self.embd_dropout = nn.Dropout(args.embd_dropout)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(args) for i in range(args.n_layers)})
        self.norm = nn.LayerNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """(Re-)share the LM head with the token embeddings, after ``to_empty`` or TP made two tensors."""
        if self.model_args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    @torch.no_grad()
    def init_weights(self, buffer_device: torch.device | None = None) -> None:
        """GPT-2 init: N(0, 0.02), zero biases, residual projections scaled by 1/sqrt(2L); full tensors
        drawn from one CPU generator, each rank keeping its shard: the same under every layout."""
        del buffer_device  # no buffers
        self.tie_weights()
        generator = torch.Generator().manual_seed(torch.initial_seed())
        residual_std = INIT_STD / math.sqrt(2 * self.model_args.n_layers)
        for name, param in self.named_parameters():
            full = torch.empty(param.shape, dtype=torch.float32)
            if name.endswith("norm.weight"):
                full.fill_(1.0)
            elif name.endswith("bias"):
                full.zero_()
            else:
                residual = name.endswith(("attention.wo.weight", "feed_forward.w2.weight"))
                full.normal_(0.0, residual_std if residual else INIT_STD, generator=generator)
            copy_full_into(param, full)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0)
        return self.embd_dropout(self.tok_embeddings(tokens) + self.pos_embeddings(positions))

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, T, V]; given ``labels``, their summed cross-entropy by Liger-Kernel's fused linear
        cross-entropy (``training.head_loss = "liger"``)."""
        h = self.embed(tokens)
        for layer in self.layers.values():
            h = layer(h)
        h = self.norm(h)
        if labels is None:
            return self.output(h)
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        # fp32 weight-gradient sums over the chunks, as the torch path's one bf16 GEMM accumulates in fp32
        return liger_fused_linear_cross_entropy(
            h.flatten(0, 1), self.output.weight, labels.flatten(), reduction="sum", accum_dtype=torch.float32
        )
