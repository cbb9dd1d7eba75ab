/* nf4dq_decode.c: ork_rt_nf4dq_decode of random nf4dq parts of 4096 x 4096 elements, one thread, wall time: into a
 * fresh buffer each run (mmap + madvise(MADV_HUGEPAGE), 16 bytes past a page, as numpy's np.empty of a large array
 * gives) and into one reused buffer; min and median of R runs, and a check hash of the output (the same for two
 * builds of kernels/ that decode alike). Two builds (main's kernels and a branch's) run interleaved:
 *
 *   gcc -O3 -ffp-contract=off -fno-math-errno -std=gnu11 -IKDIR bench/nf4dq_decode.c KDIR/runtime.c -o /tmp/dec_X -lm
 *   for r in 1 2; do for v in main branch; do /tmp/dec_$v 9; done; done
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "runtime.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static int cmpd(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
/* as np.empty of a large array: fresh pages, transparent huge pages asked for, 16 bytes past the start */
static float *fresh(size_t nbytes) {
    char *p = mmap(0, nbytes + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    madvise(p, nbytes + 4096, MADV_HUGEPAGE);
    return (float *)(p + 16);
}

int main(int argc, char **argv) {
    const int R = argc > 1 ? atoi(argv[1]) : 7;
    if (R < 1 || R > 64) return 2;
    const int64_t n = 4096LL * 4096, nb = n / 32, ng = (nb + 255) / 256;
    uint8_t *c = malloc(n / 2), *q = malloc(nb);
    float *s = malloc(ng * 4), *w = malloc(n * 4);
    if (!c || !q || !s || !w) return 2;
    srand(1);
    for (int64_t i = 0; i < n / 2; i++) c[i] = (uint8_t)rand();
    for (int64_t i = 0; i < nb; i++) q[i] = (uint8_t)rand();
    for (int64_t i = 0; i < ng; i++) s[i] = 0.5f + (rand() % 1000) / 1000.0f;
    memset(w, 0, n * 4);
    double tf[64], tw[64];
    uint64_t h = 0;
    for (int r = 0; r < R; r++) {
        const double t0 = now();
        float *o = fresh(n * 4);
        if (!o) return 2;
        ork_rt_nf4dq_decode(c, n / 2, q, nb, s, ng, 0.01f, 0, n, o);
        const double t1 = now();
        for (int64_t i = 0; i < n; i += 4099) {
            uint32_t u;
            memcpy(&u, &o[i], 4);
            h = h * 31 + u;
        }
        munmap((char *)o - 16, n * 4 + 4096);
        const double t2 = now();
        ork_rt_nf4dq_decode(c, n / 2, q, nb, s, ng, 0.01f, 0, n, w);
        const double t3 = now();
        tf[r] = t1 - t0;
        tw[r] = t3 - t2;
    }
    qsort(tf, R, 8, cmpd);
    qsort(tw, R, 8, cmpd);
    const double gb = n * 4 / 1e9;
    printf("fresh %.2f (median %.2f) GB/s   reused %.2f (median %.2f) GB/s   check %016llx\n", gb / tf[0],
           gb / tf[R / 2], gb / tw[0], gb / tw[R / 2], (unsigned long long)h);
    return 0;
}
