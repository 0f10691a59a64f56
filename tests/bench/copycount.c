/*
 * copycount.c - an LD_PRELOAD library that counts the bytes a process
 * copies with memcpy and memmove, and the heap allocations it makes, to
 * check from outside the code that kvpoold moves block payloads without
 * user-space copies and serves requests without allocating.
 *
 *   LD_PRELOAD=libcopycount.so COPYCOUNT_OUT=/tmp/counts kvpoold ...
 *
 * Copies counted: every call that reaches memcpy, memmove, mempcpy, bcopy
 * or their _FORTIFY_SOURCE variants (__memcpy_chk, __memmove_chk,
 * __mempcpy_chk) through the dynamic linker, from the program and from
 * every shared library it loads (libevent, libxxhash...). Calls of at
 * least COPYCOUNT_MIN_BYTES (default 4096) are "big" and their callers are
 * recorded.
 *
 * Allocations counted: every call of malloc, calloc, realloc,
 * reallocarray, posix_memalign, aligned_alloc, memalign, valloc and
 * pvalloc, from the program and its libraries, and from glibc itself
 * (glibc calls malloc through the dynamic linker so that it can be
 * replaced: strdup, fopen... are counted). Each call is forwarded to the
 * next definition (glibc's, or a sanitizer's). free calls are counted
 * apart.
 *
 * Copies not counted, so those figures are a lower bound:
 *  - copies glibc makes inside itself (its calls to its own memcpy are
 *    bound at link time: stdio buffers, realloc moving a block...);
 *  - copies the compiler inlined (constant, small sizes);
 *  - copies by the kernel (read, write, readv, writev): those are the
 *    socket I/O itself, not user-space copies.
 *
 * At exit (a normal exit or return from main; not on a fatal signal) the
 * totals are written to the file named by COPYCOUNT_OUT, as lines
 * "key value": big_calls, big_bytes, all_calls, all_bytes, min_bytes,
 * alloc_calls (the sum of malloc_calls, calloc_calls, realloc_calls and
 * memalign_calls, the last one counting every aligned variant),
 * alloc_bytes, free_calls, snapshots; then "caller ADDRESS SYMBOL calls N
 * bytes N" for up to 32 callers of big copies, most bytes first, and
 * "alloc_caller ADDRESS SYMBOL calls N bytes N" for up to 32 callers of
 * allocations made after the first snapshot (so that a test sees what
 * allocates in a steady state, not at start-up). Without COPYCOUNT_OUT
 * nothing is written.
 *
 * Snapshots: when COPYCOUNT_SIGNAL names a signal number (e.g. SIGRTMIN+2),
 * that signal writes the same report at once (symbols shown as "?"),
 * atomically (a temporary file renamed onto COPYCOUNT_OUT), so a test can
 * read the counts between two phases of a run. The first snapshot starts
 * the recording of alloc_caller lines.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CC_CALLERS 32
/* Heap served to dlsym while it resolves the real allocator (it calls
 * calloc for its error state); a few hundred bytes are used in practice. */
#define CC_BOOT_BYTES (64u * 1024)
#define CC_BOOT_ALIGN 16u

typedef void *(*copy_fn)(void *, const void *, size_t);

struct cc_caller {
	void *ret;         /* return address of the call */
	uint64_t calls, bytes;
};

/* A table of callers, filled in order of first appearance. */
struct cc_table {
	struct cc_caller e[CC_CALLERS];
	atomic_flag lock;
};

/* The real allocator, resolved with dlsym(RTLD_NEXT). */
struct cc_alloc {
	void *(*malloc)(size_t);
	void *(*calloc)(size_t, size_t);
	void *(*realloc)(void *, size_t);
	void *(*reallocarray)(void *, size_t, size_t);
	void (*free)(void *);
	int (*posix_memalign)(void **, size_t, size_t);
	void *(*aligned_alloc)(size_t, size_t);
	void *(*memalign)(size_t, size_t);
	void *(*valloc)(size_t);
	void *(*pvalloc)(size_t);
};

