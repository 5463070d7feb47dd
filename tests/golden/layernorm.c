/* kernelsat C prelude: branch-free float32 transcendentals that gcc vectorizes at -O3
   without -ffast-math (so -inf and NaN keep their IEEE meaning).
   exp: Cody-Waite range reduction x = k*ln2 + r, |r| <= ln2/2, degree-6 polynomial for
   exp(r) (Cephes expf coefficients), 2^k built in the exponent bits (as two factors). Results below
   FLT_MIN flush to 0; x > 88.72 gives +inf; NaN propagates.
   log: x = m * 2^e with m in [sqrt(1/2), sqrt(2)), polynomial in m-1 (Cephes logf
   coefficients); log(0) = -inf, log(x<0) = NaN, log(inf) = inf; denormals rescaled.
   tanh: odd polynomial for |x| < 0.625 (Cephes tanhf), else (1 - e)/(1 + e), e = exp(-2|x|).
   erf: Taylor series for |x| < 0.5, else 1 - erfc with the Chebyshev-fitted erfc of
   Numerical Recipes (fractional error < 1.2e-7). */
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float ks_bits_f(int32_t i) { float f; memcpy(&f, &i, 4); return f; }
static inline int32_t ks_f_bits(float f) { int32_t i; memcpy(&i, &f, 4); return i; }
static inline float ks_max(float a, float b) { return a > b ? a : b; }
static inline float ks_min(float a, float b) { return a < b ? a : b; }

/* exp(xc - k*ln2) for k = rint(xc / ln2): Cody-Waite reduction and the polynomial
   (shared by ks_exp and the fused attention's exp of nonpositive arguments). */
static inline float ks_exp_poly(float xc, float k) {
  float r = xc - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}

static inline float ks_exp(float x) {
  float xc = x < -87.33654f ? -87.33654f : (x > 88.72283f ? 88.72283f : x);
  float k = __builtin_rintf(xc * 1.44269504088896341f);
  float p = ks_exp_poly(xc, k);
  int32_t ki = (int32_t)k, k1 = ki >> 1; /* two factors: 2^128 and 2^-126 both fit */
  float y = p * ks_bits_f((k1 + 127) << 23) * ks_bits_f((ki - k1 + 127) << 23);
  y = x < -87.33654f ? 0.0f : y;
  y = x > 88.72283f ? __builtin_inff() : y;
  return x != x ? x : y;
}

/* exp(x) for x <= 0 (a max-subtracted argument, the online reductions' weights and
   rescale factors): ks_exp without the overflow branch and the NaN select (NaN
   propagates through the polynomial), 2^k as one factor (k >= -126); below -87.34
   gives 0. */
static inline float ks_exp_nonpos(float x) {
  float xc = x < -87.33654f ? -87.33654f : x;
  float k = __builtin_rintf(xc * 1.44269504088896341f);
  float p = ks_exp_poly(xc, k);
  float y = p * ks_bits_f(((int32_t)k + 127) << 23);  /* NaN x: p and y are NaN */
  return x < -87.33654f ? 0.0f : y;
}

static inline float ks_log(float x) {
  /* every select on a float comparison (an int flag reused in arithmetic and selects
     left control flow that gcc 12 would not vectorize) */
  float xs = x < 1.17549435e-38f ? x * 8388608.0f : x;
  float ef = x < 1.17549435e-38f ? -23.0f : 0.0f;
  int32_t bits = ks_f_bits(xs);
  ef += (float)(((bits >> 23) & 0xff) - 126);
  float m = ks_bits_f((bits & 0x007fffff) | 0x3f000000); /* m in [0.5, 1) */
  ef = m < 0.707106781186547524f ? ef - 1.0f : ef;
  float f = (m < 0.707106781186547524f ? m + m : m) - 1.0f;
  float z = f * f;
  float p = 7.0376836292e-2f;
  p = p * f - 1.1514610310e-1f;
  p = p * f + 1.1676998740e-1f;
  p = p * f - 1.2420140846e-1f;
  p = p * f + 1.4249322787e-1f;
  p = p * f - 1.6668057665e-1f;
  p = p * f + 2.0000714765e-1f;
  p = p * f - 2.4999993993e-1f;
  p = p * f + 3.3333331174e-1f;
  float y = f * z * p;
  y = y + ef * -2.12194440e-4f;
  y = y - 0.5f * z;
  y = f + y + ef * 0.693359375f;
  y = x == __builtin_inff() ? x : y;
  y = x == 0.0f ? -__builtin_inff() : y;
  y = x < 0.0f ? __builtin_nanf("") : y;
  return x != x ? x : y;
}

