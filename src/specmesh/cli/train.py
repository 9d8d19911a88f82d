"""train and ngram: the drafts' recipe and selfdraft's n-gram caches."""
from __future__ import annotations

import sys
from pathlib import Path

from specmesh.cli.args import Parser, out_path
from specmesh.options import positive_int


def add(sub) -> None:
    n = sub.add_parser("ngram", help="n-gram caches for selfdraft")
    nsub = n.add_subparsers(dest="ngram_command", required=True, parser_class=Parser)
    nb = nsub.add_parser("build", help="count n-grams over a corpus into a corpus cache (.npz)")
    nb.add_argument("--corpus", required=True, metavar="DIR", help="folder of text files (*.py, *.txt, *.md)")
    nb.add_argument("--out", required=True, metavar="FILE", type=out_path, help="the cache file to write (.npz)")
    nb.add_argument("--tokenizer", metavar="MODEL", help="the model whose tokenizer counts the n-grams, as --target "
                    "(default: the default target, smollm2-135m-instruct); the cache serves only models with it")
    nb.add_argument("--gram", type=positive_int, default=4, help="n-gram size G: continuations of G-1 tokens")
    nb.add_argument("--skip-heldout", action="store_true",
                    help="the embedded models' training split: .py files outside the stdlib held-out rule")

    t = sub.add_parser("train", help="train the embedded tokenizer, target and draft (the shipped recipe), or with "
                       "--teacher a draft for that model")
    t.add_argument("--specialise", choices=["tests", "lib"], metavar="DOMAIN",
                   help="a cosine drafter: the embedded draft distilled further on one domain of the standard library, "
                        "tests or lib, into models/drafters/DOMAIN (about 16 minutes on 2 cores; docs/cosine.md)")
    t.add_argument("--teacher", metavar="MODEL", help="distill a draft for this target (a name, folder or GGUF): "
                   "its answers to generated instructions and standard-library code (docs/models.md)")
    t.add_argument("--steps", type=positive_int, default=1600, help="with --teacher: distillation steps (default: 1600, "
                   "about 70 minutes on 2 cores, after about 35 minutes of the teacher answering and continuing code)")
    t.add_argument("--lr", type=float, default=2e-3, help="with --teacher: peak learning rate (default: 2e-3; the "
                   "shipped draft went on from --init at 1e-3)")
    t.add_argument("--init", metavar="DIR", help="with --teacher or --specialise: go on distilling this draft (a "
                   "folder) instead of a fresh one (--teacher) or the general draft (--specialise)")
    t.add_argument("--work", default=None, help="scratch folder: corpus, checkpoints (default: runs/train, or "
                   "runs/distill with --teacher)")
    t.add_argument("--out", default=None, help="where the finished models go (default: models, or "
                   "models/smollm2-draft with --teacher)")
    t.add_argument("--tokens", type=positive_int, default=6_000_000, help="co-training tokens (default: 6M)")
    t.add_argument("--distill-tokens", type=positive_int, default=4_000_000,
                   help="draft-only distillation tokens after co-training (default: 4M)")
    t.add_argument("--resume-from", metavar="DIR",
                   help="models folder (target/, draft/) of a finished co-training: run only the distillation")
    t.add_argument("--threads", type=positive_int, default=None)


def cmd_ngram(args, parser) -> int:
    from specmesh.proposers.ngram import build_corpus_cache, read_corpus
    from specmesh.model.loader import load_tokenizer
    from specmesh import catalog
    tokenizer = load_tokenizer(catalog.resolve(args.tokenizer))
    docs = read_corpus(Path(args.corpus), tokenizer, skip_heldout=args.skip_heldout)
    cache = build_corpus_cache(docs, cont_len=args.gram - 1)
    cache.tokenizer = tokenizer.fingerprint
    cache.save(args.out)
    print(f"{args.out}: {sum(len(p) for p, _ in cache.tables.values())} prefixes, "
          f"{Path(args.out).stat().st_size / 1e6:.1f} MB", file=sys.stderr)
    return 0


def cmd_train(args, parser) -> int:
    if args.specialise:
        from specmesh.training.drafters import specialise
        specialise(args.specialise, out=args.out or "models/drafters", work=args.work or "runs/drafters", init=args.init)
        return 0
    if args.teacher:
        from specmesh.training.distill import DistillConfig, run as distill
        distill(DistillConfig(teacher=args.teacher, out=args.out or "models/smollm2-draft",
                              work=args.work or "runs/distill", steps=args.steps, threads=args.threads or 0,
                              init=args.init or "", lr=args.lr))
        return 0
    from specmesh.training.train import TrainConfig, run
    run(TrainConfig(work=args.work or "runs/train", out=args.out or "models", tokens=args.tokens,
                    distill_tokens=args.distill_tokens, resume_from=args.resume_from or "", threads=args.threads or 0))
    return 0
