/*
 * harness.h - shared helpers of the integration tests: start and stop a
 * real kvpoold on a free loopback port, talk to it with raw protocol
 * frames, read STATS figures, run the kvpool CLI, and make deterministic
 * keys and payloads.
 *
 * Environment:
 *   KVPOOLD           path of the kvpoold binary (required)
 *   KVPOOL_CLI        path of the kvpool CLI (test_cli only)
 *   KVPOOL_TEST_DATA  folder of tests/data (test_cli only)
 *   KVPOOL_VALGRIND=1 run kvpoold under valgrind (leaks make it exit 99)
 *   CI=true           a skipped test fails instead
 *
 * Functions return 0 or a negative errno unless they say otherwise. The
 * helpers that end in _or_fail fail the current cmocka test themselves
 * (so they may only be called from a test's thread). Everything else may
 * be called from any thread.
 */
#ifndef KVPOOL_TESTS_HARNESS_H
#define KVPOOL_TESTS_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvpool.h"
#include "proto.h"

struct json_object;

#define HARNESS_MAX_ARGS 32
#define HARNESS_READY_TIMEOUT_MS 10000
#define HARNESS_STOP_TIMEOUT_MS 10000

/* One kvpoold child process. Zero-initialise before harness_start. */
struct harness_server {
	pid_t pid;       /* 0 when not running */
	uint16_t port;   /* the TCP port it listens on */
	char url[64];    /* "tcp://127.0.0.1:<port>" */
	const char *extra[HARNESS_MAX_ARGS]; /* borrowed flag strings, NULL-terminated */
};

/* ---- server lifecycle ------------------------------------------------------ */

/* Start $KVPOOLD on a free 127.0.0.1 port with the NULL-terminated flags
 * `extra` (borrowed: the strings must outlive the server, e.g. literals),
 * and wait until it answers a PING (up to 10 s; 30 s under valgrind). A
 * start that dies early (port taken by someone else) is retried on another
 * port. The child gets SIGKILL if the test process dies.
 * Errors: -ENOENT ($KVPOOLD unset or not executable), -E2BIG (too many
 * flags), -ETIMEDOUT (never answered; the child is killed), -ECHILD (it
 * kept exiting at start), -errno from fork. */
int harness_start(struct harness_server *s, const char *const *extra);

/* Like harness_start, on a given port (e.g. the port of a server that was
 * just stopped). Retries for up to 10 s while the start fails. */
int harness_start_on_port(struct harness_server *s, uint16_t port, const char *const *extra);

/* Run $KVPOOLD with `extra` on a free port expecting it to refuse to
 * start: wait up to timeout_ms for it to exit, capturing its stderr.
 * *status receives the exit code (128 + signal if killed), *err_text
 * (malloc'd, NUL-terminated; free()) what it wrote to stderr. If it is
 * still running at the deadline it is killed and -ETIMEDOUT returned; if
 * it answered a PING meanwhile (it opened its port) -EADDRINUSE is
 * returned after killing it. Errors: -ENOENT ($KVPOOLD), -E2BIG, -errno
 * of pipe/fork, -ETIMEDOUT, -EADDRINUSE. */
int harness_start_fail(const char *const *extra, int timeout_ms, int *status, char **err_text);

/* 1 when KVPOOL_VALGRIND=1 asks for kvpoold under valgrind, else 0. */
int harness_valgrind(void);

/* Send SIGTERM and wait up to 10 s (30 s under valgrind) for the exit.
 * Returns the exit status (0 = clean shutdown; 128 + signal number if a
 * signal killed it), or -ETIMEDOUT after which the child was SIGKILLed,
 * or -ECHILD when no server was running. Leaves s->pid 0. */
int harness_stop(struct harness_server *s);

/* SIGKILL and reap, for teardown after a failed test. Accepts a server
 * that is not running. */
void harness_kill(struct harness_server *s);

/* Skip the current test unless the server is running (a missing $KVPOOLD
 * is a skip, a failure under CI=true). Test thread only. */
void harness_need_server(const struct harness_server *s);

/* Connect a libkvpool client to `s` in namespace `ns` with a 10 s timeout.
 * Errors: those of kvpool_connect. */
int harness_client(const struct harness_server *s, const char *ns, struct kvpool_client **out);

/* Skip the current test with a message; under CI=true fail it instead.
 * Test thread only; does not return. */
void harness_skip(const char *why) __attribute__((noreturn));

/* ---- cmocka group fixtures ------------------------------------------------ */

/* The flags of the general-purpose server most groups start: a 64 MiB DRAM
 * arena, 2 worker threads, warnings only. NULL-terminated; static storage,
 * so it may be passed to harness_start as is. */
extern const char *const harness_default_flags[];

/* harness_start for a cmocka group setup. Returns 0 when the server runs,
 * and also when $KVPOOLD is missing (s->pid stays 0, so every test skips
 * in harness_need_server); returns -1, the value that fails a cmocka
 * fixture, after printing why the server did not start. */
