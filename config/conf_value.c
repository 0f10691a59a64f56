/*
 * conf_value.c - setting values as text: sizes with units ("64MiB",
 * "1.5GiB"), plain numbers, booleans, choices, strings, and back.
 */
#include "conf_impl.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <strings.h>
#include <unistd.h>

static const struct {
	const char *name;
	uint64_t mult;
} size_units[] = {
	{ "B", 1 },
	{ "KB", 1000ull }, { "MB", 1000000ull }, { "GB", 1000000000ull }, { "TB", 1000000000000ull },
	{ "KiB", KIB }, { "MiB", MIB }, { "GiB", GIB }, { "TiB", TIB },
};

/* Online cores, clamped to the threads range. */
static uint32_t online_cores(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	if (n < 1)
		return 1;
	return n > CONF_THREADS_MAX ? CONF_THREADS_MAX : (uint32_t)n;
}

/* Write size bytes with the largest binary unit that divides it exactly,
 * so the text parses back to the same value ("64MiB", "4097"). */
void conf_format_size(uint64_t v, char *buf, size_t len)
{
	static const char *const units[] = { "TiB", "GiB", "MiB", "KiB" };
	static const uint64_t mults[] = { TIB, GIB, MIB, KIB };

	for (size_t i = 0; i < 4 && v; i++) {
		if (v % mults[i] == 0) {
			snprintf(buf, len, "%" PRIu64 "%s", v / mults[i], units[i]);
			return;
		}
	}
	snprintf(buf, len, "%" PRIu64, v);
}

const char *conf_skip_space(const char *p)
{
	while (*p && isspace((unsigned char)*p))
		p++;
	return p;
}

/* ---- value parsers -------------------------------------------------------
 * Each returns 0, -EINVAL or -ERANGE and, on error, a reason in why[]. */

/* The multiplier of a unit name (case-insensitive), 0 if unknown. */
static uint64_t unit_mult(const char *unit, size_t len)
{
	if (len == 0)
		return 1;
	for (size_t i = 0; i < sizeof(size_units) / sizeof(size_units[0]); i++)
		if (strlen(size_units[i].name) == len && strncasecmp(unit, size_units[i].name, len) == 0)
			return size_units[i].mult;
	return 0;
}

/* Digits before the point, exactly, with overflow detection. */
static int parse_whole(const char **pp, uint64_t *out)
{
	const char *p = *pp;
	uint64_t v = 0;

	for (; isdigit((unsigned char)*p); p++) {
		unsigned int d = (unsigned int)(*p - '0');

		if (v > (UINT64_MAX - d) / 10)
			return -ERANGE;
		v = v * 10 + d;
	}
	*pp = p;
	*out = v;
	return 0;
}

/* Digits after the point as num/den; digits beyond 10^18 precision are
 * dropped (the result is rounded down anyway). */
static void parse_fraction(const char **pp, uint64_t *num, uint64_t *den)
{
	const char *p = *pp;

	*num = 0;
	*den = 1;
	for (; isdigit((unsigned char)*p); p++) {
		if (*den < 1000000000000000000ull) {
			*num = *num * 10 + (uint64_t)(*p - '0');
			*den *= 10;
		}
	}
	*pp = p;
}

/* Combine whole + num/den units of mult bytes, rounding down. */
static int size_combine(uint64_t whole, uint64_t num, uint64_t den, uint64_t mult, uint64_t *out)
{
	unsigned __int128 v = (unsigned __int128)whole * mult;

	v += (unsigned __int128)num * mult / den;
	if (v > UINT64_MAX)
		return -ERANGE;
	*out = (uint64_t)v;
	return 0;
}

static int size_parse(const char *text, uint64_t *out, char *why, size_t why_len)
{
	const char *p = conf_skip_space(text), *unit;
	uint64_t whole, num = 0, den = 1, mult;
	bool has_fraction = false;
	size_t unit_len;

	if (*p == '-') {
		conf_err(why, why_len, "negative sizes are not allowed");
		return -EINVAL;
	}
	if (!isdigit((unsigned char)*p)) {
		conf_err(why, why_len, *p ? "not a number" : "empty value");
		return -EINVAL;
	}
	if (parse_whole(&p, &whole)) {
		conf_err(why, why_len, "does not fit in 64 bits");
		return -ERANGE;
	}
	if (*p == '.') {
		p++;
		if (!isdigit((unsigned char)*p)) {
			conf_err(why, why_len, "digits expected after '.'");
			return -EINVAL;
		}
		parse_fraction(&p, &num, &den);
		has_fraction = true;
	}
	unit = p = conf_skip_space(p);
	while (isalpha((unsigned char)*p))
		p++;
	unit_len = (size_t)(p - unit);
	if (*conf_skip_space(p)) {
		conf_err(why, why_len, "trailing characters after the size");
		return -EINVAL;
	}
	mult = unit_mult(unit, unit_len);
	if (!mult) {
		conf_err(why, why_len, "unknown unit '%.*s' (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)",
			(int)(unit_len > 16 ? 16 : unit_len), unit);
		return -EINVAL;
	}
	if (has_fraction && mult == 1) {
		conf_err(why, why_len, "a fraction of a byte (a fraction needs a unit above B)");
		return -EINVAL;
	}
	if (size_combine(whole, num, den, mult, out)) {
		conf_err(why, why_len, "does not fit in 64 bits");
		return -ERANGE;
	}
	return 0;
}

