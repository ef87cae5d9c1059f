"""The encoder through torch's RNN kernel - what `torch.nn.LSTM` / `torch.nn.GRU` run: cuDNN
on a GPU, oneDNN on the CPU in float32 - with the model's own parameters
(`train.autograd_encoder: kernel`).

The fast autograd baseline a PyTorch user would write: one kernel call over the whole source
instead of one cell per position. The weights are those of the model's cells
(`nmt.cells`): i2h -> weight_ih and bias_ih, h2h -> weight_hh, a zero bias_hh, the gate rows
reordered from the cell's order to the kernel's (`RecurrentLayer.KERNEL_GATES`), all copied
into one flat buffer per call in nn.LSTM's / nn.GRU's layout (cuDNN takes it as is);
gradients flow back through the copy into the same parameters. The cell's `kernel` makes the
call.

Dropout: the kernel would draw its own inter-layer masks, all at once, which no other
executor could reproduce. So with dropout each layer is one kernel call, and the input of
every layer above the first (and the embeddings, with `model.embedding_dropout`) is
multiplied by the masks the cells would have drawn - the same draws from the same generator
in the same order (`nmt.kernels.dropout_masks`), so the decoder's masks after them are the
same too. The loss and gradients equal the cells' to rounding, dropout on or off (float64:
1e-10 against the clone executor). Without dropout between layers all layers run in one call.

Mixed precision (`compute`): the input, the initial state and the flat weights are cast to
the compute dtype before each call - what autocast would do for the kernel, done first, so
that torch picks the kernel by the dtype that runs. Left to the CPU's autocast, torch picks
oneDNN's LSTM by the float32 input and casts inside it, and on a CPU without float16 units
(no `avx512_fp16`) that primitive fails to build; the GRU kernel it leaves in float32.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from nmt.cells import RecurrentLayer, State
from nmt.kernels import dropout_masks
from nmt.model import RNNStack, Seq2SeqAttn

# cuDNN warns when the weights are not one nn.LSTM-style buffer; ours are built as one, and
# where its layout differed it would compact them (a copy we make anyway) - not the user's doing
NOT_FLAT = "RNN module weights are not part of single contiguous chunk of memory"


class KernelEncoder:
    """`Seq2SeqAttn.encode` for training batches (one source length, no mask) on the RNN
    kernel of the model's cell; pass it as `model.nll(..., encode=KernelEncoder(model))`."""

    def __init__(self, model: Seq2SeqAttn, compute: torch.dtype | None = None):
        self.model = model
        self.compute = compute  # the kernel's dtype under mixed precision (None: the model's)
        self._rows: dict[torch.device, Tensor] = {}
        self._zero_bias: dict[tuple[torch.device, torch.dtype], Tensor] = {}

    def __call__(self, src: Tensor) -> tuple[Tensor, list[State]]:
        m = self.model
        emb = m.src_embedding(src.t())  # S x B x E: the kernel's time-major layout
        with warnings.catch_warnings():
            if emb.is_cuda:
                warnings.filterwarnings("ignore", message=NOT_FLAT)
            tops, final = self._run(m.encoder, emb)
            if m.encoder_bwd is not None:  # over the reversed source, as the cells run it
                tops_b, final_b = self._run(m.encoder_bwd, emb.flip(0))
                tops = tops + tops_b.flip(0)
                final = [
                    tuple(t + tb for t, tb in zip(s, sb, strict=True))
                    for s, sb in zip(final, final_b, strict=True)
                ]
        return tops.transpose(0, 1).contiguous(), final

    def _run(self, stack: RNNStack, x: Tensor) -> tuple[Tensor, list[State]]:
        """x: S x B x E -> top layer's h at every position S x B x H, final state per layer."""
        layers, S, B = list(stack.layers), x.size(0), x.size(1)
        H, cell = self.model.cfg.rnn_size, stack.cell
        train = torch.is_grad_enabled()  # cuDNN keeps what its backward needs only if asked
        p_emb = self.model.cfg.embedding_dropout if stack.training else 0.0
        between = stack.training and stack.dropout > 0 and len(layers) > 1
        # the masks the cells draw, position by position: the embeddings', then every layer's
        # above the first
        kinds = [((B, x.size(2)), p_emb)] if p_emb > 0 else []
        kinds += [((B, H), stack.dropout)] * (len(layers) - 1) if between else []
        masks = dropout_masks(S, kinds, x) if kinds else []  # each S x B x (E or H)
        if p_emb > 0:
            x = x * masks.pop(0)
        dtype = self.compute or x.dtype
        if not between:
            zeros = x.new_zeros(len(layers), B, H, dtype=dtype)
            return cell.kernel(x.to(dtype), zeros, self._weights(layers), len(layers), train)
        zeros = x.new_zeros(1, B, H, dtype=dtype)
        final: list[State] = []
        for idx, layer in enumerate(layers):
            if idx > 0:
                x = x * masks[idx - 1]
            x, (state,) = cell.kernel(x.to(dtype), zeros, self._weights([layer]), 1, train)
            final.append(state)
        return x, final

    def _weights(self, layers: list[RecurrentLayer]) -> list[Tensor]:
        """weight_ih, weight_hh, bias_ih, bias_hh of each layer, views of one flat buffer."""
        rows = self._gate_rows(layers[0])
        tensors = []
        for layer in layers:
            tensors += [
                layer.i2h.weight.index_select(0, rows),
                layer.h2h.weight.index_select(0, rows),
                layer.i2h.bias.index_select(0, rows),
                self._bias_hh(layer.i2h.bias),
            ]
        flat = torch.cat([t.reshape(-1) for t in tensors])
        if self.compute is not None:
            flat = flat.to(self.compute)
        views, offset = [], 0
        for t in tensors:
            views.append(flat[offset : offset + t.numel()].view(t.shape))
            offset += t.numel()
        return views

    def _gate_rows(self, layer: RecurrentLayer) -> Tensor:
        """The cell's gate rows in the kernel's order, made on the weights' device: a copy
        from the host would be a synchronisation (of the first step) on a GPU."""
        w_hh = layer.h2h.weight
        if w_hh.device not in self._rows:
            H, dev = w_hh.size(1), w_hh.device
            blocks = [torch.arange(g * H, (g + 1) * H, device=dev) for g in layer.KERNEL_GATES]
            self._rows[dev] = torch.cat(blocks)
        return self._rows[w_hh.device]

    def _bias_hh(self, b_ih: Tensor) -> Tensor:
        key = (b_ih.device, b_ih.dtype)
        if key not in self._zero_bias:
            self._zero_bias[key] = torch.zeros_like(b_ih, requires_grad=False)
        return self._zero_bias[key]