static _Atomic uint64_t big_calls, big_bytes, all_calls, all_bytes;
static _Atomic uint64_t malloc_calls, calloc_calls, realloc_calls, memalign_calls;
static _Atomic uint64_t alloc_bytes, free_calls, snapshots;
static _Atomic int alloc_armed; /* record alloc_caller lines from now on */
static uint64_t min_bytes = 4096;
static struct cc_table copy_callers = { .lock = ATOMIC_FLAG_INIT };
static struct cc_table alloc_callers = { .lock = ATOMIC_FLAG_INIT };
static copy_fn real_memcpy, real_memmove;
static struct cc_alloc real;
static _Atomic int alloc_ready;  /* every field of `real` is set */
/* Initial-exec: no __tls_get_addr call, which a sanitizer intercepts and
 * cannot serve before it has initialised (it allocates meanwhile). */
static _Thread_local int resolving __attribute__((tls_model("initial-exec")));
static _Alignas(CC_BOOT_ALIGN) unsigned char boot_heap[CC_BOOT_BYTES];
static _Atomic size_t boot_used;

/* A copy that cannot call back into us: used while dlsym resolves the
 * real functions (dlsym may copy). The optimize attribute keeps GCC from
 * turning the loop into a call to memcpy. */
__attribute__((optimize("no-tree-loop-distribute-patterns")))
static void *slow_move(void *dst, const void *src, size_t n)
{
	unsigned char *d = dst;
	const unsigned char *s = src;

	if (d < s || d >= s + n) {
		for (size_t i = 0; i < n; i++)
			d[i] = s[i];
	} else {
		for (size_t i = n; i-- > 0;)
			d[i] = s[i];
	}
	return dst;
}

/* The next definition of `name` after this library (glibc's). */
static void *resolve(const char *name)
{
	void *f;

	resolving = 1;
	f = dlsym(RTLD_NEXT, name);
	resolving = 0;
	return f;
}

/* Add one call of n bytes to its caller's line in t; drops it when the
 * table is full. */
static void note_caller(struct cc_table *t, void *ret, size_t n)
{
	while (atomic_flag_test_and_set_explicit(&t->lock, memory_order_acquire))
		;
	for (int i = 0; i < CC_CALLERS; i++) {
		if (t->e[i].ret && t->e[i].ret != ret)
			continue;
		t->e[i].ret = ret;
		t->e[i].calls++;
		t->e[i].bytes += n;
		break;
	}
	atomic_flag_clear_explicit(&t->lock, memory_order_release);
}

/* Count one copy of n bytes made by the code that returns to ret. */
static inline void count(size_t n, void *ret)
{
	atomic_fetch_add_explicit(&all_calls, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&all_bytes, n, memory_order_relaxed);
	if (n < min_bytes)
		return;
	atomic_fetch_add_explicit(&big_calls, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&big_bytes, n, memory_order_relaxed);
	note_caller(&copy_callers, ret, n);
}

/* Copy with the real memcpy (or memmove when `move`). */
static void *do_copy(void *d, const void *s, size_t n, int move)
{
	copy_fn f = move ? real_memmove : real_memcpy;

	if (!f) {
		if (resolving)
			return slow_move(d, s, n);
		f = (copy_fn)resolve(move ? "memmove" : "memcpy");
		if (!f)
			return slow_move(d, s, n);
		if (move)
			real_memmove = f;
		else
			real_memcpy = f;
	}
	return f(d, s, n);
}

void *memcpy(void *d, const void *s, size_t n)
{
	count(n, __builtin_return_address(0));
	return do_copy(d, s, n, 0);
}

void *memmove(void *d, const void *s, size_t n)
{
	count(n, __builtin_return_address(0));
	return do_copy(d, s, n, 1);
}

void *mempcpy(void *d, const void *s, size_t n)
{
	count(n, __builtin_return_address(0));
	return (char *)do_copy(d, s, n, 0) + n;
}

void bcopy(const void *s, void *d, size_t n)
{
	count(n, __builtin_return_address(0));
	do_copy(d, s, n, 1);
}

void *__memcpy_chk(void *d, const void *s, size_t n, size_t dlen)
{
	if (n > dlen)
		abort();
	count(n, __builtin_return_address(0));
	return do_copy(d, s, n, 0);
}

