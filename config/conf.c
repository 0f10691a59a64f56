/*
 * conf.c - kvpoold settings: one table, read from defaults, INI files
 * (libinih) and command-line flags.
 *
 * Everything about a setting is said once, in settings[] below: its INI
 * key, its flag (the key with dashes), its type, default, range and help.
 * Defaults are INI text parsed by the same code as files and flags, so a
 * default can never escape the checks a user value gets.
 */
#include "conf.h"

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

#include <ini.h>

#include "proto.h" /* frame layout sizes only: no code from proto/ is linked */

#define KIB (1ull << 10)
#define MIB (1ull << 20)
#define GIB (1ull << 30)
#define TIB (1ull << 40)

#define CONF_THREADS_MAX 256
/* The store's page: the arena and every block take whole pages of it. */
#define CONF_PAGE_BYTES 4096ull
#define CONF_SECTION "kvpoold"

enum conf_type {
	CONF_SIZE,     /* bytes, with optional unit */
	CONF_U32,      /* plain decimal integer */
	CONF_STRING,   /* text, no whitespace or control characters */
	CONF_CHOICE,   /* one word of a list (struct conf_choices), stored as an int */
	CONF_BOOL,     /* true/false, yes/no, on/off, 1/0; stored as an int 0 or 1 */
};

/* Setting flags. */
#define CONF_ZERO_IS_CORES 0x1u /* 0 means "number of online cores" */
#define CONF_SPACES_OK 0x2u     /* strings: blanks allowed inside (paths) */
#define CONF_EMPTY_UNSET 0x4u   /* strings: "" means unset; --help says so */
#define CONF_RELOAD 0x8u        /* SIGHUP applies a new value to the running server */

/* The words a CONF_CHOICE setting accepts; word i is stored as i. */
struct conf_choices {
	const char *noun;          /* for messages: "unknown log level" */
	const char *const *names;
	size_t count;
};

struct conf_setting {
	const char *name;    /* INI key; the flag is "--" + name with '-' for '_' */
	enum conf_type type;
	size_t offset;       /* of the field in struct conf */
	size_t field_bytes;  /* 4 or 8 for numbers, buffer bytes for strings */
	const char *def;     /* default, as INI text */
	uint64_t min, max;   /* numbers: value range; strings: length range */
	unsigned int flags;
	const char *metavar; /* placeholder in --help */
	const char *help;
	const struct conf_choices *choices; /* CONF_CHOICE only */
	const char *unit;    /* of a number, for --help and docs: "bytes", "ms"; NULL if none */
};

#define FIELD(f) offsetof(struct conf, f), sizeof(((struct conf *)0)->f)

static const char *const log_level_names[] = { "error", "warn", "info", "debug" };
static const struct conf_choices log_levels = { "log level", log_level_names, 4 };
/* Indexed by enum conf_admission. */
static const char *const admission_names[] = { "all", "reused" };
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
	  "lease would pass it answers QUOTA; 0 = half of dram_capacity; dram_capacity or more = "
	  "no bound", NULL, "bytes" },
	{ "max_conn_leased_bytes", CONF_SIZE, FIELD(max_conn_leased_bytes), "0", 0, 1024 * TIB, 0,
	  "SIZE",
	  "bytes one connection may hold leased; a MATCH whose lease would pass it answers QUOTA; "
	  "0 = a quarter of dram_capacity; dram_capacity or more = no bound", NULL, "bytes" },
	{ "max_conn_match_waits", CONF_U32, FIELD(max_conn_match_waits), "64", 1, 65536, CONF_RELOAD,
	  "N",
	  "MATCHes one connection may have waiting for blocks at once; one more answers at once "
	  "without waiting", NULL, "matches" },
	{ "tenant_max_match_waits", CONF_U32, FIELD(tenant_max_match_waits), "4096", 0, 1048576,
	  CONF_RELOAD, "N",
	  "with tokens_file: MATCHes all of one token's connections may have waiting at once; one "
	  "more answers at once without waiting; 0 = no limit", NULL, "matches" },
	{ "allow_unauthenticated", CONF_BOOL, FIELD(allow_unauthenticated), "false", 0, 1, 0,
	  "BOOL", "serve a non-loopback listen address without tokens_file", NULL, NULL },
	{ "drain_timeout_ms", CONF_U32, FIELD(drain_timeout_ms), "10000", 0, 3600000, CONF_RELOAD,
	  "MS",
	  "on SIGTERM or SIGINT, wait this long at most for requests in flight", NULL, "ms" },
	{ "nvme_drain_ms", CONF_U32, FIELD(nvme_drain_ms), "10000", 0, 3600000, 0, "MS",
	  "on SIGTERM or SIGINT, after the requests: spend this long at most writing DRAM-only "
	  "blocks to NVMe, hottest first, so a restart finds them; 0 = none", NULL, "ms" },
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

static const struct {
	const char *name;
	uint64_t mult;
} size_units[] = {
	{ "B", 1 },
	{ "KB", 1000ull }, { "MB", 1000000ull }, { "GB", 1000000000ull }, { "TB", 1000000000000ull },
	{ "KiB", KIB }, { "MiB", MIB }, { "GiB", GIB }, { "TiB", TIB },
};

/* ---- small helpers ------------------------------------------------------ */

/* Format a message into err[0..err_len) if the caller gave a buffer. */
__attribute__((format(printf, 3, 4)))
static void set_err(char *err, size_t err_len, const char *fmt, ...)
{
	va_list ap;

	if (!err || !err_len)
		return;
	va_start(ap, fmt);
	vsnprintf(err, err_len, fmt, ap);
	va_end(ap);
}

