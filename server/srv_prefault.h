/*
 * srv_prefault.h - fault the store's arena in on a background thread at
 * start-up, 64 MiB at a time, so that neither start-up nor the first puts
 * wait for page zeroing.
 */
#ifndef KVPOOL_SRV_PREFAULT_H
#define KVPOOL_SRV_PREFAULT_H

struct srv;

/* Main thread, after the store is open: start the thread (s->store must
 * stay open until srv_prefault_stop). When the thread cannot be created
 * it warns and returns: pages then fault in on first use. */
void srv_prefault_start(struct srv *s);

/* Main thread, before the store closes: ask the thread to stop after its
 * current chunk and join it. A no-op when it never started. */
void srv_prefault_stop(struct srv *s);

#endif /* KVPOOL_SRV_PREFAULT_H */
