/* Status codes, strings, version and dtype sizes. */
#include <criterion/criterion.h>
#include <string.h>

#include "gdn/gdn.h"

static const gdn_status all_codes[] = {
#define GDN__LIST(name, value, text) GDN_##name,
    GDN_STATUS_MAP(GDN__LIST)
#undef GDN__LIST
};

Test(status, every_code_has_a_distinct_name_and_text)
{
    const size_t n = sizeof all_codes / sizeof all_codes[0];
    cr_assert_gt(n, 20);
    for (size_t i = 0; i < n; i++) {
        cr_assert_str_neq(gdn_status_name(all_codes[i]), "UNKNOWN");
        cr_assert_gt(strlen(gdn_status_string(all_codes[i])), 5);
        for (size_t j = 0; j < i; j++) {
            cr_assert_neq(all_codes[i], all_codes[j], "two codes share a value");
            cr_assert_str_neq(gdn_status_name(all_codes[i]), gdn_status_name(all_codes[j]));
        }
        if (all_codes[i] != GDN_OK) cr_assert_lt(all_codes[i], 0, "errors are negative");
    }
    cr_assert_eq(GDN_OK, 0);
    cr_assert_str_eq(gdn_status_name(GDN_ESLOT_DUP), "ESLOT_DUP");
}

Test(status, unknown_code_is_named_unknown)
{
    cr_assert_str_eq(gdn_status_name((gdn_status)-999), "UNKNOWN");
    cr_assert_str_eq(gdn_status_string((gdn_status)-999), "unknown status code");
    cr_assert_str_eq(gdn_status_name((gdn_status)17), "UNKNOWN");
}

Test(status, version_and_dtype_sizes)
{
    cr_assert_eq(gdn_version(), GDN_VERSION_MAJOR * 10000 + GDN_VERSION_MINOR * 100 + GDN_VERSION_PATCH);
    cr_assert_eq(gdn_dtype_size(GDN_DTYPE_F32), 4);
    cr_assert_eq(gdn_dtype_size(GDN_DTYPE_BF16), 2);
    cr_assert_eq(gdn_dtype_size(GDN_DTYPE_F16), 2);
    cr_assert_eq(gdn_dtype_size((gdn_dtype)42), 0);
}
