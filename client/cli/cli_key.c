/*
 * cli_key.c - parse and print block keys.
 */
#include "cli_key.h"

#include <errno.h>
#include <string.h>

#include <openssl/evp.h>

#define TEXT_PREFIX "text:"

/* Value of one hex digit, or -1. */
static int hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int cli_key_parse(const char *s, uint8_t out[KVPOOL_KEY_BYTES])
{
	uint8_t key[KVPOOL_KEY_BYTES];

	if (!s)
		return -EINVAL;
	if (!strncmp(s, TEXT_PREFIX, strlen(TEXT_PREFIX))) {
		s += strlen(TEXT_PREFIX);
		if (EVP_Digest(s, strlen(s), key, NULL, EVP_sha256(), NULL) != 1)
			return -EIO;
		memcpy(out, key, sizeof(key));
		return 0;
	}
	if (strlen(s) != 2 * KVPOOL_KEY_BYTES)
		return -EINVAL;
	for (int i = 0; i < KVPOOL_KEY_BYTES; i++) {
		int hi = hex_digit(s[2 * i]), lo = hex_digit(s[2 * i + 1]);

		if (hi < 0 || lo < 0)
			return -EINVAL;
		key[i] = (uint8_t)(hi << 4 | lo);
	}
	memcpy(out, key, sizeof(key));
	return 0;
}

char *cli_key_hex(const uint8_t key[KVPOOL_KEY_BYTES], char hex[CLI_KEY_HEX_BYTES])
{
	static const char digits[] = "0123456789abcdef";

	for (int i = 0; i < KVPOOL_KEY_BYTES; i++) {
		hex[2 * i] = digits[key[i] >> 4];
		hex[2 * i + 1] = digits[key[i] & 15];
	}
	hex[2 * KVPOOL_KEY_BYTES] = '\0';
	return hex;
}
