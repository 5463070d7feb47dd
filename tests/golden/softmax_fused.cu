// kernelsat CUDA source (sm_90)

extern "C" __global__ void ks_kernel0(const float* __restrict__ in0, float* __restrict__ out) {
  long gid = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (gid >= 64) return;
  long ax0 = (gid / 1) % 64;
  float acc0[16];
  for (long k_ = 0; k_ < 16; k_++) acc0[k_] = (-__int_as_float(0x7f800000));
  for (long ax2 = 0; ax2 < 8; ax2++) {
    for (long ax3 = 0; ax3 < 16; ax3++) {
      float t1 = in0[ax0*128 + ax2*16 + ax3];
      acc0[ax3] = (t1 > acc0[ax3] ? t1 : acc0[ax3]);
    }
  }
  float acc1 = (-__int_as_float(0x7f800000));
  for (long ax4 = 0; ax4 < 16; ax4++) {
    acc1 = (acc0[ax4] > acc1 ? acc0[ax4] : acc1);
  }
  float acc2[16];
  for (long k_ = 0; k_ < 16; k_++) acc2[k_] = 0.0f;
  for (long ax5 = 0; ax5 < 8; ax5++) {
    for (long ax6 = 0; ax6 < 16; ax6++) {
      float t4 = in0[ax0*128 + ax5*16 + ax6];
      float t5 = (t4 - acc1);
      float t6 = expf(t5);
      acc2[ax6] = (acc2[ax6] + t6);
    }
  }
  float acc3 = 0.0f;
  for (long ax7 = 0; ax7 < 16; ax7++) {
    acc3 = (acc3 + acc2[ax7]);
  }
  for (long ax1 = 0; ax1 < 128; ax1++) {
    float t0 = in0[ax0*128 + ax1];
    float t2 = (t0 - acc1);
    float t3 = expf(t2);
    float t7 = (t3 / acc3);
    out[ax0*128 + ax1] = t7;
  }
}
