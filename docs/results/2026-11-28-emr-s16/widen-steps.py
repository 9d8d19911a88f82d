"""Writes steps.h for widen-ab.c: one k pair (two halves) of a 6-row x 4-block FMA step in assembly, the weights
widened three ways: 0 shift + and (fma512_linear's), 1 a masked word load for the odd half, 2 masked word loads
for both halves (the even half read 2 bytes early)."""
rows = ["(%[x])", "(%[x],%[s],1)", "(%[x],%[s],2)", "(%[y])", "(%[x],%[s],4)", "(%[y],%[s],2)"]
wts = ["(%[w])", "(%[w],%[n],1)", "(%[w],%[n],2)", "(%[v])"]
def half(odd, mode):
    s = []
    for c, wa in enumerate(wts):
        if mode == 0:
            s.append(f"vpandd {wa}, %%zmm28, %%zmm{24+c}" if odd else f"vpslld $16, {wa}, %%zmm{24+c}")
        elif mode == 1:
            s.append(f"vmovdqu16 {wa}, %%zmm{24+c}%{{%%k1%}}%{{z%}}" if odd else f"vpslld $16, {wa}, %%zmm{24+c}")
        else:
            s.append(f"vmovdqu16 {'' if odd else '-2'}{wa}, %%zmm{24+c}%{{%%k1%}}%{{z%}}")
    for i, xa in enumerate(rows):
        b = 29 + i % 3
        s.append(f"vbroadcastss {'4' if odd else ''}{xa}, %%zmm{b}")
        s += [f"vfmadd231ps %%zmm{b}, %%zmm{24+c}, %%zmm{4*i+c}" for c in range(4)]
    return s
open("steps.h", "w").write("\n".join(f"#define STEP{m} " + " ".join(f'"{l}\\n\\t"' for l in half(0, m) + half(1, m))
                                     for m in range(3)) + "\n")
