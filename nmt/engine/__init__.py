"""The clone executor, Torch7 style (seq2seq-attn's training engine).

node.py / nodes.py   nodes with persistent output / grad_input buffers and explicit backward
fused.py             the fused granularity's larger nodes (LSTM cell, attention, dropout, loss)
graph.py             a clone's graph: wiring, gradient accumulation, tracing for the planner
seq2seq.py           the encoder and decoder graphs built from a Seq2SeqAttn's parameters
generator.py         the uncloned generator + criterion, run per target position
records.py           BufferRecord: one buffer the executor holds
sharing.py           SharingPlan: which (node, role) buffers all clones share
clones.py            CloneExecutor: the clones and the BPTT step, sharing as its plan says
planner.py           preallocation: finds the plan by analysing a probe executor (above clones)
accounting.py        the buffer inventory, also on the meta device (above clones, planner)
"""