static inline float ks_tanh(float x) {
  float a = x < 0.0f ? -x : x;
  float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397721982e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  float small = p * z * x + x;
  /* e^-2|x| as the square of e^-|x| (the exp sigmoid(x) evaluates too: gcc computes it
     once for both); at most e^-1.25 where it is used: no cancellation */
  float e = ks_exp_nonpos(-a);
  e = e * e;
  float big = (1.0f - e) / (1.0f + e);
  big = x < 0.0f ? -big : big;
  return a < 0.625f ? small : big;
}

static inline float ks_erf(float x) {
  float a = x < 0.0f ? -x : x;
  float z = x * x;
  float s = -1.0f / 1320.0f;
  s = s * z + 1.0f / 216.0f;
  s = s * z - 1.0f / 42.0f;
  s = s * z + 1.0f / 10.0f;
  s = s * z - 1.0f / 3.0f;
  float small = x * (1.12837916709551257f + 1.12837916709551257f * s * z);
  float t = 1.0f / (1.0f + 0.5f * a);
  float q = 0.17087277f;
  q = q * t - 0.82215223f;
  q = q * t + 1.48851587f;
  q = q * t - 1.13520398f;
  q = q * t + 0.27886807f;
  q = q * t - 0.18628806f;
  q = q * t + 0.09678418f;
  q = q * t + 0.37409196f;
  q = q * t + 1.00002368f;
  q = q * t - 1.26551223f;
  float erfc = t * ks_exp(q - z);
  float big = 1.0f - erfc;
  big = x < 0.0f ? -big : big;
  return a < 0.5f ? small : big;
}

/* sigmoid(x) from e = exp(-|x|) in (0, 1]: 1 / (1 + e) for x >= 0, e / (1 + e) below
   (the exp of a nonpositive argument: no overflow branch); NaN propagates. */
static inline float ks_sigmoid(float x) {
  float a = x < 0.0f ? -x : x;
  float e = ks_exp_nonpos(-a);
  return (x < 0.0f ? e : 1.0f) / (1.0f + e);
}

/* log1p(x) = log(u) + (x - (u - 1)) / u for u = 1 + x rounded: the second term is the
   first-order correction for the rounding of u (exact to float32 rounding when |x| is
   below 2^-24, where u == 1 and the result is x). log1p(-1) = -inf, x < -1 gives NaN,
   +inf gives +inf, -0 gives -0; NaN propagates. */
static inline float ks_log1p(float x) {
  float u = 1.0f + x;
  float y = ks_log(u) + (x - (u - 1.0f)) / u;
  y = u == __builtin_inff() ? u : y;
  y = x == -1.0f ? -__builtin_inff() : y;
  return x == 0.0f ? x : y;
}

/* softplus(x) = max(x, 0) + log1p(e^-|x|): no overflow; +inf -> +inf, -inf -> 0, NaN
   propagates (e^-|NaN| is NaN). Below x = -87.3 the e^x it tends to flushes to 0. */
static inline float ks_softplus(float x) {
  float a = x < 0.0f ? -x : x;
  float t = ks_exp(-a), u = 1.0f + t; /* t in [0, 1] or NaN: ks_log1p's selects are moot */
  return ks_max(x, 0.0f) + (ks_log(u) + (t - (u - 1.0f)) / u);
}

/* sin and cos: k = rint(x * 2/pi) and r = x - k*pi/2 in double, pi/2 in two parts (the
   first of 33 bits, so k*part exact for |k| < 2^20), then float polynomials on
   |r| <= pi/4 (Cephes sinf/cosf coefficients) chosen by the quadrant k mod 4 (taken in
   double, no integer conversion, so any finite x is safe). Absolute error below 1e-7
   for |x| < 2^40 (measured, tests/test_codegen_mathlib.py); beyond, the double
   reduction's rounding grows with |x| (3e-4 at 2^42, O(1) past 2^50: libm's exact
   Payne-Hanek reduction is not reproduced) and the result stays in [-1, 1].
   +-inf and NaN give NaN; sin(-0) = -0. */
