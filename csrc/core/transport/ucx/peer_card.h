// What a rank of a UCX transport publishes about itself through the store,
// and how it is laid out there.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/common/error.h"

namespace ringx {

// What a rank publishes about itself: where it runs, its pid there, the
// name of its presence mark in the group (presence.h), its worker's id (one
// per worker, so that a group among processes already connected finds their
// endpoints), the tag block its worker proposes for the group (ucx_worker.h),
// and its worker address.
struct PeerCard {
  std::string host;
  int pid = 0;
  std::string presence;
  uint64_t uid = 0;
  uint32_t channel = 0;
  std::vector<uint8_t> address;

  std::vector<uint8_t> encode() const {
    std::vector<uint8_t> out;
    putText(out, host);
    const int32_t p = pid;
    put(out, &p, sizeof(p));
    putText(out, presence);
    put(out, &uid, sizeof(uid));
    put(out, &channel, sizeof(channel));
    out.insert(out.end(), address.begin(), address.end());
    return out;
  }

  static PeerCard decode(const std::vector<uint8_t>& in) {
    PeerCard c;
    size_t at = 0;
    c.host = takeText(in, at);
    int32_t p = 0;
    take(in, at, &p, sizeof(p));
    c.pid = p;
    c.presence = takeText(in, at);
    take(in, at, &c.uid, sizeof(c.uid));
    take(in, at, &c.channel, sizeof(c.channel));
    c.address.assign(in.begin() + long(at), in.end());
    return c;
  }

 private:
  static void put(std::vector<uint8_t>& out, const void* src, size_t n) {
    const auto* b = static_cast<const uint8_t*>(src);
    out.insert(out.end(), b, b + n);
  }
  static void putText(std::vector<uint8_t>& out, const std::string& text) {
    const uint32_t len = uint32_t(text.size());
    put(out, &len, sizeof(len));
    out.insert(out.end(), text.begin(), text.end());
  }
  static void take(const std::vector<uint8_t>& in, size_t& at, void* dst, size_t n) {
    if (in.size() < at + n) throw Error(ErrorKind::Internal, "malformed peer address in the store");
    std::memcpy(dst, in.data() + at, n);
    at += n;
  }
  static std::string takeText(const std::vector<uint8_t>& in, size_t& at) {
    uint32_t len = 0;
    take(in, at, &len, sizeof(len));
    std::string text(len, '\0');
    take(in, at, text.data(), len);
    return text;
  }
};

}  // namespace ringx
