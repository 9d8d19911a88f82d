"""Each traced call's count, total and median per rank (trace-site.py): python THIS.py."""
import json, glob, statistics as st, collections
files = sorted(glob.glob("/tmp/s16/trace-*.json"), key=lambda f: int(f.split("-")[-1].split(".")[0]))
for f in files:
    ev = json.load(open(f))
    # only the decode phase: events whose duration < 20 ms
    tot = collections.defaultdict(float); cnt = collections.Counter(); med = collections.defaultdict(list)
    t0, t1 = ev[0][1], ev[-1][2]
    for tag, a, b in ev:
        tot[tag] += b - a; cnt[tag] += 1; med[tag].append(b - a)
    span = t1 - t0
    print(f, f"span {span:.2f} s")
    for tag in tot:
        print(f"  {tag:9s} n={cnt[tag]:6d} total {tot[tag]:.3f} s ({100*tot[tag]/span:.0f}%), median {st.median(med[tag])*1e3:.3f} ms")
