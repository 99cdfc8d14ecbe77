/* commands.h - the agentkv subcommands. Each takes the arguments after its
 * name (argv[0] is the first flag) and returns the process exit code:
 * 0 success, 1 runtime error (bad file, ...), 2 usage error. */
#ifndef AK_COMMANDS_H
#define AK_COMMANDS_H

int cmd_run(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bench_kv(int argc, char **argv);   /* agentkv bench kv */
int cmd_cache(int argc, char **argv);
int cmd_pool(int argc, char **argv);        /* agentkv pool */
int cmd_card(int argc, char **argv);        /* agentkv card */
int cmd_memory(int argc, char **argv);      /* agentkv memory */
int cmd_bench_ttft(int argc, char **argv); /* agentkv bench ttft */
int cmd_bench_serve(int argc, char **argv); /* agentkv bench serve */
int cmd_bench_pools(int argc, char **argv); /* agentkv bench pools */
int cmd_bench_reuse(int argc, char **argv); /* agentkv bench reuse */
int cmd_bench_grammar(int argc, char **argv); /* agentkv bench grammar */

/* What bench grammar --decode runs (cmd_bench_grammar_decode.c): the model,
 * the schema, the batch sizes, tokens a step each, threads, repeats. */
typedef struct {
    const char *model, *schema;
    int batch[16], n_batch;
    int n_gen, n_threads, reps;
} bench_decode_opts;
/* Free vs constrained decode side by side, one table row per batch size.
 * Returns the exit code. */
int bench_grammar_decode(const bench_decode_opts *o);

#endif
