/*
 * list.h - the intrusive list of storage/ (internal): a circular doubly
 * linked list with a sentinel head, for leases, lessees and promotions.
 */
#ifndef KVPOOL_STORE_LIST_H
#define KVPOOL_STORE_LIST_H

#include <stdbool.h>
#include <stddef.h>

#define store_container_of(ptr, type, member) \
	((type *)(void *)((char *)(ptr) - offsetof(type, member)))

/* Circular doubly linked list with a sentinel head. */
struct store_list {
	struct store_list *next, *prev;
};

static inline void store_list_init(struct store_list *h)
{
	h->next = h;
	h->prev = h;
}

static inline bool store_list_empty(const struct store_list *h)
{
	return h->next == h;
}

static inline void store_list_add_tail(struct store_list *h, struct store_list *n)
{
	n->prev = h->prev;
	n->next = h;
	h->prev->next = n;
	h->prev = n;
}

static inline void store_list_del(struct store_list *n)
{
	n->prev->next = n->next;
	n->next->prev = n->prev;
	n->next = n;
	n->prev = n;
}

#endif /* KVPOOL_STORE_LIST_H */