static const struct conf_setting *find_setting(const char *key)
{
	for (size_t i = 0; i < N_SETTINGS; i++)
		if (strcmp(settings[i].name, key) == 0)
			return &settings[i];
	return NULL;
}

/* Online cores, clamped to the threads range. */
static uint32_t online_cores(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	if (n < 1)
		return 1;
	return n > CONF_THREADS_MAX ? CONF_THREADS_MAX : (uint32_t)n;
}

/* Write size bytes with the largest binary unit that divides it exactly,
 * so the text parses back to the same value ("64MiB", "4097"). */
static void format_size(uint64_t v, char *buf, size_t len)
{
	static const char *const units[] = { "TiB", "GiB", "MiB", "KiB" };
	static const uint64_t mults[] = { TIB, GIB, MIB, KIB };

	for (size_t i = 0; i < 4 && v; i++) {
		if (v % mults[i] == 0) {
			snprintf(buf, len, "%" PRIu64 "%s", v / mults[i], units[i]);
			return;
		}
	}
	snprintf(buf, len, "%" PRIu64, v);
}

static const char *skip_space(const char *p)
{
	while (*p && isspace((unsigned char)*p))
		p++;
	return p;
}

/* ---- value parsers -------------------------------------------------------
 * Each returns 0, -EINVAL or -ERANGE and, on error, a reason in why[]. */

/* The multiplier of a unit name (case-insensitive), 0 if unknown. */
static uint64_t unit_mult(const char *unit, size_t len)
{
	if (len == 0)
		return 1;
	for (size_t i = 0; i < sizeof(size_units) / sizeof(size_units[0]); i++)
		if (strlen(size_units[i].name) == len && strncasecmp(unit, size_units[i].name, len) == 0)
			return size_units[i].mult;
	return 0;
}

/* Digits before the point, exactly, with overflow detection. */
static int parse_whole(const char **pp, uint64_t *out)
{
	const char *p = *pp;
	uint64_t v = 0;

	for (; isdigit((unsigned char)*p); p++) {
		unsigned int d = (unsigned int)(*p - '0');

		if (v > (UINT64_MAX - d) / 10)
			return -ERANGE;
		v = v * 10 + d;
	}
	*pp = p;
	*out = v;
	return 0;
}

/* Digits after the point as num/den; digits beyond 10^18 precision are
 * dropped (the result is rounded down anyway). */
static void parse_fraction(const char **pp, uint64_t *num, uint64_t *den)
{
	const char *p = *pp;

	*num = 0;
	*den = 1;
	for (; isdigit((unsigned char)*p); p++) {
		if (*den < 1000000000000000000ull) {
			*num = *num * 10 + (uint64_t)(*p - '0');
			*den *= 10;
		}
	}
	*pp = p;
}

/* Combine whole + num/den units of mult bytes, rounding down. */
static int size_combine(uint64_t whole, uint64_t num, uint64_t den, uint64_t mult, uint64_t *out)
{
	unsigned __int128 v = (unsigned __int128)whole * mult;

	v += (unsigned __int128)num * mult / den;
	if (v > UINT64_MAX)
		return -ERANGE;
	*out = (uint64_t)v;
	return 0;
}

static int size_parse(const char *text, uint64_t *out, char *why, size_t why_len)
{
	const char *p = skip_space(text), *unit;
	uint64_t whole, num = 0, den = 1, mult;
	bool has_fraction = false;
	size_t unit_len;

	if (*p == '-') {
		set_err(why, why_len, "negative sizes are not allowed");
		return -EINVAL;
	}
	if (!isdigit((unsigned char)*p)) {
		set_err(why, why_len, *p ? "not a number" : "empty value");
		return -EINVAL;
	}
	if (parse_whole(&p, &whole)) {
		set_err(why, why_len, "does not fit in 64 bits");
		return -ERANGE;
	}
	if (*p == '.') {
		p++;
		if (!isdigit((unsigned char)*p)) {
			set_err(why, why_len, "digits expected after '.'");
			return -EINVAL;
		}
		parse_fraction(&p, &num, &den);
		has_fraction = true;
	}
	unit = p = skip_space(p);
	while (isalpha((unsigned char)*p))
		p++;
	unit_len = (size_t)(p - unit);
	if (*skip_space(p)) {
		set_err(why, why_len, "trailing characters after the size");
		return -EINVAL;
	}
	mult = unit_mult(unit, unit_len);
	if (!mult) {
		set_err(why, why_len, "unknown unit '%.*s' (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)",
			(int)(unit_len > 16 ? 16 : unit_len), unit);
		return -EINVAL;
	}
	if (has_fraction && mult == 1) {
		set_err(why, why_len, "a fraction of a byte (a fraction needs a unit above B)");
		return -EINVAL;
	}
	if (size_combine(whole, num, den, mult, out)) {
		set_err(why, why_len, "does not fit in 64 bits");
		return -ERANGE;
	}
	return 0;
}

int conf_parse_size(const char *text, uint64_t *out)
{
	if (!text)
		return -EINVAL;
	return size_parse(text, out, NULL, 0);
}

static int u32_parse(const char *text, uint64_t *out, char *why, size_t why_len)
{
	const char *p = skip_space(text);
	uint64_t v;

	if (*p == '-') {
		set_err(why, why_len, "negative values are not allowed");
		return -EINVAL;
	}
	if (!isdigit((unsigned char)*p)) {
		set_err(why, why_len, *p ? "not a whole number" : "empty value");
		return -EINVAL;
	}
	if (parse_whole(&p, &v) || v > UINT32_MAX) {
		set_err(why, why_len, "does not fit in 32 bits");
		return -ERANGE;
	}
	if (*skip_space(p)) {
		set_err(why, why_len, "not a whole number (no units here)");
		return -EINVAL;
	}
	*out = v;
	return 0;
}

