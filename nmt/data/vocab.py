"""Special tokens shared by every vocabulary, in seq2seq-attn's order (0-based here)."""

PAD, UNK, BOS, EOS = 0, 1, 2, 3
SPECIALS = ["<blank>", "<unk>", "<s>", "</s>"]
