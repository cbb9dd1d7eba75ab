/* nf4dq_cpu.c: the nf4dq encoder's three steps (and the opt encoder) on one bf16 4096 x 4096 input, one thread,
 * timed in thread CPU time (min over repeats), with a hash of every output byte and the SQNR sums, so that two
 * builds of kernels/ (main and a branch) are compared in one interleaved run and shown to give the same bytes.
 *
 *   python -c "import sys; sys.path.insert(0, 'bench'); import numpy as np; from bench_codecs import make_input; \
 *       x = make_input(4096, 4096); ((x.view(np.uint32) >> 16).astype(np.uint16)).tofile('/tmp/in.bf16'); \
 *       np.random.default_rng(1).gamma(1.0, 1.0, 4096).astype(np.float32).tofile('/tmp/cw.f32')"
 *   gcc -O3 -ffp-contract=off -fno-math-errno -std=c11 -Ikernels bench/nf4dq_cpu.c kernels/codecs.c kernels/nf4opt.c \
 *       -o /tmp/nf4dq_cpu -lm -lpthread
 *   /tmp/nf4dq_cpu ISA REPEATS [COLW WEIGHTING [nf4dq-only]]    # ISA 2 avx512, 1 avx2, 0 portable
 * Inputs: ORK_BENCH_IN (default /tmp/in.bf16) and ORK_BENCH_CW (default /tmp/cw.f32). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "codecs.h"
#include "nf4opt.h"
static double now(void){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static uint64_t fnv(const void*p,size_t n,uint64_t h){const uint8_t*b=p;for(size_t i=0;i<n;i++){h^=b[i];h*=1099511628211ull;}return h;}
int main(int argc,char**argv){
  int isa=argc>1?atoi(argv[1]):-1; int reps=argc>2?atoi(argv[2]):5; int usecw=argc>3?atoi(argv[3]):0; int wt=argc>4?atoi(argv[4]):0;
  int64_t n=4096LL*4096, k=4096; uint16_t*x=malloc(n*2); const char*pin=getenv("ORK_BENCH_IN"),*pcw=getenv("ORK_BENCH_CW"); FILE*f=fopen(pin?pin:"/tmp/in.bf16","rb"); if(!f){perror("input");return 2;} fread(x,2,n,f); fclose(f);
  float*cw=malloc(k*4); f=fopen(pcw?pcw:"/tmp/cw.f32","rb"); if(!f){perror("column weights");return 2;} fread(cw,4,k,f); fclose(f);
  ork_codecs_set_isa(isa); printf("isa %d level %d\n",ork_codecs_isa(),ork_nf4opt_level());
  int64_t nb=n/32, ng=(nb+255)/256; float*d=malloc(nb*4),*sc=malloc(ng*4),off; uint8_t*codes=malloc(n/2),*q=malloc(nb);
  double t1=1e9,t2=1e9,t3=1e9, t4=1e9; uint64_t h=0; ork_codec_stats st; double sx=0,se=0;
  const int64_t CH=4096; /* NF4_CHUNK_BLOCKS-like */
  for(int r=0;r<reps;r++){
    double a=now();
    for(int64_t b=0;b<nb;b+=CH) ork_nf4opt_encode(x,2,n,k,usecw?cw:0,wt,32,1,b,b+CH<nb?b+CH:nb,0,d,0);
    double b_=now(); ork_nf4dq_scales(d,nb,sc,&off); double c=now();
    sx=se=0;
    for(int64_t b=0;b<nb;b+=CH){ork_nf4dq_encode(x,2,n,k,usecw?cw:0,wt,d,sc,off,b,b+CH<nb?b+CH:nb,codes,q,&st); sx+=st.sum_x2; se+=st.sum_err2;}
    double e=now();
    if(b_-a<t1)t1=b_-a; if(c-b_<t2)t2=c-b_; if(e-c<t3)t3=e-c; if(e-a<t4)t4=e-a;
  }
  h=fnv(codes,n/2,14695981039346656037ull); h=fnv(q,nb,h); h=fnv(sc,ng*4,h); h=fnv(&off,4,h); h=fnv(&sx,8,h); h=fnv(&se,8,h); h=fnv(d,nb*4,h);
  double gb=n*2/1e9;
  printf("step1 %.1f ms  scales %.2f ms  step3 %.1f ms  total(min) %.1f ms = %.3f GB/s bf16   hash %016llx\n",t1*1e3,t2*1e3,t3*1e3,t4*1e3,gb/t4,(unsigned long long)h);
  if(argc>5) return 0;
  /* opt nf4 64 */
  double to=1e9; uint8_t*c64=malloc(n/2); float*am=malloc(n/64*4);
  for(int r=0;r<reps;r++){double a=now(); sx=se=0; for(int64_t b=0;b<n/64;b+=2048){ork_nf4opt_encode(x,2,n,k,usecw?cw:0,wt,64,2,b,b+2048<n/64?b+2048:n/64,c64,am,&st);sx+=st.sum_x2;se+=st.sum_err2;} double e=now(); if(e-a<to)to=e-a;}
  uint64_t h2=fnv(c64,n/2,14695981039346656037ull); h2=fnv(am,n/64*4,h2); h2=fnv(&se,8,h2);
  printf("opt64 %.1f ms = %.3f GB/s  hash %016llx\n",to*1e3,gb/to,(unsigned long long)h2);
  return 0;}
