/*
 * fuzz.h - the entry point every fuzz target defines.
 *
 * A target is built twice: with clang and libFuzzer (make fuzz), which
 * calls it with generated inputs, and with the project's compiler and
 * replay.c (make test), which calls it once per file of its corpus and of
 * its regression folder. A target returns 0 and aborts (FUZZ_CHECK)
 * when a property it checks does not hold, so both builds see a failure.
 */
#ifndef KVPOOL_TESTS_FUZZ_H
#define KVPOOL_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Run one input. data[0..size) is only read. Returns 0. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Abort when a property does not hold, naming it: a crash both builds
 * report. */
#define FUZZ_CHECK(cond)                                                          \
	do {                                                                      \
		if (!(cond)) {                                                    \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, \
				#cond);                                           \
			abort();                                                  \
		}                                                                 \
	} while (0)

#endif /* KVPOOL_TESTS_FUZZ_H */
