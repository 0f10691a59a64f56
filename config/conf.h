/*
 * conf.h - kvpoold settings: one table of settings, INI files (libinih),
 * command-line flags, size parsing.
 *
 * Every setting is one entry of the table in conf.c (name, type, default,
 * min, max, unit, whether SIGHUP reloads it, help). The INI key is the
 * name; the flag is the name with dashes ("dram_capacity" ->
 * "--dram-capacity"); the environment variable is KVPOOL_ and the name in
 * capitals ("KVPOOL_DRAM_CAPACITY"). Precedence: flag > env > file >
 * default. Functions return 0 or a negative errno; on error they write a
 * one-line message naming the key, the source (file:line, --flag or
 * "env KVPOOL_NAME") and the reason into err[0..err_len).
 *
 * Threads: none of these functions keeps state; any thread may call them
 * on structs it owns.
 */
#ifndef KVPOOL_CONF_H
#define KVPOOL_CONF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum conf_log_level { CONF_LOG_ERROR = 0, CONF_LOG_WARN, CONF_LOG_INFO, CONF_LOG_DEBUG };

/* tls_only: refuse plaintext on the data port. Auto: on when a certificate
 * is set and listen is not a loopback address. */
enum conf_tls_only { CONF_TLS_ONLY_AUTO = 0, CONF_TLS_ONLY_OFF = 1, CONF_TLS_ONLY_ON = 2 };

/* nvme_admission: which blocks the NVMe tier takes when DRAM makes room. */
enum conf_admission { CONF_ADMIT_ALL = 0, CONF_ADMIT_REUSED = 1 };

/* Longest nvme_dir: a path (PATH_MAX with its NUL). */
#define CONF_PATH_MAX 4096

struct conf {
	char listen[256];                /* address to bind; default "127.0.0.1" */
	uint32_t port;                   /* TCP port; default 7470 */
	uint32_t threads;                /* worker threads; 0 in the file = number of cores */
	uint64_t dram_capacity_bytes;    /* DRAM arena; default 1 GiB; 1 MiB..4 TiB;
					  * conf_validate rounds it down to 4 KiB */
	uint64_t max_block_bytes;        /* default 64 MiB */
	uint32_t max_batch_blocks;       /* default 1024 */
	uint32_t max_frame_bytes;        /* header + body, payload excluded; default 1 MiB */
	uint32_t max_lease_ms;           /* default 5000 */
	uint32_t max_match_wait_ms;      /* cap on a MATCH's wait_ms (v2); default 30000 */
	uint32_t max_retain_ms;          /* cap on retain_ms (v2); default 86400000 (24 h) */
	uint32_t max_connections;        /* default 1024 */
	uint32_t idle_timeout_ms;        /* 0 = never; default 300000 */
	uint32_t payload_timeout_ms;     /* a stalled payload closes the connection; default 10000 */
	uint64_t max_inflight_put_bytes; /* default 512 MiB */
	int log_level;                   /* enum conf_log_level; default info */
	/* NVMe tier: none while nvme_dir is "" (the default). */
	char nvme_dir[CONF_PATH_MAX];    /* directory of segment files and index */
	uint64_t nvme_capacity_bytes;    /* segment bytes at most; 0 = unset (required
					  * with nvme_dir) */
	int nvme_admission;              /* enum conf_admission; default all */
	uint64_t nvme_segment_bytes;     /* 0 = automatic (the store picks) */
	uint32_t nvme_io_threads;        /* 0 = the store's default (2) */
	uint32_t rdma_port;              /* rdma_cm port; default 7472; 0 = no RDMA */
	/* Operations: admin HTTP, auth, shutdown. */
	uint32_t admin_port;             /* admin HTTP port on `listen`; default 7471;
					  * 0 = no admin HTTP */
	char tokens_file[CONF_PATH_MAX]; /* auth tokens file; "" (default) = no auth */
	uint32_t tenant_max_namespaces;  /* with auth: namespaces under one token's grants
					  * (tokens granting "*" exempt); 0 = no limit;
					  * default 64 */
	uint64_t tenant_max_bytes;       /* with auth: payload bytes of a token's namespaces;
					  * 0 (default) = no limit */
	uint64_t tenant_max_leased_bytes; /* with auth: leased bytes of a token's
					  * connections; 0 (default) = dram_capacity / 2 */
	uint64_t max_conn_leased_bytes;  /* leased bytes of one connection; 0 (default) =
					  * dram_capacity / 4 */
	uint64_t max_retained_bytes;     /* retained payload bytes per tenant (with auth)
					  * or namespace; 0 (default) = dram_capacity / 4 */
	uint64_t max_retained_total_bytes; /* retained payload bytes in the whole pool,
					  * whoever holds them; 0 (default) =
					  * dram_capacity / 2 */
	uint32_t max_conn_match_waits;   /* MATCHes waiting at once on one connection;
					  * default 64 */
	uint32_t tenant_max_match_waits; /* with auth: MATCHes waiting at once over one
					  * token's connections; 0 = no limit; default 4096 */
	uint64_t max_match_wait_bytes;   /* bytes all waiting MATCHes of the server may
					  * hold (their keys and records), with or
					  * without auth; 0 = no limit; default 64 MiB */
	int allow_unauthenticated;       /* bool (0/1): serve a non-loopback `listen`
					  * without tokens_file; default 0 */
	/* TLS on the data port (server/srv_tls.h, docs/security.md). */
	char tls_cert_file[CONF_PATH_MAX]; /* PEM certificate chain; "" (default) = no TLS */
	char tls_key_file[CONF_PATH_MAX];  /* PEM private key of it */
	char tls_client_ca_file[CONF_PATH_MAX]; /* PEM CAs; set: clients need a certificate */
	int tls_only;                    /* enum conf_tls_only; default auto */
	int allow_plaintext_tokens;      /* bool: accept a token over plaintext from a
					  * non-loopback peer; default 0 */
	int tls_allow_rdma;              /* bool: serve RDMA (no TLS) even with tls_only */
	uint32_t drain_timeout_ms;       /* SIGTERM/SIGINT: longest wait for requests
					  * in flight before closing; default 10000 */
	uint32_t nvme_drain_ms;          /* SIGTERM/SIGINT, then: longest time spent
					  * writing DRAM-only blocks to NVMe;
					  * default 10000; 0 = none */
	/* KV events (docs/events.md): off while kv_events_endpoint is "". */
	char kv_events_endpoint[256];    /* ZeroMQ PUB bind address; "" (default) = off */
	char kv_events_replay_endpoint[256]; /* ZeroMQ ROUTER bind address; "" = no replay */
	char kv_events_topic[128];       /* topic prefix; default "kvpool" */
	uint32_t kv_events_buffer;       /* batches kept for replay; default 1000 */
	uint32_t kv_events_queue;        /* events queued to the publisher; default 65536 */
	uint32_t kv_events_block_size;   /* tokens per block, the events' block_size; default 16 */
	uint64_t kv_events_replay_max_bytes; /* batch bytes of one replay answer; 0 = no bound */
	/* Several nodes (server/srv_etcd.c, docs/cluster.md). */
	char cluster[256];               /* "etcd://HOST[:PORT]/CLUSTER": register this
					  * node there; "" (default) = standalone */
	char node_name[129];             /* stable name in the cluster; "" = HOSTNAME:PORT */
	char advertise_address[256];     /* address clients use; "" = listen (the host
					  * name when listen is a wildcard) */
	uint32_t cluster_lease_s;        /* etcd lease of the registration; default 10 */
};

