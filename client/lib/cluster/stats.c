/*
 * stats.c - kvpool_stats on a cluster handle: the nodes' documents summed
 * (same keys as one server's), ratios computed again from their summed
 * parts, plus a "cluster" object (membership, etcd, placement, and each
 * node's state, counters and own document).
 */
#include <errno.h>
#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_impl.h"

/* Merge node STATS document `src` into `dst` (both objects): integers
 * add up, other numbers keep the largest (latency percentiles: an upper
 * bound), booleans OR, strings and arrays keep dst's, objects merge. */
static void stats_merge(struct json_object *dst, struct json_object *src)
{
	json_object_object_foreach(src, key, sv) {
		struct json_object *dv;

		if (!json_object_object_get_ex(dst, key, &dv)) {
			json_object_object_add(dst, key, json_object_get(sv));
			continue;
		}
		if (json_object_is_type(dv, json_type_object) &&
		    json_object_is_type(sv, json_type_object)) {
			stats_merge(dv, sv);
		} else if (json_object_is_type(dv, json_type_int) &&
			   json_object_is_type(sv, json_type_int)) {
			json_object_object_add(dst, key, json_object_new_int64(
						  json_object_get_int64(dv) + json_object_get_int64(sv)));
		} else if (json_object_is_type(dv, json_type_double) &&
			   json_object_is_type(sv, json_type_double)) {
			if (json_object_get_double(sv) > json_object_get_double(dv))
				json_object_object_add(dst, key, json_object_get(sv));
		} else if (json_object_is_type(dv, json_type_boolean) &&
			   json_object_is_type(sv, json_type_boolean)) {
			json_object_object_add(dst, key, json_object_new_boolean(
						  json_object_get_boolean(dv) ||
						  json_object_get_boolean(sv)));
		}
	}
}

/* After a merge: ratios again from their summed parts. */
static void stats_ratios(struct json_object *o)
{
	static const char *const r[][3] = {
		{ "hit_ratio", "blocks_matched", "blocks_queried" },
		{ "match_hit_ratio", "match_blocks_matched", "match_blocks_queried" },
	};
	struct json_object *a, *b;

	for (size_t i = 0; i < sizeof(r) / sizeof(r[0]); i++)
		if (json_object_object_get_ex(o, r[i][0], NULL) &&
		    json_object_object_get_ex(o, r[i][1], &a) &&
		    json_object_object_get_ex(o, r[i][2], &b)) {
			double den = (double)json_object_get_int64(b);

			json_object_object_add(o, r[i][0], json_object_new_double(
						  den > 0 ? (double)json_object_get_int64(a) / den : 0));
		}
	json_object_object_foreach(o, key, v) {
		(void)key;
		if (json_object_is_type(v, json_type_object))
			stats_ratios(v);
	}
}

/* The "etcd" object (under cl->lock). */
static struct json_object *etcd_object_locked(const struct kvcl *cl)
{
	struct json_object *e = json_object_new_object();

	json_object_object_add(e, "endpoint", json_object_new_string(cl->endpoint));
	json_object_object_add(e, "cluster", json_object_new_string(cl->cluster));
	json_object_object_add(e, "reachable", json_object_new_boolean(cl->etcd_reachable));
	json_object_object_add(e, "error", json_object_new_string(cl->etcd_error));
	json_object_object_add(e, "revision", json_object_new_int64(cl->etcd_revision));
	json_object_object_add(e, "failures", json_object_new_int64((int64_t)cl->etcd_failures));
	json_object_object_add(e, "resumes", json_object_new_int64((int64_t)cl->etcd_resumes));
	return e;
}

/* One entry of "nodes" (under cl->lock). */
static struct json_object *node_object_locked(const struct kvcl_node *n,
					      const struct kvcl_child *c, double share)
{
	struct json_object *x = json_object_new_object(), *st = NULL;
	int rc = c ? c->res.status : -ECONNREFUSED;

	json_object_object_add(x, "name", json_object_new_string(n->name));
	json_object_object_add(x, "url", json_object_new_string(n->url));
	json_object_object_add(x, "up", json_object_new_boolean(rc == 0));
	json_object_object_add(x, "error", json_object_new_string(rc ? kvpool_strerror(rc) : ""));
	json_object_object_add(x, "share", json_object_new_double(share));
	json_object_object_add(x, "calls", json_object_new_int64((int64_t)n->calls));
	json_object_object_add(x, "errors", json_object_new_int64((int64_t)n->errors));
	json_object_object_add(x, "misses_from_errors",
			       json_object_new_int64((int64_t)n->misses_from_errors));
	json_object_object_add(x, "puts_dropped", json_object_new_int64((int64_t)n->puts_dropped));
	if (c && c->res.json)
		st = json_tokener_parse(c->res.json);
	json_object_object_add(x, "stats", st);
	return x;
}

int kvcl_stats_doc(struct kvcl *cl, const struct kvcl_parent *p, char **json)
{
	const struct kvcl_child *by[KVCL_MAX_NODES] = { 0 };
	double share[KVCL_MAX_NODES];
	struct json_object *o = json_object_new_object(), *c = json_object_new_object();
	struct json_object *nodes = json_object_new_array();
	char *s;

	if (!o || !c || !nodes) {
		json_object_put(o);
		json_object_put(c);
		json_object_put(nodes);
		return -ENOMEM;
	}
	for (size_t j = 0; j < p->view.n; j++)
		for (const struct kvcl_child *k = p->children; k; k = k->sibling)
			if (k->node == p->view.node[j])
				by[j] = k;
	/* The nodes' documents summed (same keys as one server's), plus "cluster". */
	for (size_t j = 0; j < p->view.n; j++) {
		struct json_object *d = by[j] && by[j]->res.json ?
					json_tokener_parse(by[j]->res.json) : NULL;

		if (d && json_object_is_type(d, json_type_object))
			stats_merge(o, d);
		json_object_put(d);
	}
	stats_ratios(o);
	json_object_object_add(o, "cluster", c);
	pthread_mutex_lock(&cl->lock);
	kvcl_place_shares(&cl->place, &p->view, share);
	json_object_object_add(c, "membership",
			       json_object_new_string(cl->endpoint[0] ? "etcd" : "static"));
	json_object_object_add(c, "epoch", json_object_new_int64((int64_t)cl->epoch));
	if (cl->endpoint[0])
		json_object_object_add(c, "etcd", etcd_object_locked(cl));
	json_object_object_add(c, "segment_blocks",
			       json_object_new_int((int)cl->place.segment_blocks));
	json_object_object_add(c, "unplaced_blocks",
			       json_object_new_int64((int64_t)cl->place.unplaced));
	json_object_object_add(c, "nodes", nodes);
	for (size_t j = 0; j < p->view.n; j++)
		json_object_array_add(nodes, node_object_locked(p->view.node[j], by[j], share[j]));
	pthread_mutex_unlock(&cl->lock);
	s = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
	json_object_put(o);
	if (!s)
		return -ENOMEM;
	*json = s;
	return 0;
}
