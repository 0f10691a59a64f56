/*
 * srv_prefault.c - the thread that faults the arena in at start-up while
 * the pool already serves. See srv_prefault.h.
 */
#include "srv_prefault.h"

#include <inttypes.h>
#include <pthread.h>

#include "srv_clock.h"
#include "srv_log.h"
#include "srv_server.h"
#include "store.h"

/* Fault the arena in, 64 MiB at a time, while the pool already serves, so
 * that neither start-up nor the first puts wait for page zeroing. */
static void *prefault_main(void *arg)
{
	struct srv *s = arg;
	const uint64_t chunk = 64ull << 20;
	uint64_t off = 0, done;
	uint64_t t0 = srv_now_ms();

	while (!__atomic_load_n(&s->prefault_stop, __ATOMIC_RELAXED)) {
		done = store_prefault(s->store, off, chunk);
		if (done == 0)
			break;
		off += done;
	}
	srv_debug("arena faulted in: %" PRIu64 " bytes in %" PRIu64 " ms", off,
		  srv_now_ms() - t0);
	return NULL;
}

void srv_prefault_start(struct srv *s)
{
	if (pthread_create(&s->prefault_thread, NULL, prefault_main, s) == 0)
		s->prefault_running = 1;
	else
		srv_warn("cannot start the arena prefault thread; pages fault in on first use");
}

void srv_prefault_stop(struct srv *s)
{
	if (!s->prefault_running)
		return;
	__atomic_store_n(&s->prefault_stop, 1, __ATOMIC_RELAXED);
	pthread_join(s->prefault_thread, NULL);
	s->prefault_running = 0;
}