/* true/yes/on/1 or false/no/off/0, case-insensitive. */
static int bool_parse(const char *text, uint64_t *out, char *why, size_t why_len)
{
	static const char *const yes[] = { "true", "yes", "on", "1" };
	static const char *const no[] = { "false", "no", "off", "0" };

	for (size_t i = 0; i < 4; i++) {
		if (strcasecmp(text, yes[i]) == 0) {
			*out = 1;
			return 0;
		}
		if (strcasecmp(text, no[i]) == 0) {
			*out = 0;
			return 0;
		}
	}
	set_err(why, why_len, "not a boolean (use true or false)");
	return -EINVAL;
}

/* "a, b or c" of a choice list, for messages. */
static void choices_text(const struct conf_choices *ch, char *buf, size_t len)
{
	size_t used = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < ch->count && used < len; i++) {
		const char *sep = i == 0 ? "" : i + 1 == ch->count ? " or " : ", ";
		int n = snprintf(buf + used, len - used, "%s%s", sep, ch->names[i]);

		if (n < 0)
			return;
		used += (size_t)n;
	}
}

/* One of the words of ch, case-insensitive; *out receives its index. */
static int choice_parse(const struct conf_choices *ch, const char *text, uint64_t *out, char *why,
			size_t why_len)
{
	char list[128];

	for (size_t i = 0; i < ch->count; i++) {
		if (strcasecmp(text, ch->names[i]) == 0) {
			*out = i;
			return 0;
		}
	}
	choices_text(ch, list, sizeof(list));
	set_err(why, why_len, "unknown %s (use %s)", ch->noun, list);
	return -EINVAL;
}

/* Length within the setting's range; no control characters, and no
 * blanks either unless the setting allows them (paths). */
static int string_check(const struct conf_setting *s, const char *text, char *why, size_t why_len)
{
	size_t len = strlen(text);
	bool spaces_ok = s->flags & CONF_SPACES_OK;

	if (len < s->min || len > s->max || len >= s->field_bytes) {
		set_err(why, why_len, "length %zu is outside %" PRIu64 "..%" PRIu64 " bytes", len,
			s->min, s->max);
		return -ERANGE;
	}
	for (size_t i = 0; i < len; i++) {
		unsigned char ch = (unsigned char)text[i];

		if (iscntrl(ch) || (!spaces_ok && isspace(ch))) {
			set_err(why, why_len, spaces_ok ? "control characters are not allowed" :
							  "spaces and control characters are not allowed");
			return -EINVAL;
		}
	}
	return 0;
}

/* ---- reading and writing fields ----------------------------------------- */

static uint64_t field_get(const struct conf *c, const struct conf_setting *s)
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
		v = field_get(c, s);
		snprintf(buf, len, "%s", v < s->choices->count ? s->choices->names[v] : "?");
		return;
	case CONF_BOOL:
		snprintf(buf, len, "%s", field_get(c, s) ? "true" : "false");
		return;
	case CONF_SIZE:
		format_size(field_get(c, s), buf, len);
		return;
	case CONF_U32:
		snprintf(buf, len, "%" PRIu64, field_get(c, s));
		return;
	}
}

static void format_number(const struct conf_setting *s, uint64_t v, char *buf, size_t len)
{
	if (s->type == CONF_SIZE)
		format_size(v, buf, len);
	else
		snprintf(buf, len, "%" PRIu64, v);
}

/* ---- conf_set and defaults ---------------------------------------------- */

/* Parse text as setting s into *v (numbers) and check the range. */
static int parse_number(const struct conf_setting *s, const char *text, uint64_t *v, char *why,
			size_t why_len)
{
	char lo[32], hi[32];
	int rc;

	if (s->type == CONF_SIZE)
		rc = size_parse(text, v, why, why_len);
	else if (s->type == CONF_U32)
		rc = u32_parse(text, v, why, why_len);
	else if (s->type == CONF_BOOL)
		rc = bool_parse(text, v, why, why_len);
	else
		rc = choice_parse(s->choices, text, v, why, why_len);
	if (rc)
		return rc;
	if (*v == 0 && (s->flags & CONF_ZERO_IS_CORES))
		*v = online_cores();
	if (*v < s->min || *v > s->max) {
		/* the range --help shows: 0 is accepted here too */
		format_number(s, s->flags & CONF_ZERO_IS_CORES ? 0 : s->min, lo, sizeof(lo));
		format_number(s, s->max, hi, sizeof(hi));
		set_err(why, why_len, "out of range %s..%s%s", lo, hi,
			s->flags & CONF_ZERO_IS_CORES ? " (0 = one per core)" : "");
		return -ERANGE;
	}
	return 0;
}

/* Where each setting was last set from ("--port", "KVPOOL_PORT",
 * "/etc/kvpool/kvpool.conf:12"), for start-up messages (conf_source).
 * Main thread only, as conf_set. */
static char set_by[N_SETTINGS][96];

const char *conf_source(const char *key)
{
	const struct conf_setting *s = key ? find_setting(key) : NULL;

	if (!s)
		return NULL;
	return set_by[s - settings][0] ? set_by[s - settings] : "the default";
}

