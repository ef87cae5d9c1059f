"""The clone executor, Torch7 style (seq2seq-attn's training engine).

spec.py              ExecutorSpec: what an executor is built for (model, lengths, batch, policy)
graph.py             a clone's graph: wiring, gradient accumulation, tracing for the planner
seq2seq.py           the encoder and decoder graphs built from a Seq2SeqAttn's parameters
generator.py         the uncloned generator + criterion, run per target position (OutputLoss:
                     the fused output layer and loss)
weights.py           the weights the clones compute with: a mixed precision's copy, a cell's
                     weights in its kernel's gate order
records.py           BufferRecord: one buffer the executor holds
sharing.py           SharingPlan: which (node, role) buffers all clones share
clones.py            CloneExecutor: the clones and the BPTT step, sharing as its plan says
planner.py           preallocation: finds the plan by analysing a probe executor (above clones)
accounting.py        the buffer inventory, also on the meta device (above clones, planner)
meta.py              meta-device accounting: each op's meta kernel run once per signature

The nodes the graphs are made of live in nmt/nodes/ (node.py: the contract; modules.py:
nngraph's; fused.py: the fused granularity's).
"""
