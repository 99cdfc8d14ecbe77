/* args.h - command-line parsing helpers shared by the agentkv commands.
 *
 * Every command parses its own flags with these helpers; a bad value or an
 * unknown flag prints one line "agentkv CMD: ..." to stderr and the command
 * returns exit code 2.
 */
#ifndef AK_ARGS_H
#define AK_ARGS_H

#include <stdint.h>

#define AK_EXIT_USAGE 2

typedef struct {
    const char *cmd;   /* "run", "tokenize", ... for messages */
    int argc;
    char **argv;
    int i;             /* index of the next argument */
    int failed;        /* set once an error was printed */
} ak_args;

void args_init(ak_args *a, const char *cmd, int argc, char **argv);
/* Returns the next flag (e.g. "-m", "--temp") or NULL at the end. A
 * positional argument is returned as is; the caller decides. */
const char *args_next(ak_args *a);
/* Value of the flag just returned; prints an error and returns NULL if none. */
const char *args_value(ak_args *a, const char *flag);
/* Parse the value as a number within [lo, hi]; on error prints a one-line
 * message, sets a->failed and returns 0 (the caller checks a->failed). */
long long args_int(ak_args *a, const char *flag, long long lo, long long hi);
double args_float(ak_args *a, const char *flag, double lo, double hi);
/* Parses a comma-separated list of integers in [lo, hi] (e.g. "1024,4096")
 * into out (at most max entries); returns the count, or 0 after printing an
 * error and setting a->failed (empty list, bad number, too many entries). */
int args_int_list(ak_args *a, const char *flag, const char *list, long lo, long hi, int *out, int max);
/* Prints "agentkv CMD: unknown flag X (see agentkv CMD --help)" and sets failed. */
void args_unknown(ak_args *a, const char *flag);
/* Prints "agentkv CMD: <message>" and sets failed. */
void args_error(ak_args *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* 1 if stderr is a terminal (progress bars are drawn only then). */
int args_stderr_is_tty(void);

#endif
