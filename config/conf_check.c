/*
 * conf_check.c - conf_validate: the checks that span settings (a block
 * fits the arena, a PUT frame fits max_frame_bytes, ports differ, the NVMe
 * tier's geometry, cluster names).
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

#include "proto.h" /* frame layout sizes only: no code from proto/ is linked */

/* ---- validation ------------------------------------------------------------ */

/* Every numeric setting within its table range (for a struct filled by
 * hand) and the string NUL-terminated and valid. */
static int validate_ranges(const struct conf *c, char *err, size_t err_len)
{
	char val[64], lo[32], hi[32], why[160];

	for (size_t i = 0; i < conf_n_settings; i++) {
		const struct conf_setting *s = &conf_settings[i];
		uint64_t v;

		if (s->type == CONF_STRING) {
			const char *str = (const char *)c + s->offset;

			if (!memchr(str, '\0', s->field_bytes) ||
			    conf_string_check(s, str, why, sizeof(why))) {
				conf_err(err, err_len, "%s: invalid value", s->name);
				return -EINVAL;
			}
			continue;
		}
		v = conf_field_get(c, s);
		if (v < s->min || v > s->max) {
			conf_format_number(s, v, val, sizeof(val));
			conf_format_number(s, s->min, lo, sizeof(lo));
			conf_format_number(s, s->max, hi, sizeof(hi));
			conf_err(err, err_len, "%s: %s is out of range %s..%s", s->name,
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
	conf_format_size(c->max_block_bytes, a, sizeof(a));
	conf_format_size(capacity, b, sizeof(b));
	if (block != c->max_block_bytes) {
		char r[32];

		conf_format_size(block, r, sizeof(r));
		snprintf(pages, sizeof(pages), ", %s in 4KiB pages", r);
	}
	conf_err(err, err_len, "max_block_bytes (%s%s) must not exceed dram_capacity (%s)", a, pages,
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
		conf_format_size(c->nvme_capacity_bytes, a, sizeof(a));
		conf_err(err, err_len,
			"nvme_capacity (%s) needs nvme_dir: set nvme_dir to use the nvme tier, or "
			"leave nvme_capacity unset (0) for dram only", a);
		return -EINVAL;
	}
	if (!c->nvme_dir[0])
		return 0;
	if (!c->nvme_capacity_bytes) {
		conf_err(err, err_len, "nvme_capacity must be set when nvme_dir is set");
		return -EINVAL;
	}
	conf_format_size(c->nvme_capacity_bytes, a, sizeof(a));
	conf_format_size(block, d, sizeof(d));
	if (segment && segment % CONF_PAGE_BYTES) {
		conf_format_size(segment, b, sizeof(b));
		conf_err(err, err_len, "nvme_segment_size (%s) must be a multiple of 4KiB", b);
		return -EINVAL;
	}
	if (segment && segment < block) {
		conf_format_size(segment, b, sizeof(b));
		conf_err(err, err_len,
			"nvme_segment_size (%s) must hold a block of max_block_bytes (%s in 4KiB pages)",
			b, d);
		return -EINVAL;
	}
	if (segment && c->nvme_capacity_bytes / 2 < segment) {
		conf_format_size(segment, b, sizeof(b));
		conf_err(err, err_len, "nvme_capacity (%s) must hold two segments of nvme_segment_size (%s)",
			a, b);
		return -EINVAL;
	}
	if (!segment && c->nvme_capacity_bytes / 2 < block) {
		conf_err(err, err_len,
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
			conf_err(err, err_len,
				"cluster '%s' is not etcd://HOST[:PORT][,HOST[:PORT]...]/NAME "
				"(NAME: 1..64 of A-Z a-z 0-9 . _ -)", c->cluster);
			return -EINVAL;
		}
	}
	if (c->node_name[0] && !name_ok(c->node_name, 128, "._:-")) {
		conf_err(err, err_len,
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
		conf_format_size(c->max_inflight_put_bytes, a, sizeof(a));
		conf_format_size(c->max_block_bytes, b, sizeof(b));
		conf_err(err, err_len,
			"max_inflight_put_bytes (%s) must be at least max_block_bytes (%s)", a, b);
		return -EINVAL;
	}
	if (c->max_frame_bytes < put_frame) {
		conf_format_size(c->max_frame_bytes, a, sizeof(a));
		conf_err(err, err_len,
			"max_frame_bytes (%s) cannot hold a PUT of max_batch_blocks (%" PRIu32
			") entries: it needs at least %" PRIu64 " bytes (32 + 8 + 88 per block)",
			a, c->max_batch_blocks, put_frame);
		return -EINVAL;
	}
	if (c->rdma_port && c->rdma_port == c->port) {
		conf_err(err, err_len,
			"rdma_port (%" PRIu32 ") must differ from port: iWARP devices share the TCP "
			"port space", c->rdma_port);
		return -EINVAL;
	}
	if (c->rdma_port && c->rdma_port == c->admin_port) {
		conf_err(err, err_len,
			"rdma_port (%" PRIu32 ") must differ from admin_port: iWARP devices share the "
			"TCP port space", c->rdma_port);
		return -EINVAL;
	}
	if (c->admin_port && c->admin_port == c->port) {
		conf_err(err, err_len,
			"admin_port (%" PRIu32 ") must differ from port: both listen on the listen "
			"address (admin_port 0 turns admin http off)", c->admin_port);
		return -EINVAL;
	}
	if (!!c->tls_cert_file[0] != !!c->tls_key_file[0]) {
		conf_err(err, err_len, "%s is set but %s is not: TLS needs both the certificate "
			 "and its private key", c->tls_cert_file[0] ? "tls_cert_file" : "tls_key_file",
			 c->tls_cert_file[0] ? "tls_key_file" : "tls_cert_file");
		return -EINVAL;
	}
	if (c->tls_client_ca_file[0] && !c->tls_cert_file[0]) {
		conf_err(err, err_len, "tls_client_ca_file needs tls_cert_file and tls_key_file: "
			 "client certificates are checked in the TLS handshake");
		return -EINVAL;
	}
	if (c->tls_only == CONF_TLS_ONLY_ON && !c->tls_cert_file[0]) {
		conf_err(err, err_len, "tls_only is true but tls_cert_file is not set: nothing "
			 "could connect");
		return -EINVAL;
	}
	if (c->kv_events_replay_endpoint[0] && !c->kv_events_endpoint[0]) {
		conf_err(err, err_len,
			"kv_events_replay_endpoint (%s) needs kv_events_endpoint: set it to publish "
			"kv events", c->kv_events_replay_endpoint);
		return -EINVAL;
	}
	if (c->kv_events_replay_endpoint[0] &&
	    strcmp(c->kv_events_replay_endpoint, c->kv_events_endpoint) == 0) {
		conf_err(err, err_len,
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