int conf_set(struct conf *c, const char *key, const char *value, const char *source,
	     char *err, size_t err_len)
{
	const struct conf_setting *s = key ? find_setting(key) : NULL;
	char why[160];
	uint64_t v;
	int rc;

	if (!source)
		source = "?";
	if (!s) {
		set_err(err, err_len, "%s: unknown key '%.64s'", source, key ? key : "");
		return -ENOENT;
	}
	if (!value) {
		set_err(err, err_len, "%s: %s: missing value", source, s->name);
		return -EINVAL;
	}
	if (s->type == CONF_STRING)
		rc = string_check(s, value, why, sizeof(why));
	else
		rc = parse_number(s, value, &v, why, sizeof(why));
	if (rc) {
		set_err(err, err_len, "%s: %s: %s: '%.64s'", source, s->name, why, value);
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

/* ---- INI files ------------------------------------------------------------
 * Parsed by libinih (ini_parse_stream) from the reader below, which hands
 * inih one whole line per call, so inih's line numbers are the file's, and
 * cleans it first so that inih's build options do not show through:
 *   - a UTF-8 byte order mark on line 1 and leading blanks are dropped
 *     (indented keys are plain keys, not inih continuation lines);
 *   - a comment line becomes empty, and an inline comment - a '#' or ';'
 *     after a blank, the same for both (inih knows only ';') - is cut off
 *     with the blanks before it;
 *   - a line inih cannot take whole is refused, not split: more bytes
 *     besides its "\n" or "\r\n" than inih's buffer holds with its NUL
 *     (199 in Debian's build, INI_MAX_LINE 200). So is a NUL byte, and a
 *     section line with text after its ']' (inih would ignore the text).
 * The handler adds the rest: keys only in [kvpoold] or before any section,
 * each key once per file. The first error found stops the reading.
 */

struct load_ctx {
	struct conf *conf;      /* the copy being filled */
	const char *path;
	FILE *fp;
	int lineno;             /* of the line last handed to inih */
	int set_on[N_SETTINGS]; /* line that set each setting, 0 if none */
	int err_line;           /* first line with an error, 0 if none */
	int rc;                 /* its error */
	char err[512];          /* its message */
};

/* Record the error of the current line, if it is the first. */
__attribute__((format(printf, 3, 4)))
static void load_fail(struct load_ctx *ctx, int rc, const char *fmt, ...)
{
	va_list ap;

	if (ctx->err_line)
		return;
	ctx->err_line = ctx->lineno;
	ctx->rc = rc;
	va_start(ap, fmt);
	vsnprintf(ctx->err, sizeof(ctx->err), fmt, ap);
	va_end(ap);
}

static void load_syntax_error(struct load_ctx *ctx)
{
	load_fail(ctx, -EINVAL, "%s:%d: syntax error (expected 'key = value' or '[" CONF_SECTION
		  "]')", ctx->path, ctx->lineno);
}

/* Read the next line of fp into buf[0..cap) without its "\n" or "\r\n",
 * NUL-terminated. Returns its length in bytes, or cap if it does not fit
 * (reading stops right there, so an endless line such as /dev/zero's
 * fails at once; buf keeps its start), or -1 at the end of the file or on
 * a read error. Sets *nul if the line holds a NUL. */
static long read_line(FILE *fp, char *buf, size_t cap, bool *nul)
{
	size_t len = 0;
	int ch, next;

	while ((ch = getc(fp)) != EOF && ch != '\n') {
		if (ch == '\r') {
			next = getc(fp);
			if (next == '\n' || next == EOF)
				break;
			ungetc(next, fp);
		}
		if (len + 1 < cap)
			buf[len] = (char)ch;
		len++;
		*nul |= ch == '\0';
		if (len == cap)
			break; /* too long: the caller refuses the line */
	}
	if (ch == EOF && len == 0)
		return -1;
	buf[len < cap ? len : cap - 1] = '\0';
	return (long)len;
}

/* Cut an inline comment ('#' or ';' after a blank) and the blanks before
 * it, and trailing blanks, off text, which starts with no blank. */
static void strip_comment(char *text)
{
	size_t n;

	for (char *p = text + 1; *text && *p; p++) {
		if ((*p == '#' || *p == ';') && (p[-1] == ' ' || p[-1] == '\t')) {
			*p = '\0';
			break;
		}
	}
	n = strlen(text);
	while (n && isspace((unsigned char)text[n - 1]))
		text[--n] = '\0';
}

/* inih reader: the next line, cleaned (see above), or NULL at the end of
 * the file or after the first error. */
static char *load_read_line(char *str, int num, void *stream)
{
	struct load_ctx *ctx = stream;
	bool nul = false;
	char *text, *close;
	long len;

	if (ctx->err_line || num < 2)
		return NULL;
	len = read_line(ctx->fp, str, (size_t)num, &nul);
	if (len < 0)
		return NULL;
	ctx->lineno++;
	if (len >= num) {
		load_fail(ctx, -EINVAL, "%s:%d: line longer than %d bytes", ctx->path, ctx->lineno,
			  num - 1);
		return NULL;
	}
	if (nul) {
		load_fail(ctx, -EINVAL, "%s:%d: NUL byte in line", ctx->path, ctx->lineno);
		return NULL;
	}
	text = str;
	if (ctx->lineno == 1 && strncmp(text, "\xef\xbb\xbf", 3) == 0)
		text += 3; /* UTF-8 byte order mark */
	text = (char *)skip_space(text);
	if (*text == '#' || *text == ';')
		*text = '\0';
	strip_comment(text);
	close = strchr(text, ']');
	if (*text == '[' && (!close || close[1] != '\0')) {
		load_syntax_error(ctx);
		return NULL;
	}
	memmove(str, text, strlen(text) + 1);
	return str;
}

/* "kvpoold" in any case, blanks around it allowed; "" is the top level. */
static bool section_is_ours(const char *section)
{
	const char *p = skip_space(section);
	size_t n = strlen(p);

	while (n && isspace((unsigned char)p[n - 1]))
		n--;
	return n == 0 || (n == strlen(CONF_SECTION) && strncasecmp(p, CONF_SECTION, n) == 0);
}

/* inih handler: apply one "key = value" of the current line. Returns 1,
 * or 0 with the error recorded. */
static int load_handle(void *user, const char *section, const char *name, const char *value)
{
	struct load_ctx *ctx = user;
	const struct conf_setting *s;
	char source[300], msg[512];
	int rc;

	if (ctx->err_line)
		return 1; /* already failed: report the first error only */
	if (!name[0]) {
		load_syntax_error(ctx);
		return 0;
	}
	snprintf(source, sizeof(source), "%s:%d", ctx->path, ctx->lineno);
	if (!section_is_ours(section)) {
		load_fail(ctx, -ENOENT, "%s: unknown section [%.64s] (use [" CONF_SECTION
			  "] or none)", source, section);
		return 0;
	}
	s = find_setting(name);
	if (s && ctx->set_on[s - settings]) {
		load_fail(ctx, -EINVAL, "%s: %s: already set on line %d (one line per key)", source,
			  s->name, ctx->set_on[s - settings]);
		return 0;
	}
	rc = conf_set(ctx->conf, name, value, source, msg, sizeof(msg));
	if (rc) {
		load_fail(ctx, rc, "%s", msg);
		return 0;
	}
	ctx->set_on[s - settings] = ctx->lineno; /* s is set: conf_set knew the key */
	return 1;
}

/* Parse the file into *tmp. inih goes on after a syntax error and returns
 * the first such line; ours (from the reader or the handler) may come
 * first or later: the earlier line wins. */
static int load_into(struct conf *tmp, const char *path, char *err, size_t err_len)
{
	struct load_ctx ctx = { .conf = tmp, .path = path };
	int ret, rc = 0;

	ctx.fp = fopen(path, "r");
	if (!ctx.fp) {
		rc = -errno;
		set_err(err, err_len, "%s: cannot open: %s", path, strerror(errno));
		return rc;
	}
	{
		struct stat st;

		if (fstat(fileno(ctx.fp), &st) == 0 && S_ISDIR(st.st_mode)) {
			fclose(ctx.fp);
			set_err(err, err_len, "%s: is a directory: the configuration is a file "
				"(e.g. %s/kvpool.conf)", path, path);
			return -EISDIR;
		}
	}
	ret = ini_parse_stream(load_read_line, &ctx, load_handle, &ctx);
	if (ferror(ctx.fp)) {
		rc = -EIO;
		set_err(err, err_len, "%s: read error", path);
	} else if (ret < 0) {
		rc = -ENOMEM;
		set_err(err, err_len, "%s: out of memory", path);
	} else if (ret > 0 && (!ctx.err_line || ret < ctx.err_line)) {
		rc = -EINVAL;
		set_err(err, err_len, "%s:%d: syntax error (expected 'key = value' or '[" CONF_SECTION
			"]')", path, ret);
	} else if (ctx.err_line) {
		rc = ctx.rc;
		set_err(err, err_len, "%s", ctx.err);
	}
	fclose(ctx.fp);
	return rc;
}

int conf_load_file(struct conf *c, const char *path, char *err, size_t err_len)
{
	struct conf tmp = *c;
	int rc;

	if (!path) {
		set_err(err, err_len, "no configuration file given");
		return -EINVAL;
	}
	rc = load_into(&tmp, path, err, err_len);
	if (rc)
		return rc;
	*c = tmp;
	return 0;
}

/* ---- command line ----------------------------------------------------------- */

struct flag {
	const char *arg;   /* the argument as typed */
	char key[64];      /* setting name: dashes turned into underscores */
	size_t name_len;   /* bytes of "--name" in arg */
	const char *value; /* NULL for --help */
};

static int unknown_flag(const char *arg, size_t len, char *err, size_t err_len)
{
	set_err(err, err_len, "unknown flag %.*s (see --help)", (int)(len > 64 ? 64 : len), arg);
	return -ENOENT;
}

/* Read the flag at argv[*i] (and its value, which may be the next
 * argument) and advance *i past them. Errors: -ENOENT (unknown flag),
 * -EINVAL (not a flag, a missing value, a value given to --help). */
static int next_flag(int argc, char **argv, int *i, struct flag *f, char *err, size_t err_len)
{
	const char *arg = argv[*i], *eq;
	size_t len;

	if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0' || arg[2] == '-') {
		set_err(err, err_len, "unexpected argument '%.64s' (settings are --key value)", arg);
		return -EINVAL;
	}
	eq = strchr(arg, '=');
	len = eq ? (size_t)(eq - arg) : strlen(arg);
	f->arg = arg;
	f->name_len = len;
	if (len - 2 >= sizeof(f->key) || memchr(arg + 2, '_', len - 2))
		return unknown_flag(arg, len, err, err_len);
	for (size_t k = 2; k < len; k++)
		f->key[k - 2] = arg[k] == '-' ? '_' : arg[k];
	f->key[len - 2] = '\0';
	/* known before looking for a value: "--bogus" last is unknown, not short */
	if (strcmp(f->key, "help") && strcmp(f->key, "config") && !find_setting(f->key))
		return unknown_flag(arg, len, err, err_len);
	(*i)++;
	if (strcmp(f->key, "help") == 0) {
		if (eq) {
			set_err(err, err_len, "--help takes no value");
			return -EINVAL;
		}
		f->value = NULL;
		return 0;
	}
	if (eq) {
		f->value = eq + 1;
		return 0;
	}
	if (*i >= argc || strncmp(argv[*i], "--", 2) == 0) {
		set_err(err, err_len, "%s: missing value", arg);
		return -EINVAL;
	}
	f->value = argv[(*i)++];
	return 0;
}

/* First pass: syntax of every flag, --help, and the --config files. */
static int args_load_configs(struct conf *tmp, int argc, char **argv, int *help, char *err,
			     size_t err_len)
{
	struct flag f;
	int rc;

	/* a value never starts with "--", so any "--help" is the flag */
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0) {
			*help = 1;
			return 0;
		}
	}
	*help = 0;
	for (int i = 1; i < argc;) {
		rc = next_flag(argc, argv, &i, &f, err, err_len);
		if (rc)
			return rc;
	}
	for (int i = 1; i < argc;) {
		rc = next_flag(argc, argv, &i, &f, err, err_len);
		if (rc)
			return rc;
		if (strcmp(f.key, "config") == 0) {
			rc = load_into(tmp, f.value, err, err_len);
			if (rc)
				return rc;
		}
	}
	return 0;
}

