/* The serving-loop check (serving_loop_check.c): returns 0 when every check passed, 1 on a failed
 * check, 2 on a bad argument; exits with 1 on an API error. argv[0] is ignored. */
#ifndef GDN_TESTS_SERVING_LOOP_CHECK_H
#define GDN_TESTS_SERVING_LOOP_CHECK_H

int gdn_serving_loop_check(int argc, char **argv);

#endif
