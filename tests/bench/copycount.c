/*
 * copycount.c - an LD_PRELOAD library that counts the bytes a process
 * copies with memcpy and memmove, to check from outside the code that
 * kvpoold moves block payloads without user-space copies.
 *
 *   LD_PRELOAD=libcopycount.so COPYCOUNT_OUT=/tmp/counts kvpoold ...
 *
 * Counted: every call that reaches memcpy, memmove, mempcpy, bcopy or
 * their _FORTIFY_SOURCE variants (__memcpy_chk, __memmove_chk,
 * __mempcpy_chk) through the dynamic linker, from the program and from
 * every shared library it loads (libevent, libxxhash...). Calls of at
 * least COPYCOUNT_MIN_BYTES (default 4096) are "big" and their callers are
 * recorded.
 *
 * Not counted, so the figures are a lower bound:
 *  - copies glibc makes inside itself (its calls to its own memcpy are
 *    bound at link time: stdio buffers, realloc moving a block...);
 *  - copies the compiler inlined (constant, small sizes);
 *  - copies by the kernel (read, write, readv, writev): those are the
 *    socket I/O itself, not user-space copies.
 *
 * At exit (a normal exit or return from main; not on a fatal signal) the
 * totals are written to the file named by COPYCOUNT_OUT, as lines
 * "key value": big_calls, big_bytes, all_calls, all_bytes, min_bytes,
 * then "caller ADDRESS SYMBOL calls N bytes N" for up to 32 callers of big
 * copies, most bytes first. Without COPYCOUNT_OUT nothing is written.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CC_CALLERS 32

typedef void *(*copy_fn)(void *, const void *, size_t);

struct cc_caller {
	void *ret;         /* return address of the call */
	uint64_t calls, bytes;
};

static _Atomic uint64_t big_calls, big_bytes, all_calls, all_bytes;
static uint64_t min_bytes = 4096;
static struct cc_caller callers[CC_CALLERS];
static atomic_flag callers_lock = ATOMIC_FLAG_INIT;
static copy_fn real_memcpy, real_memmove;
static _Thread_local int resolving;

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
static copy_fn resolve(const char *name)
{
	copy_fn f;

	resolving = 1;
	f = (copy_fn)dlsym(RTLD_NEXT, name);
	resolving = 0;
	return f;
}

/* Add one big copy to its caller's line; drops it when the table is full. */
static void note_caller(void *ret, size_t n)
{
	while (atomic_flag_test_and_set_explicit(&callers_lock, memory_order_acquire))
		;
	for (int i = 0; i < CC_CALLERS; i++) {
		if (callers[i].ret && callers[i].ret != ret)
			continue;
		callers[i].ret = ret;
		callers[i].calls++;
		callers[i].bytes += n;
		break;
	}
	atomic_flag_clear_explicit(&callers_lock, memory_order_release);
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
	note_caller(ret, n);
}

/* Copy with the real memcpy (or memmove when `move`). */
static void *do_copy(void *d, const void *s, size_t n, int move)
{
	copy_fn f = move ? real_memmove : real_memcpy;

	if (!f) {
		if (resolving)
			return slow_move(d, s, n);
		f = resolve(move ? "memmove" : "memcpy");
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

__attribute__((constructor))
static void cc_init(void)
{
	const char *m = getenv("COPYCOUNT_MIN_BYTES");

	if (m && *m)
		min_bytes = strtoull(m, NULL, 10);
}

/* Sort callers by bytes, most first (a handful: insertion sort). */
static void sort_callers(void)
{
	for (int i = 1; i < CC_CALLERS; i++) {
		struct cc_caller c = callers[i];
		int j = i;

		for (; j > 0 && callers[j - 1].bytes < c.bytes; j--)
			callers[j] = callers[j - 1];
		callers[j] = c;
	}
}

/* Append one formatted line to buf[*len..cap). */
__attribute__((format(printf, 4, 5)))
static void put_line(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
	va_list ap;
	int m;

	if (*len >= cap)
		return;
	va_start(ap, fmt);
	m = vsnprintf(buf + *len, cap - *len, fmt, ap);
	va_end(ap);
	if (m > 0)
		*len += (size_t)m < cap - *len ? (size_t)m : cap - *len - 1;
}

__attribute__((destructor))
static void cc_report(void)
{
	const char *path = getenv("COPYCOUNT_OUT");
	static char buf[8192];
	size_t len = 0;
	int fd;

	if (!path || !*path)
		return;
	put_line(buf, sizeof(buf), &len, "big_calls %llu\nbig_bytes %llu\nall_calls %llu\n"
		 "all_bytes %llu\nmin_bytes %llu\n", (unsigned long long)big_calls,
		 (unsigned long long)big_bytes, (unsigned long long)all_calls,
		 (unsigned long long)all_bytes, (unsigned long long)min_bytes);
	sort_callers();
	for (int i = 0; i < CC_CALLERS && callers[i].ret; i++) {
		Dl_info info = { 0 };
		const char *sym = dladdr(callers[i].ret, &info) && info.dli_sname ?
				  info.dli_sname : "?";

		put_line(buf, sizeof(buf), &len, "caller %p %s calls %llu bytes %llu\n",
			 callers[i].ret, sym, (unsigned long long)callers[i].calls,
			 (unsigned long long)callers[i].bytes);
	}
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	if (write(fd, buf, len) != (ssize_t)len)
		len = 0;
	close(fd);
}
