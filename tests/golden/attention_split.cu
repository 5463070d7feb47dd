// kernelsat CUDA source (sm_90)

extern "C" __global__ void ks_kernel0(const float* __restrict__ in0, const float* __restrict__ in1, const float* __restrict__ in2, float* __restrict__ out) {
  long gid = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (gid >= 64) return;
  long ax0 = (gid / 1) % 64;
  float acc0 = -3.4028234663852886e+38f;
  float acc1 = 0.0f;
  float acc2[32];
  for (long k_ = 0; k_ < 32; k_++) acc2[k_] = 0.0f;
  for (long ax2 = 0; ax2 < 4; ax2++) {
    float acc3 = -3.4028234663852886e+38f;
    float acc4 = 0.0f;
    float acc5[32];
    for (long k_ = 0; k_ < 32; k_++) acc5[k_] = 0.0f;
    for (long ax3 = 0; ax3 < 32; ax3++) {
      float acc6[16];
      for (long k_ = 0; k_ < 16; k_++) acc6[k_] = 0.0f;
      for (long ax4 = 0; ax4 < 2; ax4++) {
        for (long ax5 = 0; ax5 < 16; ax5++) {
          float t1 = in0[ax0*32 + ax4*16 + ax5];
          float t2 = in1[ax2*1024 + ax3*32 + ax4*16 + ax5];
          acc6[ax5] = (acc6[ax5] + (t1 * t2));
        }
      }
      float acc7 = 0.0f;
      for (long ax6 = 0; ax6 < 16; ax6++) {
        acc7 = (acc7 + acc6[ax6]);
      }
      float t3 = (acc7 * 0.1767766922712326f);
      float t4 = (t3 - acc3);
      float t5 = expf((-fabsf(t4)));
      float t6 = (t4 > 0.0f ? t5 : 1.0f);
      float t7 = (t4 > 0.0f ? 1.0f : t5);
      acc4 = ((acc4 * t6) + t7);
      acc3 = (t4 > 0.0f ? t3 : acc3);
      for (long ax1 = 0; ax1 < 32; ax1++) {
        float t0 = in2[ax2*1024 + ax3*32 + ax1];
        acc5[ax1] = ((acc5[ax1] * t6) + (t7 * t0));
      }
    }
    float t8 = (acc3 + logf(acc4));
    float t9 = (t8 - acc0);
    float t10 = expf((-fabsf(t9)));
    float t11 = (t9 > 0.0f ? t10 : 1.0f);
    float t12 = (t9 > 0.0f ? 1.0f : t10);
    acc1 = ((acc1 * t11) + t12);
    acc0 = (t9 > 0.0f ? t8 : acc0);
    for (long ax1 = 0; ax1 < 32; ax1++) {
      acc2[ax1] = ((acc2[ax1] * t11) + (t12 * (acc5[ax1] / acc4)));
    }
  }
  for (long ax1 = 0; ax1 < 32; ax1++) {
    out[ax0*32 + ax1] = (acc2[ax1] / acc1);
  }
}