void *__memmove_chk(void *d, const void *s, size_t n, size_t dlen)
{
	if (n > dlen)
		abort();
	count(n, __builtin_return_address(0));
	return do_copy(d, s, n, 1);
}

void *__mempcpy_chk(void *d, const void *s, size_t n, size_t dlen)
{
	if (n > dlen)
		abort();
	count(n, __builtin_return_address(0));
	return (char *)do_copy(d, s, n, 0) + n;
}

/* ---- allocations ---------------------------------------------------------- */

/* Is p from the bootstrap heap (never freed, never given to the real
 * allocator)? */
static int boot_owns(const void *p)
{
	const unsigned char *b = p;

	return b >= boot_heap && b < boot_heap + sizeof(boot_heap);
}

/* Serve n bytes from the bootstrap heap, zeroed (it is static and never
 * reused), with the size stored just before them for realloc. NULL when
 * it is spent. */
static void *boot_alloc(size_t n)
{
	size_t need = CC_BOOT_ALIGN + ((n + CC_BOOT_ALIGN - 1) & ~(size_t)(CC_BOOT_ALIGN - 1));
	size_t at = atomic_fetch_add_explicit(&boot_used, need, memory_order_relaxed);

	if (n > sizeof(boot_heap) || at > sizeof(boot_heap) - need) {
		errno = ENOMEM;
		return NULL;
	}
	*(size_t *)(boot_heap + at) = n;
	return boot_heap + at + CC_BOOT_ALIGN;
}

/* Resolve the real allocator once. Returns 0, or -1 while this thread is
 * inside dlsym (the caller then serves from the bootstrap heap) or when
 * a symbol is missing. */
static int alloc_resolve(void)
{
	struct cc_alloc r;

	if (atomic_load_explicit(&alloc_ready, memory_order_acquire))
		return 0;
	if (resolving)
		return -1;
	r.malloc = (void *(*)(size_t))resolve("malloc");
	r.calloc = (void *(*)(size_t, size_t))resolve("calloc");
	r.realloc = (void *(*)(void *, size_t))resolve("realloc");
	r.reallocarray = (void *(*)(void *, size_t, size_t))resolve("reallocarray");
	r.free = (void (*)(void *))resolve("free");
	r.posix_memalign = (int (*)(void **, size_t, size_t))resolve("posix_memalign");
	r.aligned_alloc = (void *(*)(size_t, size_t))resolve("aligned_alloc");
	r.memalign = (void *(*)(size_t, size_t))resolve("memalign");
	r.valloc = (void *(*)(size_t))resolve("valloc");
	r.pvalloc = (void *(*)(size_t))resolve("pvalloc");
	if (!r.malloc || !r.calloc || !r.realloc || !r.reallocarray || !r.free ||
	    !r.posix_memalign || !r.aligned_alloc || !r.memalign || !r.valloc || !r.pvalloc)
		return -1;
	/* Two threads may race here: both store the same pointers. */
	real = r;
	atomic_store_explicit(&alloc_ready, 1, memory_order_release);
	return 0;
}

/* Count one allocation of n bytes by the code that returns to ret. */
static inline void count_alloc(_Atomic uint64_t *kind, size_t n, void *ret)
{
	atomic_fetch_add_explicit(kind, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&alloc_bytes, n, memory_order_relaxed);
	if (atomic_load_explicit(&alloc_armed, memory_order_relaxed))
		note_caller(&alloc_callers, ret, n);
}

void *malloc(size_t n)
{
	if (alloc_resolve() < 0)
		return boot_alloc(n);
	count_alloc(&malloc_calls, n, __builtin_return_address(0));
	return real.malloc(n);
}

void *calloc(size_t k, size_t n)
{
	if (alloc_resolve() < 0) {
		if (n && k > SIZE_MAX / n) {
			errno = ENOMEM;
			return NULL;
		}
		return boot_alloc(k * n);
	}
	count_alloc(&calloc_calls, k * n, __builtin_return_address(0));
	return real.calloc(k, n);
}

/* realloc of a bootstrap block: a fresh block from the real allocator
 * with the old bytes (the old block stays where it is). */
