// The points of an exhaustive sweep, fewer in a sanitizer build. The
// sanitizers look for memory and thread errors, which a sweep's kinds of
// point (empty, fewer elements than ranks, a partial last chunk, several
// chunks) find as well as its every combination; the full sweeps' results
// are checked in the plain build (make cpp-test). Under ASan and TSan the
// largest sweeps were most of test-sanitize's run, itself a sixth of CI's.
#pragma once

#include <catch2/catch.hpp>
#include <utility>
#include <vector>

namespace ringx::test {

#ifdef RINGX_TESTS_SANITIZED
inline constexpr bool kSanitizedBuild = true;
#else
inline constexpr bool kSanitizedBuild = false;
#endif

// A Catch2 generator over `all`, or over `sanitized` in a sanitizer build.
template <class T>
Catch::Generators::GeneratorWrapper<T> sweep(std::vector<T> all, std::vector<T> sanitized) {
  return Catch::Generators::from_range(kSanitizedBuild ? std::move(sanitized) : std::move(all));
}

}  // namespace ringx::test
