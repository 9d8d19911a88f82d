#!/usr/bin/env bash
# The open performance targets of issues 20 and 23, measured in one go on whatever CPU this is (8.5 minutes
# on 2 Zen 4 cores with 30 prompts on 2026-11-28; nothing else should run meanwhile).
# Usage, from the repository root, after the install:
#   bash docs/results/cpu-kind-check.sh [OUT_DIR] [PROMPTS]
# OUT_DIR (default: runs/cpu-kind-DATE) gets one file per check; PROMPTS (default 30) is the bench's prompt count
# (the multi-process bench takes at most 20, cosine's side-by-side twice as many, at most 40: the issues' sets).
# Each figure is a ratio within one run: compare nothing across runs of this VM-speed-drifting machine.
set -euo pipefail
out=${1:-runs/cpu-kind-$(date +%Y-%m-%d)}
n=${2:-30}
multi=$(( n < 20 ? n : 20 ))
mixed=$(( 2 * n < 40 ? 2 * n : 40 ))
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)

echo "== CPU" | tee "$out/cpu.txt"
python -c "from specmesh.kernels import cpu_model; print(cpu_model())" | tee -a "$out/cpu.txt"
git log --oneline -1 | tee -a "$out/cpu.txt"

echo "== the target's forward by width over 128 and 400 cached tokens (issue 20: 8 rows <= 1.5x, 16 <= 2.5x one)"
for ctx in 128 400; do
    echo "over $ctx cached tokens: $(python "$here/2026-11-27-zen4-width.py" models/target $ctx)" | tee -a "$out/width.txt"
done

echo "== single-process methods and llama.cpp (issue 20: sd >= 1.7x ar, tree >= 1.1x sd, selfdraft >= 1.4x ar,"
echo "   best >= 1.3x llama.cpp's best, ar >= 1.0x llama.cpp, auto within 5% of the best)"
python -m specmesh.bench.llamacpp build > "$out/llamacpp-build.txt" 2>&1 || echo "llama.cpp did not build: see $out/llamacpp-build.txt"
specmesh bench --target embedded --dtype bfloat16 --limit "$n" \
    --methods ar,sd,tree,selfdraft,auto,llama.cpp,llama.cpp-spec,llama.cpp-lookup --json "$out/bench.json" \
    | tee "$out/bench.txt"
python -m specmesh.bench.report "$out/bench.json" sd/ar tree/sd selfdraft/ar auto/sd | tee -a "$out/bench.txt"

echo "== multi-process methods, default settings (issue 20: pp >= 0.8x ar, pipedec >= 1.15x pp, pearl >= 1.15x sd@1t)"
specmesh bench --target embedded --dtype bfloat16 --limit "$multi" --methods ar,sd@1t,pearl,pp,pipedec \
    --json "$out/multiprocess.json" | tee "$out/multiprocess.txt"
python -m specmesh.bench.report "$out/multiprocess.json" pp/ar pipedec/pp pearl/sd@1t | tee -a "$out/multiprocess.txt"

echo "== cosine at one client (issue 23: time per output token <= 0.9x sd's), $mixed mixed-domain prompts"
python - "$out/mixed40.jsonl" <<'EOF'
import sys
tests = open("prompts/tests-heldout.jsonl").readlines()[:20]
lib = open("prompts/lib-heldout.jsonl").readlines()[:20]
open(sys.argv[1], "w").writelines(line for pair in zip(tests, lib) for line in pair)
EOF
cp "$here/2026-11-26-cosine-side2.py" "$out/cosine-side.py"      # it writes its JSON next to itself
python "$out/cosine-side.py" "$out/mixed40.jsonl" "$mixed" 'sd:method=sd' 'cosine:' | tee "$out/cosine.txt"

echo "done: $out"