static void *boot_realloc(void *p, size_t n)
{
	size_t old = *(size_t *)((unsigned char *)p - CC_BOOT_ALIGN);
	void *q = alloc_resolve() < 0 ? boot_alloc(n) : real.malloc(n);

	if (q)
		slow_move(q, p, old < n ? old : n);
	return q;
}

void *realloc(void *p, size_t n)
{
	if (p && boot_owns(p))
		return boot_realloc(p, n);
	if (alloc_resolve() < 0)
		return p ? NULL : boot_alloc(n);
	count_alloc(&realloc_calls, n, __builtin_return_address(0));
	return real.realloc(p, n);
}

void *reallocarray(void *p, size_t k, size_t n)
{
	if (n && k > SIZE_MAX / n) {
		errno = ENOMEM;
		return NULL;
	}
	if (p && boot_owns(p))
		return boot_realloc(p, k * n);
	if (alloc_resolve() < 0)
		return p ? NULL : boot_alloc(k * n);
	count_alloc(&realloc_calls, k * n, __builtin_return_address(0));
	return real.reallocarray(p, k, n);
}

void free(void *p)
{
	if (!p || boot_owns(p))
		return;
	atomic_fetch_add_explicit(&free_calls, 1, memory_order_relaxed);
	/* Not resolved means nothing was allocated through us yet. */
	if (alloc_resolve() == 0)
		real.free(p);
}

int posix_memalign(void **out, size_t align, size_t n)
{
	if (alloc_resolve() < 0)
		return ENOMEM;
	count_alloc(&memalign_calls, n, __builtin_return_address(0));
	return real.posix_memalign(out, align, n);
}

void *aligned_alloc(size_t align, size_t n)
{
	if (alloc_resolve() < 0)
		return NULL;
	count_alloc(&memalign_calls, n, __builtin_return_address(0));
	return real.aligned_alloc(align, n);
}

void *memalign(size_t align, size_t n)
{
	if (alloc_resolve() < 0)
		return NULL;
	count_alloc(&memalign_calls, n, __builtin_return_address(0));
	return real.memalign(align, n);
}

void *valloc(size_t n)
{
	if (alloc_resolve() < 0)
		return NULL;
	count_alloc(&memalign_calls, n, __builtin_return_address(0));
	return real.valloc(n);
}

void *pvalloc(size_t n)
{
	if (alloc_resolve() < 0)
		return NULL;
	count_alloc(&memalign_calls, n, __builtin_return_address(0));
	return real.pvalloc(n);
}

/* ---- the report -------------------------------------------------------------- */

/* A report being formatted without stdio or the heap (it is also written
 * from a signal handler). */
struct cc_out {
	char buf[12288];
	size_t len;
};

static void out_str(struct cc_out *o, const char *s)
{
	while (*s && o->len < sizeof(o->buf))
		o->buf[o->len++] = *s++;
}

/* v in base 10 or 16 ("0x" prefixed). */
static void out_u64(struct cc_out *o, uint64_t v, int hex)
{
	char d[24];
	int n = 0;

	do {
		d[n++] = "0123456789abcdef"[v % (hex ? 16 : 10)];
		v /= hex ? 16 : 10;
	} while (v);
	if (hex)
		out_str(o, "0x");
	while (n && o->len < sizeof(o->buf))
		o->buf[o->len++] = d[--n];
}

static void out_kv(struct cc_out *o, const char *key, uint64_t v)
{
	out_str(o, key);
	out_str(o, " ");
	out_u64(o, v, 0);
	out_str(o, "\n");
}

/* Sort a caller table by bytes, most first (a handful: insertion sort). */
static void sort_callers(struct cc_table *t)
{
	for (int i = 1; i < CC_CALLERS; i++) {
		struct cc_caller c = t->e[i];
		int j = i;

		for (; j > 0 && t->e[j - 1].bytes < c.bytes; j--)
			t->e[j] = t->e[j - 1];
		t->e[j] = c;
	}
}

/* One line per caller of t, each starting with `tag`; symbols only when
 * `symbols` (dladdr is not safe in a signal handler). */
