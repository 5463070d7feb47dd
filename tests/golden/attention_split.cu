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
    float acc7[32];
    for (long k_ = 0; k_ < 32; k_++) acc7[k_] = 0.0f;
    for (long ax3 = 0; ax3 < 32; ax3++) {
      float acc6[4];
      for (long k_ = 0; k_ < 4; k_++) acc6[k_] = 0.0f;
      for (long ax4 = 0; ax4 < 8; ax4++) {
        for (long ax5 = 0; ax5 < 4; ax5++) {
          float t0 = in0[ax0*32 + ax4*4 + ax5];
          float t1 = in1[ax2*1024 + ax3*32 + ax4*4 + ax5];
          acc6[ax5] = (acc6[ax5] + (t0 * t1));
        }
      }
      for (long ax6 = 0; ax6 < 2; ax6++) {
        acc6[ax6] = (acc6[ax6] + acc6[ax6 + 2]);
      }
      for (long ax7 = 0; ax7 < 1; ax7++) {
        acc6[ax7] = (acc6[ax7] + acc6[ax7 + 1]);
      }
      float t2 = (acc6[0] * 0.1767766922712326f);
      acc7[ax3] = t2;
    }
    float acc8[16];
    for (long k_ = 0; k_ < 16; k_++) acc8[k_] = -3.4028234663852886e+38f;
    for (long ax8 = 0; ax8 < 2; ax8++) {
      for (long ax9 = 0; ax9 < 16; ax9++) {
        acc8[ax9] = (acc7[ax8*16 + ax9] > acc8[ax9] ? acc7[ax8*16 + ax9] : acc8[ax9]);
      }
    }
    for (long ax10 = 0; ax10 < 8; ax10++) {
      acc8[ax10] = (acc8[ax10 + 8] > acc8[ax10] ? acc8[ax10 + 8] : acc8[ax10]);
    }
    for (long ax11 = 0; ax11 < 4; ax11++) {
      acc8[ax11] = (acc8[ax11 + 4] > acc8[ax11] ? acc8[ax11 + 4] : acc8[ax11]);
    }
    for (long ax12 = 0; ax12 < 2; ax12++) {
      acc8[ax12] = (acc8[ax12 + 2] > acc8[ax12] ? acc8[ax12 + 2] : acc8[ax12]);
    }
    for (long ax13 = 0; ax13 < 1; ax13++) {
      acc8[ax13] = (acc8[ax13 + 1] > acc8[ax13] ? acc8[ax13 + 1] : acc8[ax13]);
    }
    acc3 = acc8[0];
    float acc9[16];
    for (long k_ = 0; k_ < 16; k_++) acc9[k_] = 0.0f;
    for (long ax14 = 0; ax14 < 2; ax14++) {
      for (long ax15 = 0; ax15 < 16; ax15++) {
        acc7[ax14*16 + ax15] = expf((acc7[ax14*16 + ax15] - acc3));
        acc9[ax15] = (acc9[ax15] + acc7[ax14*16 + ax15]);
      }
    }
    for (long ax16 = 0; ax16 < 8; ax16++) {
      acc9[ax16] = (acc9[ax16] + acc9[ax16 + 8]);
    }
    for (long ax17 = 0; ax17 < 4; ax17++) {
      acc9[ax17] = (acc9[ax17] + acc9[ax17 + 4]);
    }
    for (long ax18 = 0; ax18 < 2; ax18++) {
      acc9[ax18] = (acc9[ax18] + acc9[ax18 + 2]);
    }
    for (long ax19 = 0; ax19 < 1; ax19++) {
      acc9[ax19] = (acc9[ax19] + acc9[ax19 + 1]);
    }
    acc4 = acc9[0];
    for (long ax20 = 0; ax20 < 32; ax20++) {
      for (long ax1 = 0; ax1 < 32; ax1++) {
        float t3 = in2[ax2*1024 + ax20*32 + ax1];
        acc5[ax1] = (acc5[ax1] + (acc7[ax20] * t3));
      }
    }
    float t4 = (acc3 + logf(acc4));
    float t5 = (t4 - acc0);
    float t6 = expf((-fabsf(t5)));
    float t7 = (t5 > 0.0f ? t6 : 1.0f);
    float t8 = (t5 > 0.0f ? 1.0f : t6);
    acc1 = ((acc1 * t7) + t8);
    acc0 = (t5 > 0.0f ? t4 : acc0);
    for (long ax1 = 0; ax1 < 32; ax1++) {
      acc2[ax1] = ((acc2[ax1] * t7) + (t8 * (acc5[ax1] / acc4)));
    }
  }
  for (long ax1 = 0; ax1 < 32; ax1++) {
    out[ax0*32 + ax1] = (acc2[ax1] / acc1);
  }
}
