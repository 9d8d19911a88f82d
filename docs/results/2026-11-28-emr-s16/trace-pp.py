"""pp: one token's parts from the two ranks' traces (trace-site.py), medians: python THIS.py."""
import json, glob, statistics as st, bisect, sys
files = sorted(glob.glob("/tmp/s16/trace-*.json"), key=lambda f: int(f.split("-")[-1].split(".")[0]))
r0, r1 = [json.load(open(f)) for f in files]
# rank 0 events: fwd, send_on, recv (token: the recv that is not inside send_on)
f0 = [e for e in r0 if e[0] == "fwd"]; so = [e for e in r0 if e[0] == "send_on"]
rv0 = [e for e in r0 if e[0] == "recv"]
rc1 = [e for e in r1 if e[0] == "receive"]; f1 = [e for e in r1 if e[0] == "fwd"]; s1 = [e for e in r1 if e[0] == "send"]
rc1_end = [e[2] for e in rc1]; f1_start = [e[1] for e in f1]; s1_start = [e[1] for e in s1]; rv0_end = [e[2] for e in rv0]
f0_start = [e[1] for e in f0]
rows = []
for (fa, fb) in [(e[1], e[2]) for e in f0]:
    i = bisect.bisect_left([s[1] for s in so], fb)
    if i >= len(so): break
    sa, sb = so[i][1], so[i][2]
    j = bisect.bisect_left(rc1_end, sb)
    if j >= len(rc1): break
    k = bisect.bisect_left(f1_start, rc1_end[j]);  m = bisect.bisect_left(s1_start, f1[k][2]) if k < len(f1) else None
    if k >= len(f1) or m is None or m >= len(s1): break
    n = bisect.bisect_left(rv0_end, s1[m][2]);
    if n >= len(rv0): break
    q = bisect.bisect_left(f0_start, rv0[n][2])
    if q >= len(f0): break
    rows.append(dict(fwd0=fb - fa, gap0=sa - fb, send_on=sb - sa, hop1=rc1_end[j] - sb, pre1=f1[k][1] - rc1_end[j],
                     fwd1=f1[k][2] - f1[k][1], sample1=s1[m][1] - f1[k][2], send1=s1[m][2] - s1[m][1],
                     hop2=rv0[n][2] - s1[m][2], loop0=f0[q][1] - rv0[n][2], total=f0[q][1] - fa))
rows = [r for r in rows if r["total"] < 0.01]
print(len(rows), "tokens")
for key in rows[0]:
    v = [r[key] * 1e3 for r in rows]
    print(f"{key:8s} median {st.median(v):.3f} ms  mean {st.mean(v):.3f}")
