/*
 * conf_impl.h - what the parts of kvpoold's settings code share: the
 * setting table's types, and the helpers more than one part calls.
 * Private to config/: nothing outside it includes this file.
 *
 *   conf.c         the table, conf_set/conf_defaults, output, reload, JSON
 *   conf_value.c   value parsing and formatting (sizes, numbers, choices)
 *   conf_source.c  where values come from: INI files, flags, environment
 *   conf_check.c   conf_validate: checks across settings
 *
 * Threads: as conf.h; the table is constant.
 */
#ifndef KVPOOL_CONF_IMPL_H
#define KVPOOL_CONF_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "conf.h"

#define KIB (1ull << 10)
#define MIB (1ull << 20)
#define GIB (1ull << 30)
#define TIB (1ull << 40)

#define CONF_THREADS_MAX 256
/* The store's page: the arena and every block take whole pages of it. */
#define CONF_PAGE_BYTES 4096ull
#define CONF_SECTION "kvpoold"

enum conf_type {
	CONF_SIZE,     /* bytes, with optional unit */
	CONF_U32,      /* plain decimal integer */
	CONF_STRING,   /* text, no whitespace or control characters */
	CONF_CHOICE,   /* one word of a list (struct conf_choices), stored as an int */
	CONF_BOOL,     /* true/false, yes/no, on/off, 1/0; stored as an int 0 or 1 */
};

/* Setting flags. */
#define CONF_ZERO_IS_CORES 0x1u /* 0 means "number of online cores" */
#define CONF_SPACES_OK 0x2u     /* strings: blanks allowed inside (paths) */
#define CONF_EMPTY_UNSET 0x4u   /* strings: "" means unset; --help says so */
#define CONF_RELOAD 0x8u        /* SIGHUP applies a new value to the running server */

/* The words a CONF_CHOICE setting accepts; word i is stored as i. */
struct conf_choices {
	const char *noun;          /* for messages: "unknown log level" */
	const char *const *names;
	size_t count;
};

struct conf_setting {
	const char *name;    /* INI key; the flag is "--" + name with '-' for '_' */
	enum conf_type type;
	size_t offset;       /* of the field in struct conf */
	size_t field_bytes;  /* 4 or 8 for numbers, buffer bytes for strings */
	const char *def;     /* default, as INI text */
	uint64_t min, max;   /* numbers: value range; strings: length range */
	unsigned int flags;
	const char *metavar; /* placeholder in --help */
	const char *help;
	const struct conf_choices *choices; /* CONF_CHOICE only */
	const char *unit;    /* of a number, for --help and docs: "bytes", "ms"; NULL if none */
};

/* Environment variables: KVPOOL_<NAME>; KVPOOL_CONFIG names a file. */
#define ENV_PREFIX "KVPOOL_"
#define ENV_CONFIG ENV_PREFIX "CONFIG"

/* More than the table holds (conf.c checks it at compile time), for
 * arrays indexed by setting. */
#define CONF_SETTINGS_MAX 128

/* The table (conf.c) and its length. */
extern const struct conf_setting *const conf_settings;
extern const size_t conf_n_settings;

/* Format a message into err[0..err_len) when err is not NULL and err_len
 * is not 0. */
__attribute__((format(printf, 3, 4)))
void conf_err(char *err, size_t err_len, const char *fmt, ...);

/* The table's entry named key, or NULL. */
const struct conf_setting *conf_find(const char *key);

/* A field of c as a number (CONF_SIZE, CONF_U32, CONF_CHOICE, CONF_BOOL). */
uint64_t conf_field_get(const struct conf *c, const struct conf_setting *s);

/* conf_value.c. p past leading blanks. */
const char *conf_skip_space(const char *p);
/* v bytes as text that parses back to v ("64MiB", "4097"). */
void conf_format_size(uint64_t v, char *buf, size_t len);
/* v as text in s's unit (sizes as conf_format_size). */
void conf_format_number(const struct conf_setting *s, uint64_t v, char *buf, size_t len);
/* Parse text as numeric setting s into *v and check s's range. 0, or
 * -EINVAL / -ERANGE with the reason in why[0..why_len). */
int conf_parse_number(const struct conf_setting *s, const char *text, uint64_t *v, char *why,
		      size_t why_len);
/* Check text as string setting s (length, characters). 0, or -EINVAL /
 * -ERANGE with the reason in why[0..why_len). */
int conf_string_check(const struct conf_setting *s, const char *text, char *why,
		      size_t why_len);

#endif /* KVPOOL_CONF_IMPL_H */