/* Second pass: every other flag, on top of the files. */
static int args_apply_flags(struct conf *tmp, int argc, char **argv, char *err, size_t err_len)
{
	char source[80];
	struct flag f;
	int rc;

	for (int i = 1; i < argc;) {
		rc = next_flag(argc, argv, &i, &f, err, err_len);
		if (rc)
			return rc;
		if (strcmp(f.key, "config") == 0)
			continue;
		snprintf(source, sizeof(source), "%.*s", (int)f.name_len, f.arg);
		rc = conf_set(tmp, f.key, f.value, source, err, err_len);
		if (rc)
			return rc;
	}
	return 0;
}

int conf_from_args(struct conf *c, int argc, char **argv, int *want_help, char *err,
		   size_t err_len)
{
	struct conf tmp = *c;
	int help, rc;

	rc = args_load_configs(&tmp, argc, argv, &help, err, err_len);
	if (rc)
		return rc;
	if (help) {
		*want_help = 1;
		return 0;
	}
	rc = args_apply_flags(&tmp, argc, argv, err, err_len);
	if (rc)
		return rc;
	*c = tmp;
	*want_help = 0;
	return 0;
}

/* ---- environment ------------------------------------------------------------
 * KVPOOL_<NAME>, the name in capitals ("KVPOOL_DRAM_CAPACITY"), for
 * containers. KVPOOL_CONFIG names a file read when no --config is given.
 * Other KVPOOL_ variables are not settings (the CLI and the tests use a
 * few): they are reported on `warn`, so that a misspelt setting is seen,
 * and otherwise ignored. */

