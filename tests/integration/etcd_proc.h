/*
 * etcd_proc.h - start and stop Debian's etcd (etcd-server) for the
 * cluster tests: free loopback ports, a temporary data directory, and
 * SIGKILL of the child if the test process dies.
 *
 * Environment: KVPOOL_ETCD (the etcd binary; default "etcd" on PATH).
 * Functions return 0 or -errno. Any thread.
 */
#ifndef KVPOOL_TESTS_ETCD_PROC_H
#define KVPOOL_TESTS_ETCD_PROC_H

#include <stdint.h>
#include <sys/types.h>

struct etcd_proc {
	pid_t pid;              /* 0 when not running */
	uint16_t client_port;
	uint16_t peer_port;
	char dir[64];           /* data dir parent, removed by etcd_proc_destroy */
	char endpoint[32];      /* "127.0.0.1:<client_port>" */
	char name[32];          /* member name ("kvpooltest" when empty) */
	char cluster[512];      /* --initial-cluster ("" = this member alone) */
	char token[64];         /* --initial-cluster-token ("" = from dir) */
};

/* Is an etcd binary there to run? 1 or 0. */
int etcd_proc_available(void);

/* Pick ports and a data dir (first start) or keep them (a restart after
 * etcd_proc_stop, same data: the store survives), start etcd and wait
 * until it answers (up to 15 s). Errors: -ENOENT (no etcd binary),
 * -ETIMEDOUT (never answered; killed), -errno of fork/mkdtemp. */
int etcd_proc_start(struct etcd_proc *e);

/* SIGTERM and wait (SIGKILL after 5 s). Keeps the data dir. Accepts a
 * stopped one. */
void etcd_proc_stop(struct etcd_proc *e);

/* Stop it and remove its data dir. Accepts a zeroed struct. */
void etcd_proc_destroy(struct etcd_proc *e);

/* A free loopback TCP port, or 0. */
uint16_t etcd_proc_free_port(void);

/* Stop it, remove its data (the store is gone: revision 1 again, no keys,
 * no leases) and start it again on the same ports: what an operator who
 * wipes or replaces etcd does. Errors: those of etcd_proc_start. */
int etcd_proc_wipe(struct etcd_proc *e);

/* Start an etcd cluster of n members (1..5) on loopback (m[] zeroed
 * first): each its own ports and data dir, all started, then waited for
 * until each answers /health. Errors: those of etcd_proc_start (members
 * already started are destroyed). Restart a member with etcd_proc_start
 * (it keeps its data and rejoins). */
int etcd_proc_start_cluster(struct etcd_proc *m, size_t n);

/* POST a JSON body to path (e.g. "/v3/kv/compaction") of its client
 * port; the reply body (NUL-terminated, truncated to cap) into out (may be
 * NULL). Returns the HTTP status (200...) or -errno. */
int etcd_proc_post(const struct etcd_proc *e, const char *path, const char *json, char *out,
		   size_t cap);

/* A comma list of the members' endpoints ("127.0.0.1:p1,127.0.0.1:p2")
 * into buf. */
void etcd_proc_endpoints(const struct etcd_proc *m, size_t n, char *buf, size_t cap);

#endif