int conf_parse_size(const char *text, uint64_t *out)
{
	if (!text)
		return -EINVAL;
	return size_parse(text, out, NULL, 0);
}

static int u32_parse(const char *text, uint64_t *out, char *why, size_t why_len)
{
	const char *p = conf_skip_space(text);
	uint64_t v;

	if (*p == '-') {
		conf_err(why, why_len, "negative values are not allowed");
		return -EINVAL;
	}
	if (!isdigit((unsigned char)*p)) {
		conf_err(why, why_len, *p ? "not a whole number" : "empty value");
		return -EINVAL;
	}
	if (parse_whole(&p, &v) || v > UINT32_MAX) {
		conf_err(why, why_len, "does not fit in 32 bits");
		return -ERANGE;
	}
	if (*conf_skip_space(p)) {
		conf_err(why, why_len, "not a whole number (no units here)");
		return -EINVAL;
	}
	*out = v;
	return 0;
}

/* true/yes/on/1 or false/no/off/0, case-insensitive. */
static int bool_parse(const char *text, uint64_t *out, char *why, size_t why_len)
{
	static const char *const yes[] = { "true", "yes", "on", "1" };
	static const char *const no[] = { "false", "no", "off", "0" };

	for (size_t i = 0; i < 4; i++) {
		if (strcasecmp(text, yes[i]) == 0) {
			*out = 1;
			return 0;
		}
		if (strcasecmp(text, no[i]) == 0) {
			*out = 0;
			return 0;
		}
	}
	conf_err(why, why_len, "not a boolean (use true or false)");
	return -EINVAL;
}

/* "a, b or c" of a choice list, for messages. */
static void choices_text(const struct conf_choices *ch, char *buf, size_t len)
{
	size_t used = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < ch->count && used < len; i++) {
		const char *sep = i == 0 ? "" : i + 1 == ch->count ? " or " : ", ";
		int n = snprintf(buf + used, len - used, "%s%s", sep, ch->names[i]);

		if (n < 0)
			return;
		used += (size_t)n;
	}
}

/* One of the words of ch, case-insensitive; *out receives its index. */
static int choice_parse(const struct conf_choices *ch, const char *text, uint64_t *out, char *why,
			size_t why_len)
{
	char list[128];

	for (size_t i = 0; i < ch->count; i++) {
		if (strcasecmp(text, ch->names[i]) == 0) {
			*out = i;
			return 0;
		}
	}
	choices_text(ch, list, sizeof(list));
	conf_err(why, why_len, "unknown %s (use %s)", ch->noun, list);
	return -EINVAL;
}

/* Length within the setting's range; no control characters, and no
 * blanks either unless the setting allows them (paths). */
int conf_string_check(const struct conf_setting *s, const char *text, char *why, size_t why_len)
{
	size_t len = strlen(text);
	bool spaces_ok = s->flags & CONF_SPACES_OK;

	if (len < s->min || len > s->max || len >= s->field_bytes) {
		conf_err(why, why_len, "length %zu is outside %" PRIu64 "..%" PRIu64 " bytes", len,
			s->min, s->max);
		return -ERANGE;
	}
	for (size_t i = 0; i < len; i++) {
		unsigned char ch = (unsigned char)text[i];

		if (iscntrl(ch) || (!spaces_ok && isspace(ch))) {
			conf_err(why, why_len, spaces_ok ? "control characters are not allowed" :
							  "spaces and control characters are not allowed");
			return -EINVAL;
		}
	}
	return 0;
}

void conf_format_number(const struct conf_setting *s, uint64_t v, char *buf, size_t len)
{
	if (s->type == CONF_SIZE)
		conf_format_size(v, buf, len);
	else
		snprintf(buf, len, "%" PRIu64, v);
}

/* Parse text as setting s into *v (numbers) and check the range. */
int conf_parse_number(const struct conf_setting *s, const char *text, uint64_t *v, char *why,
			size_t why_len)
{
	char lo[32], hi[32];
	int rc;

	if (s->type == CONF_SIZE)
		rc = size_parse(text, v, why, why_len);
	else if (s->type == CONF_U32)
		rc = u32_parse(text, v, why, why_len);
	else if (s->type == CONF_BOOL)
		rc = bool_parse(text, v, why, why_len);
	else
		rc = choice_parse(s->choices, text, v, why, why_len);
	if (rc)
		return rc;
	if (*v == 0 && (s->flags & CONF_ZERO_IS_CORES))
		*v = online_cores();
	if (*v < s->min || *v > s->max) {
		/* the range --help shows: 0 is accepted here too */
		conf_format_number(s, s->flags & CONF_ZERO_IS_CORES ? 0 : s->min, lo, sizeof(lo));
		conf_format_number(s, s->max, hi, sizeof(hi));
		conf_err(why, why_len, "out of range %s..%s%s", lo, hi,
			s->flags & CONF_ZERO_IS_CORES ? " (0 = one per core)" : "");
		return -ERANGE;
	}
	return 0;
}