#define ENV_PREFIX "KVPOOL_"
#define ENV_CONFIG ENV_PREFIX "CONFIG"

/* The setting whose variable is name[0..len) (the part after KVPOOL_):
 * capitals, digits and '_' only. */
static const struct conf_setting *env_setting(const char *name, size_t len)
{
	char key[64];

	if (len == 0 || len >= sizeof(key))
		return NULL;
	for (size_t i = 0; i < len; i++) {
		if (islower((unsigned char)name[i]))
			return NULL;
		key[i] = (char)tolower((unsigned char)name[i]);
	}
	key[len] = '\0';
	return find_setting(key);
}

/* Variables of the client side and of kvpool's own scripts that share
 * the prefix: the CLI's token, the Python binding's library path, the
 * names the container entrypoint and the test runner give our programs. A container or a unit that sets
 * them for its health check must not see a warning at every start. */
static bool env_is_client_var(const char *var, size_t len)
{
	/* read by libkvpool and the CLI, or naming kvpool's own programs for
	 * the container entrypoint and the test runner: not typos of settings */
	static const char *const client_vars[] = {
		"KVPOOL_TOKEN", "KVPOOL_LIB", "KVPOOL_CLI", "KVPOOL_TEST_DATA", "KVPOOL_URL",
		"KVPOOL_HEALTH_FILE",
		"KVPOOL_COPYCOUNT", "KVPOOL_FUZZ_DIR",
	};

	for (size_t i = 0; i < sizeof(client_vars) / sizeof(client_vars[0]); i++)
		if (len == strlen(client_vars[i]) && strncmp(var, client_vars[i], len) == 0)
			return true;
	return false;
}

int conf_from_env(struct conf *c, char *const *envp, FILE *warn, char *err, size_t err_len)
{
	struct conf tmp = *c;
	char source[96];
	int rc;

	if (!envp)
		return 0;
	for (char *const *e = envp; *e; e++) {
		const char *var = *e, *eq = strchr(var, '=');
		const struct conf_setting *s;
		size_t len;

		if (!eq || strncmp(var, ENV_PREFIX, strlen(ENV_PREFIX)) != 0)
			continue;
		len = (size_t)(eq - var);
		if (len == strlen(ENV_CONFIG) && strncmp(var, ENV_CONFIG, len) == 0)
			continue;
		if (env_is_client_var(var, len))
			continue;
		s = env_setting(var + strlen(ENV_PREFIX), len - strlen(ENV_PREFIX));
		if (!s) {
			if (warn)
				fprintf(warn, "kvpoold: ignoring environment variable %.*s: not a "
					"setting (see --help)\n", (int)(len > 64 ? 64 : len), var);
			continue;
		}
		snprintf(source, sizeof(source), "env %.*s", (int)(len > 64 ? 64 : len), var);
		rc = conf_set(&tmp, s->name, eq + 1, source, err, err_len);
		if (rc)
			return rc;
	}
	*c = tmp;
	return 0;
}

