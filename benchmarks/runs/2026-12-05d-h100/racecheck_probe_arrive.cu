// racecheck probe: producer warpgroup writes shared memory then bar.arrive; consumer bar.sync then reads.
#include <cstdio>
__global__ void Probe(int* out, int mode) {
  __shared__ int s[128];
  const int t = threadIdx.x;
  for (int it = 0; it < 4; ++it) {
    if (t < 128) {
      s[t] = t + it;
      if (mode == 0) asm volatile("bar.arrive 1, 256;" ::: "memory");
      else asm volatile("bar.sync 1, 256;" ::: "memory");
      asm volatile("bar.sync 2, 256;" ::: "memory");  // consumer done reading before the next write
    } else {
      asm volatile("bar.sync 1, 256;" ::: "memory");
      out[t - 128] += s[t - 128];
      if (mode == 0) asm volatile("bar.arrive 2, 256;" ::: "memory");
      else asm volatile("bar.sync 2, 256;" ::: "memory");
    }
  }
}
int main() {
  int* out; cudaMalloc(&out, 128 * 4); cudaMemset(out, 0, 512);
  for (int mode = 0; mode < 2; ++mode) { Probe<<<1, 256>>>(out, mode); cudaDeviceSynchronize(); printf("mode %d: %s\n", mode, cudaGetErrorString(cudaGetLastError())); }
  return 0;
}
