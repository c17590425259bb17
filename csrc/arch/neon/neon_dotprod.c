/* neon_dotprod.c — the integer matmuls with vdotq_s32 (FEAT_DotProd: armv8.2-a and later cores,
 * every Apple silicon core, Graviton 2+, Cortex-A76+). Compiled with -march=armv8.2-a+dotprod;
 * reachable only through the neon_dotprod table. */
#if defined(__aarch64__) || defined(_M_ARM64)
#include <arm_neon.h>

#include "neon.h"

#define IG_NDOT(acc, w, x) vdotq_s32((acc), (w), (x))
#define FN(name) name##_neon_dotprod
#include "qdot_tmpl.h"
#endif
