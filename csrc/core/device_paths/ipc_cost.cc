#include "core/device_paths/ipc_cost.h"

#include <cctype>

#include "core/common/error.h"
#include "core/device_paths/ipc_plan.h"
#include "core/patterns/ring.h"

namespace ringx {

namespace {

// The model's constants, all guesses: no GPU has run the ipc path. The
// prepared GPU run (tests/gpu/device_run.sh) times every algorithm forced
// in turn (RINGX_IPC_ALGO) over 8 B .. 64 MiB; fit these to what it shows
// and say where in this comment.
//
// One flag exchange: a signal kernel's system-scope fence and store, seen
// by a peer's polling wait kernel, the next launch after it. Host memory
// polled over PCIe, a few kernel launches.
constexpr double kFlagSeconds = 10e-6;
// A rank reading one peer's buffer while every buffer has one reader (the
// ring): one NVLink direction of a recent GPU, a little under its peak.
constexpr double kOneReaderBytesPerSecond = 100e9;
// A rank's total read rate while every rank reads every peer at once
// (one-shot and two-shot from 3 ranks): n (n-1) transfers share the
// switch, the PCIe root or, ranks sharing a GPU, its memory. Half the
// above; on an NVSwitch machine it may be as high, and then the ring never
// pays.
constexpr double kAllReadersBytesPerSecond = 50e9;

size_t roundsOf(size_t bytes, size_t roundBytes) { return ring::numSegments(bytes, roundBytes); }

}  // namespace

const char* ipcAlgoName(IpcAlgo algo) {
  switch (algo) {
    case IpcAlgo::OneShot: return "one_shot";
    case IpcAlgo::TwoShot: return "two_shot";
    case IpcAlgo::Ring: return "ring";
  }
  return "?";
}

std::optional<IpcAlgo> parseIpcAlgo(const std::string& value) {
  std::string v;
  for (char c : value) v += char(std::tolower(static_cast<unsigned char>(c)));
  if (v == "auto") return std::nullopt;
  for (IpcAlgo a : kIpcAlgos) {
    if (v == ipcAlgoName(a)) return a;
  }
  throw Error(ErrorKind::InvalidArgument,
              "ringx: RINGX_IPC_ALGO='" + value + "' is none of auto, one_shot, two_shot, ring");
}

bool ipcAlgoApplies(IpcAlgo algo, size_t elemBytes, int n, size_t bufferBytes) {
  if (algo == IpcAlgo::Ring) return ipcRingPlan(0, elemBytes, n, bufferBytes).slots >= 2;
  return bufferBytes >= elemBytes;
}

// Each algorithm as flag exchanges one after the other (alpha) plus the
// bytes a rank reads out of its peers' buffers (beta); copies within a
// GPU's own memory are left out. One-shot: two exchanges a round (Arrive,
// Left), every peer's whole round read. Two-shot: three (Reduced too), a
// portion of every peer's round read twice. The ring: one exchange a step,
// 2n-1 steps a round of n slots, each step one chunk of the left peer's.
// One-shot and two-shot read from n-1 peers at once; at 2 ranks that is
// one reader a buffer, as in the ring.
double ipcAllReduceSeconds(IpcAlgo algo, size_t bytes, size_t elemBytes, int n, size_t bufferBytes) {
  const double all = double(bytes), peerShare = double(n - 1) / n;
  const double fanIn = n <= 2 ? kOneReaderBytesPerSecond : kAllReadersBytesPerSecond;
  switch (algo) {
    case IpcAlgo::OneShot:
      return 2.0 * double(roundsOf(bytes, bufferBytes)) * kFlagSeconds + double(n - 1) * all / fanIn;
    case IpcAlgo::TwoShot:
      return 3.0 * double(roundsOf(bytes, bufferBytes)) * kFlagSeconds + 2.0 * peerShare * all / fanIn;
    case IpcAlgo::Ring: {
      const IpcRingPlan p = ipcRingPlan(bytes / elemBytes, elemBytes, n, bufferBytes);
      const size_t rounds = std::max<size_t>(1, p.rounds);
      return double(rounds * p.stepsPerRound()) * kFlagSeconds + 2.0 * peerShare * all / kOneReaderBytesPerSecond;
    }
  }
  return 0;
}

IpcAlgo ipcAllReduceAlgo(size_t bytes, size_t elemBytes, int n, size_t bufferBytes, std::optional<IpcAlgo> forced) {
  if (forced && ipcAlgoApplies(*forced, elemBytes, n, bufferBytes)) return *forced;
  IpcAlgo best = IpcAlgo::OneShot;
  double bestSeconds = ipcAllReduceSeconds(best, bytes, elemBytes, n, bufferBytes);
  for (IpcAlgo a : kIpcAlgos) {
    if (!ipcAlgoApplies(a, elemBytes, n, bufferBytes)) continue;
    const double t = ipcAllReduceSeconds(a, bytes, elemBytes, n, bufferBytes);
    if (t < bestSeconds) {
      best = a;
      bestSeconds = t;
    }
  }
  return best;
}

}  // namespace ringx
