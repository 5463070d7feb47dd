// kernelsat CUDA source (sm_90)

extern "C" __global__ void ks_kernel0(const float* __restrict__ in0, const float* __restrict__ in1, const float* __restrict__ in2, float* __restrict__ out) {
  long gid = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (gid >= 64) return;
  long ax0 = (gid / 1) % 64;
  float fx0 = -3.4028234663852886e+38f;
  float fx1 = 0.0f;
  float fx2[32];
  #pragma unroll
  for (int k_ = 0; k_ < 32; k_++) fx2[k_] = 0.0f;
  for (long ax1 = 0; ax1 < 128; ax1++) {
    float t0 = 0.0f;
    for (long fx3 = 0; fx3 < 32; fx3++) {
      t0 = (t0 + (in0[ax0*32 + fx3] * in1[ax1*32 + fx3]));
    }
    float fx9 = (t0 * 0.1767766922712326f);
    float fx5 = (fx9 - fx0);
    float fx6 = expf((-fabsf(fx5)));
    float fx7 = (fx5 > 0.0f ? fx6 : 1.0f);
    float fx8 = (fx5 > 0.0f ? 1.0f : fx6);
    fx1 = ((fx1 * fx7) + fx8);
    fx0 = (fx5 > 0.0f ? fx9 : fx0);
    for (long fx4 = 0; fx4 < 32; fx4++) {
      fx2[fx4] = ((fx2[fx4] * fx7) + (fx8 * in2[ax1*32 + fx4]));
    }
  }
  for (long fx4 = 0; fx4 < 32; fx4++) {
    out[ax0*32 + fx4] = (fx2[fx4] / fx1);
  }
}
