"""The clone executor, Torch7 style (seq2seq-attn's training engine).

node.py / nodes.py   nodes with persistent output / grad_input buffers and explicit backward
graph.py             a clone's graph: wiring, gradient accumulation, tracing for the planner
seq2seq.py           the encoder and decoder graphs built from a Seq2SeqAttn's parameters
generator.py         the uncloned generator + criterion, run per target position
clones.py            CloneExecutor: the clones and the BPTT step
planner.py           preallocation: which buffers all clones may share (by analysis)
accounting.py        the buffer inventory, also on the meta device
"""