/* Fill *c with every default (threads = number of online cores). */
void conf_defaults(struct conf *c);

/* Parse a size: plain bytes or a number (decimals allowed, e.g. "1.5") and
 * a unit, case-insensitive: B, KB, MB, GB, TB (powers of 1000), KiB, MiB,
 * GiB, TiB (powers of 1024). Whitespace between number and unit is allowed.
 * A fraction needs a unit above B and is rounded down to a whole byte.
 * Errors: -EINVAL (NULL, empty, negative, not a number, unknown unit,
 * trailing junk, a fraction of a byte), -ERANGE (does not fit in 64 bits). */
int conf_parse_size(const char *text, uint64_t *out);

/* Apply one setting by name (underscore form) from `source` (e.g.
 * "kvpool.conf:12" or "--port"), validating type and range. threads = 0
 * means the number of online cores. *c is changed only on success.
 * Errors: -ENOENT (unknown key), -EINVAL (bad value or NULL value),
 * -ERANGE (out of range, or a number too big for its type). */
int conf_set(struct conf *c, const char *key, const char *value, const char *source,
	     char *err, size_t err_len);

/* Where setting `key` was last set from by conf_set (its `source`: a
 * flag, an environment variable, "file:line"), or "the default"; NULL for
 * an unknown key. For start-up messages; main thread only. */
const char *conf_source(const char *key);

/* Parse an INI file with libinih: keys at top level or in a [kvpoold]
 * section, as "key = value" or "key : value"; lines may be indented and
 * end in \n or \r\n. Comments: a line whose first non-blank character is
 * # or ;, and after a value, a # or ; preceded by a blank up to the end of
 * the line (the same for both characters). A line holds at most 199 bytes
 * besides its line end (libinih's line buffer, INI_MAX_LINE 200 in the
 * Debian build, less its NUL): a listen address longer than 192 bytes
 * must come from --listen. Each key may appear once per file (a later
 * --config file may set it again). *c is changed only on success.
 * Errors: -errno if the file cannot be opened, -EISDIR for a directory,
 * -EIO on a read error, or
 * the error of the first bad line, with "file:line:" in the message: a
 * conf_set error, -ENOENT (a key in another section), -EINVAL (syntax
 * error, a line longer than 199 bytes or holding a NUL byte, a key set
 * twice: the message names the earlier line), -ENOMEM. */
int conf_load_file(struct conf *c, const char *path, char *err, size_t err_len);

