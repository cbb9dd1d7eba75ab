"""intdq encode/decode time against nf4dq and int8, one process, interleaved (thread CPU time, medians of 5):
    python bench/intdq_speed.py
on a 1024 x 4096 Student-t(2) bf16 matrix; ratios to nf4dq (its hand-written AVX-512 search; intdq is portable C)."""
import time, numpy as np
from orkpack import codecs
rng = np.random.default_rng(0)
x = (rng.standard_t(2, (1024, 4096)) * 0.02).astype(np.float32)
xbf = (x.view(np.uint32) >> 16).astype(np.uint16)
names = ["nf4dq", "int5dq", "int6dq", "int8dq", "int8"]
enc = {n: codecs.get_codec(n).encode(xbf) for n in names}
t = {n: [] for n in names}; d = {n: [] for n in names}
for _ in range(5):
    for n in names:
        c = codecs.get_codec(n)
        t0 = time.thread_time(); c.encode(xbf); t[n].append(time.thread_time() - t0)
        t0 = time.thread_time(); c.decode(enc[n].parts, x.shape, enc[n].layout); d[n].append(time.thread_time() - t0)
m = {n: float(np.median(v)) for n, v in t.items()}; md = {n: float(np.median(v)) for n, v in d.items()}
for n in names:
    print(f"{n:7s} encode {m[n]*1e3:8.1f} ms ({m[n]/m['nf4dq']:.2f}x nf4dq)  decode {md[n]*1e3:7.1f} ms ({md[n]/md['nf4dq']:.2f}x nf4dq)")
