#include "core/transport/ucx/ucx_info.h"

#include <dlfcn.h>
#include <ucm/api/ucm.h>
#include <ucp/api/ucp.h>
#include <uct/api/uct.h>

namespace ringx {

namespace {

// The transports of one memory domain; "" or what failed.
std::string listDomain(uct_component_h component, const char* mdName,
                       std::vector<std::string>& out) {
  uct_md_config_t* config = nullptr;
  ucs_status_t st = uct_md_config_read(component, nullptr, nullptr, &config);
  if (st != UCS_OK) return std::string(mdName) + ": uct_md_config_read: " + ucs_status_string(st);
  uct_md_h md = nullptr;
  st = uct_md_open(component, mdName, config, &md);
  uct_config_release(config);
  if (st != UCS_OK) return std::string(mdName) + ": uct_md_open: " + ucs_status_string(st);
  uct_tl_resource_desc_t* res = nullptr;
  unsigned n = 0;
  st = uct_md_query_tl_resources(md, &res, &n);
  if (st == UCS_OK) {
    for (unsigned i = 0; i < n; ++i)
      out.push_back(std::string(res[i].tl_name) + "/" + res[i].dev_name);
    uct_release_tl_resource_list(res);
  }
  uct_md_close(md);
  return st == UCS_OK
             ? ""
             : std::string(mdName) + ": uct_md_query_tl_resources: " + ucs_status_string(st);
}

}  // namespace

UcxInfo ucxInfo() {
  UcxInfo info;
  info.version = ucp_get_version_string();
  Dl_info where{};
  if (::dladdr(reinterpret_cast<void*>(&ucp_get_version_string), &where) && where.dli_fname) {
    info.library = where.dli_fname;
  }
  uct_component_h* components = nullptr;
  unsigned ncomp = 0;
  ucs_status_t st = uct_query_components(&components, &ncomp);
  if (st != UCS_OK) {
    info.error = std::string("uct_query_components: ") + ucs_status_string(st);
    return info;
  }
  for (unsigned c = 0; c < ncomp; ++c) {
    uct_component_attr_t attr{};
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    if (uct_component_query(components[c], &attr) != UCS_OK) continue;
    std::vector<uct_md_resource_desc_t> mds(attr.md_resource_count);
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    attr.md_resources = mds.data();
    if (uct_component_query(components[c], &attr) != UCS_OK) continue;
    for (const auto& md : mds) {
      std::string err = listDomain(components[c], md.md_name, info.transports);
      if (!err.empty()) info.error += (info.error.empty() ? "" : "; ") + err;
    }
  }
  uct_release_component_list(components);
  return info;
}

int ucxMemoryEvents() {
  // Looked up, not linked: ringx links libucp alone, and libucm is loaded
  // with it.
  const auto* opts =
      static_cast<const ucm_global_config_t*>(::dlsym(RTLD_DEFAULT, "ucm_global_opts"));
  return opts ? (opts->enable_events ? 1 : 0) : -1;
}

}  // namespace ringx
