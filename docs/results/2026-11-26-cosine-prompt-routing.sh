#!/bin/bash
# the prompt's routing with the final defaults, side by side on the 40 mixed-domain prompts
cd /work/main
(head -20 prompts/tests-heldout.jsonl; head -20 prompts/lib-heldout.jsonl) > /tmp/mixed40.jsonl
python docs/results/2026-11-26-cosine-side2.py /tmp/mixed40.jsonl 40 "ar:method=ar" "sd:method=sd" "tree-tests:method=tree;draft=specmesh-drafter-tests" \
  "tree-lib:method=tree;draft=specmesh-drafter-lib" "cosine:" "cosine-w64:draft_window=64" \
  "cosine-before:PROMPT_GAP=0;ETA=0.5;draft_window=64;explore_below=2" > /tmp/final4-mixed40.log 2>&1
cp docs/results/2026-11-26-cosine-side2.py.json /tmp/final4-mixed40.json
