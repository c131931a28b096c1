// The functions UCX calls back, with UCX's types, which ucx_worker.h keeps
// out of its includers: shared by the worker's set-up (endpoint errors, leave
// notices) and its transfers (request completions).
#pragma once

#include <ucp/api/ucp.h>

namespace ringx {

struct UcxCallbacks {
  static void onSend(void* request, ucs_status_t status, void* user);
  static void onRecv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user);
  static void onEpError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void onNoticeSent(void* request, ucs_status_t status, void* user);
  static ucs_status_t onLeaving(void* arg, const void* header, size_t headerLength, void* data, size_t length,
                                const ucp_am_recv_param_t* param);
};

}  // namespace ringx
