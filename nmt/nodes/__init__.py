"""The node types clone graphs are made of, Torch7 `nn` style (seq2seq-attn's engine).

node.py     the Node contract: persistent buffers by role, forward / backward, and the facts
            the planner needs (what backward reads, which buffers are scratch)
modules.py  Torch7's nn modules as nodes (Linear, Sigmoid, CMul, MMScores, Dropout, ...): what
            a layer's nngraph form (`RecurrentLayer.wire`, `Attention.wire`) is wired from
fused.py    a layer's own fused form as one node (`FusedLayer`), and the fused dropout

A layer needing a node type that is not here adds it to modules.py; the graphs, the planner
and the accounting take any node that states its facts.
"""
