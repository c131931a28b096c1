// Which all_reduce the ipc path runs: one-shot, two-shot or the chunked
// ring, the cheapest by an alpha-beta estimate of each (ipc_cost.cc holds
// the constants, guesses until a GPU measures them), unless RINGX_IPC_ALGO
// forces one. Every rank computes the same choice from what the ranks share
// (the size, the dtype, the group and its buffer size).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace ringx {

enum class IpcAlgo : uint8_t { OneShot, TwoShot, Ring };
inline constexpr IpcAlgo kIpcAlgos[] = {IpcAlgo::OneShot, IpcAlgo::TwoShot, IpcAlgo::Ring};

// "one_shot", "two_shot", "ring": RINGX_IPC_ALGO's words.
const char* ipcAlgoName(IpcAlgo algo);
// RINGX_IPC_ALGO's value, any case: nullopt for auto (the cost model).
// Throws Error(InvalidArgument) naming the value and the choices.
std::optional<IpcAlgo> parseIpcAlgo(const std::string& value);

// Whether `algo` can run an all_reduce of `elemBytes`-byte elements at `n`
// ranks through buffers of `bufferBytes`: the ring needs two ranks and two
// slots of an element, the others one element.
bool ipcAlgoApplies(IpcAlgo algo, size_t elemBytes, int n, size_t bufferBytes);
// The estimate, in seconds, of an all_reduce of `bytes`.
double ipcAllReduceSeconds(IpcAlgo algo, size_t bytes, size_t elemBytes, int n, size_t bufferBytes);
// `forced` when it applies, else the cheapest that applies.
IpcAlgo ipcAllReduceAlgo(size_t bytes, size_t elemBytes, int n, size_t bufferBytes,
                         std::optional<IpcAlgo> forced = std::nullopt);

}  // namespace ringx
