/*
 * conf.c - kvpoold settings: one table, conf_set and the defaults, and
 * the table's output (--help, the printed settings, SIGHUP reload, JSON).
 * Values are parsed in conf_value.c, read from files, flags and the
 * environment in conf_source.c and checked across settings in conf_check.c.
 *
 * Everything about a setting is said once, in settings[] below: its INI
 * key, its flag (the key with dashes), its type, default, range and help.
 * Defaults are INI text parsed by the same code as files and flags, so a
 * default can never escape the checks a user value gets.
 */
#include "conf_impl.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <strings.h>
#include <unistd.h>

#define FIELD(f) offsetof(struct conf, f), sizeof(((struct conf *)0)->f)

static const char *const log_level_names[] = { "error", "warn", "info", "debug" };
static const struct conf_choices log_levels = { "log level", log_level_names, 4 };
/* Indexed by enum conf_admission. */
static const char *const admission_names[] = { "all", "reused" };
static const char *const tls_only_names[] = { "auto", "false", "true" };
static const struct conf_choices tls_only_choices = {
	"tls_only value (auto, true or false)", tls_only_names, 3,
};
static const struct conf_choices admissions = { "admission", admission_names, 2 };

static const struct conf_setting settings[] = {
	{ "listen", CONF_STRING, FIELD(listen), "127.0.0.1", 1, 255, 0, "ADDR",
	  "address to listen on (IPv4, IPv6 or host name)", NULL, NULL },
	{ "port", CONF_U32, FIELD(port), "7470", 1, 65535, 0, "N",
	  "TCP port", NULL, NULL },
	{ "threads", CONF_U32, FIELD(threads), "0", 1, CONF_THREADS_MAX, CONF_ZERO_IS_CORES, "N",
	  "worker threads, each with its own event loop", NULL, "threads" },
	{ "dram_capacity", CONF_SIZE, FIELD(dram_capacity_bytes), "1GiB", MIB, 4 * TIB, 0, "SIZE",
	  "DRAM arena for block payloads, allocated at start; rounded down to 4KiB pages", NULL,
	  "bytes" },
	{ "max_block_bytes", CONF_SIZE, FIELD(max_block_bytes), "64MiB", 1, 4 * GIB, 0, "SIZE",
	  "largest block a PUT may store", NULL, "bytes" },
	{ "max_batch_blocks", CONF_U32, FIELD(max_batch_blocks), "1024", 1, 65536, 0, "N",
	  "blocks per batch request", NULL, "blocks" },
	{ "max_frame_bytes", CONF_SIZE, FIELD(max_frame_bytes), "1MiB", 4 * KIB, GIB, 0, "SIZE",
	  "largest frame header + body (block payload not counted)", NULL, "bytes" },
	{ "max_lease_ms", CONF_U32, FIELD(max_lease_ms), "5000", 0, 3600000, 0, "MS",
	  "longest MATCH lease; 0 = MATCH never leases", NULL, "ms" },
	{ "max_match_wait_ms", CONF_U32, FIELD(max_match_wait_ms), "30000", 0, 3600000, CONF_RELOAD,
	  "MS",
	  "longest wait a MATCH may ask for (protocol v2 wait_ms; longer asks are cut to it); "
	  "0 = MATCH never waits", NULL, "ms" },
	{ "max_retain_ms", CONF_U32, FIELD(max_retain_ms), "86400000", 0, 2592000000u, 0, "MS",
	  "longest retention a PUT or MATCH may ask for (protocol v2 retain_ms; longer asks "
	  "are cut to it); 0 = no retention", NULL, "ms" },
	{ "max_connections", CONF_U32, FIELD(max_connections), "1024", 1, 1048576, CONF_RELOAD,
	  "N",
	  "open client connections; more are refused with BUSY", NULL, "connections" },
	{ "idle_timeout_ms", CONF_U32, FIELD(idle_timeout_ms), "300000", 0, 86400000, CONF_RELOAD,
	  "MS",
	  "close a connection idle this long; 0 = never", NULL, "ms" },
	{ "payload_timeout_ms", CONF_U32, FIELD(payload_timeout_ms), "10000", 10, 3600000,
	  CONF_RELOAD, "MS",
	  "close a connection whose frame is not whole this long after its first byte", NULL,
	  "ms" },
	{ "max_inflight_put_bytes", CONF_SIZE, FIELD(max_inflight_put_bytes), "512MiB", 1, 256 * TIB,
	  0, "SIZE", "PUT payload bytes being received at once; beyond it PUT answers BUSY", NULL,
	  "bytes" },
	{ "log_level", CONF_CHOICE, FIELD(log_level), "info", CONF_LOG_ERROR, CONF_LOG_DEBUG,
	  CONF_RELOAD, "LEVEL", "error, warn, info or debug", &log_levels, NULL },
	{ "nvme_dir", CONF_STRING, FIELD(nvme_dir), "", 0, CONF_PATH_MAX - 1,
	  CONF_SPACES_OK | CONF_EMPTY_UNSET, "DIR",
	  "existing directory for the NVMe tier's segment files and index; unset = no NVMe tier",
	  NULL, NULL },
	{ "nvme_capacity", CONF_SIZE, FIELD(nvme_capacity_bytes), "0", 0, 1024 * TIB, 0, "SIZE",
	  "segment file bytes the NVMe tier may use; required with nvme_dir", NULL, "bytes" },
	{ "nvme_admission", CONF_CHOICE, FIELD(nvme_admission), "all", CONF_ADMIT_ALL,
	  CONF_ADMIT_REUSED, 0, "WHICH",
	  "blocks leaving DRAM that go to NVMe: all, or reused (used at least once after their put)",
	  &admissions, NULL },
	{ "nvme_segment_size", CONF_SIZE, FIELD(nvme_segment_bytes), "0", 0, 16 * GIB, 0, "SIZE",
	  "NVMe segment file size, rounded down to 4KiB and raised to one max_block_bytes block; "
	  "0 = automatic: 256MiB, or nvme_capacity/8 when smaller (nvme_capacity must hold two)",
	  NULL, "bytes" },
	{ "nvme_io_threads", CONF_U32, FIELD(nvme_io_threads), "0", 0, 64, 0, "N",
	  "NVMe demotion and promotion threads; 0 = 2", NULL, "threads" },
	{ "rdma_port", CONF_U32, FIELD(rdma_port), "7472", 0, 65535, 0, "N",
	  "RDMA (rdma_cm) port, served when an RDMA device is usable; 0 = TCP only", NULL,
	  NULL },
	{ "admin_port", CONF_U32, FIELD(admin_port), "7471", 0, 65535, 0, "N",
	  "admin HTTP port (/metrics, /healthz, /stats) on the listen address; 0 = off", NULL,
	  NULL },
	{ "tokens_file", CONF_STRING, FIELD(tokens_file), "", 0, CONF_PATH_MAX - 1,
	  CONF_SPACES_OK | CONF_EMPTY_UNSET | CONF_RELOAD, "FILE",
	  "auth tokens file (not readable by group or others); unset = no authentication", NULL,
	  NULL },
	{ "tenant_max_namespaces", CONF_U32, FIELD(tenant_max_namespaces), "64", 0, 4096, 0, "N",
	  "with tokens_file: namespaces that may exist under one token's grants before its PUT "
	  "to a new one answers QUOTA; tokens granting * are exempt; 0 = no limit", NULL,
	  "namespaces" },
	{ "tenant_max_bytes", CONF_SIZE, FIELD(tenant_max_bytes), "0", 0, 1024 * TIB, 0, "SIZE",
	  "with tokens_file: payload bytes of all the namespaces a token created, both tiers; a "
	  "PUT past it evicts that namespace's own oldest blocks, then answers QUOTA; 0 = no limit",
	  NULL, "bytes" },
	{ "tenant_max_leased_bytes", CONF_SIZE, FIELD(tenant_max_leased_bytes), "0", 0, 1024 * TIB,
	  0, "SIZE",
	  "with tokens_file: bytes all of one token's connections may hold leased; a MATCH whose "
	  "lease would pass it answers the longest leading run whose lease fits (LEASE_CUT); 0 = "
	  "half of dram_capacity; dram_capacity or more = no bound", NULL, "bytes" },
	{ "max_conn_leased_bytes", CONF_SIZE, FIELD(max_conn_leased_bytes), "0", 0, 1024 * TIB, 0,
	  "SIZE",
	  "bytes one connection may hold leased; a MATCH whose lease would pass it answers the "
	  "longest leading run whose lease fits (LEASE_CUT); 0 = a quarter of dram_capacity; "
	  "dram_capacity or more = no bound", NULL, "bytes" },
	{ "max_retained_bytes", CONF_SIZE, FIELD(max_retained_bytes), "0", 0, 1024 * TIB, 0, "SIZE",
	  "payload bytes one tenant (with tokens_file; a token may set its own) or else one "
	  "namespace may hold retained; a retention past it is refused and the block stored "
	  "without it; 0 = a quarter of dram_capacity", NULL, "bytes" },
	{ "max_retained_total_bytes", CONF_SIZE, FIELD(max_retained_total_bytes), "0", 0,
	  1024 * TIB, 0, "SIZE",
	  "payload bytes the whole pool may hold retained, over every tenant and namespace, so "
	  "that ordinary blocks always have room; a retention past it is refused as for the "
	  "budget; 0 = half of dram_capacity; dram_capacity or more = no pool-wide bound",
	  NULL, "bytes" },
	{ "max_conn_match_waits", CONF_U32, FIELD(max_conn_match_waits), "64", 1, 65536, CONF_RELOAD,
	  "N",
	  "MATCHes one connection may have waiting for blocks at once; one more answers at once "
	  "without waiting", NULL, "matches" },
	{ "tenant_max_match_waits", CONF_U32, FIELD(tenant_max_match_waits), "4096", 0, 1048576,
	  CONF_RELOAD, "N",
	  "with tokens_file: MATCHes all of one token's connections may have waiting at once; one "
	  "more answers at once without waiting; 0 = no limit", NULL, "matches" },
	{ "max_match_wait_bytes", CONF_SIZE, FIELD(max_match_wait_bytes), "64MiB", 0, 1024 * GIB,
	  CONF_RELOAD, "SIZE",
	  "memory all waiting MATCHes of the server may hold (each keeps its keys, 32 bytes "
	  "each, and a record); one more answers at once without waiting; applies without "
	  "tokens_file too; 0 = no limit", NULL, "bytes" },
	{ "allow_unauthenticated", CONF_BOOL, FIELD(allow_unauthenticated), "false", 0, 1, 0,
	  "BOOL", "serve a non-loopback listen address without tokens_file", NULL, NULL },
	{ "tls_cert_file", CONF_STRING, FIELD(tls_cert_file), "", 0, CONF_PATH_MAX - 1,
	  CONF_SPACES_OK | CONF_EMPTY_UNSET | CONF_RELOAD, "FILE",
	  "PEM certificate chain (leaf first) for TLS on the data port; unset = no TLS; SIGHUP "
	  "loads it again", NULL, NULL },
	{ "tls_key_file", CONF_STRING, FIELD(tls_key_file), "", 0, CONF_PATH_MAX - 1,
	  CONF_SPACES_OK | CONF_EMPTY_UNSET | CONF_RELOAD, "FILE",
	  "PEM private key of tls_cert_file (others may not read it)", NULL, NULL },
	{ "tls_client_ca_file", CONF_STRING, FIELD(tls_client_ca_file), "", 0, CONF_PATH_MAX - 1,
	  CONF_SPACES_OK | CONF_EMPTY_UNSET | CONF_RELOAD, "FILE",
	  "PEM CA certificates: TLS clients must present a certificate one of them signed; "
	  "unset = any client", NULL, NULL },
	{ "tls_only", CONF_CHOICE, FIELD(tls_only), "auto", CONF_TLS_ONLY_AUTO, CONF_TLS_ONLY_ON, 0,
	  "WHEN", "refuse plaintext clients on the data port: true, false, or auto (true when "
	  "tls_cert_file is set and listen is not a loopback address)", &tls_only_choices, NULL },
	{ "allow_plaintext_tokens", CONF_BOOL, FIELD(allow_plaintext_tokens), "false", 0, 1, 0,
	  "BOOL", "with tokens_file: accept tokens over plaintext from peers that are not on "
	  "loopback (else such a HELLO is refused, and a non-loopback listen needs TLS)", NULL,
	  NULL },
	{ "tls_allow_rdma", CONF_BOOL, FIELD(tls_allow_rdma), "false", 0, 1, 0, "BOOL",
	  "serve RDMA, which carries no TLS, even when tls_only is in force", NULL, NULL },
	{ "drain_timeout_ms", CONF_U32, FIELD(drain_timeout_ms), "10000", 0, 3600000, CONF_RELOAD,
	  "MS",
	  "on SIGTERM or SIGINT, wait this long at most for requests in flight", NULL, "ms" },
	{ "nvme_drain_ms", CONF_U32, FIELD(nvme_drain_ms), "10000", 0, 3600000, 0, "MS",
	  "on SIGTERM or SIGINT, after the requests: spend this long at most writing DRAM-only "
	  "blocks to NVMe, retained ones first, then hottest first, so a restart finds them; "
	  "0 = none", NULL, "ms" },
	{ "kv_events_endpoint", CONF_STRING, FIELD(kv_events_endpoint), "", 0, 255, CONF_EMPTY_UNSET,
	  "ADDR", "ZeroMQ PUB address to bind for KV events (e.g. tcp://127.0.0.1:5557); "
	  "unset = no events", NULL, NULL },
	{ "kv_events_replay_endpoint", CONF_STRING, FIELD(kv_events_replay_endpoint), "", 0, 255,
	  CONF_EMPTY_UNSET, "ADDR",
	  "ZeroMQ ROUTER address to bind for KV-event replay; unset = no replay", NULL, NULL },
	{ "kv_events_topic", CONF_STRING, FIELD(kv_events_topic), "kvpool", 1, 100, 0, "TOPIC",
	  "KV-event topic prefix; each batch's topic is TOPIC.NAMESPACE", NULL, NULL },
	{ "kv_events_buffer", CONF_U32, FIELD(kv_events_buffer), "1000", 1, 1000000, 0, "N",
	  "KV-event batches kept for replay", NULL, "batches" },
	{ "kv_events_queue", CONF_U32, FIELD(kv_events_queue), "65536", 1, 16777216, 0, "N",
	  "KV events queued to the publisher thread; more are dropped and counted", NULL,
	  "events" },
	{ "kv_events_block_size", CONF_U32, FIELD(kv_events_block_size), "16", 1, 1048576, 0, "N",
	  "tokens per block, sent as the KV events' block_size", NULL, "tokens" },
	{ "kv_events_replay_max_bytes", CONF_SIZE, FIELD(kv_events_replay_max_bytes), "64MiB", 0,
	  64 * GIB, 0, "SIZE",
	  "batch bytes one KV-event replay answer carries at most (then its end marker: ask "
	  "again from the next sequence); 0 = no bound", NULL, "bytes" },
	{ "cluster", CONF_STRING, FIELD(cluster), "", 0, 255, CONF_EMPTY_UNSET, "URL",
	  "etcd://HOST[:PORT][,HOST[:PORT]...]/CLUSTER: register this node in that cluster's "
	  "etcd (several members: calls fail over between them); unset = standalone", NULL,
	  NULL },
	{ "node_name", CONF_STRING, FIELD(node_name), "", 0, 128, CONF_EMPTY_UNSET, "NAME",
	  "this node's stable name in the cluster (placement uses it); unset = HOSTNAME:PORT",
	  NULL, NULL },
	{ "advertise_address", CONF_STRING, FIELD(advertise_address), "", 0, 255,
	  CONF_EMPTY_UNSET, "ADDR",
	  "address clients reach this node at, as registered; unset = listen (the host name "
	  "when listen is 0.0.0.0 or ::)", NULL, NULL },
	{ "cluster_lease_s", CONF_U32, FIELD(cluster_lease_s), "10", 2, 3600, 0, "S",
	  "etcd lease of the registration, renewed every third of it", NULL, "s" },
};