static void out_callers(struct cc_out *o, const struct cc_table *t, const char *tag, int symbols)
{
	for (int i = 0; i < CC_CALLERS && t->e[i].ret; i++) {
		Dl_info info = { 0 };
		const char *sym = symbols && dladdr(t->e[i].ret, &info) && info.dli_sname ?
				  info.dli_sname : "?";

		out_str(o, tag);
		out_str(o, " ");
		out_u64(o, (uint64_t)(uintptr_t)t->e[i].ret, 1);
		out_str(o, " ");
		out_str(o, sym);
		out_str(o, " calls ");
		out_u64(o, t->e[i].calls, 0);
		out_str(o, " bytes ");
		out_u64(o, t->e[i].bytes, 0);
		out_str(o, "\n");
	}
}

/* Format every counter into o (callers with symbols when `symbols`). */
static void format_report(struct cc_out *o, int symbols)
{
	uint64_t m = malloc_calls, c = calloc_calls, r = realloc_calls, a = memalign_calls;

	o->len = 0;
	out_kv(o, "big_calls", big_calls);
	out_kv(o, "big_bytes", big_bytes);
	out_kv(o, "all_calls", all_calls);
	out_kv(o, "all_bytes", all_bytes);
	out_kv(o, "min_bytes", min_bytes);
	out_kv(o, "alloc_calls", m + c + r + a);
	out_kv(o, "malloc_calls", m);
	out_kv(o, "calloc_calls", c);
	out_kv(o, "realloc_calls", r);
	out_kv(o, "memalign_calls", a);
	out_kv(o, "alloc_bytes", alloc_bytes);
	out_kv(o, "free_calls", free_calls);
	out_kv(o, "snapshots", snapshots);
	out_callers(o, &copy_callers, "caller", symbols);
	out_callers(o, &alloc_callers, "alloc_caller", symbols);
}

/* Write o to `path` (through path.tmp and a rename when `atomic`). */
static void write_report(const struct cc_out *o, const char *path, int atomic)
{
	struct cc_out tmp;
	int fd;

	tmp.len = 0;
	out_str(&tmp, path);
	out_str(&tmp, ".tmp");
	if (tmp.len >= sizeof(tmp.buf))
		return;
	tmp.buf[tmp.len] = '\0';
	fd = open(atomic ? tmp.buf : path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	if (write(fd, o->buf, o->len) != (ssize_t)o->len) {
		close(fd);
		return;
	}
	close(fd);
	if (atomic)
		rename(tmp.buf, path);
}

/* COPYCOUNT_SIGNAL: a snapshot of the counts, then alloc callers are
 * recorded. Only async-signal-safe calls (the report is formatted by
 * hand; caller tables are read without their lock: a line may be torn). */
static void cc_snapshot(int sig)
{
	static struct cc_out o;
	const char *path = getenv("COPYCOUNT_OUT");
	int saved = errno;

	(void)sig;
	atomic_fetch_add_explicit(&snapshots, 1, memory_order_relaxed);
	if (path && *path) {
		format_report(&o, 0);
		write_report(&o, path, 1);
	}
	atomic_store_explicit(&alloc_armed, 1, memory_order_relaxed);
	errno = saved;
}

__attribute__((constructor))
static void cc_init(void)
{
	const char *m = getenv("COPYCOUNT_MIN_BYTES");
	const char *s = getenv("COPYCOUNT_SIGNAL");

	if (m && *m)
		min_bytes = strtoull(m, NULL, 10);
	alloc_resolve();
	if (s && *s) {
		struct sigaction sa = { .sa_handler = cc_snapshot, .sa_flags = SA_RESTART };

		sigemptyset(&sa.sa_mask);
		sigaction(atoi(s), &sa, NULL);
	}
}

__attribute__((destructor))
static void cc_report(void)
{
	static struct cc_out o;
	const char *path = getenv("COPYCOUNT_OUT");

	if (!path || !*path)
		return;
	while (atomic_flag_test_and_set_explicit(&copy_callers.lock, memory_order_acquire))
		;
	sort_callers(&copy_callers);
	atomic_flag_clear_explicit(&copy_callers.lock, memory_order_release);
	while (atomic_flag_test_and_set_explicit(&alloc_callers.lock, memory_order_acquire))
		;
	sort_callers(&alloc_callers);
	atomic_flag_clear_explicit(&alloc_callers.lock, memory_order_release);
	format_report(&o, 1);
	write_report(&o, path, 0);
}
