"""Reads the timestamps that 2026-11-27-s8-pp-timeline.patch makes pp write (PPT=/tmp/s8/ppt: ppt.r0, ppt.r1, one
line per 150 tokens; the first line, the warm-up, is skipped) and prints the median of each part of a token."""
import sys

import numpy as np

PREFIX = sys.argv[1] if len(sys.argv) > 1 else "/tmp/s8/ppt"
r0 = [np.array(l.split(), dtype=np.int64).reshape(-1, 4) for l in open(PREFIX + ".r0")]
r1 = [np.array(l.split(), dtype=np.int64).reshape(-1, 4) for l in open(PREFIX + ".r1")]
# pair lines: skip first (warmup), align r0 rows with r1 rows by time
A = np.concatenate(r0[1:]); B = np.concatenate(r1[1:])
# for each r0 row i: forward A1-A0, send A2-A1, r1 row j with B0 > A2 nearest
j = np.searchsorted(B[:, 0], A[:, 2])
ok = j < len(B)
A, B = A[ok], B[j[ok]]
ok = B[:, 3] < A[:, 3]
A, B = A[ok], B[ok]
us = lambda x: np.median(x) / 1e3
nxt = A[1:, 0] - A[:-1, 3]
print("n", len(A))
print("r0 forward      %.0f us" % us(A[:, 1] - A[:, 0]))
print("r0 send         %.0f" % us(A[:, 2] - A[:, 1]))
print("hop r0->r1      %.0f" % us(B[:, 0] - A[:, 2]))
print("r1 forward      %.0f" % us(B[:, 1] - B[:, 0]))
print("r1 sample       %.0f" % us(B[:, 2] - B[:, 1]))
print("r1 send         %.0f" % us(B[:, 3] - B[:, 2]))
print("hop r1->r0      %.0f" % us(A[:, 3] - B[:, 3]))
print("r0 loop gap     %.0f" % us(nxt))
print("total per token %.0f" % us(A[1:, 0] - A[:-1, 0]))
