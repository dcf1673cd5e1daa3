/* Status strings, version, dtype sizes: the small pure functions of the public API. */
#include "gdn/gdn.h"

int gdn_version(void) { return GDN_VERSION_MAJOR * 10000 + GDN_VERSION_MINOR * 100 + GDN_VERSION_PATCH; }

const char *gdn_status_name(gdn_status status)
{
    switch (status) {
#define GDN__STATUS_NAME(name, value, text) \
    case GDN_##name: return #name;
        GDN_STATUS_MAP(GDN__STATUS_NAME)
#undef GDN__STATUS_NAME
    }
    return "UNKNOWN";
}

const char *gdn_status_string(gdn_status status)
{
    switch (status) {
#define GDN__STATUS_TEXT(name, value, text) \
    case GDN_##name: return text;
        GDN_STATUS_MAP(GDN__STATUS_TEXT)
#undef GDN__STATUS_TEXT
    }
    return "unknown status code";
}

size_t gdn_dtype_size(gdn_dtype dtype)
{
    switch (dtype) {
    case GDN_DTYPE_F32: return 4;
    case GDN_DTYPE_BF16: return 2;
    case GDN_DTYPE_F16: return 2;
    }
    return 0;
}
