#!/bin/bash
# the final side-by-side: old and new specialised drafters, baselines and ablations (40 mixed prompts)
cd /work/main && export PYTHONPATH=/work/main/src
N=runs/drafters2/models
python runs/cosine/side.py /tmp/mixed40.jsonl 40 "ar:method=ar" "sd:method=sd" \
  "tree-tests:method=tree;draft=specmesh-drafter-tests" "tree-lib:method=tree;draft=specmesh-drafter-lib" \
  "tree-tests-new:method=tree;draft=$N/tests" "tree-lib-new:method=tree;draft=$N/lib" \
  "context-alone:drafters=context-only" "cosine:" "cosine-new:drafters=$N/tests,$N/lib,context" \
  "new+general:drafters=specmesh-draft,$N/tests,$N/lib,context" \
  "new-no-routing:drafters=$N/tests,$N/lib,context;no_routing=true" \
  "new-no-fusion:drafters=$N/tests,$N/lib,context;no_fusion=true" \
  "new-no-scheduler:drafters=$N/tests,$N/lib,context;no_scheduler=true" \
  "new-no-adaptive:drafters=$N/tests,$N/lib,context;no_adaptive=true" \
  "new-no-context:drafters=$N/tests,$N/lib"