static inline float ks_sincos_poly(float x, int want_cos) {
  double xd = (double)x;
  double k = __builtin_rint(xd * 6.36619772367581382433e-01);
  double rd = (xd - k * 1.57079632673412561417e+00) - k * 6.07710050650619224932e-11;
  double q = k - 4.0 * __builtin_rint(k * 0.25); /* floor would not vectorize */
  q = q < 0.0 ? q + 4.0 : q;
  float r = (float)rd;
  r = r > 0.78539819f ? 0.78539819f : r; /* huge |x|: keep |y| <= 1 (NaN passes) */
  r = r < -0.78539819f ? -0.78539819f : r;
  float z = r * r;
  float s = -1.9515295891e-4f;
  s = s * z + 8.3321608736e-3f;
  s = s * z - 1.6666654611e-1f;
  s = s * z * r + r;
  float c = 2.443315711809948e-5f;
  c = c * z - 1.388731625493765e-3f;
  c = c * z + 4.166664568298827e-2f;
  c = c * z * z - 0.5f * z + 1.0f;
  q = want_cos ? q + 1.0 : q; /* cos(x) = sin(x + pi/2); q in 0..4, 4 as 0 */
  float y = ((q == 1.0) | (q == 3.0)) ? c : s; /* `|`, not `||`: no branch */
  return ((q == 2.0) | (q == 3.0)) ? -y : y;
}
static inline float ks_sin(float x) { float y = ks_sincos_poly(x, 0); return x == 0.0f ? x : y; }
static inline float ks_cos(float x) { return ks_sincos_poly(x, 1); }

volatile int ks_cancel = 0;  /* set by a watchdog: stop early, output undefined */

static void ks_kernel0(const float* restrict in0, const float* restrict in1, const float* restrict in2, float* restrict out) {
  #pragma omp parallel for schedule(static)
  for (long ax0 = 0; ax0 < 64; ax0++) {
    if (ks_cancel) continue;
    float acc0[16];
    for (long k_ = 0; k_ < 16; k_++) acc0[k_] = 0.0f;
    for (long ax2 = 0; ax2 < 8; ax2++) {
      for (long ax3 = 0; ax3 < 16; ax3++) {
        float t1 = in0[ax0*128 + ax2*16 + ax3];
        acc0[ax3] = (acc0[ax3] + t1);
      }
    }
    for (long ax4 = 0; ax4 < 8; ax4++) {
      acc0[ax4] = (acc0[ax4] + acc0[ax4 + 8]);
    }
    for (long ax5 = 0; ax5 < 4; ax5++) {
      acc0[ax5] = (acc0[ax5] + acc0[ax5 + 4]);
    }
    for (long ax6 = 0; ax6 < 2; ax6++) {
      acc0[ax6] = (acc0[ax6] + acc0[ax6 + 2]);
    }
    for (long ax7 = 0; ax7 < 1; ax7++) {
      acc0[ax7] = (acc0[ax7] + acc0[ax7 + 1]);
    }
    float t2 = (acc0[0] * 0.0078125f);
    float acc1[16];
    for (long k_ = 0; k_ < 16; k_++) acc1[k_] = 0.0f;
    for (long ax8 = 0; ax8 < 8; ax8++) {
      for (long ax9 = 0; ax9 < 16; ax9++) {
        float t4 = in0[ax0*128 + ax8*16 + ax9];
        float t5 = (t4 - t2);
        float t6 = (t5 * t5);
        acc1[ax9] = (acc1[ax9] + t6);
      }
    }
    for (long ax10 = 0; ax10 < 8; ax10++) {
      acc1[ax10] = (acc1[ax10] + acc1[ax10 + 8]);
    }
    for (long ax11 = 0; ax11 < 4; ax11++) {
      acc1[ax11] = (acc1[ax11] + acc1[ax11 + 4]);
    }
    for (long ax12 = 0; ax12 < 2; ax12++) {
      acc1[ax12] = (acc1[ax12] + acc1[ax12 + 2]);
    }
    for (long ax13 = 0; ax13 < 1; ax13++) {
      acc1[ax13] = (acc1[ax13] + acc1[ax13 + 1]);
    }
    float t7 = (acc1[0] * 0.0078125f);
    float t8 = (t7 + 9.999999747378752e-06f);
    float t9 = sqrtf(t8);
    float t10 = (7.888609052210118e-31f > fabsf(t9) ? 1.2676506002282294e+30f : 1.0f);
    float t11 = (1.0f / (t9 * t10));
    for (long ax1 = 0; ax1 < 128; ax1++) {
      float t0 = in0[ax0*128 + ax1];
      float t3 = (t0 - t2);
      float t12 = ((t3 * t10) * t11);
      float t13 = in1[ax1];
      float t14 = (t12 * t13);
      float t15 = in2[ax1];
      float t16 = (t14 + t15);
      out[ax0*128 + ax1] = t16;
    }
  }
}

void ks_run(void** args) {
  if (ks_cancel) return;
  ks_kernel0((float*)args[0], (float*)args[1], (float*)args[2], (float*)args[3]);
}
