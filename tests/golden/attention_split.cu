// kernelsat CUDA source (sm_90)

extern "C" __global__ void ks_kernel0(const float* __restrict__ in0, const float* __restrict__ in1, const float* __restrict__ in2, float* __restrict__ out) {
  __shared__ float ks_Q[4][32];
  __shared__ float ks_K[64][32 + 1];
  __shared__ float ks_V[64][32 + 1];
  const int ks_tid = threadIdx.x, ks_warp = ks_tid >> 5, ks_lane = ks_tid & 31;
  const long ks_h = blockIdx.x / 16;
  const long ks_r0 = (blockIdx.x % 16) * 4;
  const long ax0 = ks_r0 + ks_warp;
  for (int e_ = ks_tid; e_ < 128; e_ += 128) {
    const int r_ = e_ / 32, c_ = e_ % 32;
    ks_Q[r_][c_] = ks_r0 + r_ < 64 ? in0[0 + (ks_r0 + r_)*32 + (c_)*1] : 0.0f;
  }
  float ks_m = (-3.4028234663852886e+38f), ks_l = 0.0f;
  float ks_acc[32];
  #pragma unroll
  for (int x_ = 0; x_ < 32; x_++) ks_acc[x_] = 0.0f;
  for (long ks_k0 = 0; ks_k0 < 128; ks_k0 += 64) {
    __syncthreads();
    for (int e_ = ks_tid; e_ < 2048; e_ += 128) {
      const int j_ = e_ / 32, c_ = e_ % 32;
      ks_K[j_][c_] = ks_k0 + j_ < 128 ? in1[0 + (ks_k0 + j_)*32 + (c_)*1] : 0.0f;
    }
    for (int e_ = ks_tid; e_ < 2048; e_ += 128) {
      const int j_ = e_ / 32, c_ = e_ % 32;
      ks_V[j_][c_] = ks_k0 + j_ < 128 ? in2[0 + (ks_k0 + j_)*32 + (c_)*1] : 0.0f;
    }
    __syncthreads();
    if (ax0 < 64) {
      for (int j_ = ks_lane; j_ < 64 && ks_k0 + j_ < 128; j_ += 32) {
        const long ax1 = ks_k0 + j_;
        float t0 = 0.0f;
        #pragma unroll 8
        for (int c_ = 0; c_ < 32; c_++) t0 = fmaf(ks_Q[ks_warp][c_], ks_K[j_][c_], t0);
        const float ks_s = (t0 * 0.1767766922712326f);
        const float ks_t = ks_s - ks_m;
        const float ks_w = expf(-fabsf(ks_t));
        const float ks_c = ks_t > 0.0f ? ks_w : 1.0f;
        const float ks_p = ks_t > 0.0f ? 1.0f : ks_w;
        ks_l = ks_l * ks_c + ks_p;
        ks_m = ks_t > 0.0f ? ks_s : ks_m;
        #pragma unroll
        for (int x_ = 0; x_ < 32; x_++) ks_acc[x_] = ks_acc[x_] * ks_c + ks_p * ks_V[j_][x_];
      }
    }
  }
  for (int ks_o = 16; ks_o > 0; ks_o >>= 1) {
    float ks_om0 = __shfl_xor_sync(0xffffffffu, ks_m, ks_o);
    float ks_top0 = (ks_om0 > ks_m ? ks_om0 : ks_m);
    float ks_ca0 = (ks_m == ks_top0) ? 1.0f : expf(ks_m - ks_top0);
    float ks_cb0 = (ks_om0 == ks_top0) ? 1.0f : expf(ks_om0 - ks_top0);
    ks_l = ks_l * ks_ca0 + __shfl_xor_sync(0xffffffffu, ks_l, ks_o) * ks_cb0;
    #pragma unroll
    for (int k_ = 0; k_ < 32; k_++) ks_acc[k_] = ks_acc[k_] * ks_ca0 + __shfl_xor_sync(0xffffffffu, ks_acc[k_], ks_o) * ks_cb0;
    ks_m = ks_top0;
  }
  if (ax0 < 64) {
    #pragma unroll
    for (int x_ = 0; x_ < 32; x_++)
      if ((x_ & 31) == ks_lane) out[0 + (ax0)*32 + (x_)*1] = ks_l > 0.0f ? ks_acc[x_] / ks_l : 0.0f;
  }
}