int harness_group_start(struct harness_server *s, const char *const *extra);

/* harness_client for a cmocka group setup, after harness_group_start.
 * Returns 0 with *out connected, or 0 with *out untouched when s is not
 * running (the tests skip); returns -1 after printing the connect error. */
int harness_group_client(const struct harness_server *s, const char *ns,
			 struct kvpool_client **out);

/* The test body behind HARNESS_CLEAN_SHUTDOWN_TEST: *state is the server.
 * Skips unless it runs, then asserts that SIGTERM makes it exit 0. */
void harness_test_clean_shutdown(void **state);

/* A cmocka test entry named test_clean_shutdown that stops the server
 * `srv` points at (a static struct harness_server) and fails unless the
 * shutdown is clean. The server reaches the test as its initial state, so
 * the group setup must leave the group state NULL (cmocka would hand a
 * group state to every test instead). Put it last: the server is gone
 * after it. */
#define HARNESS_CLEAN_SHUTDOWN_TEST(srv)                    \
	{                                                   \
		.name = "test_clean_shutdown",              \
		.test_func = harness_test_clean_shutdown,   \
		.initial_state = (srv),                     \
	}

/* ---- raw frames -------------------------------------------------------------- */

/* A frame read from the server. body and payload are malloc'd (NULL when
 * empty) and freed by harness_frame_free. */
struct harness_frame {
	struct proto_header h;
	uint8_t *body;
	uint8_t *payload;
};

/* Open a blocking TCP connection to 127.0.0.1:port; *fd receives it. */
int harness_raw_connect(uint16_t port, int *fd);

/* Write all of buf; -EPIPE / -ECONNRESET when the peer is gone (no SIGPIPE). */
int harness_send_all(int fd, const void *buf, size_t len);

/* Encode a request header (version 1, flags 0) and send it with its body
 * and payload. Either pointer may be NULL when its length is 0. */
int harness_send_frame(int fd, uint8_t op, uint64_t request_id, const void *body,
		       uint32_t body_bytes, const void *payload, uint64_t payload_bytes);

/* harness_send_frame with header version `version` (a v2 frame, or a
 * version the server does not speak). */
int harness_send_frame_v(int fd, uint8_t version, uint8_t op, uint64_t request_id,
			 const void *body, uint32_t body_bytes, const void *payload,
			 uint64_t payload_bytes);

/* Read one reply frame within timeout_ms. The header must decode as a
 * reply of a version the codec knows (1 or 2). Errors: -ETIMEDOUT, -ECONNRESET (peer closed or reset,
 * also mid-frame), -EPROTO/-EMSGSIZE/... (header did not decode as a reply),
 * -ENOMEM. *f is written only on success. */
int harness_read_frame(int fd, int timeout_ms, struct harness_frame *f);

/* Free a frame's buffers. Accepts a zeroed frame. */
void harness_frame_free(struct harness_frame *f);

/* Wait until the peer closes the connection, discarding anything it sends.
 * Returns 0 once closed, -ETIMEDOUT if still open after timeout_ms. */
int harness_wait_closed(int fd, int timeout_ms);

/* Say HELLO for namespace `ns` (NUL-terminated) over a raw connection and
 * check the reply is OK; *out (may be NULL) receives the limits.
 * Errors: transport errors as harness_read_frame, -EPROTO on a non-OK or
 * malformed reply. */
int harness_raw_hello(int fd, const char *ns, struct proto_hello_reply *out);

/* harness_raw_hello offering versions min_version..max_version (the
 * HELLO header is version 1, as every client sends it); out->version
 * says which one the server chose. */
int harness_raw_hello_v(int fd, const char *ns, uint16_t min_version, uint16_t max_version,
			struct proto_hello_reply *out);

/* harness_raw_connect to port, then harness_raw_hello for namespace ns
 * (limits may be NULL); fails the test if either fails. Returns the
 * connected fd, which the caller closes. Test thread only. */
int harness_raw_session_or_fail(uint16_t port, const char *ns, struct proto_hello_reply *limits);

/* Decode the error body of a non-OK reply into buf (NUL-terminated,
 * truncated to cap) and the server's versions into *min_v and *max_v (may be
 * NULL). Errors: -EPROTO when the body is not an error body. */
int harness_error_message(const struct harness_frame *f, char *buf, size_t cap,
			  uint16_t *min_v, uint16_t *max_v);

/* Decode result i of a batch reply body, in the layout of the frame's
 * header version. Errors: -EPROTO. */
int harness_reply_result(const struct harness_frame *f, uint32_t i, struct proto_result *out);

/* Send a one-block PUT request (first block when parent is NULL). The
 * checksum sent is `checksum` (pass harness_xxh3(data, len) for a correct
 * one). Only `sent_bytes` of the payload are written (pass len for all). */
