"""Translation with a trained model.

options     SearchOptions: every decoding option, its flag, help and check from its field
search      one search loop (beam; greedy and sampling as a beam of one), on the device
translator  length-sorted batching, eval/inference mode
ensemble    several models decoding as one: their probabilities averaged
decoding    the checkpoint's translate: section, each value overridden by its flag
scoring     gold scoring: teacher-forced log-likelihood of references
unk         replace-unk and its phrase table
formats     n-best lines, attention JSON records, gold-score lines
metrics     sacreBLEU BLEU and chrF lines with signatures
run         `nmt translate`: TranslateOptions; source reader, Translator, writers
"""
