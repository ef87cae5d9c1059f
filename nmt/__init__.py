"""nmt: an LSTM-attention translation trainer that reproduces seq2seq-attn's clone executor
and its memory preallocation."""

__version__ = "0.1.0"
