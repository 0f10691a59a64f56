/*
 * url.c - parse libkvpool server URLs.
 */
#include "url.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

/* A scheme is a letter followed by letters, digits, '+', '-' or '.'
 * (RFC 3986); returns its length, or 0 if `s` does not start with one
 * followed by "://". */
static size_t scheme_len(const char *s)
{
	size_t n = 0;

	if (!isalpha((unsigned char)s[0]))
		return 0;
	while (isalnum((unsigned char)s[n]) || s[n] == '+' || s[n] == '-' || s[n] == '.')
		n++;
	return strncmp(s + n, "://", 3) == 0 ? n : 0;
}

/* Is `c` allowed in a host name or IPv4 address? */
static int host_char_ok(char c)
{
	return isalnum((unsigned char)c) || c == '-' || c == '.' || c == '_';
}

/* Is `c` allowed inside the brackets of an IPv6 literal (with zone id)? */
static int ipv6_char_ok(char c)
{
	return isxdigit((unsigned char)c) || c == ':' || c == '.' || c == '%' ||
	       isalnum((unsigned char)c) || c == '-' || c == '_';
}

/* Parse "[v6]" or "name" at s into host; *rest receives what follows. */
static int parse_host(const char *s, char *host, const char **rest)
{
	const char *start = s, *end;

	if (*s == '[') {
		start = ++s;
		while (*s && *s != ']') {
			if (!ipv6_char_ok(*s))
				return -EINVAL;
			s++;
		}
		if (*s != ']' || !memchr(start, ':', (size_t)(s - start)))
			return -EINVAL;
		end = s++;
	} else {
		while (host_char_ok(*s))
			s++;
		end = s;
	}
	if (end == start || (size_t)(end - start) > KVC_URL_HOST_MAX_BYTES)
		return -EINVAL;
	memcpy(host, start, (size_t)(end - start));
	host[end - start] = '\0';
	*rest = s;
	return 0;
}

/* Parse ":PORT" (1..65535, decimal digits only) or nothing at s. */
static int parse_port(const char *s, uint16_t *port)
{
	unsigned long v = 0;

	if (*s == '\0') {
		*port = KVC_URL_DEFAULT_PORT;
		return 0;
	}
	if (*s++ != ':' || *s == '\0')
		return -EINVAL;
	for (; *s; s++) {
		if (!isdigit((unsigned char)*s))
			return -EINVAL;
		v = v * 10 + (unsigned long)(*s - '0');
		if (v > 65535)
			return -EINVAL;
	}
	if (v == 0)
		return -EINVAL;
	*port = (uint16_t)v;
	return 0;
}

int kvc_url_parse(const char *url, struct kvc_url *out)
{
	struct kvc_url u;
	const char *rest;
	size_t n;
	int rc;

	if (!url || !out)
		return -EINVAL;
	n = scheme_len(url);
	if (n == 0)
		return -EINVAL;
	memset(&u, 0, sizeof(u));
	if (n == 3 && strncasecmp(url, "tcp", 3) == 0)
		u.transport = KVC_TRANSPORT_TCP;
	else if (n == 4 && strncasecmp(url, "rdma", 4) == 0)
		u.transport = KVC_TRANSPORT_RDMA;
	else if (n == 4 && strncasecmp(url, "auto", 4) == 0)
		u.transport = KVC_TRANSPORT_AUTO;
	else if (n == 3 && strncasecmp(url, "tls", 3) == 0)
		u.transport = KVC_TRANSPORT_TLS;
	else
		return -EOPNOTSUPP;
	rc = parse_host(url + n + 3, u.host, &rest);
	if (rc)
		return rc;
	rc = parse_port(rest, &u.port);
	if (rc)
		return rc;
	if (u.transport == KVC_TRANSPORT_RDMA && *rest == '\0')
		u.port = KVC_URL_DEFAULT_RDMA_PORT;
	snprintf(u.port_str, sizeof(u.port_str), "%u", (unsigned)u.port);
	*out = u;
	return 0;
}
