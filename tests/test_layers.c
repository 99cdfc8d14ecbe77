/* test_layers.c - the layer rule (scripts/check-layers.sh): the real tree
 * and README pass; a tree with an include of a higher layer, an include
 * without a layer, a loose source file and a folder outside the table fails,
 * naming each file and line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "base/util.h"
#include "test.h"

/* Runs check-layers.sh on args; returns its exit code and output (malloc'd). */
static int check(const char *args, char **out) {
    char log[512], cmd[1024];
    snprintf(log, sizeof log, "%s/layers.log", test_tmp_dir());
    snprintf(cmd, sizeof cmd, "sh scripts/check-layers.sh %s >%s 2>&1", args, log);
    int st = system(cmd);
    *out = ak_read_file(log, NULL, NULL);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

TEST(layers_rule_holds_and_catches_bad_includes) {
    char *out = NULL;
    CHECK(check("src README.md", &out) == 0, "the tree breaks the layer rule:\n%s", out ? out : "");
    free(out);
    char root[512], p[600];
    snprintf(root, sizeof root, "%s/layers-src", test_tmp_dir());
    static const char *const dirs[] = {"", "/base", "/serve", "/kv", "/extra"};
    for (int i = 0; i < 5; i++) {
        snprintf(p, sizeof p, "%s%s", root, dirs[i]);
        mkdir(p, 0700);
    }
    snprintf(p, sizeof p, "%s/base/low.c", root);
    write_file(p, "#include <stdio.h>\n#include \"base/low.h\"\n#include \"serve/server.h\"\n");
    snprintf(p, sizeof p, "%s/kv/mid.h", root);
    write_file(p, "#include \"util.h\"\n#include \"base/util.h\"\n");
    snprintf(p, sizeof p, "%s/serve/top.c", root);
    write_file(p, "#include \"kv/mid.h\"\n#include \"base/low.h\"\n");
    snprintf(p, sizeof p, "%s/loose.c", root);
    write_file(p, "int x;\n");
    char args[600];
    snprintf(args, sizeof args, "%s", root);
    int rc = check(args, &out);
    const char *o = out ? out : "";
    CHECK(rc == 1, "a bad tree passed (exit %d):\n%s", rc, o);
    CHECK(strstr(o, "base/low.c:3: layer base may not include serve/server.h"), "the upward include not named:\n%s", o);
    CHECK(strstr(o, "kv/mid.h:1: #include \"util.h\" names no layer"), "the include without a layer not named:\n%s", o);
    CHECK(strstr(o, "loose.c:1: a source file outside the layer folders"), "the loose file not named:\n%s", o);
    CHECK(strstr(o, "extra:1: folder 'extra' is not a layer"), "the unknown folder not named:\n%s", o);
    CHECK(!strstr(o, "serve/top.c"), "allowed includes refused:\n%s", o);
    CHECK(strstr(o, "4 violation(s)"), "not exactly four violations:\n%s", o);
    free(out);
}
