// Flush-to-zero and denormals-are-zero for the current thread while a kernel runs, restored
// afterwards. A scan's state decays toward zero; values below float's normal range (1.2e-38) are
// handled in microcode, tens of times slower, and change nothing the results can show at the
// ops' tolerances. Set per call and per worker thread (the flags are per thread), never for the
// process: the libraries are linked without crtfastmath.o (build.py) for that reason.
#pragma once

#if defined(__SSE__) && (defined(__x86_64__) || defined(__i386__))
#include <xmmintrin.h>

namespace ssmcc {

class FlushDenormals {
 public:
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040); }  // FTZ | DAZ
  ~FlushDenormals() { _mm_setcsr(saved_); }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  unsigned saved_;
};

}  // namespace ssmcc
#else
namespace ssmcc {
struct FlushDenormals {};
}  // namespace ssmcc
#endif
