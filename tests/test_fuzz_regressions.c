/*
 * The fuzz corpora replayed without libFuzzer (issue 17), one test per file so that the summary names
 * the input; GDN_FUZZ_TRACE=1 in the environment prints every call (run the suite binary with --filter
 * to pick one). A fixed set of pseudo-random inputs runs as well for each target, so that CI without
 * clang still exercises the drivers beyond the corpora.
 *   fuzz/corpus: every file of tests/fuzz_corpus/ (the hand-made seeds, gen_seeds.py's output, and each
 *     input a fuzzing run found a bug with) through the engine-API driver (tests/fuzz_driver.c), in
 *     strict mode: a library bug that is known but not fixed yet fails its input here.
 *   fuzz_op/corpus: every file of tests/fuzz_corpus_op/ through the op-layer driver
 *     (tests/fuzz_op_driver.c). That driver knows library bugs that are not fixed yet (its known_bug
 *     list) and steps around each where an input would show it; an input that steps around nothing
 *     has run exactly as strictly as in strict mode. The inputs named open-bug-* each show one open
 *     bug: they must still step around one (a note on stderr names it). Once the library is fixed,
 *     drop the entry from known_bug and rename the input crash-*. (Strictly, an open bug's input
 *     fails with the driver's message, or under the sanitizers aborts: GDN_FUZZ_STRICT=1
 *     scripts/fuzz.sh replay tests/fuzz_corpus_op/open-bug-... shows it.)
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_driver.h"
#include "fuzz_op_driver.h"
#include "kernels/ref/gdn_spec.h"

#ifndef GDN_FUZZ_CORPUS_DIR
#error "GDN_FUZZ_CORPUS_DIR (tests/fuzz_corpus) must be defined by the build"
#endif
#ifndef GDN_FUZZ_OP_CORPUS_DIR
#error "GDN_FUZZ_OP_CORPUS_DIR (tests/fuzz_corpus_op) must be defined by the build"
#endif

/* Files of the corpus directory that are not inputs. */
static int is_input(const char *name)
{
    if (name[0] == '.') return 0;
    const size_t n = strlen(name);
    if (strncmp(name, "README", 6) == 0) return 0;
    if (n > 3 && strcmp(name + n - 3, ".py") == 0) return 0;
    return 1;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A corpus folder's input names, sorted (the caller frees with free_names). */
static char **corpus_names_in(const char *folder, size_t *count)
{
    size_t n = 0, cap = 64;
    char **names = malloc(cap * sizeof *names);
    DIR *dir = opendir(folder);
    if (dir) {
        struct dirent *entry;
        while ((entry = readdir(dir)) != NULL) {
            if (!is_input(entry->d_name)) continue;
            if (n == cap) names = realloc(names, (cap *= 2) * sizeof *names);
            names[n++] = strdup(entry->d_name);
        }
        closedir(dir);
    }
    qsort(names, n, sizeof *names, by_name);
    *count = n;
    return names;
}

static char **corpus_names(size_t *count) { return corpus_names_in(GDN_FUZZ_CORPUS_DIR, count); }

static void free_names(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
}

typedef struct corpus_param {
    char *name;
} corpus_param;

static void free_params(struct criterion_test_params *crp)
{
    corpus_param *params = crp->params;
    for (size_t i = 0; i < crp->length; i++) cr_free(params[i].name);
    cr_free(params);
}

static struct criterion_test_params corpus_params(const char *folder)
{
    size_t n = 0;
    char **names = corpus_names_in(folder, &n);
    corpus_param *params = cr_malloc((n ? n : 1) * sizeof *params);
    for (size_t i = 0; i < n; i++) {
        params[i].name = cr_malloc(strlen(names[i]) + 1);
        strcpy(params[i].name, names[i]);
    }
    free_names(names, n);
    return cr_make_param_array(corpus_param, params, n, free_params);
}

ParameterizedTestParameters(fuzz, corpus) { return corpus_params(GDN_FUZZ_CORPUS_DIR); }

static unsigned char *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    size_t cap = 4096, n = 0;
    unsigned char *buf = malloc(cap);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    *size = n;
    return buf;
}

ParameterizedTest(corpus_param *param, fuzz, corpus)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", GDN_FUZZ_CORPUS_DIR, param->name);
    size_t size = 0;
    unsigned char *data = read_file(path, &size);
    gdn_fuzz_result result;
    const int failed = gdn_fuzz_run_one(data, size, GDN_FUZZ_STRICT, &result);
    free(data);
    cr_assert(!failed, "%s: %s", param->name, result.message);
}

