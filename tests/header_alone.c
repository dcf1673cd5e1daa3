/* Build check: the public header compiles by itself with -std=c11 -Wall -Wextra -Werror -pedantic. */
#include "gdn/gdn.h"
#include "gdn/gdn_op.h"

gdn_status gdn__header_check_status(void);
gdn_status gdn__header_check_status(void) { return GDN_OK; }