#define N_SETTINGS (sizeof(settings) / sizeof(settings[0]))

_Static_assert(N_SETTINGS <= CONF_SETTINGS_MAX, "CONF_SETTINGS_MAX is too small");

const struct conf_setting *const conf_settings = settings;
const size_t conf_n_settings = N_SETTINGS;

/* ---- small helpers ------------------------------------------------------ */

/* Format a message into err[0..err_len) if the caller gave a buffer. */
__attribute__((format(printf, 3, 4)))
void conf_err(char *err, size_t err_len, const char *fmt, ...)
{
	va_list ap;

	if (!err || !err_len)
		return;
	va_start(ap, fmt);
	vsnprintf(err, err_len, fmt, ap);
	va_end(ap);
}

const struct conf_setting *conf_find(const char *key)
{
	for (size_t i = 0; i < N_SETTINGS; i++)
		if (strcmp(settings[i].name, key) == 0)
			return &settings[i];
	return NULL;
}

/* ---- reading and writing fields ----------------------------------------- */

uint64_t conf_field_get(const struct conf *c, const struct conf_setting *s)
{
	const char *p = (const char *)c + s->offset;

	if (s->type == CONF_CHOICE || s->type == CONF_BOOL) {
		int v;

		memcpy(&v, p, sizeof(v));
		return (uint64_t)(int64_t)v;
	}
	if (s->field_bytes == sizeof(uint32_t)) {
		uint32_t v;

		memcpy(&v, p, sizeof(v));
		return v;
	}
	uint64_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static void field_set(struct conf *c, const struct conf_setting *s, uint64_t v)
{
	char *p = (char *)c + s->offset;

	if (s->type == CONF_CHOICE || s->type == CONF_BOOL) {
		int iv = (int)v;

		memcpy(p, &iv, sizeof(iv));
	} else if (s->field_bytes == sizeof(uint32_t)) {
		uint32_t v32 = (uint32_t)v; /* the table's max keeps it in range */

		memcpy(p, &v32, sizeof(v32));
	} else {
		memcpy(p, &v, sizeof(v));
	}
}

/* A setting's value as text that conf_set accepts back. */
static void format_value(const struct conf *c, const struct conf_setting *s, char *buf, size_t len)
{
	uint64_t v;

	switch (s->type) {
	case CONF_STRING:
		snprintf(buf, len, "%s", (const char *)c + s->offset);
		return;
	case CONF_CHOICE:
		v = conf_field_get(c, s);
		snprintf(buf, len, "%s", v < s->choices->count ? s->choices->names[v] : "?");
		return;
	case CONF_BOOL:
		snprintf(buf, len, "%s", conf_field_get(c, s) ? "true" : "false");
		return;
	case CONF_SIZE:
		conf_format_size(conf_field_get(c, s), buf, len);
		return;
	case CONF_U32:
		snprintf(buf, len, "%" PRIu64, conf_field_get(c, s));
		return;
	}
}

/* ---- conf_set and defaults ---------------------------------------------- */

/* Where each setting was last set from ("--port", "KVPOOL_PORT",
 * "/etc/kvpool/kvpool.conf:12"), for start-up messages (conf_source).
 * Main thread only, as conf_set. */
static char set_by[N_SETTINGS][96];

const char *conf_source(const char *key)
{
	const struct conf_setting *s = key ? conf_find(key) : NULL;

	if (!s)
		return NULL;
	return set_by[s - settings][0] ? set_by[s - settings] : "the default";
}

int conf_set(struct conf *c, const char *key, const char *value, const char *source,
	     char *err, size_t err_len)
{
	const struct conf_setting *s = key ? conf_find(key) : NULL;
	char why[160];
	uint64_t v;
	int rc;

	if (!source)
		source = "?";
	if (!s) {
		conf_err(err, err_len, "%s: unknown key '%.64s'", source, key ? key : "");
		return -ENOENT;
	}
	if (!value) {
		conf_err(err, err_len, "%s: %s: missing value", source, s->name);
		return -EINVAL;
	}
	if (s->type == CONF_STRING)
		rc = conf_string_check(s, value, why, sizeof(why));
	else
		rc = conf_parse_number(s, value, &v, why, sizeof(why));
	if (rc) {
		conf_err(err, err_len, "%s: %s: %s: '%.64s'", source, s->name, why, value);
		return rc;
	}
	if (s->type == CONF_STRING)
		memcpy((char *)c + s->offset, value, strlen(value) + 1);
	else
		field_set(c, s, v);
	snprintf(set_by[s - settings], sizeof(set_by[0]), "%s", source);
	return 0;
}

void conf_defaults(struct conf *c)
{
	memset(c, 0, sizeof(*c));
	for (size_t i = 0; i < N_SETTINGS; i++) {
		int rc = conf_set(c, settings[i].name, settings[i].def, "default", NULL, 0);

		assert(rc == 0); /* the table's defaults are unit-tested */
		(void)rc;
	}
}

/* ---- output ---------------------------------------------------------------- */

static void flag_name(const struct conf_setting *s, char *buf, size_t len)
{
	size_t n = strlen(s->name);

	if (n + 3 > len)
		n = len - 3;
	buf[0] = buf[1] = '-';
	for (size_t i = 0; i < n; i++)
		buf[2 + i] = s->name[i] == '_' ? '-' : s->name[i];
	buf[2 + n] = '\0';
}

/* "KVPOOL_" + the name in capitals. */
static void env_var_name(const struct conf_setting *s, char *buf, size_t len)
{
	size_t n = strlen(s->name), p = strlen(ENV_PREFIX);

	if (p + n + 1 > len)
		n = len - p - 1;
	memcpy(buf, ENV_PREFIX, p);
	for (size_t i = 0; i < n; i++)
		buf[p + i] = (char)toupper((unsigned char)s->name[i]);
	buf[p + n] = '\0';
}

/* The "(default ...; range unit; reloaded by SIGHUP)" of one setting. */
static void usage_tail(const struct conf *def, const struct conf_setting *s, FILE *out)
{
	char val[300], lo[32], hi[32];

	/* the table's text, not this machine's core count: same help everywhere */
	if (s->flags & CONF_ZERO_IS_CORES)
		snprintf(val, sizeof(val), "%s (one per online core)", s->def);
	else if ((s->flags & CONF_EMPTY_UNSET) && !s->def[0])
		snprintf(val, sizeof(val), "unset");
	else
		format_value(def, s, val, sizeof(val));
	fprintf(out, "(default %s", val);
	if (s->type == CONF_SIZE || s->type == CONF_U32) {
		conf_format_number(s, s->flags & CONF_ZERO_IS_CORES ? 0 : s->min, lo, sizeof(lo));
		conf_format_number(s, s->max, hi, sizeof(hi));
		fprintf(out, "; %s..%s", lo, hi);
		if (s->unit && s->type != CONF_SIZE)
			fprintf(out, " %s", s->unit);
	}
	if (s->flags & CONF_RELOAD)
		fprintf(out, "; SIGHUP reloads it");
	fprintf(out, ")\n");
}

void conf_usage(FILE *out)
{
	struct conf def;
	char flag[64], env[80];

	conf_defaults(&def);
	fprintf(out,
		"usage: kvpoold [--config FILE] [--SETTING VALUE | --SETTING=VALUE]... [--help]\n"
		"\n"
		"Each setting comes from, the first that has it: a flag, an environment\n"
		"variable, the INI file given with --config (or by " ENV_CONFIG " when there\n"
		"is no --config; keys at top level or in a [" CONF_SECTION "] section), its default.\n"
		"The INI key is the flag without \"--\" and with \"_\" for \"-\"; the variable\n"
		"is " ENV_PREFIX " and the key in capitals. Other " ENV_PREFIX "* variables are\n"
		"reported and ignored.\n"
		"Sizes are bytes or a number with a unit: B, KB, MB, GB, TB (powers of 1000)\n"
		"or KiB, MiB, GiB, TiB (powers of 1024), case-insensitive, e.g. 4GiB or 1.5GB.\n"
		"SIGHUP reads every source again and applies the settings marked so; a\n"
		"change to any other setting is logged and waits for a restart.\n"
		"\n"
		"  --config FILE, " ENV_CONFIG "\n      INI file to read before applying flags\n"
		"  --help\n      print this help and exit\n"
		"  --version\n      print the version and exit\n"
		"  --print-config\n      print the effective settings as \"key value\" lines and "
		"exit\n");
	for (size_t i = 0; i < N_SETTINGS; i++) {
		const struct conf_setting *s = &settings[i];

		flag_name(s, flag, sizeof(flag));
		env_var_name(s, env, sizeof(env));
		fprintf(out, "  %s %s, %s\n      %s ", flag, s->metavar, env, s->help);
		usage_tail(&def, s, out);
	}
}

void conf_print(const struct conf *c, FILE *out)
{
	char val[300];

	for (size_t i = 0; i < N_SETTINGS; i++) {
		format_value(c, &settings[i], val, sizeof(val));
		fprintf(out, "%s %s\n", settings[i].name, val);
	}
}

/* ---- reload -------------------------------------------------------------- */

int conf_is_reloadable(const char *name)
{
	const struct conf_setting *s = name ? conf_find(name) : NULL;

	if (!s)
		return -ENOENT;
	return (s->flags & CONF_RELOAD) ? 1 : 0;
}

int conf_reload(struct conf *cur, const struct conf *next, conf_change_fn *fn, void *arg)
{
	char old[CONF_PATH_MAX + 16], now[CONF_PATH_MAX + 16];
	int applied = 0;

	for (size_t i = 0; i < N_SETTINGS; i++) {
		const struct conf_setting *s = &settings[i];
		bool reload = s->flags & CONF_RELOAD;

		format_value(cur, s, old, sizeof(old));
		format_value(next, s, now, sizeof(now));
		if (strcmp(old, now) == 0)
			continue;
		if (reload) {
			memcpy((char *)cur + s->offset, (const char *)next + s->offset,
			       s->field_bytes);
			applied++;
		}
		if (fn)
			fn(arg, s->name, old, now, reload);
	}
	return applied;
}

/* ---- JSON ------------------------------------------------------------------- */

/* Append to buf[0..len) at *used, counting what does not fit. */
__attribute__((format(printf, 4, 5)))
static void json_add(char *buf, size_t len, size_t *used, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(*used < len ? buf + *used : NULL, *used < len ? len - *used : 0, fmt, ap);
	va_end(ap);
	if (n > 0)
		*used += (size_t)n;
}

/* A JSON string: strings settings hold no control characters
 * (conf_string_check), so only '"' and '\\' need escaping. */
static void json_string(char *buf, size_t len, size_t *used, const char *str)
{
	json_add(buf, len, used, "\"");
	for (const char *p = str; *p; p++) {
		if (*p == '"' || *p == '\\')
			json_add(buf, len, used, "\\%c", *p);
		else
			json_add(buf, len, used, "%c", *p);
	}
	json_add(buf, len, used, "\"");
}

size_t conf_json(const struct conf *c, char *buf, size_t len)
{
	char val[CONF_PATH_MAX + 16];
	size_t used = 0;

	if (buf && len)
		buf[0] = '\0';
	else
		len = 0;
	json_add(buf, len, &used, "{");
	for (size_t i = 0; i < N_SETTINGS; i++) {
		const struct conf_setting *s = &settings[i];

		json_add(buf, len, &used, "%s\"%s\":", i ? "," : "", s->name);
		switch (s->type) {
		case CONF_SIZE:
		case CONF_U32:
			json_add(buf, len, &used, "%" PRIu64, conf_field_get(c, s));
			break;
		case CONF_BOOL:
			json_add(buf, len, &used, "%s", conf_field_get(c, s) ? "true" : "false");
			break;
		case CONF_CHOICE:
		case CONF_STRING:
			format_value(c, s, val, sizeof(val));
			json_string(buf, len, &used, val);
			break;
		}
	}
	json_add(buf, len, &used, "}");
	return used;
}
