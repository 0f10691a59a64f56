/*
 * srv_fdlimit.c - RLIMIT_NOFILE against max_connections (srv_fdlimit.h).
 */
#include "srv_fdlimit.h"

#include <inttypes.h>
#include <sys/resource.h>

#include "srv_log.h"
#include "srv_server.h"

uint32_t srv_conn_limit(uint32_t max_connections, uint64_t nofile)
{
	if (nofile >= (uint64_t)max_connections + SRV_RESERVED_FDS)
		return max_connections;
	return nofile > SRV_RESERVED_FDS ? (uint32_t)(nofile - SRV_RESERVED_FDS) : 1;
}

void srv_conn_limit_update(struct srv *s)
{
	uint64_t need = (uint64_t)s->conf.max_connections + SRV_RESERVED_FDS;
	struct rlimit rl;

	s->conn_limit = s->conf.max_connections;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY ||
	    rl.rlim_cur >= need)
		return;
	if (rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need)
		rl.rlim_cur = need;
	else
		rl.rlim_cur = rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &rl) < 0 && getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return;
	s->conn_limit = srv_conn_limit(s->conf.max_connections, rl.rlim_cur);
	if (s->conn_limit < s->conf.max_connections)
		srv_warn("max_connections %u needs %" PRIu64 " file descriptors but RLIMIT_NOFILE is %"
			 PRIu64 "; serving at most %u connections", s->conf.max_connections, need,
			 (uint64_t)rl.rlim_cur, s->conn_limit);
}