/* The value of KVPOOL_CONFIG in envp, NULL if unset or empty. */
static const char *env_config(char *const *envp)
{
	size_t n = strlen(ENV_CONFIG);

	for (char *const *e = envp; e && *e; e++)
		if (strncmp(*e, ENV_CONFIG, n) == 0 && (*e)[n] == '=' && (*e)[n + 1])
			return *e + n + 1;
	return NULL;
}

/* Is there a --config flag in argv (either form)? */
static bool args_have_config(int argc, char **argv)
{
	for (int i = 1; i < argc; i++)
		if (strcmp(argv[i], "--config") == 0 || strncmp(argv[i], "--config=", 9) == 0)
			return true;
	return false;
}

int conf_load(struct conf *c, int argc, char **argv, char *const *envp, FILE *warn,
	      int *want_help, char *err, size_t err_len)
{
	struct conf tmp;
	const char *file;
	int help, rc;

	conf_defaults(&tmp);
	rc = args_load_configs(&tmp, argc, argv, &help, err, err_len);
	if (rc)
		return rc;
	if (help) {
		*want_help = 1;
		return 0;
	}
	file = env_config(envp);
	if (file && !args_have_config(argc, argv)) {
		rc = load_into(&tmp, file, err, err_len);
		if (rc)
			return rc;
	}
	rc = conf_from_env(&tmp, envp, warn, err, err_len);
	if (rc)
		return rc;
	rc = args_apply_flags(&tmp, argc, argv, err, err_len);
	if (rc)
		return rc;
	rc = conf_validate(&tmp, err, err_len);
	if (rc)
		return rc;
	*c = tmp;
	*want_help = 0;
	return 0;
}

/* ---- validation ------------------------------------------------------------ */

/* Every numeric setting within its table range (for a struct filled by
 * hand) and the string NUL-terminated and valid. */
static int validate_ranges(const struct conf *c, char *err, size_t err_len)
{
	char val[64], lo[32], hi[32], why[160];

	for (size_t i = 0; i < N_SETTINGS; i++) {
		const struct conf_setting *s = &settings[i];
		uint64_t v;

		if (s->type == CONF_STRING) {
			const char *str = (const char *)c + s->offset;

			if (!memchr(str, '\0', s->field_bytes) ||
			    string_check(s, str, why, sizeof(why))) {
				set_err(err, err_len, "%s: invalid value", s->name);
				return -EINVAL;
			}
			continue;
		}
		v = field_get(c, s);
		if (v < s->min || v > s->max) {
			format_number(s, v, val, sizeof(val));
			format_number(s, s->min, lo, sizeof(lo));
			format_number(s, s->max, hi, sizeof(hi));
			set_err(err, err_len, "%s: %s is out of range %s..%s", s->name,
				s->type == CONF_CHOICE || s->type == CONF_BOOL ? "value" : val,
				lo, hi);
			return -EINVAL;
		}
	}
	return 0;
}

/* value rounded up to whole 4 KiB pages (no overflow below 2^64 - 4 KiB). */
static uint64_t page_round_up(uint64_t v)
{
	return (v + CONF_PAGE_BYTES - 1) / CONF_PAGE_BYTES * CONF_PAGE_BYTES;
}

/* A block of max_block_bytes takes whole pages of the arena: it must fit
 * in the capacity, itself rounded down to whole pages. */
static int validate_block_fits(const struct conf *c, uint64_t capacity, char *err,
			       size_t err_len)
{
	uint64_t block = page_round_up(c->max_block_bytes);
	char a[32], b[32], pages[64] = "";

	if (block <= capacity)
		return 0;
	format_size(c->max_block_bytes, a, sizeof(a));
	format_size(capacity, b, sizeof(b));
	if (block != c->max_block_bytes) {
		char r[32];

		format_size(block, r, sizeof(r));
		snprintf(pages, sizeof(pages), ", %s in 4KiB pages", r);
	}
	set_err(err, err_len, "max_block_bytes (%s%s) must not exceed dram_capacity (%s)", a, pages,
		b);
	return -EINVAL;
}

/* The NVMe tier's settings, when it has a directory: a capacity, a
 * segment size the store can use (whole pages, room for the largest
 * block), and room for two segments, the least the tier can rotate. */
static int validate_nvme(const struct conf *c, char *err, size_t err_len)
{
	uint64_t block = page_round_up(c->max_block_bytes), segment = c->nvme_segment_bytes;
	char a[32], b[32], d[32];

	/* nvme_capacity defaults to 0, so a nonzero one was set by the user:
	 * without a directory it would be ignored and the pool DRAM only. */
	if (!c->nvme_dir[0] && c->nvme_capacity_bytes) {
		format_size(c->nvme_capacity_bytes, a, sizeof(a));
		set_err(err, err_len,
			"nvme_capacity (%s) needs nvme_dir: set nvme_dir to use the nvme tier, or "
			"leave nvme_capacity unset (0) for dram only", a);
		return -EINVAL;
	}
	if (!c->nvme_dir[0])
		return 0;
	if (!c->nvme_capacity_bytes) {
		set_err(err, err_len, "nvme_capacity must be set when nvme_dir is set");
		return -EINVAL;
	}
	format_size(c->nvme_capacity_bytes, a, sizeof(a));
	format_size(block, d, sizeof(d));
	if (segment && segment % CONF_PAGE_BYTES) {
		format_size(segment, b, sizeof(b));
		set_err(err, err_len, "nvme_segment_size (%s) must be a multiple of 4KiB", b);
		return -EINVAL;
	}
	if (segment && segment < block) {
		format_size(segment, b, sizeof(b));
		set_err(err, err_len,
			"nvme_segment_size (%s) must hold a block of max_block_bytes (%s in 4KiB pages)",
			b, d);
		return -EINVAL;
	}
	if (segment && c->nvme_capacity_bytes / 2 < segment) {
		format_size(segment, b, sizeof(b));
		set_err(err, err_len, "nvme_capacity (%s) must hold two segments of nvme_segment_size (%s)",
			a, b);
		return -EINVAL;
	}
	if (!segment && c->nvme_capacity_bytes / 2 < block) {
		set_err(err, err_len,
			"nvme_capacity (%s) must hold two segments, each at least max_block_bytes (%s in 4KiB pages)",
			a, d);
		return -EINVAL;
	}
	return 0;
}