/* Parse argv (argv[0] is skipped): every "--config FILE" is loaded first,
 * in order, then every "--key value" or "--key=value" flag is applied on
 * top, wherever it stands. "--help" anywhere sets *want_help to 1 and
 * applies nothing; otherwise *want_help is set to 0. *c and *want_help are
 * written only on success.
 * Errors: as conf_load_file and conf_set, plus -ENOENT for an unknown flag
 * (even as the last argument: "unknown flag --bogus"), -EINVAL for a flag
 * without a value, a value given to --help ("--help=1"), or a stray
 * argument. */
int conf_from_args(struct conf *c, int argc, char **argv, int *want_help, char *err,
		   size_t err_len);

/* Apply every KVPOOL_<NAME> variable of envp (a NULL-terminated
 * "NAME=value" array, such as environ; NULL = none) on top of *c, with
 * "env KVPOOL_NAME" as the source. KVPOOL_CONFIG is skipped (conf_load
 * reads it). Any other KVPOOL_ variable that names no setting (the name
 * must be in capitals) gets a one-line notice on `warn` (NULL: silence)
 * and is ignored: the CLI and tests use such variables too. *c is changed
 * only on success. Errors: as conf_set. */
int conf_from_env(struct conf *c, char *const *envp, FILE *warn, char *err, size_t err_len);

/* Everything kvpoold does to get its settings, in precedence order:
 * defaults, the --config files (or, when argv has no --config, the file
 * named by KVPOOL_CONFIG in envp), the environment (conf_from_env), the
 * flags, then conf_validate. "--help" anywhere sets *want_help to 1 and
 * returns 0 with *c untouched; otherwise *want_help is set to 0. Used at
 * start and again on SIGHUP. *c is written only on success.
 * Errors: as conf_from_args, conf_from_env and conf_validate. */
int conf_load(struct conf *c, int argc, char **argv, char *const *envp, FILE *warn,
	      int *want_help, char *err, size_t err_len);

/* Is the setting `name` applied by SIGHUP to a running server? Returns 1
 * or 0, or -ENOENT for an unknown name. */
int conf_is_reloadable(const char *name);

/* Called by conf_reload for each setting whose value differs: its name,
 * the old and new values as conf_print writes them, and whether it was
 * applied (1, reloadable) or kept (0: takes a restart). */
typedef void conf_change_fn(void *arg, const char *name, const char *old_value,
			    const char *new_value, int applied);

/* Compare *cur with *next (both validated) setting by setting: copy every
 * reloadable setting that differs into *cur and report every difference
 * to fn (may be NULL), in table order. Settings that need a restart keep
 * their value in *cur. Returns the number of settings copied. */
int conf_reload(struct conf *cur, const struct conf *next, conf_change_fn *fn, void *arg);

/* Write the settings of *c as one JSON object, {"name": value, ...} in
 * table order: sizes and counts as numbers (bytes, ms), booleans as
 * true/false, strings and choices as strings ("" when unset). Writes at
 * most len bytes with a NUL (nothing when buf is NULL or len 0) and
 * returns the length of the whole document without its NUL, like
 * snprintf: a return >= len means it was cut. */
size_t conf_json(const struct conf *c, char *buf, size_t len);

/* Check every setting's range (for a struct filled by hand) and the
 * cross-setting rules, then round dram_capacity_bytes down to a multiple
 * of 4 KiB (the store's page) and write it back: the one change this makes
 * to *c, and only on success. Rules: max_block_bytes rounded up to 4 KiB
 * <= the rounded dram_capacity (a block takes whole pages),
 * max_inflight_put_bytes >= max_block_bytes, and max_frame_bytes >=
 * 32 + 8 + 88 * max_batch_blocks (a full PUT batch fits in a frame).
 * A nonzero rdma_port differs from port and admin_port (iWARP shares
 * TCP's port space); a nonzero admin_port differs from port.
 * A nonzero nvme_capacity needs nvme_dir (it would be ignored).
 * With nvme_dir set: nvme_capacity set (not 0); a nonzero
 * nvme_segment_size a multiple of 4 KiB and at least max_block_bytes
 * rounded up to 4 KiB; nvme_capacity at least two segments (with the
 * automatic size, two blocks of max_block_bytes in 4 KiB pages). Without
 * nvme_dir the other nvme_* settings are not checked against each other.
 * kv_events_replay_endpoint needs kv_events_endpoint, and differs from it.
 * cluster, when set, is etcd://HOST[:PORT]/NAME with a NAME of 1..64
 * bytes of [A-Za-z0-9._-]; node_name, when set, is 1..128 bytes of
 * [A-Za-z0-9._:-].
 * Call it once, after conf_from_args, before using the settings.
 * Errors: -EINVAL with a message (*c unchanged). */
int conf_validate(struct conf *c, char *err, size_t err_len);

/* Print usage: every setting with its flag, environment variable,
 * default, range, unit, whether SIGHUP reloads it, and help. The
 * text is the same on every machine (threads shows "0 (one per online
 * core)", not this machine's count). */
void conf_usage(FILE *out);

/* Print the effective settings, one "name value" line each, in a form
 * conf_set accepts back (sizes with the largest exact binary unit). */
void conf_print(const struct conf *c, FILE *out);

#endif /* KVPOOL_CONF_H */
