/* Throughput of the sigmoid-family elementwise ops at each ISA level (src/kernels/elementwise_fast.c),
 * 256-element spans as the unary kernel feeds them (the refill of the span is included).
 * Build: gcc -O2 -fopenmp -Isrc -Iinclude bench/kernels/bench_elementwise.c $(sh bench/static_link.sh build) -o ewbench */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "kernels/reference_internal.h"
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
int main(void){
  enum{N=256}; float v[N]; const int reps=200000;
  const char*names[]={"gelu_tanh","silu"}; cdf_unary_op ops[]={CDF_UN_GELU_TANH,CDF_UN_SILU};
  for(int o=0;o<2;o++) for(int isa=0;isa<=cdf_k_isa_native();isa++){
    double best=1e9;
    for(int t=0;t<3;t++){ double t0=now();
      for(int r=0;r<reps;r++){ for(int i=0;i<N;i++) v[i]=(i-128)*0.03f; cdf_k_unary_span_at(isa,ops[o],v,N,0,0);} 
      double dt=now()-t0; if(dt<best)best=dt;}
    printf("%-10s %-12s %.2f ns/elem\n",names[o],cdf_k_isa_name(isa),best*1e9/((double)reps*N));
  }
  return 0;}
