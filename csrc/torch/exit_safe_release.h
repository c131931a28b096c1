// Ownership of what an op holds into Python (tensors, Works and their
// futures), for objects that the engine's own threads may drop last.
#pragma once

#include <memory>
#include <utility>

namespace ringx {

namespace detail {
// Runs destroy(p) now, or never once the interpreter is exiting (see .cc).
void destroyUnlessExiting(void (*destroy)(void*), void* p);
}  // namespace detail

// `value`, shared, and released by whichever thread drops the last copy, as
// long as that is safe; from the interpreter's atexit on, it is leaked.
template <class T>
std::shared_ptr<T> exitSafe(T value) {
  return std::shared_ptr<T>(new T(std::move(value)), [](T* p) {
    detail::destroyUnlessExiting([](void* q) { delete static_cast<T*>(q); }, p);
  });
}

// Called once by the interpreter's atexit hook, with the GIL released:
// waits for the releases under way, and makes every later one a leak.
void stopReleasingAtExit();

}  // namespace ringx
