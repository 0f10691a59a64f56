/*
 * srv_etcd.h - kvpoold's registration in a cluster's etcd (settings
 * cluster, node_name, advertise_address, cluster_lease_s; docs/cluster.md).
 *
 * When `cluster` is set, a thread of its own keeps the record
 * kvpool/<cluster>/nodes/<node_name> (JSON: name, address, port, tls,
 * rdma_port, admin_port, rdma, dram/nvme capacities, start epoch) under
 * an etcd lease of cluster_lease_s seconds that it renews every third of
 * it, reading the record back each time. etcd unreachable, a lease that
 * expired meanwhile, or a record deleted while the lease lives never stops
 * kvpoold: the thread logs it once per change of state, keeps serving
 * and tries again (re-granting and re-putting as needed); the state is in
 * STATS ("cluster"). The record is written only where the name is free,
 * already this process's, or left by an earlier run of this node (same
 * address and port); another node's record under the same name is left
 * alone and reported ("name in use by another node"). A clean stop
 * deletes the record if it is still under this process's lease and
 * revokes the lease. cluster_url may name several etcd members
 * (etcd://a:2379,b:2379/NAME); calls fail over between them.
 *
 * Threads: start, leave and free from the main thread; json from any
 * thread (it takes the state lock); the registration thread only talks
 * to etcd.
 */
#ifndef KVPOOL_SRV_ETCD_H
#define KVPOOL_SRV_ETCD_H

#include <stdint.h>

struct srv_etcd;

/* What the record says. Strings are copied by srv_etcd_start. */
struct srv_etcd_node {
	const char *cluster_url;     /* etcd://HOST[:PORT]/CLUSTER */
	const char *node_name;       /* "" = HOSTNAME:PORT */
	const char *address;         /* advertised; "" = listen, or the host name
				      * when listen is a wildcard */
	const char *listen;          /* the listen setting */
	uint16_t port, rdma_port, admin_port;
	int rdma;                    /* RDMA is served */
	int tls;                     /* the data port speaks TLS: clients use tls:// */
	uint64_t dram_capacity_bytes, nvme_capacity_bytes;
	uint32_t lease_s;
};

/* Start registering (returns at once; the first registration happens on
 * the thread). Errors: -EINVAL (cluster_url does not parse), -ENOMEM,
 * -errno of pthread_create. Nothing is started on error. */
int srv_etcd_start(const struct srv_etcd_node *n, struct srv_etcd **out);

/* Leave the cluster: stop the thread, then delete the record and revoke
 * the lease (each bounded by a 1 s etcd timeout). e stays valid (its
 * state reads "left") until srv_etcd_free, so a STATS being answered on a
 * worker meanwhile is safe. Main thread. Accepts NULL; once only. */
void srv_etcd_leave(struct srv_etcd *e);

/* Free (after srv_etcd_leave, once no worker can read it). Accepts NULL. */
void srv_etcd_free(struct srv_etcd *e);

/* The registration state as a JSON object (malloc'd, NUL-terminated;
 * the caller frees it): {"url","key","registered" (the record is in etcd
 * under this process's lease, as last checked),"state","last_error",
 * "registrations","reregistrations" (records found deleted or replaced
 * while the lease lived),"failures","lease" (its id in hex as etcdctl
 * shows it, "" when not registered),"endpoint" (the etcd member in use),"failovers"}. NULL when
 * e is NULL or out of memory. Any thread. */
char *srv_etcd_json(struct srv_etcd *e);

/* 1 when `address` is a loopback address literal (127.0.0.0/8, ::1,
 * ::ffff:127.x, in brackets or not) or "localhost"; 2 when it is a name
 * that resolves here (getaddrinfo, may block on DNS) to loopback
 * addresses only; 0 otherwise (including names that do not resolve).
 * Any thread. */
int srv_etcd_loopback(const char *address);

#endif /* KVPOOL_SRV_ETCD_H */
