/*
 * main.c - `kvpool`, the command-line tool of the kvpool KV-cache pool:
 * main() and the dispatch to subcommands (cli.h).
 */
#include "cli.h"
#include "cli_opts.h"
#include "proto.h"

#include <stdio.h>
#include <string.h>

struct subcommand {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *summary;
};

static const struct subcommand subcommands[] = {
	{ "stats", cli_stats_main, "show the server's statistics (--json: as JSON)" },
	{ "put", cli_put_main, "store a file as a block" },
	{ "get", cli_get_main, "fetch a block" },
	{ "exists", cli_exists_main, "tell which blocks the pool holds" },
	{ "match", cli_match_main, "prefix match: how many leading blocks of a chain are held" },
	{ "delete", cli_delete_main, "remove blocks and their descendants" },
	{ "ping", cli_ping_main, "check that the server answers" },
	{ "replay", cli_replay_main, "replay a request trace and report hit ratios" },
	{ "bench", cli_bench_main, "measure put/get/exists/match throughput and latency" },
	{ "health", cli_health_main, "exit 0 if the pool serves, 1 otherwise" },
	{ "drop-namespace", cli_drop_main, "remove every block of a namespace" },
};

#define N_SUBCOMMANDS (sizeof(subcommands) / sizeof(subcommands[0]))

/* Top-level usage, on stdout for --help and on stderr for mistakes. */
static void usage(FILE *f)
{
	fprintf(f, "usage: kvpool COMMAND [options] [arguments]\n\ncommands:\n");
	for (size_t i = 0; i < N_SUBCOMMANDS; i++)
		fprintf(f, "  %-14s %s\n", subcommands[i].name, subcommands[i].summary);
	fprintf(f, "\nEvery command takes --server URL (default " KVPOOL_DEFAULT_URL
		   "; also rdma://host:port,\n"
		   "or auto://host:port: TCP, moving to RDMA when the server offers it),\n"
		   "--namespace NS and --timeout-ms N; KVPOOL_URL is the default --server,\n"
		   "KVPOOL_TOKEN the auth token. KEYs are 64 hex digits or text:STRING\n"
		   "(SHA-256 of STRING). Exit status: 0 success, 1 a miss or a refusal by\n"
		   "the server (at connect too), 2 an error. 'kvpool COMMAND --help'\n"
		   "describes a command; 'kvpool --version' prints the version.\n");
}

int main(int argc, char **argv)
{
	char prog[64];

	if (argc < 2) {
		usage(stderr);
		return CLI_EXIT_ERROR;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return CLI_EXIT_OK;
	}
	if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
		printf("kvpool %s (protocol %d..%d)\n", KVPOOL_VERSION, PROTO_VERSION_MIN,
		       PROTO_VERSION_MAX);
		return CLI_EXIT_OK;
	}
	for (size_t i = 0; i < N_SUBCOMMANDS; i++) {
		if (strcmp(argv[1], subcommands[i].name))
			continue;
		snprintf(prog, sizeof(prog), "kvpool %s", subcommands[i].name);
		argv[1] = prog;
		return subcommands[i].run(argc - 1, argv + 1);
	}
	fprintf(stderr, "kvpool: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return CLI_EXIT_ERROR;
}
