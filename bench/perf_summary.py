"""Sum a `perf record -g` profile of one `orkpack build` into where the CPU time went (issue 14).

    perf record -F 1999 -g -o build.data taskset -c 0 python -m orkpack build MODEL -o OUT --threads 1
    python bench/perf_summary.py build.data

Prints the sampled CPU time (cpu-clock) split by where it was spent: the kernel, the C
encode kernels, the Python interpreter (start-up, imports, the tier-map plan) and xxhash;
then the kernel's share by entry point (children time of the kernel function): page faults
(fresh pages the kernel zeroes), write()/pwrite() of the pack, preadv() and read() of the
source, mmap() (MAP_POPULATE maps the source pages), munmap(), fsync(). Needs `perf`.
"""
from __future__ import annotations

import re
import subprocess
import sys

CATEGORIES = [
    ("page faults (fresh pages zeroed)", ["asm_exc_page_fault"]),
    ("write()/pwrite() of the pack", ["ksys_write", "__x64_sys_pwrite64"]),
    ("preadv() of the source", ["do_preadv"]),
    ("read() (source hashing)", ["ksys_read"]),
    ("mmap() incl. MAP_POPULATE", ["vm_mmap_pgoff"]),
    ("munmap()", ["__x64_sys_munmap"]),
    ("fsync()", ["__x64_sys_fsync"]),
]


def report(data: str, args: list[str]) -> str:
    return subprocess.run(["perf", "report", "-i", data, "--stdio", "-g", "none", *args],
                          capture_output=True, text=True, check=True).stdout


def main(data: str) -> None:
    by_dso = report(data, ["--no-children", "--sort", "dso"])
    cpu = int(re.search(r"Event count \(approx.\): (\d+)", by_dso).group(1)) / 1e9
    dso: dict[str, float] = {}
    for line in by_dso.splitlines():
        m = re.match(r"\s+([\d.]+)%\s+(\S+)", line)
        if m:
            dso[m.group(2)] = float(m.group(1))
    children: dict[str, float] = {}
    for line in report(data, ["--children", "--sort", "sym"]).splitlines():
        m = re.match(r"\s+([\d.]+)%\s+([\d.]+)%\s+\[k\]\s+(\S+)", line)
        if m:
            children.setdefault(m.group(3), float(m.group(1)))
    print(f"CPU time sampled (cpu-clock): {cpu:.2f} s")
    groups = [("kernel (all)", ["[kernel.kallsyms]"]), ("C kernels (encode)", [k for k in dso if k.startswith("_kernels.")]),  # abi3 or cpython-3XX
              ("python (interpreter, imports, plan)", [k for k in dso if k.startswith("libpython")]),
              ("xxhash", [k for k in dso if "xxhash" in k])]
    for name, keys in groups:
        p = sum(dso.get(k, 0.0) for k in keys)
        print(f"  {name:40s} {p * cpu / 100:5.2f} s  {p:5.1f}%")
    for name, keys in CATEGORIES:
        p = max(children.get(k, 0.0) for k in keys)
        print(f"    kernel: {name:32s} {p * cpu / 100:5.2f} s  {p:5.1f}%")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
