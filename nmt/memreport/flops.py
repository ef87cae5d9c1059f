"""The FLOPs of a training step, and what recomputing clones adds to them.

Counted as multiply-adds of the forward at maximum lengths (the cells', the attention's and
the generator's products; elementwise work left out), 2 FLOP each, x3 for forward and
backward. A clone that recomputes runs its forward once more; the generator never does.
"""

from __future__ import annotations

from nmt import attention, cells, policies
from nmt.memreport.measure import Setting


def position_macs(s: Setting) -> tuple[int, int]:
    """Multiply-adds of one sentence's forward at one position: (a source position, both
    directions when bidirectional; a target position, its attention included)."""
    m = s.model
    H, E, L = m.rnn_size, m.word_vec_size, m.num_layers
    cell = cells.get(m.rnn_type)

    def stack(inp: int) -> int:  # multiply-adds of one position of a recurrent stack
        return cell.macs(inp, H) + (L - 1) * cell.macs(H, H)

    enc = stack(E) * (2 if m.bidirectional else 1)
    dec = stack(E + H if m.input_feed else E) + attention.get(m.attention).macs(H, s.encoder_clones)
    return enc, dec


def forward_macs(s: Setting) -> tuple[int, int]:
    """Multiply-adds of one forward at maximum lengths: (every clone, the generator)."""
    enc, dec = position_macs(s)
    clones = s.batch_size * (s.encoder_clones * enc + s.decoder_clones * dec)
    return clones, s.batch_size * s.decoder_clones * s.model.rnn_size * s.tgt_vocab


def step_gflop(s: Setting) -> float:
    """Rough cost of one training step: 2 FLOP per multiply-add, x3 for forward + backward."""
    return 6 * sum(forward_macs(s)) / 1e9


def recomputed(s: Setting, policy: str) -> tuple[int, int]:
    """The source and target positions whose clones recompute under row `policy`: all of
    them under a policy that recomputes; under another registered one, the spec's partial
    recompute (`ExecutorSpec.recompute_encoder` / `recompute_decoder`); none for autograd."""
    if policy not in policies.REGISTRY:
        return 0, 0
    if policies.get(policy).recompute:
        return s.encoder_clones, s.decoder_clones
    spec = s.spec
    return min(spec.recompute_encoder, s.encoder_clones), min(
        spec.recompute_decoder, s.decoder_clones
    )


def recompute_fraction(s: Setting, encoder: int, decoder: int) -> float:
    """FLOPs the clones of `encoder` source and `decoder` target positions add to a step by
    running their forward once more, as a fraction of the step (`step_gflop`)."""
    enc, dec = position_macs(s)
    clones, generator = forward_macs(s)
    return 2 * s.batch_size * (encoder * enc + decoder * dec) / (6 * (clones + generator))


def extra_flop_fraction(s: Setting, policy: str) -> float:
    """FLOPs a row adds to a training step, as a fraction of the step (`step_gflop`): a
    policy that recomputes runs every clone's forward once more (not the generator's), a
    partial recompute its recomputing clones' (`recomputed`)."""
    return recompute_fraction(s, *recomputed(s, policy))
