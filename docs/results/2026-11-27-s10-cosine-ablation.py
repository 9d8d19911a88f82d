"""cosine's ablations as in 2026-11-26-cosine-ablation.py (that harness, imported), with the rows of the tenth session
of 2026-11-27: the lookup's guess rounds off, and the rounds before them.
usage: python THIS.py PROMPTS.jsonl N {client|cluster}"""
import importlib.util
import sys
from pathlib import Path

spec = importlib.util.spec_from_file_location("ablation", Path(__file__).with_name("2026-11-26-cosine-ablation.py"))
ablation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ablation)
ablation.ABLATIONS += [("--guess-budget 0", {"guess_budget": 0}),
                       ("--solo-budget 16 --guess-budget 0 (before)", {"solo_budget": 16, "guess_budget": 0})]
ablation.main(sys.argv)
