/*
 * cli.h - the subcommands of the kvpool command-line tool.
 *
 * Each takes the arguments after "kvpool" (argv[0] is "kvpool SUB", used in
 * messages), parses its own options, does its work and returns the process
 * exit code: 0 success, 1 a miss or a refusal, 2 an error (see cli_opts.h).
 * Single-threaded callers only (they use getopt).
 */
#ifndef KVPOOL_CLI_H
#define KVPOOL_CLI_H

int cli_stats_main(int argc, char **argv);   /* cli_stats.c */
int cli_put_main(int argc, char **argv);     /* cli_ops.c ... */
int cli_get_main(int argc, char **argv);
int cli_exists_main(int argc, char **argv);
int cli_match_main(int argc, char **argv);
int cli_delete_main(int argc, char **argv);
int cli_ping_main(int argc, char **argv);
int cli_replay_main(int argc, char **argv);  /* cli_replay.c */
int cli_bench_main(int argc, char **argv);   /* cli_bench.c */

#endif /* KVPOOL_CLI_H */
