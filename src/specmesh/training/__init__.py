"""The drafts' training recipe: the corpora and held-out split (corpus.py), co-training and distillation steps
(train.py), a draft distilled from a target of its own (distill.py, on self-generated instructions: instructions.py),
and the shipped drafters specialised by domain (drafters.py)."""
