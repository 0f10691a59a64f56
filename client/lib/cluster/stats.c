/*
 * stats.c - kvpool_stats on a cluster handle: the nodes' documents summed
 * (same keys as one server's) - except what is no counter: pid and
 * uptime_s are left out, version and protocol kept when every node says
 * the same, settings left to each node's own document - ratios computed
 * again from their summed parts, plus a "cluster" object (membership,
 * etcd, placement, its counters, and each node's state, counters and own
 * document).
 */
#include <errno.h>
#include <json-c/json.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_impl.h"
#include "lib/clock.h"

/* Merge node STATS document `src` into `dst` (both objects): integers
 * add up, other numbers keep the largest (latency percentiles: an upper
 * bound), booleans OR, strings and arrays keep dst's, objects merge. */
static void stats_merge(struct json_object *dst, struct json_object *src)
{
	json_object_object_foreach(src, key, sv) {
		struct json_object *dv;

		if (!strcmp(key, "cluster"))
			continue; /* a node's etcd registration: in its own document */
		if (!json_object_object_get_ex(dst, key, &dv)) {
			json_object_object_add(dst, key, json_object_get(sv));
			continue;
		}
		if (json_object_is_type(dv, json_type_object) &&
		    json_object_is_type(sv, json_type_object)) {
			stats_merge(dv, sv);
		} else if (json_object_is_type(dv, json_type_int) &&
			   json_object_is_type(sv, json_type_int)) {
			int64_t sum;

			if (__builtin_add_overflow(json_object_get_int64(dv),
						   json_object_get_int64(sv), &sum))
				sum = INT64_MAX; /* not a counter anyone reads summed */
			json_object_object_add(dst, key, json_object_new_int64(sum));
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

#define ADD_I64(o, k, v) json_object_object_add((o), (k), json_object_new_int64((int64_t)(v)))

/* Placement, its settings and counters, and what is wrong with the
 * membership, into the "cluster" object (under cl->lock). */
static void cluster_counters_locked(struct kvcl *cl, struct json_object *c,
				    const struct kvcl_view *v)
{
	const struct kvcl_place *pl = &cl->place;
	struct json_object *f = json_object_new_object();
	char err[384] = "";

	json_object_object_add(c, "placement", json_object_new_string("block"));
	ADD_I64(c, "hot_replicas", pl->replicas);
	ADD_I64(c, "hot_children", pl->hot.threshold);
	ADD_I64(c, "hot_blocks", pl->hot.marked);
	ADD_I64(c, "budget_ms", cl->budget_ms);
	json_object_object_add(f, "active", json_object_new_boolean(pl->fallback));
	ADD_I64(f, "previous_nodes", pl->fallback ? pl->n_prev : 0);
	ADD_I64(f, "changes", pl->changes);
	ADD_I64(f, "fallback_ms", pl->fallback_ms);
	json_object_object_add(c, "fallback", f);
	ADD_I64(c, "fallback_hits", cl->fallback_hits);
	ADD_I64(c, "copies", cl->copies);
	ADD_I64(c, "copy_bytes", cl->copy_bytes);
	ADD_I64(c, "copies_dropped", cl->copies_dropped);
	ADD_I64(c, "redirected_puts", cl->redirected_puts);
	ADD_I64(c, "puts_nowhere", cl->puts_nowhere);
	ADD_I64(c, "budget_expired", cl->budget_expired);
	ADD_I64(c, "pending_removals", kvcl_removals_pending_locked(cl));
	ADD_I64(c, "ignored_nodes", cl->ignored_nodes);
	if (!v->n)
		snprintf(err, sizeof(err), "no node is a member%s%s%s", cl->endpoint[0] ?
			 " (nothing registered under " : "", cl->endpoint[0] ? cl->prefix : "",
			 cl->endpoint[0] ? ")" : "");
	else if (cl->ignored_nodes)
		snprintf(err, sizeof(err), "%zu registered nodes past the limit of %d are not "
			 "used (e.g. %s)", cl->ignored_nodes, KVCL_MAX_NODES, cl->ignored_name);
	else if (!v->n_up)
		snprintf(err, sizeof(err), "every node is down");
	json_object_object_add(c, "error", json_object_new_string(err));
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
	/* refused: it answers, and says no (a token, a namespace) */
	json_object_object_add(x, "state", json_object_new_string(
				   rc == 0 ? "up" : !kvcl_is_conn_error(rc) ? "refused"
				   : n->down ? "down" : "unreachable"));
	if (rc && c && c->res.msg) {
		char why[1200];

		snprintf(why, sizeof(why), "%s: %s", kvpool_strerror(rc), c->res.msg);
		json_object_object_add(x, "error", json_object_new_string(why));
	} else {
		json_object_object_add(x, "error",
				       json_object_new_string(rc ? kvpool_strerror(rc) : ""));
	}
	ADD_I64(x, "retry_in_ms", n->down && n->retry_at_ms > kvc_now_ms() ?
		n->retry_at_ms - kvc_now_ms() : 0);
	ADD_I64(x, "downs", n->downs);
	ADD_I64(x, "probes", n->probes);
	ADD_I64(x, "budget_expired", n->budget_expired);
	ADD_I64(x, "puts_redirected", n->puts_redirected);
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

/* Keys of a node's document that are no counters: the node's identity,
 * its clock, its settings. */
static void identity_fix(struct json_object *o, struct json_object *const *docs, size_t n)
{
	static const char *const drop[] = { "pid", "uptime_s", "settings", "started_at" };
	static const char *const same[] = { "version", "protocol" };

	for (size_t i = 0; i < sizeof(drop) / sizeof(drop[0]); i++)
		json_object_object_del(o, drop[i]);
	for (size_t i = 0; i < sizeof(same) / sizeof(same[0]); i++) {
		struct json_object *first = NULL, *v;
		int equal = 1;

		for (size_t j = 0; j < n; j++) {
			if (!docs[j] || !json_object_object_get_ex(docs[j], same[i], &v))
				continue;
			if (!first)
				first = v;
			else if (strcmp(json_object_to_json_string(first),
					json_object_to_json_string(v)) != 0)
				equal = 0;
		}
		if (first && equal)
			json_object_object_add(o, same[i], json_object_get(first));
		else
			json_object_object_add(o, same[i], json_object_new_string("mixed"));
	}
}

int kvcl_stats_doc(struct kvcl *cl, const struct kvcl_parent *p, char **json)
{
	struct json_object *docs[KVCL_MAX_NODES] = { 0 };
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

		if (d && json_object_is_type(d, json_type_object)) {
			stats_merge(o, d);
			docs[j] = d;
		} else {
			json_object_put(d);
		}
	}
	identity_fix(o, docs, p->view.n);
	for (size_t j = 0; j < p->view.n; j++)
		json_object_put(docs[j]);
	stats_ratios(o);
	json_object_object_add(o, "cluster", c);
	pthread_mutex_lock(&cl->lock);
	kvcl_place_shares(&cl->place, &p->view, share);
	json_object_object_add(c, "membership",
			       json_object_new_string(cl->endpoint[0] ? "etcd" : "static"));
	json_object_object_add(c, "epoch", json_object_new_int64((int64_t)cl->epoch));
	if (cl->endpoint[0])
		json_object_object_add(c, "etcd", etcd_object_locked(cl));
	cluster_counters_locked(cl, c, &p->view);
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
