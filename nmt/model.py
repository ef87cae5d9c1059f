"""The seq2seq-attn network: the parameters (single source of truth) and the autograd forward.

Both training executors use these parameter tensors: the autograd executor runs `forward`
below; the clone executor (`nmt.engine`) runs the same arithmetic node by node (the cells'
and the attention's own wiring and fused forms) and writes its gradients into the same
`.grad` fields. Dropout masks come from `dropout_mask` (`keep_mask_`), drawn in the same
order by both executors, so that they agree to rounding. Where no gradient is recorded
(translation, validation) a model whose granularity infers with the fused forms
(`nmt.granularities`) runs the fused cell and attention, as its clones do.

Shapes: B batch, S source length, T target length, H rnn_size, E word_vec_size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt import cells, granularities, precisions, randomness
from nmt.attention import LEGACY_NAMES, Attention, build_attention
from nmt.cells import RecurrentLayer, State
from nmt.config import ModelConfig
from nmt.data.vocab import PAD
from nmt.errors import NmtError
from nmt.kernels import dropout_mask
from nmt.randomness import PRIVATE_RNG

# src B x S -> (context B x S x H, final state of every layer): `Seq2SeqAttn.encode` or another
# implementation of the same arithmetic (`nmt.nn_rnn`)
Encode = Callable[[Tensor], tuple[Tensor, list[State]]]


class RNNStack(nn.Module):
    """Stacked recurrent layers of one cell type (`model.rnn_type`, `nmt.cells`) with
    dropout on the input of every layer above the first."""

    def __init__(
        self,
        cell: type[RecurrentLayer],
        input_size: int,
        rnn_size: int,
        layers: int,
        dropout: float,
    ):
        super().__init__()
        sizes = [input_size] + [rnn_size] * (layers - 1)
        self.layers = nn.ModuleList(cell(n, rnn_size) for n in sizes)
        self.cell, self.dropout = cell, dropout

    def forward(self, x: Tensor, states: list[State], fused: bool = False) -> list[State]:
        new_states: list[State] = []
        for idx, (layer, state) in enumerate(zip(self.layers, states, strict=True)):
            if idx > 0:
                x = new_states[-1][0]
                if self.training and self.dropout > 0:
                    x = x * dropout_mask(x.shape, self.dropout, x)
            new_states.append(layer(x, state, fused))
        return new_states


@dataclass
class DecoderState:
    """Everything the decoder carries from one target position to the next."""

    layers: list[State]  # per layer, the cell's state (LSTM: h, c; GRU: h), each B x H
    input_feed: Tensor  # B x H, the previous attentional output (zeros at the start)

    def index_select(self, index: Tensor) -> DecoderState:
        """Reorder/expand the batch dimension (beam search)."""
        return DecoderState(
            [tuple(t.index_select(0, index) for t in state) for state in self.layers],
            self.input_feed.index_select(0, index),
        )


def _embedding(num_embeddings: int, dim: int) -> nn.Embedding:
    """nn.Embedding, left undrawn when built on meta: its own N(0, 1) draw is overwritten by
    `reset_parameters` anyway, and on meta `normal_` imports torch._dynamo (seconds at every
    start of `nmt translate` and `nmt train`, which build a model on meta to check weights and
    plan memory). Elsewhere the draw stays, so that a seed gives the weights it always gave."""
    weight = torch.empty(num_embeddings, dim)
    if weight.is_meta:
        return nn.Embedding.from_pretrained(weight, freeze=False)
    return nn.Embedding(num_embeddings, dim)


class Seq2SeqAttn(nn.Module):
    """Recurrent encoder, recurrent decoder with input feeding and global attention: the cell
    of `model.rnn_type` (seq2seq-attn's LSTM by default, see `nmt.cells`), the attention of
    `model.attention` (Luong "general" by default, see `nmt.attention`)."""

    def __init__(self, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int):
        super().__init__()
        self.cfg = cfg
        H, E = cfg.rnn_size, cfg.word_vec_size
        cell, L = cells.get(cfg.rnn_type), cfg.num_layers
        self.src_embedding = _embedding(src_vocab_size, E)
        self.encoder = RNNStack(cell, E, H, L, cfg.dropout)
        self.encoder_bwd = RNNStack(cell, E, H, L, cfg.dropout) if cfg.bidirectional else None
        self.tgt_embedding = _embedding(tgt_vocab_size, E)
        dec_in = E + H if cfg.input_feed else E
        self.decoder = RNNStack(cell, dec_in, H, L, cfg.dropout)
        self.attention: Attention = build_attention(cfg.attention, H)
        self.generator = nn.Linear(H, tgt_vocab_size)
        self.tie_weights()
        self.reset_parameters()
        self.register_load_state_dict_pre_hook(_rename_legacy_keys)

    def tie_weights(self) -> None:
        """`model.tie_embeddings`: the output layer's weight (V x H) is the target embedding
        (V x E, E = H), and with `all` the source embedding is too (one joint vocabulary).
        One Parameter serves each role, so every executor sums its gradients from all roles
        into one `.grad` and the optimizer, clipping and checkpoints see it once. Called again
        by `build_model` after the weights move, should a move ever make new Parameters."""
        tie = self.cfg.tie_embeddings
        if tie in ("decoder", "all"):
            self.generator.weight = self.tgt_embedding.weight
        if tie == "all":
            if self.src_embedding.num_embeddings != self.tgt_embedding.num_embeddings:
                raise NmtError(
                    "model.tie_embeddings all: the source and target vocabularies differ "
                    f"({self.src_embedding.num_embeddings} and "
                    f"{self.tgt_embedding.num_embeddings} entries)"
                )
            self.src_embedding.weight = self.tgt_embedding.weight

    def reset_parameters(self) -> None:
        for p in self.parameters():
            a = self.cfg.param_init
            nn.init.uniform_(p, -a, a, generator=randomness.generator(p.device))

    @property
    def granularity(self) -> granularities.Granularity:
        """`model.granularity`: the clone executor's node set, and the inference forms."""
        return granularities.get(self.cfg.granularity)

    def fused(self) -> bool:
        """Whether to run the fused cell and attention now: where the model's granularity
        infers with them and no gradient is recorded (their in-place ops are not for
        autograd)."""
        return self.granularity.fused_inference and not torch.is_grad_enabled()

    # ---- encoder -------------------------------------------------------------------------

    def zero_states(self, batch: int, like: Tensor) -> list[State]:
        H = self.cfg.rnn_size
        z = like.new_zeros(batch, H, dtype=self.generator.weight.dtype)
        return [(z,) * len(self.encoder.cell.STATE) for _ in range(self.cfg.num_layers)]

    def _run_encoder(
        self, stack: RNNStack, emb: Tensor, order: range, src_mask: Tensor | None
    ) -> tuple[list[Tensor | None], list[State]]:
        states = self.zero_states(emb.size(0), emb)
        tops: list[Tensor | None] = [None] * emb.size(1)
        fused = self.fused()
        for t in order:
            new = stack(self._drop_embedding(emb[:, t]), states, fused)
            if src_mask is not None:  # padded positions keep the previous state
                keep = src_mask[:, t].unsqueeze(1)
                new = [
                    tuple(torch.where(keep, t, pt) for t, pt in zip(s, ps, strict=True))
                    for s, ps in zip(new, states, strict=True)
                ]
            states = new
            tops[t] = states[-1][0]
        return tops, states

    def _drop_embedding(self, x: Tensor) -> Tensor:
        """`model.embedding_dropout` on one position's embeddings (B x E), drawn position by
        position in the order the clones run: each direction of the encoder its own masks."""
        p = self.cfg.embedding_dropout
        if self.training and p > 0:
            x = x * dropout_mask(x.shape, p, x)
        return x

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> tuple[Tensor, list[State]]:
        """src: B x S token ids -> context B x S x H and the final state of every layer.

        Training batches have one source length and no mask; translation may pad and pass
        `src_mask` (True at real tokens), in which case padded steps leave states unchanged.
        """
        emb = self.src_embedding(src)
        tops, final = self._run_encoder(self.encoder, emb, range(src.size(1)), src_mask)
        context = torch.stack(tops, dim=1)
        if self.encoder_bwd is not None:
            tops_b, final_b = self._run_encoder(
                self.encoder_bwd, emb, range(src.size(1) - 1, -1, -1), src_mask
            )
            context = context + torch.stack(tops_b, dim=1)
            final = [
                tuple(t + tb for t, tb in zip(s, sb, strict=True))
                for s, sb in zip(final, final_b, strict=True)
            ]
        return context, final

    # ---- decoder -------------------------------------------------------------------------

    def init_decoder_state(self, final: list[State]) -> DecoderState:
        h = final[0][0]
        return DecoderState(list(final), h.new_zeros(h.shape))

    def attend(
        self, h_top: Tensor, context: Tensor, src_mask: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """Global attention: returns (tanh(W_c [c_t ; h_t]) B x H, attention B x S)."""
        return self.attention(h_top, context, src_mask, self.fused())

    def decode_step(
        self, y: Tensor, state: DecoderState, context: Tensor, src_mask: Tensor | None = None
    ) -> tuple[Tensor, DecoderState, Tensor]:
        """One target position: y (B,) -> attentional output B x H, next state, attention."""
        x = self._drop_embedding(self.tgt_embedding(y))
        if self.cfg.input_feed:
            x = torch.cat([x, state.input_feed], dim=1)
        layers = self.decoder(x, state.layers, self.fused())
        out, attn = self.attend(layers[-1][0], context, src_mask)
        if self.training and self.cfg.dropout > 0:
            out = out * dropout_mask(out.shape, self.cfg.dropout, out)
        return out, DecoderState(layers, out), attn

    def forward(self, src: Tensor, tgt_in: Tensor, encode: Encode | None = None) -> Tensor:
        """Teacher-forced decoder outputs B x T x H (before the generator); `encode`
        replaces `self.encode`."""
        context, final = (encode or self.encode)(src)
        state = self.init_decoder_state(final)
        outs = []
        for t in range(tgt_in.size(1)):
            out, state, _ = self.decode_step(tgt_in[:, t], state, context)
            outs.append(out)
        return torch.stack(outs, dim=1)

    def log_probs(self, out: Tensor) -> Tensor:
        """log-softmax over the vocabulary in float32 at least: in a low precision the logits
        product runs in it, the normalisation over tens of thousands of words does not (the
        loss, perplexity and beam scores summed from it would round to 8 or 11 bits; CUDA's
        autocast does the same, the CPU's would not)."""
        logits = self.generator(out)
        if precisions.is_low(logits.dtype):
            logits = logits.float()
        if logits.requires_grad:
            return F.log_softmax(logits, dim=-1)
        # without autograd (a search step, validation) the logits are this call's own - the
        # generator's fresh product or its float32 copy - so they are normalised where they
        # lie: one N x V tensor a step instead of two
        return torch.log_softmax(logits, dim=-1, out=logits)

    def nll(
        self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, encode: Encode | None = None
    ) -> Tensor:
        """Summed negative log-likelihood of the non-PAD target tokens."""
        return summed_nll(self.log_probs(self.forward(src, tgt_in, encode)), tgt_out)


def summed_nll(logp: Tensor, gold: Tensor) -> Tensor:
    """-sum of log p(gold) over the non-PAD positions: logp (..., V), gold (...). A gather and
    a sum, not aten's nll_loss, which has no deterministic CUDA kernel (it refuses to run
    under `torch.use_deterministic_algorithms`, the default of `train.deterministic`)."""
    picked = logp.gather(-1, gold.unsqueeze(-1)).squeeze(-1)
    return -picked.masked_fill(gold == PAD, 0.0).sum()


def build_model(
    model_cfg: ModelConfig,
    src_vocab: int,
    tgt_vocab: int,
    *,
    device: torch.device | str,
    dtype: torch.dtype,
) -> Seq2SeqAttn:
    """The one way to make a model. Its weights are drawn on the CPU in float32 and then
    moved, so one seed gives the same weights on every device and dtype; on `meta` it is
    built there (nothing is allocated, the weights are not drawn). Inside `private_rng` the
    modules are built on meta and only then drawn, from the private generator, so that
    their default initialisation does not draw from the global one either."""
    if torch.device(device).type == "meta":
        with torch.device("meta"):
            model = Seq2SeqAttn(model_cfg, src_vocab, tgt_vocab).to(dtype=dtype)
    elif PRIVATE_RNG.get() is None:
        model = Seq2SeqAttn(model_cfg, src_vocab, tgt_vocab).to(device=device, dtype=dtype)
    else:
        with torch.device("meta"):
            model = Seq2SeqAttn(model_cfg, src_vocab, tgt_vocab)
        model.to_empty(device="cpu")
        model.tie_weights()
        model.reset_parameters()
        model = model.to(device=device, dtype=dtype)
    model.tie_weights()
    return model


def weights_problem(weights: Any, cfg: ModelConfig, src_vocab: int, tgt_vocab: int) -> str | None:
    """Why `weights` are not a state dict of the model `cfg` builds for these vocabulary
    sizes (None: they are one): the first missing, unknown, non-float or misshapen entry, or
    mixed dtypes. Compared with the model built on meta, so nothing is allocated."""
    if not isinstance(weights, dict) or not weights:
        return "it holds no model weights"
    weights = dict(weights)
    _rename_legacy_keys(None, weights, "")
    expected = build_model(cfg, src_vocab, tgt_vocab, device="meta", dtype=torch.float32)
    wanted = expected.state_dict()
    if missing := [name for name in wanted if name not in weights]:
        return f"parameter {missing[0]} is missing"
    for name, value in weights.items():
        if name not in wanted:
            return f"it holds a parameter {name} that the model of its config does not have"
        if not isinstance(value, Tensor) or not value.is_floating_point():
            return f"parameter {name} is not a floating-point tensor"
        if value.shape != wanted[name].shape:
            return (
                f"parameter {name} has shape {tuple(value.shape)}, but its config and "
                f"vocabularies make {tuple(wanted[name].shape)}"
            )
    if len({value.dtype for value in weights.values()}) > 1:
        return "its parameters mix dtypes"
    return None


def check_weights(
    weights: Any, cfg: ModelConfig, src_vocab: int, tgt_vocab: int, where: object
) -> None:
    """`weights_problem` as one NmtError naming `where` (a checkpoint)."""
    if problem := weights_problem(weights, cfg, src_vocab, tgt_vocab):
        raise NmtError(
            f"{where}: the model weights do not match the checkpoint's config: {problem}"
        )


def _rename_legacy_keys(
    module: nn.Module | None, state_dict: dict, prefix: str, *_: object
) -> None:
    """Checkpoints from before `nmt.attention` name W_a and W_c `attn_in` / `attn_out`."""
    for old, new in LEGACY_NAMES.items():
        if prefix + old in state_dict and prefix + new not in state_dict:
            state_dict[prefix + new] = state_dict.pop(prefix + old)