int harness_raw_put(int fd, uint64_t request_id, const uint8_t key[32], const uint8_t *parent,
		    const void *data, uint64_t len, uint64_t checksum, uint64_t sent_bytes);

/* ---- stats ---------------------------------------------------------------- */

/* Fetch and parse the STATS document (ns NULL = all namespaces). *doc is
 * released with json_object_put. Errors: kvpool_stats errors, -EPROTO when
 * it is not JSON. */
int harness_stats(struct kvpool_client *c, const char *ns, struct json_object **doc);

/* Look a dotted path ("tiers.dram.used_bytes") up in doc. Errors: -ENOENT
 * (missing), -EINVAL (not a non-negative integer / not a number). */
int harness_json_u64(struct json_object *doc, const char *path, uint64_t *out);
int harness_json_double(struct json_object *doc, const char *path, double *out);

/* harness_json_u64 / harness_json_double that return the value and fail
 * the test when the field is missing or of the wrong type. Test thread
 * only. */
uint64_t harness_json_u64_or_fail(struct json_object *doc, const char *path);
double harness_json_double_or_fail(struct json_object *doc, const char *path);

/* Fetch STATS and return one integer field; fails the test on any error. */
uint64_t harness_stat_or_fail(struct kvpool_client *c, const char *path);

/* A field of namespace ns ("blocks", "get_hits"...); a namespace absent
 * from STATS counts as all zero. Fails the test on other errors. */
uint64_t harness_ns_stat_or_fail(struct kvpool_client *c, const char *ns, const char *field);

/* Poll STATS every 20 ms until `path` equals `want` or timeout_ms passes.
 * Returns the last value read; fails the test on a STATS error. */
uint64_t harness_wait_stat_or_fail(struct kvpool_client *c, const char *path, uint64_t want,
				   int timeout_ms);

/* Like harness_wait_stat_or_fail, but waits until `path` is at least
 * `min`. Returns the last value read, which is below min on a timeout. */
uint64_t harness_wait_stat_at_least_or_fail(struct kvpool_client *c, const char *path,
					    uint64_t min, int timeout_ms);

/* ---- blocks ------------------------------------------------------------------ */

/* GET key into a buffer of exactly len bytes and fail the test unless the
 * GET succeeds with the len bytes at want. Test thread only. */
void harness_check_block_or_fail(struct kvpool_client *c, const uint8_t key[32], const void *want,
				 size_t len);

/* EXISTS key and fail the test unless the call succeeds and the key is
 * absent (-ENOENT) in c's namespace. Test thread only. */
void harness_check_absent_or_fail(struct kvpool_client *c, const uint8_t key[32]);

/* Send one GET request for keys[0..count) (each with max_length) over a
 * raw connection and read its reply into *f (check f->h.request_id and
 * decode results with harness_reply_result; OK payloads are concatenated
 * in f->payload). Errors: as harness_send_frame and harness_read_frame,
 * -ENOMEM. */
int harness_raw_get(int fd, uint64_t request_id, const uint8_t (*keys)[32], uint32_t count,
		    uint64_t max_length, int timeout_ms, struct harness_frame *f);

/* Send (do not read) one GET request for keys[0..count). */
int harness_raw_get_send(int fd, uint64_t request_id, const uint8_t (*keys)[32], uint32_t count,
			 uint64_t max_length);

/* ---- processes, data, time ------------------------------------------------ */

/* Run argv[0] with argv, stdout captured into *out (malloc'd, NUL-terminated;
 * free()), stderr inherited, stdin /dev/null. Kills it after timeout_ms.
 * *status receives the exit code, or 128 + signal. Errors: -errno of spawn,
 * -ETIMEDOUT (killed). */
int harness_run(char *const argv[], int timeout_ms, char **out, int *status);

/* A deterministic 32-byte key from a tag and a number. */
void harness_key(uint8_t key[32], const char *tag, uint64_t n);

/* Fill buf with len deterministic pseudo-random bytes derived from seed. */
void harness_fill(void *buf, size_t len, uint64_t seed);

/* A seed derived from a key, for payloads whose content follows the key. */
uint64_t harness_key_seed(const uint8_t key[32]);

/* xxh3-64 (seed 0) of buf, the protocol checksum. */
uint64_t harness_xxh3(const void *buf, size_t len);

/* Make a fresh empty directory "<$TMPDIR or /tmp>/kvpool-<tag>-XXXXXX" and
 * write its path into buf[0..cap). Errors: -ENAMETOOLONG, -errno of
 * mkdtemp. */
int harness_tmpdir(const char *tag, char *buf, size_t cap);

/* Remove path and everything under it (no symlink is followed). Returns 0
 * or the first -errno met; a missing path is 0. */
int harness_rm_rf(const char *path);

/* CLOCK_MONOTONIC in milliseconds. */
uint64_t harness_now_ms(void);

/* Sleep for ms milliseconds. */
void harness_sleep_ms(uint32_t ms);

#endif /* KVPOOL_TESTS_HARNESS_H */
