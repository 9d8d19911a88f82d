"""Writes /tmp/profc/avx2.c: csrc/avx2.c with omp_get_wtime timers around block_forward's calls and prof_dump(n)
(prints each part's time per forward and resets). Build it as kernels/build.py does (gcc -O3 -mavx2 -mfma -shared
-fPIC avx2.c avx512.c -fopenmp, torch's libgomp), copy it into a directory under the name the current sources hash
to (2026-11-26-abdir.sh here: kernels.build names the library avx2-<sha256 of avx2.c + avx512.c>[:16].so) and run
2026-11-26-forward-parts.py with SPECMESH_CACHE pointing there."""
import pathlib, shutil

src = pathlib.Path(__file__).resolve().parents[2] / "src/specmesh/csrc"
out = pathlib.Path("/tmp/profc")
out.mkdir(exist_ok=True)
shutil.copy(src / "avx512.c", out)
s = (src / "avx2.c").read_text()


def rep(a: str, b: str) -> None:
    global s
    assert a in s, a[:60]
    s = s.replace(a, b)


rep("#include <string.h>", """#include <string.h>
#include <omp.h>
#include <stdio.h>
double PT[8]; const char *PN[8] = {"qkv_linear", "qkv_rest", "attend", "o", "norm_add", "gate_up", "swiglu", "down"};
void prof_dump(double n) { double t = 0; for (int i = 0; i < 8; i++) { t += PT[i]; printf("%-10s %.3f ms\\n", PN[i], PT[i] * 1e3 / n); PT[i] = 0; } printf("sum %.3f ms\\n", t * 1e3 / n); fflush(stdout); }
#define TIC double _t = omp_get_wtime();
#define TOC(i) { double _n = omp_get_wtime(); PT[i] += _n - _t; _t = _n; }
""")
rep("""    float *x = malloc(sizeof(float) * M * D);
    rms_norm(h, M, D, L->attn_norm, L->eps, x);
    linear(x, M, D, L->qkv, L->kind, L->qkv_s, Q, L->qkv_b, qkv);
    free(x);""", """    TIC
    float *x = malloc(sizeof(float) * M * D);
    rms_norm(h, M, D, L->attn_norm, L->eps, x);
    TOC(4)
    linear(x, M, D, L->qkv, L->kind, L->qkv_s, Q, L->qkv_b, qkv);
    free(x);
    TOC(0)""")
rep("""                memcpy((float *)vc + at, v, sizeof(float) * hd);
            }
        }
    }
}""", """                memcpy((float *)vc + at, v, sizeof(float) * hd);
            }
        }
    }
    TOC(1)
}""")
rep("    AttendHead head = attend_head_for(hd);", "    TIC\n    AttendHead head = attend_head_for(hd);")
rep("""                     att + (int64_t)b * T * H * hd, g, part * R / S, (part + 1) * R / S);
    free(qkv);""", """                     att + (int64_t)b * T * H * hd, g, part * R / S, (part + 1) * R / S);
    free(qkv);
    TOC(2)""")
rep("""    float *x = malloc(sizeof(float) * M * D), *act = malloc(sizeof(float) * M * I);
    linear(att, M, L->H * L->hd, L->o, L->kind, L->o_s, D, L->o_b, x);""", """    TIC
    float *x = malloc(sizeof(float) * M * D), *act = malloc(sizeof(float) * M * I);
    linear(att, M, L->H * L->hd, L->o, L->kind, L->o_s, D, L->o_b, x);
    TOC(3)""")
rep("""    rms_norm(h, M, D, L->mlp_norm, L->eps, x);
    if (L->glu)""", """    rms_norm(h, M, D, L->mlp_norm, L->eps, x);
    TOC(4)
    if (L->glu)""")
rep("""        linear(x, M, D, L->gate_up, L->kind, L->gate_up_s, 2 * I, L->gate_up_b, gu);
        swiglu(gu, M, I, act);""", """        linear(x, M, D, L->gate_up, L->kind, L->gate_up_s, 2 * I, L->gate_up_b, gu);
        TOC(5)
        swiglu(gu, M, I, act);
        TOC(6)""")
rep("""    linear(act, M, I, L->down, L->kind, L->down_s, D, L->down_b, x);
    if (L->reduce) L->reduce(x, M * D);                          // this rank's MLP columns' part -> the whole
    add(h, x, M * D);""", """    linear(act, M, I, L->down, L->kind, L->down_s, D, L->down_b, x);
    TOC(7)
    if (L->reduce) L->reduce(x, M * D);                          // this rank's MLP columns' part -> the whole
    add(h, x, M * D);
    TOC(4)""")
(out / "avx2.c").write_text(s)
print(out / "avx2.c")