/* Are all of s's bytes in [A-Za-z0-9] or in `extra`? (and 1..max bytes) */
static int name_ok(const char *s, size_t max, const char *extra)
{
	size_t n = strlen(s);

	if (n == 0 || n > max)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
		      (s[i] >= '0' && s[i] <= '9') || strchr(extra, s[i])))
			return 0;
	return 1;
}

/* cluster: etcd://HOST[:PORT][,HOST[:PORT]...]/NAME; node_name: a name
 * placement can hash. */
static int validate_cluster(const struct conf *c, char *err, size_t err_len)
{
	const char *host, *slash;

	if (c->cluster[0]) {
		host = strncmp(c->cluster, "etcd://", 7) == 0 ? c->cluster + 7 : NULL;
		slash = host ? strchr(host, '/') : NULL;
		if (!host || !slash || slash == host || !name_ok(slash + 1, 64, "._-")) {
			set_err(err, err_len,
				"cluster '%s' is not etcd://HOST[:PORT][,HOST[:PORT]...]/NAME "
				"(NAME: 1..64 of A-Z a-z 0-9 . _ -)", c->cluster);
			return -EINVAL;
		}
	}
	if (c->node_name[0] && !name_ok(c->node_name, 128, "._:-")) {
		set_err(err, err_len,
			"node_name '%s' must be 1..128 of A-Z a-z 0-9 . _ : -", c->node_name);
		return -EINVAL;
	}
	return 0;
}

int conf_validate(struct conf *c, char *err, size_t err_len)
{
	uint64_t put_frame = PROTO_HEADER_BYTES + PROTO_BATCH_PREFIX_BYTES +
			     (uint64_t)PROTO_PUT_ENTRY_BYTES * c->max_batch_blocks;
	uint64_t capacity = c->dram_capacity_bytes / CONF_PAGE_BYTES * CONF_PAGE_BYTES;
	char a[32], b[32];
	int rc;

	rc = validate_ranges(c, err, err_len);
	if (rc)
		return rc;
	rc = validate_block_fits(c, capacity, err, err_len);
	if (rc)
		return rc;
	rc = validate_cluster(c, err, err_len);
	if (rc)
		return rc;
	if (c->max_inflight_put_bytes < c->max_block_bytes) {
		format_size(c->max_inflight_put_bytes, a, sizeof(a));
		format_size(c->max_block_bytes, b, sizeof(b));
		set_err(err, err_len,
			"max_inflight_put_bytes (%s) must be at least max_block_bytes (%s)", a, b);
		return -EINVAL;
	}
	if (c->max_frame_bytes < put_frame) {
		format_size(c->max_frame_bytes, a, sizeof(a));
		set_err(err, err_len,
			"max_frame_bytes (%s) cannot hold a PUT of max_batch_blocks (%" PRIu32
			") entries: it needs at least %" PRIu64 " bytes (32 + 8 + 88 per block)",
			a, c->max_batch_blocks, put_frame);
		return -EINVAL;
	}
	if (c->rdma_port && c->rdma_port == c->port) {
		set_err(err, err_len,
			"rdma_port (%" PRIu32 ") must differ from port: iWARP devices share the TCP "
			"port space", c->rdma_port);
		return -EINVAL;
	}
	if (c->rdma_port && c->rdma_port == c->admin_port) {
		set_err(err, err_len,
			"rdma_port (%" PRIu32 ") must differ from admin_port: iWARP devices share the "
			"TCP port space", c->rdma_port);
		return -EINVAL;
	}
	if (c->admin_port && c->admin_port == c->port) {
		set_err(err, err_len,
			"admin_port (%" PRIu32 ") must differ from port: both listen on the listen "
			"address (admin_port 0 turns admin http off)", c->admin_port);
		return -EINVAL;
	}
	if (c->kv_events_replay_endpoint[0] && !c->kv_events_endpoint[0]) {
		set_err(err, err_len,
			"kv_events_replay_endpoint (%s) needs kv_events_endpoint: set it to publish "
			"kv events", c->kv_events_replay_endpoint);
		return -EINVAL;
	}
	if (c->kv_events_replay_endpoint[0] &&
	    strcmp(c->kv_events_replay_endpoint, c->kv_events_endpoint) == 0) {
		set_err(err, err_len,
			"kv_events_replay_endpoint must differ from kv_events_endpoint (%s)",
			c->kv_events_endpoint);
		return -EINVAL;
	}
	rc = validate_nvme(c, err, err_len);
	if (rc)
		return rc;
	c->dram_capacity_bytes = capacity;
	return 0;
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
		format_number(s, s->flags & CONF_ZERO_IS_CORES ? 0 : s->min, lo, sizeof(lo));
		format_number(s, s->max, hi, sizeof(hi));
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
	const struct conf_setting *s = name ? find_setting(name) : NULL;

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
 * (string_check), so only '"' and '\\' need escaping. */
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
			json_add(buf, len, &used, "%" PRIu64, field_get(c, s));
			break;
		case CONF_BOOL:
			json_add(buf, len, &used, "%s", field_get(c, s) ? "true" : "false");
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
