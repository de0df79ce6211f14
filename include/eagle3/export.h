// EAGLE3_API marks the public classes and functions of libeagle3 and libeagle3_cuda.
//
// Both libraries are compiled with hidden visibility. In a shared build (-DBUILD_SHARED_LIBS=ON; CMake
// then defines EAGLE3_SHARED for the libraries and for everything that links them) EAGLE3_API gives
// the marked declarations default visibility: they are what libeagle3.so and libeagle3_cuda.so
// export, and nothing else is. In the default static build EAGLE3_API is empty, so an engine that
// links the static libraries into its own shared object exports none of eagle3's symbols.
// Inline and template code needs no mark.
#pragma once

#if defined(EAGLE3_SHARED) && (defined(__GNUC__) || defined(__clang__))
#define EAGLE3_API __attribute__((visibility("default")))
#else
#define EAGLE3_API
#endif