Test(fuzz, corpus_is_there_and_reaches_the_engine)
{
    size_t n = 0;
    char **names = corpus_names(&n);
    cr_assert_geq(n, 10, "tests/fuzz_corpus holds %zu inputs", n);
    int32_t created = 0, steps = 0, commits = 0, refusals = 0;
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", GDN_FUZZ_CORPUS_DIR, names[i]);
        size_t size = 0;
        unsigned char *data = read_file(path, &size);
        gdn_fuzz_result r;
        (void)gdn_fuzz_run_one(data, size, 0, &r); /* failures are the corpus test's business */
        free(data);
        created += r.created, steps += r.steps_run, commits += r.commits, refusals += r.refusals;
    }
    free_names(names, n);
    cr_assert_geq(created, 5, "only %d corpus inputs create an engine", created);
    cr_assert_geq(steps, 20, "the corpus runs only %d layer steps", steps);
    cr_assert_geq(commits, 5, "the corpus commits only %d verify steps", commits);
    cr_assert_geq(refusals, 20, "the corpus checks only %d refusals", refusals);
}

/* Inputs from a fixed seed: a valid configuration header (most of the time) and random operations. */
Test(fuzz, pseudo_random_inputs)
{
    gdn__rng rng = gdn__rng_seeded(17);
    unsigned char data[384];
    int32_t created = 0;
    for (int input = 0; input < 300; input++) {
        const size_t size = 16 + (size_t)(gdn__rng_next(&rng) % (sizeof data - 16));
        for (size_t i = 0; i < size; i++) data[i] = (unsigned char)gdn__rng_next(&rng);
        data[10] |= 0x80; /* b_inv >= 40: a valid configuration */
        if (input % 10 == 0) data[10] = (unsigned char)(input % 40); /* and some invalid ones */
        gdn_fuzz_result r;
        const int failed = gdn_fuzz_run_one(data, size, 0, &r);
        cr_assert(!failed, "pseudo-random input %d (seed 17): %s", input, r.message);
        created += r.created;
    }
    cr_assert_geq(created, 200);
}

/* ---- the op-layer corpus (tests/fuzz_corpus_op/, tests/fuzz_op_driver.c) ---- */

ParameterizedTestParameters(fuzz_op, corpus) { return corpus_params(GDN_FUZZ_OP_CORPUS_DIR); }

ParameterizedTest(corpus_param *param, fuzz_op, corpus)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", GDN_FUZZ_OP_CORPUS_DIR, param->name);
    size_t size = 0;
    unsigned char *data = read_file(path, &size);
    const int open_bug = strncmp(param->name, "open-bug-", 9) == 0;
    gdn_fuzz_op_result result;
    const int failed = gdn_fuzz_op_run_one(data, size, 0, &result);
    free(data);
    cr_assert(!failed, "%s: %s", param->name, result.message);
    if (open_bug) {
        cr_assert_neq(result.known_bugs_hit, 0u, "%s shows no open bug: is it fixed (see this file's top)?", param->name);
        for (int i = 0; gdn_fuzz_op_known_bug(i); i++)
            if (result.known_bugs_hit >> i & 1) /* (stderr: a Criterion warning would fail the suite's exit status) */
                fprintf(stderr, "[NOTE] %s: open library bug: %s\n", param->name, gdn_fuzz_op_known_bug(i));
    }
}

Test(fuzz_op, corpus_is_there_and_reaches_the_op_layer)
{
    size_t n = 0;
    char **names = corpus_names_in(GDN_FUZZ_OP_CORPUS_DIR, &n);
    cr_assert_geq(n, 10, "tests/fuzz_corpus_op holds %zu inputs", n);
    int32_t steps = 0, commits = 0, slot_ops = 0, refusals = 0;
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", GDN_FUZZ_OP_CORPUS_DIR, names[i]);
        size_t size = 0;
        unsigned char *data = read_file(path, &size);
        gdn_fuzz_op_result r;
        (void)gdn_fuzz_op_run_one(data, size, 0, &r); /* failures are the corpus test's business */
        free(data);
        steps += r.steps_run, commits += r.commits, slot_ops += r.slot_ops, refusals += r.refusals;
    }
    free_names(names, n);
    cr_assert_geq(steps, 50, "the op corpus runs only %d layer steps", steps);
    cr_assert_geq(commits, 10, "the op corpus commits only %d verify steps", commits);
    cr_assert_geq(slot_ops, 50, "the op corpus runs only %d slot operations", slot_ops);
    cr_assert_geq(refusals, 50, "the op corpus checks only %d refusals", refusals);
}

/* Inputs from a fixed seed (every header decodes to a valid geometry; invalid fields come per call). */
Test(fuzz_op, pseudo_random_inputs)
{
    gdn__rng rng = gdn__rng_seeded(23);
    unsigned char data[320];
    int32_t steps = 0;
    for (int input = 0; input < 120; input++) {
        const size_t size = 9 + (size_t)(gdn__rng_next(&rng) % (sizeof data - 9));
        for (size_t i = 0; i < size; i++) data[i] = (unsigned char)gdn__rng_next(&rng);
        gdn_fuzz_op_result r;
        const int failed = gdn_fuzz_op_run_one(data, size, 0, &r);
        cr_assert(!failed, "pseudo-random op input %d (seed 23): %s", input, r.message);
        steps += r.steps_run;
    }
    cr_assert_geq(steps, 100);
}
